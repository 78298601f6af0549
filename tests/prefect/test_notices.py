"""Interruption notices on Prefect: a notice from a test metadata server on 127.0.0.1 (AWS,
IMDSv2) reaches a running task run, which checkpoints and fails; the task retry resumes."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import prefect_helpers as ph
import pytest

from core import CheckpointStore
from prefect_integration import CheckpointStoreBlock, flow_from_template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from metadata_server import MetadataServer  # noqa: E402  (tests/)

COUNTER = REPO / "tests" / "data" / "counter.yaml"


def test_a_notice_checkpoints_the_task_run_and_the_retry_resumes(tmp_path: Path) -> None:
    server = MetadataServer()
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(
        COUNTER,
        store=store.location,
        task_retries=1,
        interruption_notices=f"aws:{server.url}",
        notice_poll_seconds=0.2,
    )

    def notify() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            runs, _ = store.list_runs()
            for run in runs:
                tasks, _ = store.read_tasks(run.job_key, run.run_id)
                if any(t.checkpoint is not None for t in tasks):
                    server.trigger("aws", 60, once=True)  # the retry's host gets none
                    return
            time.sleep(0.1)

    notifier = threading.Thread(target=notify)
    notifier.start()
    try:
        state = flow(N=30, StepSeconds=0.1, SaveEvery=3, return_state=True)
    finally:
        notifier.join()
        server.close()
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [count] = ph.task_runs(flow_run_id)
    assert count.run_count == 2
    messages = [log.message for log in ph.wait_for_logs(flow_run_id, "COUNTER-DONE")]
    assert any("interruption notice from aws" in m for m in messages), messages
    assert any("stopped by an interruption notice" in m for m in messages), messages
    assert any("resuming from checkpoint generation" in m for m in messages), messages
    starts = [m.split("from=")[1] for m in messages if "COUNTER-START" in m]
    assert starts[0] == "0" and int(starts[1]) > 0, starts
    assert any("COUNTER-DONE n=30 sum=465" in m for m in messages)
    (run,), _ = store.list_runs()
    assert run.notices and run.notices[0]["source"] == "aws"


def test_notice_settings_are_checked_when_the_flow_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interruption_notices=: unknown"):
        flow_from_template(COUNTER, store=tmp_path, interruption_notices="aws,nope")
    with pytest.raises(ValueError, match="interruption_notices"):
        CheckpointStoreBlock(location=str(tmp_path), interruption_notices="file:")
    block = CheckpointStoreBlock(location=str(tmp_path), interruption_notices="gcp")
    flow = flow_from_template(COUNTER, store=block)
    assert flow is not None
