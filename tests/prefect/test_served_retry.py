"""A served flow run (``flow.serve()``) stopped, then retried the ways Prefect offers, at once:
``prefect flow-run retry ID`` (no ``--entrypoint``: the run has a deployment) and the state
change the UI's Retry button makes (``Scheduled``/``AwaitingRetry``, forced). Stopped two ways:
a cancel through Prefect's API (the default mode, ``Suspended``) and a SIGTERM to the flow run's
process. The retry is made as soon as the user sees the flow run ``Cancelled`` (issue 40: a
retry made then stayed ``Cancelled``: the runner's own cancel sequence set ``Cancelled`` again
over it, seconds later). Within a bounded time the served process takes the retry, the task
prints RESUMED, no frame is rendered twice, and the finally step runs."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import prefect_helpers as ph
import psutil
import pytest
from prefect.client.schemas.objects import StateType
from test_cancel import _chunks_render, _frames, _write_flow, task_processes

from core import CheckpointStore, RunStatus

pytestmark = pytest.mark.slow


def _retry_with_cli(flow_run_id: uuid.UUID) -> str:
    """``prefect flow-run retry ID``, as a user types it for a deployment's flow run."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run_id)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"prefect flow-run retry exited {done.returncode}:\n{out}"
    return out


def _retry_as_the_ui_does(flow_run_id: uuid.UUID) -> None:
    """The UI's Retry on a finished deployment run: schedule it again, same id."""
    body = {"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True}
    resp = httpx.post(f"{ph.api_url()}/flow_runs/{flow_run_id}/set_state", json=body, timeout=30)
    resp.raise_for_status()
    assert resp.json()["status"] == "ACCEPT", resp.json()


def _flow_run_process(served: ph.ServedFlow, store: CheckpointStore) -> psutil.Process:
    """The process the served runner started for the flow run: the ancestor of a running
    task's process that is a child of the serve process."""
    serve_pid = served.process.pid
    chains = []
    for run in store.list_runs()[0]:
        for rec in store.read_tasks(run.job_key, run.run_id)[0]:
            if rec.process is None or not rec.process.pid:
                continue
            try:
                chain = [
                    psutil.Process(rec.process.pid),
                    *psutil.Process(rec.process.pid).parents(),
                ]
            except psutil.NoSuchProcess:
                continue
            for proc in chain:
                if proc.ppid() == serve_pid:
                    return proc
            chains.append([(p.pid, p.cmdline()[:3]) for p in chain])
    raise AssertionError(f"no ancestor of a task process is a child of {serve_pid}: {chains}")


@pytest.mark.parametrize("stop", ["api-cancel", "sigterm"])
@pytest.mark.parametrize("retry", ["cli", "ui"])
def test_a_stopped_served_flow_run_retried_at_once_resumes(
    flows_dir: Path, proc_log_dir: Path, tmp_path: Path, stop: str, retry: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    store = CheckpointStore(tmp_path / "store")
    module, _ = _write_flow(flows_dir, store)
    served = ph.serve_flow(module, "three", log_dir=proc_log_dir)
    try:
        run = served.run({"Out": str(out), "FrameSeconds": 3})
        _chunks_render(store)
        if stop == "api-cancel":
            assert ph.cancel_flow_run_via_api(run.id)["status"] == "ACCEPT"
        else:
            _flow_run_process(served, store).terminate()
        final = ph.wait_for_flow_run(run.id, timeout=60)
        assert final.state_type == StateType.CANCELLED, ph.flow_run_states(run.id)
        assert not task_processes()
        [core_run] = store.list_runs()[0]
        assert core_run.status == RunStatus.INTERRUPTED
        assert not (out / "cleanup-status").exists()

        # at once, as a user who sees "Cancelled" does
        if retry == "cli":
            said = _retry_with_cli(run.id)
            assert "scheduled for retry" in said.lower() or str(run.id) in said, said
        else:
            _retry_as_the_ui_does(run.id)
        asked = time.monotonic()
        # (it starts Cancelled: wait for an end a retry can reach)
        ended = {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED}
        final = ph.wait_for_flow_run(run.id, until=ended, timeout=120)
        assert final.state_type == StateType.COMPLETED, (
            ph.flow_run_states(run.id),
            served.process.log(60),
        )
        print(f"\nretried run completed {time.monotonic() - asked:.1f} s after the retry")
        logs = ph.wait_for_logs(run.id, "resuming from checkpoint generation")
        assert any("RESUMED" in log.message for log in logs)
        assert _frames(out) == {f: "x" for f in range(1, 7)}  # no frame rendered twice
        assert (out / "cleanup-status").read_text() == "Succeeded\n"  # finally ran
        [core_run] = store.list_runs()[0]
        assert core_run.status == RunStatus.SUCCEEDED and core_run.attempt == 2
        assert not task_processes()
    finally:
        served.stop()
