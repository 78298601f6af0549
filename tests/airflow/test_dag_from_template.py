"""dag_from_template under dag.test(): the DAG's shape, a run that succeeds, a failing step with
the finally step still run, an execution_timeout whose retry resumes from the checkpoint, and
the same with managed checkpoint files (restored into the retry's new session); the
``[openjd_checkpoint]`` file settings."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import airflow_helpers as ah
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
THREE_STEPS = ROOT / "tests" / "data" / "three_steps.yaml"
FIBONACCI = ROOT / "examples" / "fibonacci" / "fibonacci-fast.yaml"
TRAINING = ROOT / "examples" / "managed-files" / "training.yaml"
FAILING_EXIT = ROOT / "tests" / "data" / "failing_exit.yaml"
EXPR_SAMPLE = ROOT / "tests" / "data" / "expr-test-job.yaml"

DAG_FILE = """
from datetime import timedelta

from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r},
    dag_id={dag_id!r},
    store={store!r},
    default_args={default_args},
)
"""


def dag_source(template: Path, dag_id: str, store: Path, default_args: str = "{}") -> str:
    return DAG_FILE.format(
        template=str(template), dag_id=dag_id, store=str(store), default_args=default_args
    )


def core_runs(store: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(store.glob("jobs/*/runs/*/run.json"))]


def test_three_steps_shape_and_success(dag_tester: ah.DagTester, tmp_path: Path, capfd) -> None:
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    result = dag_tester.run(
        "three_steps_ok.py",
        source=dag_source(THREE_STEPS, "three_steps_ok", store, '{"retries": 0}'),
        run_conf={"Out": str(out), "FrameSeconds": 0.01},
    )

    assert result.state == "success", result.states()
    assert result.states() == {
        ("openjd_begin", -1): "success",
        ("plan_Render", -1): "success",
        ("plan_Assemble", -1): "success",
        ("plan_Cleanup", -1): "success",
        ("Render", 0): "success",
        ("Render", 1): "success",
        ("Render", 2): "success",
        ("Assemble", 0): "success",
        ("Cleanup", 0): "success",
        ("openjd_finish", -1): "success",
    }
    labels = {(t.task_id, t.map_index): t.rendered_map_index for t in result.tis}
    assert labels[("Render", 0)] == "Render[Frame=1-2]"
    assert labels[("Render", 1)] == "Render[Frame=3-4]"
    assert labels[("Render", 2)] == "Render[Frame=5-6]"
    assert labels[("Assemble", 0)] == "Assemble"
    assert labels[("Cleanup", 0)] == "Cleanup"
    tasks = result.dag.task_dict
    assert tasks["openjd_begin"].is_setup
    assert tasks["Render"].downstream_task_ids == {"Assemble", "Cleanup", "openjd_finish"}
    assert tasks["Assemble"].upstream_task_ids == {"openjd_begin", "plan_Assemble", "Render"}
    assert tasks["Cleanup"].is_teardown
    assert tasks["Cleanup"].upstream_task_ids == {
        "openjd_begin",
        "plan_Cleanup",
        "Render",
        "Assemble",
    }
    assert tasks["openjd_finish"].is_teardown and tasks["openjd_finish"].on_failure_fail_dagrun
    assert tasks["Render"].retries == 0  # default_args win over the default of 1
    assert sorted(p.name for p in out.glob("frame-*")) == [f"frame-{i}" for i in range(1, 7)]
    assert (out / "cleanup-status").read_text() == "Succeeded\n"
    [run] = core_runs(store)
    assert run["status"] == "succeeded"
    assert run["external_key"] == f"three_steps_ok/{result.run_id}"
    printed = capfd.readouterr().out
    assert "ASSEMBLED" in printed
    assert "CLEANUP status=Succeeded" in printed
    # The task state store summarizes what tasks stored to resume from (Render's finished
    # frames); a first try that stored nothing (Assemble, Cleanup) writes no summary.
    stored = state_store("three_steps_ok", result.run_id)
    assert set(stored) == {("Render", 0), ("Render", 1), ("Render", 2)}
    [task] = stored[("Render", 1)]["openjd_checkpoint"]["tasks"]
    assert (task["label"], task["status"], task["frames_done"]) == (
        "Render[Frame=3-4]",
        "succeeded",
        2,
    )


def test_params_from_job_parameters(dag_tester: ah.DagTester, tmp_path: Path) -> None:
    path = dag_tester.write(
        "three_steps_params.py",
        dag_source(THREE_STEPS, "three_steps_params", tmp_path / "store"),
    )
    dag = dag_tester.load(path)["three_steps_params"]
    params = dag.params
    assert params.get_param("FrameSeconds").value == 0.1
    assert params.get_param("FrameSeconds").schema["type"] == "number"
    assert params.get_param("FailFrame").schema["type"] == "integer"
    assert params.get_param("Out").schema["type"] == ["string", "null"]
    assert params.get_param("resume").value is None
    assert "OpenJDCheckpointJobStatus" not in params
    assert dag.task_dict["Render"].retries == 1  # retries default to 1


def test_failing_step_fails_the_run_and_finally_runs(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    (out / "fail-now").write_text("")
    result = dag_tester.run(
        "three_steps_fail.py",
        source=dag_source(THREE_STEPS, "three_steps_fail", store, '{"retries": 0}'),
        run_conf={"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 3},
    )

    assert result.state == "failed", result.states()
    states = result.states()
    assert states[("Render", 1)] == "failed"
    assert states[("Render", 0)] == "success"
    assert states[("Render", 2)] == "success"
    assert states[("Assemble", -1)] == "upstream_failed"  # never expanded
    assert states[("Cleanup", 0)] == "success"
    assert states[("openjd_finish", -1)] == "failed"
    assert (out / "cleanup-status").read_text() == "Failed\n"
    [run] = core_runs(store)
    assert run["status"] == "failed"
    printed = capfd.readouterr().out
    assert "RENDER-FAIL 3" in printed
    assert "CLEANUP status=Failed" in printed


def test_a_failing_on_exit_fails_the_dag_run(dag_tester: ah.DagTester, tmp_path: Path, capfd):
    """The core's rule (docs/decisions.md, "onExit failures"): the task instance whose session
    closed with a failed onExit succeeds (its task did), the DAG run fails."""
    store = tmp_path / "store"
    result = dag_tester.run(
        "failing_exit.py",
        source=dag_source(FAILING_EXIT, "failing_exit", store, '{"retries": 0}'),
        run_conf={},
    )

    assert result.state == "failed", result.states()
    states = result.states()
    assert states[("S", 0)] == "success"
    assert states[("openjd_finish", -1)] == "failed"
    [run] = core_runs(store)
    assert run["status"] == "failed"
    assert "onExit failed: exited with code: 7" in run["condition"]["message"]
    printed = capfd.readouterr().out
    assert "TASK-RAN" in printed and "EXIT-RAN" in printed


def test_an_expr_job_with_list_parameters_runs(dag_tester: ah.DagTester, tmp_path: Path, capfd):
    """EXPR (lets, list parameters, path functions) through the DAG: every mapped task instance
    rebuilds the job from the run's record, list values included."""
    store = tmp_path / "store"
    result = dag_tester.run(
        "expr_sample.py",
        source=dag_source(EXPR_SAMPLE, "expr_sample", store, '{"retries": 0}'),
        run_conf={"Scene": "/projects/show/scene_010.blend", "OutputDir": "/out",
                  "Frames": [1, 2, 4], "Cameras": ["left", "right"]},
    )  # fmt: skip

    assert result.state == "success", result.states()
    printed = capfd.readouterr().out
    assert "OUT:count=3 last=4 sum=7" in printed
    assert "OUT:camera=RIGHT out=shot_right.4" in printed
    assert "OUT:doubled=[2, 4, 8]" in printed
    assert "OUT:/out/scene_010_3.exr" in printed  # the Outputs step's range 1-4
    [run] = core_runs(store)
    assert json.loads(run["parameters"]["Cameras"]) == ["left", "right"]


