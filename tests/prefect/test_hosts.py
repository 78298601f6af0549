"""Several hosts: the process work pool's two workers (host-a, host-b: own folders, own host
ids) stand in for two machines sharing one checkpoint store."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import prefect_helpers as ph
import pytest
from prefect.client.schemas.objects import StateType

from core import CheckpointStore, RunStatus

REPO = Path(__file__).resolve().parents[2]

FLOW_MODULE = """
from prefect_integration import flow_from_template

counter = flow_from_template({template!r}, store={store!r}, name={name!r})
"""


def _set_state(flow_run_id: uuid.UUID, state_type: str, name: str) -> None:
    body = {"state": {"type": state_type, "name": name}, "force": True}
    resp = httpx.post(f"{ph.api_url()}/flow_runs/{flow_run_id}/set_state", json=body, timeout=30)
    resp.raise_for_status()
    assert resp.json()["status"] == "ACCEPT", resp.json()


def _running_record(store: CheckpointStore, timeout: float = 90):
    """The counter's task record once it has a checkpoint (and a process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in store.list_runs()[0]:
            for rec in store.read_tasks(run.job_key, run.run_id)[0]:
                if rec.checkpoint is not None and rec.process is not None:
                    return run, rec
        time.sleep(0.2)
    raise AssertionError("the counter stored no checkpoint")


@pytest.mark.slow
def test_a_killed_host_s_run_resumes_on_the_other_host(
    process_work_pool, flows_dir: Path, tmp_path: Path
) -> None:
    """The worker running a checkpointing flow run is SIGKILLed with its whole process tree
    (the host dies: no hook, no state change). Rescheduled (what an automation on the missing
    heartbeat, or an operator, does), the same flow run is picked up by the other worker,
    continues the same core run and resumes the task from its checkpoint under that host's id."""
    store = CheckpointStore(tmp_path / "shared-store")
    name = f"counter-hosts-{uuid.uuid4().hex[:8]}"
    source = FLOW_MODULE.format(
        template=str(REPO / "tests" / "data" / "counter.yaml"), store=store.location, name=name
    )
    module = ph.write_module(flows_dir, name.replace("-", "_"), source)
    deployment_id = ph.deploy_to_work_pool(module, "counter", "hosts", process_work_pool.name)
    flow_run = ph.start_deployment_run(
        deployment_id,
        {"N": 40, "StepSeconds": 0.25, "SaveEvery": 4},
        work_queue_name="default",  # both workers poll it: whichever takes it first
    )
    run, rec = _running_record(store)
    first_host = rec.process.host
    other = {"host-a": "host-b", "host-b": "host-a"}[first_host]
    killed_at = time.monotonic()
    process_work_pool.kill_worker_tree(first_host)
    try:
        assert not ph.pid_alive(rec.process.pid)
        assert ph.flow_run(flow_run.id).state_type == StateType.RUNNING  # nobody noticed
        _set_state(flow_run.id, "CRASHED", "Crashed")
        _set_state(flow_run.id, "SCHEDULED", "AwaitingRetry")
        final = ph.wait_for_flow_run(flow_run.id, timeout=120)
        took = time.monotonic() - killed_at
        print(f"\nresumed on {other} and completed {took:.1f} s after the kill")
        assert final.state_type == StateType.COMPLETED, ph.flow_run_states(flow_run.id)
        logs = ph.wait_for_logs(flow_run.id, "COUNTER-DONE")
        messages = [log.message for log in logs]
        assert any("resuming from checkpoint generation" in m for m in messages)
        assert any("COUNTER-DONE n=40 sum=820" in m for m in messages)
        starts = [int(m.split("from=")[1]) for m in messages if "COUNTER-START" in m]
        assert starts[0] == 0 and starts[-1] > 0, starts
        [after] = store.list_runs()[0]
        assert after.run_id == run.run_id and after.attempt == 2
        assert after.status == RunStatus.SUCCEEDED
        attempts = [m for m in messages if m.startswith("core run ")]
        assert len(attempts) == 2, attempts
        assert "(attempt 1)" in attempts[0] and attempts[0].endswith(f"on host {first_host}")
        assert "(attempt 2)" in attempts[1] and attempts[1].endswith(f"on host {other}")
    finally:
        process_work_pool.start_workers(first_host)
