"""Flows from job templates against the session's Prefect server: task runs, dependencies,
finally steps, final states, retries that resume, ``resume="latest"``, managed checkpoint
files."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import prefect_helpers as ph
import pytest
from escaping import alive_with_argv, escapes, kill_left, template
from prefect.client.schemas.objects import StateType

from core import CheckpointStore, RunStatus
from core.job import plan_tasks
from core.process._cgroups import containment
from prefect_integration import flow_from_template, openjd_flow

REPO = Path(__file__).resolve().parents[2]
THREE_STEPS = REPO / "tests" / "data" / "three_steps.yaml"
COUNTER = REPO / "tests" / "data" / "counter.yaml"
TRAINING = REPO / "examples" / "managed-files" / "training.yaml"
FAILING_EXIT = REPO / "tests" / "data" / "failing_exit.yaml"
EXPR_SAMPLE = REPO / "tests" / "data" / "expr-test-job.yaml"
FINALLY_CHAIN = REPO / "tests" / "prefect" / "data" / "finally_chain.yaml"


def _frames(out: Path) -> dict[int, str]:
    frames = [p for p in out.iterdir() if p.name.startswith("frame-")]
    return {int(p.name.split("-")[1]): p.read_text() for p in frames}


def _names(flow_run_id: Any) -> list[str]:
    return sorted(r.name for r in ph.task_runs(flow_run_id))


def test_flow_parameters_are_the_job_parameters(tmp_path: Path) -> None:
    flow = flow_from_template(THREE_STEPS, store=tmp_path / "store")
    assert flow.name == "Three step test job"
    props = flow.parameters.properties
    assert list(props) == ["Out", "FrameSeconds", "FailFrame", "resume"]
    assert flow.parameters.required == ["Out"]
    assert props["FrameSeconds"]["default"] == 0.1 and props["FrameSeconds"]["type"] == "number"
    assert props["FailFrame"]["default"] == 0 and props["FailFrame"]["type"] == "integer"
    assert props["Out"]["type"] == "string"
    # Prefect checks types when a run is made
    assert flow.validate_parameters({"Out": "x", "FailFrame": "3"})["FailFrame"] == 3
    try:
        flow.validate_parameters({"Out": "x", "FailFrame": "three"})
    except Exception as exc:
        assert "FailFrame" in str(exc)
    else:
        raise AssertionError("a non-integer FailFrame was accepted")


def test_three_steps_through_flow_from_template(tmp_path: Path) -> None:
    """Render (6 frames in 3 chunks, grouped into 2 task runs), Assemble after it, Cleanup
    (finally) with Job.Status Succeeded; the run's checkpoints are gone afterwards."""
    out = tmp_path / "out"
    out.mkdir()
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(THREE_STEPS, store=store.location, max_task_runs_per_step=2)
    state = flow(Out=str(out), FrameSeconds=0.01, return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    assert _names(flow_run_id) == [
        "Assemble",
        "Cleanup",
        "Render[Frame=1-4] (2 tasks)",
        "Render[Frame=5-6]",
    ]
    runs = {r.name: r for r in ph.task_runs(flow_run_id)}
    assert {r.state_type for r in runs.values()} == {StateType.COMPLETED}
    # Assemble waited for both Render task runs; Cleanup ran last
    assert runs["Assemble"].start_time >= max(
        runs[n].end_time for n in ("Render[Frame=1-4] (2 tasks)", "Render[Frame=5-6]")
    )
    assert runs["Cleanup"].start_time >= runs["Assemble"].end_time
    assert _frames(out) == {f: "x" for f in range(1, 7)}
    assert (out / "cleanup-status").read_text() == "Succeeded\n"
    [run] = store.list_runs()[0]
    assert run.status == RunStatus.SUCCEEDED and run.external_key == str(flow_run_id)
    logs = ph.wait_for_logs(flow_run_id, "ASSEMBLED")
    assert any("RENDER-DONE 5-6" in log.message for log in logs)
    [table] = [a for a in ph.artifacts(flow_run_id) if a.type == "table"]
    assert "Render[Frame=1-2]" in str(table.data) and "succeeded" in str(table.data)


def test_three_steps_through_the_decorator_with_a_failing_step(tmp_path: Path) -> None:
    """@openjd_flow's function changes a parameter (FailFrame=3) before the steps run; frame 3
    fails: Assemble does not run, Cleanup runs with Job.Status Failed, the flow run fails."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").write_text("")
    seen: list[dict[str, Any]] = []

    @openjd_flow(THREE_STEPS, store=tmp_path / "store", name="three-steps-decorated")
    def three(parameters: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(parameters))
        return {**parameters, "FailFrame": 3}

    assert three.name == "three-steps-decorated"
    state = three(Out=str(out), FrameSeconds=0.01, return_state=True)
    assert state.is_failed(), state
    assert seen == [{"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 0}]
    flow_run_id = state.state_details.flow_run_id
    runs = {r.name: r for r in ph.task_runs(flow_run_id)}
    assert runs["Render[Frame=3-4]"].state_type == StateType.FAILED
    assert runs["Render[Frame=1-2]"].state_type == StateType.COMPLETED
    assert runs["Cleanup"].state_type == StateType.COMPLETED
    assert runs.get("Assemble") is None or runs["Assemble"].state_type != StateType.COMPLETED
    assert (out / "cleanup-status").read_text() == "Failed\n"
    assert "Render" in (state.message or "")
    assert 4 not in _frames(out)


def test_finally_steps_run_in_a_cancelling_flow_run_skip_a_step_whose_dependency_failed(
    tmp_path: Path,
) -> None:
    """A Prefect cancel named ``CancelledRunFinally`` while the regular step runs: Prefect
    starts no task run in a Cancelling flow run, so the finally steps run in the flow run
    process (``_run_inline``), in dependency order as everywhere else (``core.StepWalk``):
    Collect fails, so Publish, which depends on it, does not start; Notify runs."""
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(FINALLY_CHAIN, store=store.location)
    answers: list[Any] = []

    def cancel_it() -> None:
        flow_run_id = ph.flow_run_of_store(store)
        ph.wait_for_logs(flow_run_id, "LONG-START", timeout=60)
        answers.append(ph.cancel_flow_run_via_api(flow_run_id, name="CancelledRunFinally"))

    helper = threading.Thread(target=cancel_it)
    helper.start()
    state = flow(return_state=True)
    helper.join()
    assert [a["status"] for a in answers] == ["ACCEPT"], answers
    assert state.type == StateType.CANCELLED and state.name == "CancelledRunFinally", state
    logs = [log.message for log in ph.wait_for_logs(state.state_details.flow_run_id, "NOTIFY-RAN")]
    assert any("finally steps run in the flow" in line for line in logs), logs[-30:]
    assert any("COLLECT-FAILS" in line for line in logs), logs[-30:]
    assert not any("PUBLISH-RAN" in line for line in logs), logs[-30:]
    assert any(
        "Publish: not started: its dependency Collect did not succeed" in line for line in logs
    ), logs[-30:]
    [run] = store.list_runs()[0]
    assert run.status == RunStatus.CANCELED, run.status


def test_no_process_of_an_action_outlives_its_task_run(tmp_path: Path) -> None:
    """A task run's action leaves processes in every way a process can escape (``setsid env
    -i``, double forks): none is alive once the flow run ends. The flow runs in this process,
    no subreaper: each action is in a cgroup of its own where the machine allows it
    (docs/decisions.md, "Escaped processes")."""
    if not containment().cgroups:
        pytest.skip("no writable cgroup v2 here: actions are contained by the earlier rules")
    script, argvs = escapes()
    try:
        flow = flow_from_template(template(tmp_path / "t.yaml", script), store=tmp_path / "s")
        state = flow(return_state=True)
        assert state.is_completed(), state
        ph.wait_for_logs(state.state_details.flow_run_id, "ESCAPED")
        assert [a for a in argvs if alive_with_argv(a)] == []
    finally:
        kill_left(argvs)


def test_a_failing_on_exit_fails_the_flow_run(tmp_path: Path) -> None:
    """The core's rule (docs/decisions.md, "onExit failures"): the task run whose session
    closed with a failed onExit completes (its task did), the flow run fails."""
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(FAILING_EXIT, store=store.location)
    state = flow(return_state=True)
    assert state.is_failed(), state
    assert "onExit failed: exited with code: 7" in (state.message or "")
    runs = {r.name: r for r in ph.task_runs(state.state_details.flow_run_id)}
    assert runs["S"].state_type == StateType.COMPLETED
    [run] = store.list_runs()[0]
    assert run.status == RunStatus.FAILED


def test_an_expr_job_with_list_parameters_runs(tmp_path: Path) -> None:
    """EXPR (lets, list parameters, path functions) as a flow: list values as flow parameters,
    kept in the core run's record as JSON."""
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(EXPR_SAMPLE, store=store.location)
    state = flow(
        Scene="/projects/show/scene_010.blend",
        OutputDir="/out",
        Frames=[1, 2, 4],
        Cameras=["left", "right"],
        return_state=True,
    )
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    logs = ph.wait_for_logs(flow_run_id, "OUT:/out/scene_010_3.exr")
    text = "\n".join(log.message for log in logs)
    assert "OUT:count=3 last=4 sum=7" in text
    assert "OUT:camera=RIGHT out=shot_right.4" in text
    [run] = store.list_runs()[0]
    assert json.loads(run.parameters["Cameras"]) == ["left", "right"]


