"""One flow run's tasks spread over a farm: ``DaskTaskRunner`` (prefect-dask) on a real Dask
cluster, a scheduler and two ``dask worker`` processes standing in for two machines (host ids
``dask-a`` / ``dask-b``, ``--nthreads 1``, ``--no-nanny``: ``dask_session.py``), the flow run
process for a third, a real Prefect server, and the store on the S3-protocol test server with
managed checkpoint files (the machines share nothing else).

The job is ``tests/data/farm.yaml``: a chunked step (Render) with more tasks than workers, a
checkpointing step (Train) whose checkpoint is a file in its session working directory, a step
depending on both (Total), a finally step (Report).

- ``test_a_two_step_job_spreads_over_both_workers``: every task runs once, on either worker;
  the table artifact's ``host`` column names both.
- ``test_a_prefect_cancel_suspends_tasks_on_both_workers_and_a_resume_finishes``: a cancel
  through Prefect's API checkpoints the tasks running on both workers; Cancelled (Suspended)
  only after their processes are gone; ``resume="latest"`` resumes them (RESUMED) and skips
  what had finished.
- ``test_a_sigterm_to_the_flow_run_process_reaches_both_workers``: a SIGTERM to the flow run's
  process (a worker shutting down) checkpoints the tasks on both workers as a cancel does.
- ``test_a_killed_worker_s_task_resumes_on_the_other_worker``: a ``dask worker`` and its task's
  process group SIGKILLed mid-task; Dask runs the task again on the other worker, which waits
  for the dead worker's lease, restores the checkpoint file there and resumes from it.
- ``test_end_flow_run_cancelled_run_finally_reaches_both_workers``: ``end_flow_run`` in
  ``CancelledRunFinally`` cancels the tasks on both workers; the finally step runs once, with
  ``Job.Status`` ``Cancelled``.
- ``test_a_second_try_on_a_worker_says_how_to_resume_and_which_try_saved``: a notice stops a
  task on a worker, whose line says how to resume with the flow's real entrypoint; its second
  try (a Prefect task retry in the same flow run) resumes, and the table's checkpoint history
  and ``checkpoints show`` both say that try saved the generations it saved.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import prefect_helpers as ph
import pytest
from dask_session import DASK_HOSTS, LEASE_SECONDS, DaskCluster
from prefect import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import StateType

from core import CheckpointStore, RunStatus, TaskRecord
from prefect_integration import end_flow_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FARM = REPO / "tests" / "data" / "farm.yaml"

FLOW_MODULE = """
from prefect_dask import DaskTaskRunner

from prefect_integration import flow_from_template

