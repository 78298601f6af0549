"""Smoke tests of the Prefect test infrastructure (conftest.py, prefect_helpers.py): a real server,
flows in this process and in subprocesses, a served deployment cancelled through the REST API and
the CLI, and a flow run through a worker of the process work pool."""

from __future__ import annotations

import os
import time
from pathlib import Path

import prefect_helpers as ph
import psutil
import pytest
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import StateType
from prefect.task_runners import ThreadPoolTaskRunner


@task(task_run_name="double[{x}]")
def double(x: int) -> int:
    get_run_logger().info("doubling %s", x)
    return 2 * x


@flow(name="smoke-mapped", task_runner=ThreadPoolTaskRunner(max_workers=2))
def mapped_flow(n: int) -> list[int]:
    results = double.map(list(range(n))).result()
    create_table_artifact(
        key="smoke-table", table=[{"x": x, "double": r} for x, r in enumerate(results)]
    )
    return results


def test_mapped_flow_in_process_is_seen_by_the_server() -> None:
    state = mapped_flow(3, return_state=True)
    assert state.is_completed(), state
    assert state.result() == [0, 2, 4]
    run_id = state.state_details.flow_run_id

    fr = ph.flow_run(run_id)
    assert fr.state_type == StateType.COMPLETED
    assert fr.name

    runs = ph.task_runs(run_id)
    assert sorted(r.name for r in runs) == ["double[0]", "double[1]", "double[2]"]
    assert {r.state_type for r in runs} == {StateType.COMPLETED}

    logs = ph.wait_for_logs(run_id, "doubling 2")
    assert sum("doubling" in log.message for log in logs) == 3

    [artifact] = ph.artifacts(run_id)
    assert artifact.key == "smoke-table" and artifact.type == "table"
    assert "double" in str(artifact.data)


SUBPROCESS_FLOWS = """
from prefect import flow, task

@task
def boom(x: int) -> int:
    if x == 2:
        raise ValueError("no twos")
    return x

@flow(name="smoke-sub-ok")
def ok(n: int) -> int:
    return sum(f.result() for f in [boom.submit(i) for i in range(n)])

@flow(name="smoke-sub-fail")
def fails(n: int) -> int:
    return sum(boom.map(list(range(n))).result())
"""


def test_flows_in_a_subprocess(flows_dir: Path, proc_log_dir: Path) -> None:
    module = ph.write_module(flows_dir, "smoke_sub_flows", SUBPROCESS_FLOWS)
    ok = ph.start_flow_in_subprocess(module, "ok", {"n": 2}, log_dir=proc_log_dir)
    fails = ph.start_flow_in_subprocess(module, "fails", {"n": 3}, log_dir=proc_log_dir)
    assert ok.flow_run_id() != fails.flow_run_id()

    good = ok.wait()
    assert good.returncode == 0, good.output
    assert good.flow_run_id == ok.flow_run_id()
    assert good.state_type == "COMPLETED"
    assert ph.flow_run(good.flow_run_id).state_type == StateType.COMPLETED
    assert len(ph.task_runs(good.flow_run_id)) == 2

    bad = fails.wait()
    assert bad.flow_run_id is not None, bad.output
    assert bad.state_type == "FAILED"
    assert ph.flow_run(bad.flow_run_id).state_type == StateType.FAILED
    task_states = sorted(r.state_type.value for r in ph.task_runs(bad.flow_run_id))
    assert task_states == ["COMPLETED", "COMPLETED", "FAILED"]


SERVED_FLOWS = """
import os, subprocess, sys, time
from pathlib import Path
from prefect import flow, task


def record_hook(flow, flow_run, state):
    # on_cancellation: which process runs it?
    Path(flow_run.parameters["out"], "hook.pid").write_text(str(os.getpid()))


@task
def sleeper(out: str) -> None:
    child = subprocess.Popen(["sleep", "60"])
    Path(out, "child.pid").write_text(str(child.pid))
    Path(out, "task.pid").write_text(str(os.getpid()))
    child.wait()


@flow(name="smoke-served", on_cancellation=[record_hook])
def served(out: str) -> None:
    sleeper(out)
"""


def _wait_file(path: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.1)
    return path.read_text()


