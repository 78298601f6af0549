"""Several hosts: the process work pool's two workers (host-a, host-b: own folders, own
``TMPDIR``, own host ids) stand in for two machines sharing one checkpoint store, on the S3
protocol (a store of its own per test on the session's moto server, ``tests/s3server.py``; the
workers and their flow runs inherit its endpoint and credentials).

- ``test_a_killed_host_s_run_resumes_on_the_other_host``: a host dies (its worker and flow run
  process SIGKILLed); the rescheduled flow run continues on the other host.
- ``test_managed_files_resume_on_the_other_host``: a store with managed checkpoint files (a
  ``CheckpointStoreBlock`` with ``files="managed"``); the training example's files, kept in its
  session working directory on host-a, are restored into one on host-b, where the run resumes.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import httpx
import prefect_helpers as ph
import psutil
import pytest
from prefect.client.schemas.objects import StateType
from prefect_session import POOL_LEASE_SECONDS

from core import CheckpointStore, RunStatus, TaskRecord
from prefect_integration import CheckpointStoreBlock, end_flow_run

REPO = Path(__file__).resolve().parents[2]
TRAINING = REPO / "examples" / "managed-files" / "training.yaml"
LEASE_TTL = POOL_LEASE_SECONDS
"""A task lease on an S3 store expires this long after its holder's last renewal (a flock on a
local store is free as soon as its holder dies): the pool workers' lease setting."""

FLOW_MODULE = """
from prefect_integration import flow_from_template

counter = flow_from_template({template!r}, store={store!r}, name={name!r})
"""


def _set_state(flow_run_id: uuid.UUID, state_type: str, name: str) -> None:
    body = {"state": {"type": state_type, "name": name}, "force": True}
    resp = httpx.post(f"{ph.api_url()}/flow_runs/{flow_run_id}/set_state", json=body, timeout=30)
    resp.raise_for_status()
    assert resp.json()["status"] == "ACCEPT", resp.json()