def test_execution_timeout_then_retry_resumes(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    store = tmp_path / "store"
    result = dag_tester.run(
        "fibonacci_timeout.py",
        source=dag_source(
            FIBONACCI,
            "fibonacci_timeout",
            store,
            '{"retries": 1, "execution_timeout": timedelta(seconds=5)}',
        ),
        run_conf={"N": 60, "StepSeconds": 0.1, "CheckpointSeconds": 1.0},
    )

    assert result.state == "success", (result.states(), result.history)
    ti = result.ti("ResumableFibonacci", 0)
    assert ti.state == "success" and ti.try_number == 2
    assert [(h.task_id, h.try_number) for h in result.history] == [("ResumableFibonacci", 1)]
    printed = capfd.readouterr().out
    assert "Final answer: Fibonacci number 60 is 1548008755920" in printed
    assert printed.count("Fibonacci number 1 is 1") == 1  # the retry did not start over
    assert "resuming from checkpoint generation" in printed
    assert "openjd_checkpoint_resume_status" in printed
    summary = state_store(result.dag.dag_id, result.run_id)[("ResumableFibonacci", 0)]
    [task] = summary["openjd_checkpoint"]["tasks"]
    assert task["label"] == "ResumableFibonacci"
    assert task["status"] == "succeeded"
    # one or more before the timeout (how many depends on the machine's load), more after
    assert task["generation"] >= 2
    assert task["resume_status"] == "RESUMED"
    assert "state" not in task


def state_store(dag_id: str, run_id: str) -> dict[tuple[str, int], dict]:
    """The task state store of a dag.test() run: (task_id, map_index) -> {key: value}."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[tuple[str, int], dict] = {}
    with create_session() as session:
        rows = session.scalars(
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == dag_id, TaskStateStoreModel.run_id == run_id
            )
        )
        for row in rows:
            out.setdefault((row.task_id, row.map_index), {})[row.key] = json.loads(row.value)
    return out


def test_redacted_values_are_masked(dag_tester: ah.DagTester, tmp_path: Path, capfd) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    secret = "hunter2-airflow-secret"
    assert secret in str(redact(f"x {secret}"))  # not masked before the run
    result = dag_tester.run(
        "secret_env.py",
        source=dag_source(HERE / "data" / "secret_env.yaml", "secret_env", tmp_path / "store"),
    )

    assert result.state == "success", result.states()
    printed = capfd.readouterr().out
    assert "TOKEN-IS ********" in printed
    assert "USED-SECRET" in printed
    assert secret not in printed
    assert secret not in str(redact(f"x {secret}"))  # Airflow's masker now hides it too
    stored = state_store("secret_env", result.run_id)
    assert stored[("UseSecret", 0)]["openjd_checkpoint"]["tasks"][0]["generation"] == 1
    assert secret not in json.dumps(list(stored.values()))


CHUNKED = ROOT / "examples" / "chunked-frames" / "chunked-frames.yaml"

GROUPED_DAG = """
from datetime import timedelta

from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r},
    dag_id="chunked_grouped",
    store={store!r},
    max_map_length=2,
    default_args={{"retries": 6, "execution_timeout": timedelta(seconds=3)}},
)
"""


def test_grouped_step_resumes_only_unfinished_tasks(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    out, store = tmp_path / "frames", tmp_path / "store"
    result = dag_tester.run(
        "chunked_grouped.py",
        source=GROUPED_DAG.format(template=str(CHUNKED), store=str(store)),
        run_conf={
            "Frames": "1-10",
            "FramesPerChunk": 1,
            # A group's five frames take 4.5 s of sleeping alone, past the 3 s timeout on any
            # machine, and one frame fits in a try with room for a slow start: each try makes
            # progress and each group times out at least once.
            "FrameSeconds": 0.9,
            "OutputDir": str(out),
        },
    )

    assert result.state == "success", (result.states(), result.history)
    labels = {t.map_index: t.rendered_map_index for t in result.tis if t.task_id == "Render"}
    assert labels == {
        0: "Render[Frame=1-5] (5 tasks)",
        1: "Render[Frame=6-10] (5 tasks)",
    }
    interrupted = [h.map_index for h in result.history if h.task_id == "Render"]
    assert sorted(set(interrupted)) == [0, 1]  # each group timed out at least once
    assert sorted(p.name for p in out.iterdir()) == [f"frame-{i:04d}.txt" for i in range(1, 11)]
    printed = capfd.readouterr().out
    runs = {f: len(re.findall(rf"CHUNK {f}-{f}\s", printed)) for f in range(1, 11)}
    assert all(n >= 1 for n in runs.values()), runs
    # Only the task running at each timeout runs again; finished ones never do.
    assert sum(runs.values()) <= 10 + len(interrupted), (runs, interrupted)
    assert "finished in an earlier try; not run again" in printed


def test_resume_param_resumes_an_earlier_run_or_refuses(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    (out / "fail-now").write_text("")
    source = dag_source(THREE_STEPS, "three_steps_resume", store, '{"retries": 0}')
    conf = {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 3}
    first = dag_tester.run("three_steps_resume.py", source=source, run_conf=conf)
    assert first.state == "failed"
    [run] = core_runs(store)
    (out / "fail-now").unlink()
    capfd.readouterr()

    refused = dag_tester.run("three_steps_resume.py", run_conf={**conf, "resume": "no-such-run"})
    assert refused.state == "failed"
    assert refused.ti("openjd_begin").state == "failed"
    assert "unknown-run" in capfd.readouterr().out

    second = dag_tester.run("three_steps_resume.py", run_conf={**conf, "resume": run["run_id"]})
    assert second.state == "success", second.states()
    printed = capfd.readouterr().out
    assert f"operator resume of run {run['run_id']}" in printed
    # Frames 1-2 and 5-6 finished in the first DAG run and were not rendered again.
    assert {p.name: p.read_text() for p in out.glob("frame-*")} == {
        f"frame-{i}": "x" for i in range(1, 7)
    }
    assert printed.count("RENDER-START") == 1  # only the failed chunk ran again
    [again] = core_runs(store)
    assert again["run_id"] == run["run_id"] and again["status"] == "succeeded"


def test_template_error_fails_the_import_with_the_core_message(
    dag_tester: ah.DagTester, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\nname: bad\n"
        "steps:\n- name: S\n  script:\n    actions:\n      onRun: {commandd: echo}\n"
    )
    path = dag_tester.write("bad_template.py", dag_source(bad, "bad_template", tmp_path))
    with pytest.raises(ah.DagImportError) as info:
        dag_tester.load(path)
    assert "steps[0].script.actions.onRun" in str(info.value)
    path.unlink()  # keep the dags folder importable for the other tests


def test_host_requirements_map_to_queue_and_pool(tmp_path: Path) -> None:
    from airflow_plugin import dag_from_template

    template = tmp_path / "hosts.yaml"
    template.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\nname: hosts\nsteps:\n"
        "- name: Gpu\n  hostRequirements:\n    attributes:\n"
        "    - {name: attr.worker.os.family, anyOf: [linux]}\n"
        "  script:\n    actions:\n      onRun: {command: 'true'}\n"
        "- name: Any\n  script:\n    actions:\n      onRun: {command: 'true'}\n"
    )
    seen = []

    def mapping(step: str, requirements: dict) -> dict:
        seen.append((step, requirements))
        return {"queue": "linux", "pool": "linux_pool"}

    dag = dag_from_template(template, dag_id="hosts", host_requirements=mapping)
    assert dag.task_dict["Gpu"].partial_kwargs["queue"] == "linux"
    assert dag.task_dict["Gpu"].partial_kwargs["pool"] == "linux_pool"
    assert dag.task_dict["Any"].partial_kwargs.get("pool") in (None, "default_pool")
    assert seen == [
        ("Gpu", {"attributes": [{"name": "attr.worker.os.family", "anyOf": ["linux"]}]})
    ]
    with pytest.raises(ValueError, match="unsupported operator arguments"):
        dag_from_template(template, dag_id="hosts2", host_requirements={"Gpu": {"image": "x"}})


MANAGED_DAG = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id={dag_id!r}, store={store!r}, files="managed", default_args={{"retries": 1}}
)
"""