def _state_names(flow_run_id: Any) -> dict[str, list[str]]:
    """Task run name -> the final state names of its task runs, oldest first."""
    out: dict[str, list[str]] = {}
    for r in ph.task_runs(flow_run_id):
        out.setdefault(r.name, []).append(r.state_name or "")
    return out


def test_flow_retry_continues_the_core_run_and_skips_finished_task_runs(tmp_path: Path) -> None:
    """Frame 6 fails on the first try; the flow retry (same flow run, same core run) skips the
    finished task run (Cached), runs only frame 6 of the failed chunk, Assemble, and the finally
    step again (Failed, then Succeeded)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").write_text("")
    store = CheckpointStore(tmp_path / "store")
    tries: list[int] = []

    @openjd_flow(THREE_STEPS, store=store.location, max_task_runs_per_step=2, retries=1)
    def retried(parameters: dict[str, Any]) -> None:
        tries.append(1)
        if len(tries) == 2:
            (out / "fail-now").unlink()  # the cause of the failure is fixed before the retry

    state = retried(Out=str(out), FrameSeconds=0.01, FailFrame=6, return_state=True)
    assert state.is_completed(), state
    assert len(tries) == 2
    flow_run_id = state.state_details.flow_run_id
    names = _state_names(flow_run_id)
    assert names["Render[Frame=1-4] (2 tasks)"] == ["Completed", "Cached"]
    assert names["Render[Frame=5-6]"] == ["Failed", "Completed"]
    assert names["Cleanup"] == ["Completed", "Completed"]
    assert _frames(out) == {f: "x" for f in range(1, 7)}  # nothing ran twice
    assert (out / "cleanup-status").read_text() == "Failed\nSucceeded\n"
    [run] = store.list_runs()[0]
    assert run.attempt == 2 and run.status == RunStatus.SUCCEEDED


def _kill_after_checkpoint(store: CheckpointStore, killed: list[int], timeout: float = 60) -> None:
    """SIGKILL the running task's process once it has stored a checkpoint (a crash)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in store.list_runs()[0]:
            for rec in store.read_tasks(run.job_key, run.run_id)[0]:
                if rec.checkpoint is not None and rec.process is not None:
                    os.kill(rec.process.pid, signal.SIGKILL)
                    killed.append(rec.process.pid)
                    return
        time.sleep(0.1)