def _running_record(store: CheckpointStore, generation: int = 1, timeout: float = 180):
    """The task's record once it has checkpoint ``generation`` (and a process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in store.list_runs()[0]:
            for rec in store.read_tasks(run.job_key, run.run_id)[0]:
                ckpt = rec.checkpoint
                if ckpt is not None and ckpt.generation >= generation and rec.process is not None:
                    return run, rec
        time.sleep(0.3)
    raise AssertionError(f"the task stored no checkpoint generation {generation}")


def _wait_lease_free(store: CheckpointStore, rec: TaskRecord, timeout: float = LEASE_TTL + 30):
    """Wait until nobody holds the task's lease: on an S3 store, until the lease of its dead
    holder has expired (up to ``LEASE_TTL`` after the holder's last renewal)."""
    deadline = time.monotonic() + timeout
    while store.task_lease_held(rec.job_key, rec.run_id, rec.step, rec.task_key):
        if time.monotonic() > deadline:
            raise AssertionError(f"the task lease of {rec.step} is still held after {timeout} s")
        time.sleep(1.0)


@pytest.mark.slow
def test_a_killed_host_s_run_resumes_on_the_other_host(
    process_work_pool, s3_server, flows_dir: Path
) -> None:
    """The worker running a checkpointing flow run is SIGKILLed with the flow run process (the
    runner dies: no hook, no state change), but the OpenJD task process, in a session of its
    own, lives on, as on a host cut off from the network. Rescheduled (what an automation on the
    missing heartbeat, or an operator, does), the same flow run is picked up by the other
    worker, continues the same core run and resumes the task from its checkpoint under that
    host's id; the task's record still names the first host's live process, and the other host
    never signals it: a pid recorded under another host id means nothing here (on a real other
    machine, an unrelated process). The flow run is rescheduled once the dead runner's task
    lease has expired (the store is on S3: up to ``LEASE_TTL`` after the runner's death).

    The left-over task process is frozen (SIGSTOP) before its runner is killed: it would run
    ahead of the resumed copy and could end on its own before the other host claims the task.
    Frozen, it cannot end by itself, a SIGKILL still removes it, and any other signal stays
    pending, so it shows whether anyone signalled it."""
    store = CheckpointStore(s3_server.new_store("prefect-hosts"))
    name = f"counter-hosts-{uuid.uuid4().hex[:8]}"
    source = FLOW_MODULE.format(
        template=str(REPO / "tests" / "data" / "counter.yaml"), store=store.url, name=name
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
        # and its task lease is free once it expires (its holder, the runner, is dead; the task
        # process holds no part of it).
        assert ph.pid_alive(left.pid) and abs(task.create_time() - left.start_time) < 0.01
        now = store.read_task(run.job_key, run.run_id, rec.step, rec.task_key)
        assert now is not None and now.process == left, now
        _wait_lease_free(store, rec)
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


TRAINING_MODULE = """
from prefect_integration import CheckpointStoreBlock, flow_from_template

training = flow_from_template(
    {template!r}, store=CheckpointStoreBlock.load({block!r}), name={name!r}
)
"""


@pytest.mark.slow
def test_managed_files_resume_on_the_other_host(
    process_work_pool, s3_server, flows_dir: Path
) -> None:
    """A deployment whose store is a saved ``CheckpointStoreBlock`` with ``files="managed"``.
    Its training task runs on host-a and writes its model file and samples in its session
    working directory there; ``end_flow_run(..., "Suspended")`` stops it with a checkpoint (the
    store keeps the files). A new flow run with ``resume="latest"`` on host-b's queue continues
    the run in a session working directory of host-b's, where the store restored the files: it
    resumes from the restored model file and sums every sample, host-a's included."""
    url = s3_server.new_store("prefect-training")
    suffix = uuid.uuid4().hex[:8]
    block, name = f"training-{suffix}", f"training-hosts-{suffix}"
    CheckpointStoreBlock(location=url, files="managed").save(block)
    source = TRAINING_MODULE.format(template=str(TRAINING), block=block, name=name)
    module = ph.write_module(flows_dir, name.replace("-", "_"), source)
    deployment_id = ph.deploy_to_work_pool(module, "training", "hosts", process_work_pool.name)
    epochs = 24
    parameters = {"Epochs": epochs, "EpochSeconds": 0.25}
    store = CheckpointStore(url)
    host_a, host_b = "host-a", "host-b"

    first = ph.start_deployment_run(deployment_id, parameters, work_queue_name=host_a)
    run, rec = _running_record(store, generation=3)
    assert rec.process is not None and rec.process.host == host_a
    assert rec.checkpoint is not None and rec.checkpoint.manifest  # the store keeps the files
    assert ph.flow_run(first.id).labels.get("openjd.files") == "managed"
    end_flow_run(first.id, "Suspended")
    stopped = ph.wait_for_flow_run(first.id, timeout=90)
    assert (stopped.state_type, stopped.state_name) == (StateType.CANCELLED, "Suspended")

    second = ph.start_deployment_run(
        deployment_id, {**parameters, "resume": "latest"}, work_queue_name=host_b
    )
    final = ph.wait_for_flow_run(second.id, timeout=120)
    assert final.state_type == StateType.COMPLETED, ph.flow_run_states(second.id)
    a_tmp = str(process_work_pool.host_dir(host_a) / "tmp") + os.sep
    b_tmp = str(process_work_pool.host_dir(host_b) / "tmp") + os.sep
    logs = ph.flow_run_logs(first.id)
    before = [log.message for log in logs]
    # the worker's engine logs the end of a run stopped as asked at INFO, with no traceback
    # (Prefect logs "Engine execution exited with unexpected exception" at ERROR otherwise)
    engine = [(log.level, log.message) for log in logs if log.message.startswith("Engine exec")]
    assert engine == [(logging.INFO, f"Engine execution ended as asked: {stopped.state.message}")]
    saved = [m for m in before if "openjd_checkpoint_save" in m]
    assert saved and all(f'"file": "{a_tmp}' in m for m in saved), saved
    expected = sum(k * k for k in range(epochs))
    messages = [log.message for log in ph.wait_for_logs(second.id, f"result: {expected}")]
    [resumed] = [m for m in messages if "resumed at epoch" in m]
    epoch, model = resumed.split("resumed at epoch ")[1].split(" from ")
    assert 3 <= int(epoch) < epochs
    assert model.startswith(b_tmp) and model.endswith("model.txt"), resumed
    assert "checkpoint files: managed" in messages
    assert any(m.startswith("core run ") and m.endswith(f"on host {host_b}") for m in messages)
    [after] = store.list_runs()[0]
    assert after.run_id == run.run_id and after.status == RunStatus.SUCCEEDED