def _kill_at_generation(store: Path, generation: int, killed: list[int]) -> None:
    """SIGKILL the running task's process once it has stored checkpoint ``generation`` (a
    crash: the action fails, Airflow retries the task)."""
    from core import CheckpointStore

    checkpoints = CheckpointStore(str(store))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not killed:
        for run in checkpoints.list_runs()[0]:
            for rec in checkpoints.read_tasks(run.job_key, run.run_id)[0]:
                ckpt = rec.checkpoint
                if ckpt and ckpt.generation >= generation and rec.process and rec.process.pid:
                    os.kill(rec.process.pid, signal.SIGKILL)
                    killed.append(rec.process.pid)
                    return
        time.sleep(0.05)


def test_managed_files_are_restored_into_the_retry_s_session(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    """``files="managed"``: the training example writes its model file and samples in the
    session working directory, which is deleted when the try ends. Its process is killed after
    a few checkpoints; the retry runs in a new session, where the store restored the files: it
    resumes from the restored model file and sums every sample, those of the first try
    included."""
    store = tmp_path / "store"
    epochs = 12
    killed: list[int] = []
    killer = threading.Thread(target=_kill_at_generation, args=(store, 3, killed), daemon=True)
    killer.start()
    result = dag_tester.run(
        "training_managed.py",
        source=MANAGED_DAG.format(
            template=str(TRAINING), dag_id="training_managed", store=str(store)
        ),
        run_conf={"Epochs": epochs, "EpochSeconds": 0.3},
    )
    killer.join(5)

    assert killed, "the task stored no checkpoint generation 3"
    assert result.state == "success", (result.states(), result.history)
    assert result.ti("Train", 0).try_number == 2
    printed = capfd.readouterr().out
    [(epoch, model)] = re.findall(r"resumed at epoch (\d+) from (\S+)", printed)
    assert 3 <= int(epoch) < epochs
    saved = re.findall(r'openjd_checkpoint_save: \{"file": "([^"]+)"\}', printed)
    first_session = Path(saved[0]).parent
    assert Path(model).name == "model.txt"
    assert Path(model).parent != first_session  # a new session, the files restored into it
    assert not first_session.exists()  # the first try's session is gone
    assert f"result: {sum(k * k for k in range(epochs))}" in printed
    assert list(store.glob("blobs/blake3/*/*")), "the store kept the files"
    summary = state_store(result.dag.dag_id, result.run_id)[("Train", 0)]
    [task] = summary["openjd_checkpoint"]["tasks"]
    assert task["files_mode"] == "managed" and task["resume_status"] == "RESUMED"


def test_file_settings_from_the_configuration_and_the_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[openjd_checkpoint] files`` / ``file_roots`` (here through their AIRFLOW__ variables)
    apply when the DAG gives none; an argument wins; a bad value is refused, naming where it
    came from."""
    from airflow_plugin import _config, dag_from_template

    files_var, roots_var = (
        "AIRFLOW__OPENJD_CHECKPOINT__FILES",
        "AIRFLOW__OPENJD_CHECKPOINT__FILE_ROOTS",
    )
    monkeypatch.delenv("OPENJD_CHECKPOINT_FILES", raising=False)
    monkeypatch.delenv("OPENJD_CHECKPOINT_FILE_ROOTS", raising=False)
    monkeypatch.delenv(files_var, raising=False)
    monkeypatch.delenv(roots_var, raising=False)
    assert _config.files_mode() is None and _config.file_roots() == []
    assert _config.open_store(str(tmp_path / "s")).file_flow.value == "shared"

    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv(files_var, "Managed")
    monkeypatch.setenv(roots_var, f"{a}:{b}")
    store = _config.open_store(str(tmp_path / "s"))
    assert store.file_flow.value == "managed" and store.file_roots == [str(a), str(b)]
    store = _config.open_store(str(tmp_path / "s"), "shared", [str(b)])  # arguments win
    assert store.file_flow.value == "shared" and store.file_roots == [str(b)]

    monkeypatch.setenv(files_var, "copied")
    with pytest.raises(ValueError, match=r"\[openjd_checkpoint\] files = 'copied' is not"):
        _config.files_mode()
    monkeypatch.setenv(roots_var, "relative/folder")
    with pytest.raises(ValueError, match=r"\[openjd_checkpoint\] file_roots: 'relative/folder'"):
        _config.file_roots()

    dag = dag_from_template(TRAINING, dag_id="files_args", files="managed", file_roots=str(a))
    train = dag.task_dict["Train"]
    assert train.partial_kwargs["files"] == "managed"
    assert train.partial_kwargs["file_roots"] == [str(a)]
    assert dag.task_dict["openjd_begin"].files == "managed"
    assert dag.task_dict["openjd_finish"].file_roots == [str(a)]
    with pytest.raises(ValueError, match="files='copied' is not one of shared, managed"):
        dag_from_template(TRAINING, dag_id="files_bad", files="copied")
    with pytest.raises(ValueError, match="file_roots: 'relative' is not an absolute path"):
        dag_from_template(TRAINING, dag_id="roots_bad", file_roots=["relative"])