def test_task_retry_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    """The counter's process is killed after a checkpoint: the task run fails, Prefect retries
    it, and the retry resumes from the stored state (right sum, started past 0)."""
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(COUNTER, store=store.location, task_retries=1)
    killed: list[int] = []
    killer = threading.Thread(target=_kill_after_checkpoint, args=(store, killed))
    killer.start()
    state = flow(N=12, StepSeconds=0.15, SaveEvery=2, return_state=True)
    killer.join()
    assert killed, "no checkpoint was stored"
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [count] = ph.task_runs(flow_run_id)
    assert count.name == "Count" and count.run_count == 2
    logs = ph.wait_for_logs(flow_run_id, "COUNTER-DONE")
    messages = [log.message for log in logs]
    assert any("resuming from checkpoint generation" in m for m in messages), messages
    starts = [m.split("from=")[1] for m in messages if "COUNTER-START" in m]
    assert starts[0] == "0" and int(starts[1]) > 0, starts
    assert any("COUNTER-DONE n=12 sum=78" in m for m in messages)


def test_resume_latest_resumes_and_without_it_starts_fresh(tmp_path: Path) -> None:
    """Flow run A fails at frame 6. Flow run B with resume="latest" continues A's core run: the
    finished task run is Cached, only frame 6 runs. Flow run C without resume runs everything."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").write_text("")
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(THREE_STEPS, store=store.location, max_task_runs_per_step=2)
    params = {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 6}
    a = flow(**params, return_state=True)
    assert a.is_failed(), a
    [run_a] = store.list_runs()[0]
    (out / "fail-now").unlink()

    b = flow(**params, resume="latest", return_state=True)
    assert b.is_completed(), b
    names = _state_names(b.state_details.flow_run_id)
    assert names["Render[Frame=1-4] (2 tasks)"] == ["Cached"]
    assert names["Render[Frame=5-6]"] == ["Completed"]
    assert _frames(out) == {f: "x" for f in range(1, 7)}
    runs = store.list_runs()[0]
    assert [r.run_id for r in runs] == [run_a.run_id]
    assert runs[0].attempt == 2 and runs[0].status == RunStatus.SUCCEEDED

    c = flow(**params, return_state=True)
    assert c.is_completed(), c
    assert set(_state_names(c.state_details.flow_run_id)["Render[Frame=1-4] (2 tasks)"]) == {
        "Completed"
    }
    assert _frames(out) == {f: "xx" for f in range(1, 7)}
    assert len(store.list_runs()[0]) == 2


def test_store_from_a_saved_block(tmp_path: Path) -> None:
    """A CheckpointStoreBlock saved on the server and loaded again names the flow's store; one
    naming a LocalFileSystem block uses its base path."""
    from prefect.filesystems import LocalFileSystem

    from prefect_integration import CheckpointStoreBlock

    CheckpointStoreBlock(location=str(tmp_path / "a")).save("store-a", overwrite=True)
    CheckpointStoreBlock(storage=LocalFileSystem(basepath=str(tmp_path / "b"))).save(
        "store-b", overwrite=True
    )
    for name, folder in (("store-a", "a"), ("store-b", "b")):
        block = CheckpointStoreBlock.load(name)
        flow = flow_from_template(COUNTER, store=block)
        state = flow(N=2, StepSeconds=0.01, return_state=True)
        assert state.is_completed(), state
        [run] = CheckpointStore(tmp_path / folder).list_runs()[0]
        assert run.external_key == str(state.state_details.flow_run_id)
    try:
        CheckpointStoreBlock().store_location()
    except ValueError as exc:
        assert "neither a location nor a storage" in str(exc)
    else:
        raise AssertionError("an empty block gave a location")


def _kill_at_generation(store: CheckpointStore, generation: int, killed: list[int]) -> None:
    """SIGKILL the running task's process once it has stored checkpoint ``generation``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for run in store.list_runs()[0]:
            for rec in store.read_tasks(run.job_key, run.run_id)[0]:
                ckpt = rec.checkpoint
                if ckpt and ckpt.generation >= generation and rec.process is not None:
                    os.kill(rec.process.pid, signal.SIGKILL)
                    killed.append(rec.process.pid)
                    return
        time.sleep(0.05)