farm = flow_from_template(
    {template!r},
    name={name!r},
    store={store!r},
    files="managed",
    task_runner=DaskTaskRunner(address={address!r}),
)
"""


def _flow_module(flows_dir: Path, cluster: DaskCluster, store: str) -> Path:
    name = f"farm-{uuid.uuid4().hex[:8]}"
    source = FLOW_MODULE.format(template=str(FARM), name=name, store=store, address=cluster.address)
    return ph.write_module(flows_dir, name.replace("-", "_"), source)


def _start_farm(
    cluster: DaskCluster,
    s3_server: Any,
    flows_dir: Path,
    log_dir: Path,
    prefix: str,
    params: dict[str, Any],
) -> tuple[CheckpointStore, Path, ph.FlowProcess]:
    """A fresh S3 store (``prefix``), the farm flow on the cluster, and its flow run started
    with ``params`` in a process of its own (host id ``dask-flow``)."""
    store = CheckpointStore(s3_server.new_store(prefix))
    module = _flow_module(flows_dir, cluster, store.url)
    flow = ph.start_flow_in_subprocess(
        module, "farm", params, log_dir=log_dir, env=_flow_env(cluster)
    )
    return store, module, flow


def _flow_env(cluster: DaskCluster) -> dict[str, str]:
    return {**cluster.env(), "OPENJD_CHECKPOINT_HOST_ID": "dask-flow"}


def _all_logs(flow_run_id: uuid.UUID) -> list[str]:
    """Every log line of the flow run and its task runs, oldest first."""
    return [log.message for log in ph.flow_run_logs(flow_run_id)]


def _logs_with(flow_run_id: uuid.UUID, contains: str, timeout: float = 30.0) -> list[str]:
    """The flow run's log lines, once one contains ``contains`` (logs come in batches)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = _all_logs(flow_run_id)
        if any(contains in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def _table(flow_run_id: uuid.UUID) -> list[dict[str, Any]]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    [table] = [a for a in found if a.type == "table"]
    data = table.data
    return json.loads(data) if isinstance(data, str) else data


def _running(
    store: CheckpointStore, step: str, count: int, generation: int = 0, timeout: float = 240
) -> list[TaskRecord]:
    """``count`` records of ``step`` whose task runs now (a process named) with at least
    checkpoint ``generation``, once there are that many. (Generous: in CI the core and Airflow
    suites share the machine's two cores, and a flow run then takes a minute to start.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for run in store.list_runs()[0]:
            for rec in store.read_tasks(run.job_key, run.run_id)[0]:
                ckpt = rec.checkpoint
                if rec.step != step or rec.process is None or not rec.process.pid:
                    continue
                if generation and (ckpt is None or ckpt.generation < generation):
                    continue
                found.append(rec)
        if len(found) >= count:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{count} running {step} tasks (generation {generation}) not seen")


def _wait_final(
    flow: ph.FlowProcess, cluster: DaskCluster, timeout: float = 180.0
) -> tuple[uuid.UUID, Any]:
    """Wait for the flow run to reach a final state; at that moment no task process may be
    left under any worker. Returns the flow run id and the flow run."""
    flow_run_id = flow.flow_run_id()
    deadline = time.monotonic() + timeout
    while True:
        run = ph.flow_run(flow_run_id)
        if run.state_type in (StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"flow run still {run.state_type} after {timeout} s")
        time.sleep(0.2)
    left = cluster.task_processes()
    assert left == [], f"task processes left on the workers as the flow run ended: {left}"
    result = flow.wait(timeout=60)
    assert result.returncode == 0, result.output[-3000:]
    return flow_run_id, run


def _trains_on_both_workers(store: CheckpointStore, generation: int) -> None:
    """Wait until a Train task runs on each worker with checkpoint ``generation`` stored."""
    running = _running(store, "Train", 2, generation=generation)
    assert {r.process.host for r in running if r.process} == set(DASK_HOSTS)


def _trains_suspended(store: CheckpointStore) -> list[TaskRecord]:
    """The job run is suspended, and both Train tasks with it, each with its managed checkpoint
    file kept and no process left; returns every task record."""
    job_run = _job_run(store)
    assert job_run.status == RunStatus.INTERRUPTED, job_run
    records = store.read_tasks(job_run.job_key, job_run.run_id)[0]
    trains = [r for r in records if r.step == "Train"]
    assert len(trains) == 2
    for rec in trains:
        assert rec.status.value == "interrupted", rec
        assert rec.checkpoint is not None and rec.checkpoint.manifest, rec  # the file kept
        assert rec.process is None
    return records


def _job_run(store: CheckpointStore):
    [run] = store.list_runs()[0]
    return run


def test_a_two_step_job_spreads_over_both_workers(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path
) -> None:
    """Six Render chunks (more than the two workers' threads) and two Train tasks, then Total
    and the finally step: every task runs once, spread over both workers, and the result is
    right (every frame rendered once, each trainer's every epoch, Total after both)."""
    store = CheckpointStore(s3_server.new_store("dask-spread"))
    module = _flow_module(flows_dir, dask_cluster, store.url)
    flow = ph.start_flow_in_subprocess(
        module,
        "farm",
        {"Frames": "1-12", "ChunkSize": 2, "FrameSeconds": 0.3},
        log_dir=proc_log_dir,
        env=_flow_env(dask_cluster),
    )
    flow_run_id, run = _wait_final(flow, dask_cluster)
    assert run.state_type == StateType.COMPLETED, ph.flow_run_states(flow_run_id)
    rows = _table(flow_run_id)
    assert len(rows) == 6 + 2 + 1 + 1, rows
    assert {r["status"] for r in rows} == {"succeeded"}, rows
    by_host = Counter(r["host"] for r in rows)
    assert set(by_host) == set(DASK_HOSTS), by_host  # the records name both workers' hosts
    lines = _logs_with(flow_run_id, "REPORT status=Succeeded")
    frames = Counter(
        int(line.split("FRAME ")[1].split()[0]) for line in lines if "| FRAME " in line
    )
    assert frames == Counter(range(1, 13)), frames
    assert not [line for line in lines if "progress artifact of" in line]  # sent from workers
    hosts = {line.rsplit("host=", 1)[1] for line in lines if "| FRAME " in line}
    assert hosts == set(DASK_HOSTS), hosts
    done = [line for line in lines if "TRAIN-DONE" in line]
    assert len(done) == 2 and all("epochs=4" in line for line in done), done
    total = [i for i, line in enumerate(lines) if "TOTAL-RAN" in line]
    last_train = max(i for i, line in enumerate(lines) if "TRAIN-DONE" in line)
    last_frame = max(i for i, line in enumerate(lines) if "| FRAME " in line)
    assert len(total) == 1 and total[0] > max(last_train, last_frame)
    assert sum("REPORT status=Succeeded" in line for line in lines) == 1
    assert _job_run(store).status == RunStatus.SUCCEEDED


def test_a_prefect_cancel_suspends_tasks_on_both_workers_and_a_resume_finishes(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path
) -> None:
    """Both Train tasks run, one on each worker, with checkpoints stored; a cancel through
    Prefect's API (the UI's Cancel) reaches them on their workers: each stores a checkpoint and
    stops. The flow run is Cancelled (named Suspended) only once no task process is left, the
    job run Suspended. A new flow run with ``resume="latest"`` resumes both (RESUMED, from the
    checkpoint file restored on whichever worker runs it), runs no finished Render chunk again,
    and finishes right."""
    params = {"Frames": "1-4", "ChunkSize": 2, "Epochs": 120, "EpochSeconds": 0.25}
    store, module, first = _start_farm(
        dask_cluster, s3_server, flows_dir, proc_log_dir, "dask-cancel", params
    )
    _trains_on_both_workers(store, generation=2)
    result = ph.cancel_flow_run_via_api(first.flow_run_id())
    assert result["status"] == "ACCEPT", result
    first_id, stopped = _wait_final(first, dask_cluster)
    assert (stopped.state_type, stopped.state_name) == (StateType.CANCELLED, "Suspended")
    records = _trains_suspended(store)
    renders = [r for r in records if r.step == "Render"]
    assert len(renders) == 2 and all(r.status.value == "succeeded" for r in renders)
    before = _all_logs(first_id)
    assert sum("TRAIN-STOPPED" in line for line in before) == 2, before[-40:]

    second = ph.start_flow_in_subprocess(
        module,
        "farm",
        {**params, "resume": "latest"},
        log_dir=proc_log_dir,
        env=_flow_env(dask_cluster),
    )
    second_id, final = _wait_final(second, dask_cluster)
    assert final.state_type == StateType.COMPLETED, ph.flow_run_states(second_id)
    after = _logs_with(second_id, "REPORT status=Succeeded")
    assert not [line for line in after if "RENDER-START" in line]  # finished chunks skipped
    frames = Counter(
        int(line.split("FRAME ")[1].split()[0]) for line in before + after if "| FRAME " in line
    )
    assert frames == Counter(range(1, 5)), frames
    resumed = [line for line in after if "TRAIN-RESUMED" in line]
    assert len(resumed) == 2, after[-40:]
    for line in resumed:
        epoch = int(line.split(" at epoch ")[1].split()[0])
        host = line.rsplit("host=", 1)[1]
        restored = line.split(" from ")[1].split()[0]
        assert epoch >= 2
        assert restored.startswith(str(dask_cluster.host_dir(host))), line
    done = [line for line in after if "TRAIN-DONE" in line]
    assert len(done) == 2 and all("epochs=120" in line for line in done), done
    rows = {r["task"]: r for r in _table(second_id)}
    assert [r["resume status"] for k, r in rows.items() if k.startswith("Train")] == [
        "RESUMED",
        "RESUMED",
    ], rows
    assert _job_run(store).status == RunStatus.SUCCEEDED


def test_a_sigterm_to_the_flow_run_process_reaches_both_workers(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path
) -> None:
    """A SIGTERM straight to the process running the flow (its machine shutting down, no
    cancel): the Train tasks running on both workers each store a checkpoint and stop, and the
    flow run ends Cancelled (Suspended) only once no task process is left on either worker."""
    params = {"Frames": "1-2", "ChunkSize": 2, "Epochs": 200, "EpochSeconds": 0.25}
    store, module, flow = _start_farm(
        dask_cluster, s3_server, flows_dir, proc_log_dir, "dask-sigterm", params
    )
    _trains_on_both_workers(store, generation=1)
    os.kill(flow.process.pid, signal.SIGTERM)
    flow_run_id, final = _wait_final(flow, dask_cluster)
    assert (final.state_type, final.state_name) == (StateType.CANCELLED, "Suspended")
    _trains_suspended(store)
    lines = _logs_with(flow_run_id, "TRAIN-STOPPED")
    assert sum("TRAIN-STOPPED" in line for line in lines) == 2, lines[-40:]


def test_a_killed_worker_s_task_resumes_on_the_other_worker(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path
) -> None:
    """A ``dask worker`` (started with ``--no-nanny``: nothing restarts it) is SIGKILLed with
    its task's process group while the Train task checkpoints: the host is gone. Dask runs the
    task's task run again on the other worker; there the dead worker's task lease (on S3: until
    it expires, ``LEASE_SECONDS``) makes the new try wait, said in the log, instead of refusing
    it; the task then resumes from its last checkpoint, its checkpoint file restored into a
    session working directory of the other worker's, and the flow run succeeds."""
    params = {"Frames": "1-2", "ChunkSize": 2, "Trainers": 1, "Epochs": 80, "EpochSeconds": 0.3}
    store, module, flow = _start_farm(
        dask_cluster, s3_server, flows_dir, proc_log_dir, "dask-kill", params
    )
    [rec] = _running(store, "Train", 1, generation=3)
    assert rec.process is not None
    dead = rec.process.host
    [other] = [h for h in DASK_HOSTS if h != dead]
    try:
        dask_cluster.kill_worker(dead)
        os.killpg(rec.process.pgid, signal.SIGKILL)
        flow_run_id, final = _wait_final(flow, dask_cluster)
        assert final.state_type == StateType.COMPLETED, ph.flow_run_states(flow_run_id)
    finally:
        dask_cluster.start_workers(dead)
    lines = _logs_with(flow_run_id, "TRAIN-DONE")
    [resumed] = [line for line in lines if "TRAIN-RESUMED" in line]
    epoch = int(resumed.split(" at epoch ")[1].split()[0])
    restored = resumed.split(" from ")[1].split()[0]
    assert epoch >= 3, resumed
    assert resumed.endswith(f"host={other}")
    assert restored.startswith(str(dask_cluster.host_dir(other))), resumed
    waited = [line for line in lines if "lease" in line and "waiting" in line]
    assert waited, lines[-40:]  # the new try said it waits for the dead worker's lease
    [done] = [line for line in lines if "TRAIN-DONE" in line]
    assert "epochs=80" in done and done.endswith(f"host={other}")
    assert not [line for line in lines if "already-resumed" in line]
    assert LEASE_SECONDS < 60
    assert _job_run(store).status == RunStatus.SUCCEEDED


def test_end_flow_run_cancelled_run_finally_reaches_both_workers(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path
) -> None:
    """``end_flow_run(..., "CancelledRunFinally")`` while a Train task runs on each worker:
    both are cancelled on their workers, Total never runs, the finally step runs once with
    ``Job.Status`` ``Cancelled``, and the flow run ends Cancelled (named CancelledRunFinally)
    once no task process is left."""
    params = {"Frames": "1-2", "ChunkSize": 2, "Epochs": 200, "EpochSeconds": 0.25}
    store, module, flow = _start_farm(
        dask_cluster, s3_server, flows_dir, proc_log_dir, "dask-finally", params
    )
    _trains_on_both_workers(store, generation=1)
    end_flow_run(flow.flow_run_id(), "CancelledRunFinally")
    flow_run_id, final = _wait_final(flow, dask_cluster)
    assert (final.state_type, final.state_name) == (StateType.CANCELLED, "CancelledRunFinally")
    lines = _logs_with(flow_run_id, "REPORT status=")
    reports = [line for line in lines if "REPORT status=" in line]
    assert len(reports) == 1 and reports[0].endswith("REPORT status=Cancelled"), reports
    assert not [line for line in lines if "TOTAL-RAN" in line]
    assert not [line for line in lines if "TRAIN-DONE" in line]
    assert _job_run(store).status == RunStatus.CANCELED


RETRY_MODULE = """
from prefect_dask import DaskTaskRunner

from prefect_integration import flow_from_template

train = flow_from_template(
    {template!r},
    name={name!r},
    store={store!r},
    files="managed",
    task_runner=DaskTaskRunner(address={address!r}),
    task_retries=1,
    interruption_notices={notices!r},
    notice_poll_seconds=0.5,
)
"""


def test_a_second_try_on_a_worker_says_how_to_resume_and_which_try_saved(
    dask_cluster: DaskCluster, s3_server: Any, flows_dir: Path, proc_log_dir: Path, tmp_path: Path
) -> None:
    """The training job on a worker, with ``task_retries=1`` and a notice file: once it has
    stored two checkpoints, the notice stops it (checkpoint kept) and the task run fails; its
    second try (the task run's ``run_count`` 2, in the same flow run and core run attempt)
    resumes and finishes. The line the first try logged on the worker says how to resume with
    the flow's real entrypoint (the worker has no flow run context of its own: it was
    ``--entrypoint FILE.py:FLOW``, a placeholder). The table's checkpoint history says which
    try of the task saved each generation kept (``task attempt #2, run attempt 1``: it said
    ``attempt 1``, the run's, for generations the second try saved), and ``checkpoints show``
    of the finished run says the same words."""
    notice = tmp_path / "notice"
    store = CheckpointStore(s3_server.new_store("dask-retry"))
    name = f"train-{uuid.uuid4().hex[:8]}"
    source = RETRY_MODULE.format(
        template=str(REPO / "examples" / "managed-files" / "training.yaml"),
        name=name,
        store=store.url,
        address=dask_cluster.address,
        notices=f"file:{notice}",
    )
    module = ph.write_module(flows_dir, name.replace("-", "_"), source)
    flow = ph.start_flow_in_subprocess(
        module,
        "train",
        {"Epochs": 24, "EpochSeconds": 0.25},
        log_dir=proc_log_dir,
        env=_flow_env(dask_cluster),
    )
    _running(store, "Train", 1, generation=2)
    notice.write_text(f"{time.time() + 30}\n")
    flow_run_id, final = _wait_final(flow, dask_cluster)
    assert final.state_type == StateType.COMPLETED, ph.flow_run_states(flow_run_id)
    [task_run] = ph.task_runs(flow_run_id)
    assert task_run.run_count == 2, task_run  # one task run, tried twice
    # 1. the first try's line, logged on a worker, names the flow's real entrypoint
    lines = _logs_with(flow_run_id, "result: ")
    [kept] = [line for line in lines if line.startswith("Train: suspended") and "resume" in line]
    assert "FILE.py:FLOW" not in kept, kept
    retry = f"`prefect flow-run retry {flow_run_id} --entrypoint "
    assert retry in kept and kept.endswith("` or a new flow run with resume=latest"), kept
    entrypoint = kept.split(retry)[1].split("`")[0]
    assert entrypoint.endswith(f"{module.name}:train"), kept
    assert (Path(flow.process.cwd or ".") / entrypoint.split(":")[0]).resolve() == module
    # 2. the generations the second try saved say so, in the table and in checkpoints show
    [row] = _table(flow_run_id)
    history = row["checkpoint history"].split("; ")
    assert len(history) == 3 and row["attempts"] == 2, row  # the three the store keeps
    assert all("(task attempt #2, run attempt 1, " in h for h in history), history
    [job_run] = store.list_runs()[0]
    shown = subprocess.run(
        [sys.executable, "-m", "core.cli", "checkpoints", "show", job_run.run_id]
        + ["--store", store.url],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    marks = [line.strip()[2:] for line in shown.splitlines() if line.strip().startswith("▲ ")]
    assert marks == history, shown