@pytest.mark.slow
def test_served_flow_cancelled_via_api_and_cli(
    flows_dir: Path, proc_log_dir: Path, tmp_path: Path
) -> None:
    """Two runs of a served flow whose task waits on ``sleep 60`` in a subprocess: one cancelled
    through the REST API, one through the CLI; both end Cancelled. The runner SIGTERMs only the
    flow run process: the ``sleep`` child is not signalled and outlives the flow run (orphaned).
    The on_cancellation hook runs in the serve() process, after the flow run process has gone."""
    module = ph.write_module(flows_dir, "smoke_served", SERVED_FLOWS)
    served = ph.serve_flow(module, "served", deployment="smoke", log_dir=proc_log_dir)
    outs = {how: tmp_path / how for how in ("api", "cli")}
    runs = {}
    for how, out in outs.items():
        out.mkdir()
        runs[how] = served.run({"out": str(out)})
    children, flow_pids = {}, {}
    for how, out in outs.items():
        children[how] = int(_wait_file(out / "child.pid"))
        flow_pids[how] = int(_wait_file(out / "task.pid"))
        assert ph.flow_run(runs[how].id).state_type == StateType.RUNNING
        assert flow_pids[how] in {p.pid for p in served.process.tree()}

    asked = time.monotonic()
    result = ph.cancel_flow_run_via_api(runs["api"].id)
    assert result["status"] == "ACCEPT", result
    assert "cancellation" in ph.cancel_flow_run_via_cli(runs["cli"].id)
    for how, run in runs.items():
        final = ph.wait_for_flow_run(run.id, timeout=60)
        print(f"\ncancel via {how}: {final.state_type.value} {time.monotonic() - asked:.1f} s")
        assert final.state_type == StateType.CANCELLED, ph.flow_run_states(run.id)
        assert not ph.pid_alive(flow_pids[how])
        assert int(_wait_file(outs[how] / "hook.pid", timeout=30)) == served.process.pid
        # Prefect's cancellation does not reach the task's subprocess:
        assert ph.pid_alive(children[how]), "the sleep child was stopped too"
        child = psutil.Process(children[how])
        assert child.ppid() != flow_pids[how]  # orphaned
        child.kill()
        child.wait(5)
    assert served.stop() is not None


WORKER_FLOWS = """
import os, tempfile
from prefect import flow, get_run_logger

@flow(name="smoke-worker")
def where() -> str:
    get_run_logger().info(
        "host=%s dir=%s tmp=%s cwd=%s",
        os.environ.get("OPENJD_CHECKPOINT_HOST_ID"),
        os.environ.get("OPENJD_CHECKPOINT_WORK_DIR"),
        tempfile.gettempdir(),
        os.getcwd(),
    )
    return os.environ.get("OPENJD_CHECKPOINT_HOST_ID", "")
"""


@pytest.mark.slow
def test_flow_run_through_a_process_worker(process_work_pool, flows_dir: Path) -> None:
    module = ph.write_module(flows_dir, "smoke_worker_flows", WORKER_FLOWS)
    deployment_id = ph.deploy_to_work_pool(module, "where", "smoke-worker", process_work_pool.name)

    run = ph.start_deployment_run(deployment_id, work_queue_name="host-b")
    final = ph.wait_for_flow_run(run.id, timeout=120)
    assert final.state_type == StateType.COMPLETED, ph.flow_run_states(run.id)
    logs = ph.wait_for_logs(run.id, "host=")
    [line] = [log.message for log in logs if log.message.startswith("host=")]
    print(f"\nthrough a worker: {line}")
    seen = dict(part.split("=", 1) for part in line.split(" "))
    # The flow run inherits its worker's environment: host id, host folder, TMPDIR. Its cwd is
    # the deployment's code folder (the pull step set_working_directory), not the host's.
    assert seen["host"] == "host-b"
    assert seen["dir"] == str(process_work_pool.host_dir("host-b"))
    assert seen["tmp"] == str(process_work_pool.host_dir("host-b") / "tmp")
    assert seen["cwd"] == str(flows_dir)
    assert os.environ.get("OPENJD_CHECKPOINT_HOST_ID") is None  # only the workers have it