def test_managed_files_from_a_block_are_restored_for_the_task_retry(tmp_path: Path) -> None:
    """A saved block with ``files="managed"``: the training example keeps its model file and
    samples in the session working directory, deleted when the task run's try ends. Its
    process is killed after three checkpoints; the task retry runs in a new session, where the
    store restored the files, and sums every sample (the first try's included)."""
    from prefect_integration import CheckpointStoreBlock

    CheckpointStoreBlock(location=str(tmp_path / "store"), files="managed").save(
        "managed-store", overwrite=True
    )
    block = CheckpointStoreBlock.load("managed-store")
    assert block.files == "managed" and block.file_roots == []
    flow = flow_from_template(TRAINING, store=block, task_retries=1)
    store = CheckpointStore(tmp_path / "store")
    killed: list[int] = []
    killer = threading.Thread(target=_kill_at_generation, args=(store, 3, killed))
    killer.start()
    epochs = 12
    state = flow(Epochs=epochs, EpochSeconds=0.3, return_state=True)
    killer.join()
    assert killed, "the task stored no checkpoint generation 3"
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [train] = ph.task_runs(flow_run_id)
    assert train.run_count == 2
    logs = ph.wait_for_logs(flow_run_id, "result: ")
    messages = [log.message for log in logs]
    assert "checkpoint files: managed" in messages
    [resumed] = [m for m in messages if "resumed at epoch" in m]
    epoch, model = resumed.split("resumed at epoch ")[1].split(" from ")
    saves = [m for m in messages if "openjd_checkpoint_save" in m]
    first_session = Path(saves[0].split('"file": "')[1].split('"')[0]).parent
    assert int(epoch) >= 3 and Path(model).parent != first_session
    assert not first_session.exists()
    assert any(f"result: {sum(k * k for k in range(epochs))}" in m for m in messages), messages
    assert list((tmp_path / "store").glob("blobs/blake3/*/*"))


