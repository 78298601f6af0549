"""Several hosts: the process work pool's two workers (host-a, host-b: own folders, own host
ids) stand in for two machines sharing one checkpoint store."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import prefect_helpers as ph
import psutil
import pytest
from prefect.client.schemas.objects import StateType

from core import CheckpointStore, RunStatus, TaskRecord

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


def _wait_lease_free(store: CheckpointStore, rec: TaskRecord, root: Path, timeout: float = 60):
    """Wait until nobody holds the task's lease (a flock on a local store: free once every
    thread of its dead holder has exited)."""
    deadline = time.monotonic() + timeout
    while store.task_lease_held(rec.job_key, rec.run_id, rec.step, rec.task_key):
        if time.monotonic() > deadline:
            locks = root.glob(f"jobs/*/runs/{rec.run_id}/tasks/*.lock")
            holders = {str(p): ph.flock_holders(p) for p in locks}
            raise AssertionError(f"the task lease is still held after {timeout} s: {holders}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_killed_host_s_run_resumes_on_the_other_host(
    process_work_pool, flows_dir: Path, tmp_path: Path
) -> None:
    """The worker running a checkpointing flow run is SIGKILLed with the flow run process (the
    runner dies: no hook, no state change), but the OpenJD task process, in a session of its
    own, lives on, as on a host cut off from the network. Rescheduled (what an automation on the
    missing heartbeat, or an operator, does), the same flow run is picked up by the other
    worker, continues the same core run and resumes the task from its checkpoint under that
    host's id; the task's record still names the first host's live process, and the other host
    never signals it: a pid recorded under another host id means nothing here (on a real other
    machine, an unrelated process).

    The left-over task process is frozen (SIGSTOP) before its runner is killed: it would run
    ahead of the resumed copy and could end on its own before the other host claims the task.
    Frozen, it cannot end by itself, a SIGKILL still removes it, and any other signal stays
    pending, so it shows whether anyone signalled it."""
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
    left = rec.process
    first_host = left.host
    other = {"host-a": "host-b", "host-b": "host-a"}[first_host]
    task = psutil.Process(left.pid)
    assert os.getpgid(left.pid) == left.pgid == left.pid  # a session of its own
    assert task.environ()["OPENJD_CHECKPOINT_HOST_ID"] == first_host
    assert task.environ()["OPENJD_CHECKPOINT_SESSION"] == left.marker  # kill_marked finds it
    try:
        ph.freeze_group(left.pgid)
        killed = ph.kill_tree_sparing(process_work_pool.workers[first_host], left.pgid)
        assert left.pid not in killed and len(killed) >= 2, killed  # worker and flow run
        # The premise: the first host's task process is alive and is what the record names,
        # and its task lease is free (the runner held the flock and is dead; the task process
        # does not inherit the lock's descriptor).
        assert ph.pid_alive(left.pid) and abs(task.create_time() - left.start_time) < 0.01
        now = store.read_task(run.job_key, run.run_id, rec.step, rec.task_key)
        assert now is not None and now.process == left, now
        _wait_lease_free(store, rec, tmp_path / "shared-store")
        assert ph.flow_run(flow_run.id).state_type == StateType.RUNNING  # nobody noticed
        _set_state(flow_run.id, "CRASHED", "Crashed")
        _set_state(flow_run.id, "SCHEDULED", "AwaitingRetry")
        final = ph.wait_for_flow_run(flow_run.id, timeout=180)
        assert final.state_type == StateType.COMPLETED, ph.flow_run_states(flow_run.id)
        # The other host claimed the task whose record named the first host's process, and
        # left that process alone: not killed, not signalled at all.
        assert ph.pid_alive(left.pid), f"{other} killed {first_host}'s process {left.pid}"
        assert task.is_running()  # the same process (pid and start time), not a reused pid
        assert task.status() == psutil.STATUS_STOPPED
        assert ph.signals_pending(left.pid) == [], f"{other} signalled {first_host}'s process"
        logs = ph.wait_for_logs(flow_run.id, "COUNTER-DONE")
        messages = [log.message for log in logs]
        assert not [m for m in messages if "left running by" in m], messages
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
        ph.kill_group_and_wait(task)  # the first host's task process, frozen or not
        process_work_pool.start_workers(first_host)