def test_the_task_runner_of_a_flow(tmp_path: Path) -> None:
    """The default is a ThreadPoolTaskRunner of ``max_workers`` threads (4 unless given); any
    Prefect task runner, an instance or a class, may be given instead; ``max_workers`` with it,
    or something that is not a task runner, is refused when the flow is made, naming it."""
    import pytest
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    store = tmp_path / "store"
    default = flow_from_template(THREE_STEPS, store=store).task_runner
    assert isinstance(default, ThreadPoolTaskRunner) and default._max_workers == 4
    two = flow_from_template(THREE_STEPS, store=store, max_workers=2).task_runner
    assert isinstance(two, ThreadPoolTaskRunner) and two._max_workers == 2
    given = DaskTaskRunner(address="tcp://127.0.0.1:1")
    assert flow_from_template(THREE_STEPS, store=store, task_runner=given).task_runner is given
    made = flow_from_template(THREE_STEPS, store=store, task_runner=DaskTaskRunner).task_runner
    assert isinstance(made, DaskTaskRunner)
    with pytest.raises(ValueError, match="max_workers.*DaskTaskRunner"):
        flow_from_template(THREE_STEPS, store=store, max_workers=2, task_runner=given)
    with pytest.raises(TypeError, match="'dask' is not a Prefect task runner"):
        flow_from_template(THREE_STEPS, store=store, task_runner="dask")
    with pytest.raises(TypeError, match="not a Prefect task runner"):
        openjd_flow(THREE_STEPS, store=store, task_runner=dict)(lambda p: p)
    with pytest.raises(ValueError, match="max_workers must be 1 or more"):
        flow_from_template(THREE_STEPS, store=store, max_workers=0)


def test_file_settings_of_a_flow() -> None:
    """``files``/``file_roots``: the arguments, else the block's or the CheckpointStore's, else
    none (the environment where the flow runs); bad values are refused when the flow is made."""
    from prefect_integration import CheckpointStoreBlock
    from prefect_integration._flow import _file_settings

    block = CheckpointStoreBlock(location="/s", files="managed", file_roots=["/data"])
    assert _file_settings(block, None, None) == ("managed", ("/data",))
    assert _file_settings(block, "shared", []) == ("shared", ())
    assert _file_settings("/s", None, None) == (None, ())
    assert _file_settings("/s", "Managed", ["/a", "/b"]) == ("managed", ("/a", "/b"))
    store = CheckpointStore("memory://file-settings", files="managed", file_roots=["/r"])
    assert _file_settings(store, None, None) == ("managed", ("/r",))
    try:
        CheckpointStoreBlock(location="/s", file_roots=["relative"])
    except ValueError as exc:
        assert "not an absolute path" in str(exc)
    else:
        raise AssertionError("a relative root was accepted")
    for files, roots, message in (("copied", None, "files='copied'"), (None, ["r"], "'r'")):
        try:
            flow_from_template(COUNTER, store="/s", files=files, file_roots=roots)
        except ValueError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(f"files={files!r} file_roots={roots!r} accepted")


SECRETS_AND_HOSTS = Path(__file__).resolve().parent / "data" / "secrets_and_hosts.yaml"


def _secrets_flow(tmp_path: Path) -> tuple[Any, Path]:
    results = tmp_path / "results"
    flow = flow_from_template(
        SECRETS_AND_HOSTS,
        store=tmp_path / "store",
        max_task_runs_per_step=3,
        host_requirements={"attr.worker.os.family": ["linux-hosts"]},
        result_storage=results,
    )
    return flow, results


def test_grouping_and_host_requirements(tmp_path: Path) -> None:
    """Nine tasks in three task runs named after their ranges, one session each (the job
    environment is entered once per task run); the mapped host requirement becomes a tag, the
    unmapped one a warning in the flow run's log."""
    flow, _ = _secrets_flow(tmp_path)
    state = flow(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    runs = ph.task_runs(flow_run_id)
    assert sorted(r.name for r in runs) == [
        f"Work[Frame={r}] (3 tasks)" for r in ("1-3", "4-6", "7-9")
    ]
    assert all(r.tags == ["linux-hosts"] for r in runs)
    logs = ph.wait_for_logs(flow_run_id, "WORK 9")
    messages = [log.message for log in logs]
    assert any("amount.worker.gpu has no mapping" in m for m in messages)
    # one session per task run: the job environment is entered three times
    assert sum("openjd_redacted_env: SECRET=********" in m for m in messages) == 3


def test_secrets_never_reach_logs_artifacts_or_results(tmp_path: Path) -> None:
    flow, results = _secrets_flow(tmp_path)
    state = flow(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    messages = [log.message for log in ph.wait_for_logs(flow_run_id, "WORK 9")]
    assert not any("hunter2" in str(a.data) for a in ph.artifacts(flow_run_id))
    stored = [p.read_text(errors="replace") for p in results.rglob("*") if p.is_file()]
    assert len(stored) == 3 and not any("hunter2" in text for text in stored)
    assert any("WORK 1 ********" in m for m in messages)
    assert not any("hunter2" in m for m in messages)


def test_ten_thousand_tasks_make_a_bounded_number_of_task_runs(tmp_path: Path) -> None:
    """A step of 10,000 tasks plans and groups into at most the configured number of task
    runs, named after their ranges, without running anything (its time:
    benchmarks/prefect_integration_costs.py)."""
    from core import group_label, group_tasks, load_template, prepare_job

    text = SECRETS_AND_HOSTS.read_text().replace('range: "1-9"', 'range: "1-10000"')
    path = tmp_path / "big.yaml"
    path.write_text(text)
    flow = flow_from_template(path, store=tmp_path / "store")
    job = prepare_job(load_template(path), {})
    groups = group_tasks(plan_tasks(job, "Work"), 100)
    assert flow.name == "Secrets and hosts test job"
    assert len(groups) == 100 and {len(g) for g in groups} == {100}
    assert group_label(groups[0]) == "Work[Frame=1-100] (100 tasks)"
    assert group_label(groups[-1]) == "Work[Frame=9901-10000] (100 tasks)"


def test_the_block_is_registered_through_the_collections_entry_point() -> None:
    """Prefect imports the package through its entry point (in workers, and in the server,
    which then registers the block type at start)."""
    from prefect._internal.plugins.collections import load_prefect_collections

    import prefect_integration

    loaded = load_prefect_collections(reload=True)
    assert loaded.get("prefect_integration") is prefect_integration, loaded
