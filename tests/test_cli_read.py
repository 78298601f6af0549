"""The reading commands (``runs``, ``checkpoints list``, ``checkpoints show``, ``logs``) on a store
holding finished, suspended, failed and refused runs: tables for a person, ``--json`` with the
fields the README documents. Real subprocesses, real signals, a real store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, CliProcess, one_step_template, run_cli

# one xdist worker runs the module (--dist loadgroup): its module-scoped fixture is made once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli_read")]

RUN_FIELDS = {
    "run_id", "job", "parameters", "status", "stored_status", "reason", "message", "attempts",
    "started_at", "started_time", "updated_at", "duration_seconds", "tasks",
    "tasks_with_checkpoints", "tasks_resumable", "template", "metrics",
}  # fmt: skip
CHECKPOINT_FIELDS = {
    "run_id", "job", "step", "task", "task_status", "generation", "saved_at", "saved_time",
    "state_bytes", "files", "files_mode", "file_bytes", "frames_done",
}  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def as_json(*args: str) -> Any:
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store with a finished, a failed and a suspended run, and a refused resume."""
    tmp = tmp_path_factory.mktemp("read")
    store = str(tmp / "store")
    ok = one_step_template(tmp / "ok.yaml", "Finishes", "print('all good')")
    bad = one_step_template(tmp / "bad.yaml", "Fails", "import sys; print('oops'); sys.exit(3)")
    assert cli("run", str(ok), "--store", store).returncode == 0
    assert cli("run", str(bad), "--store", store).returncode == 1
    fib = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    sus = CliProcess("run", str(fib), "-p", "N=400", "--store", store)
    sus.wait_for("checkpoint generation 1 stored", timeout=60, stream="err")
    sus.proc.send_signal(signal.SIGTERM)
    assert sus.wait(60) == 75, sus.stderr
    ids = {r["job"]: r["run_id"] for r in as_json("runs", "--store", store)["runs"]}
    refused = cli("resume", ids["Finishes"], "--store", store)
    assert refused.returncode == 4, refused.stderr
    return {"store": store, "ids": ids, "refused": refused}


def test_runs_json_has_the_documented_fields_and_plain_statuses(store: dict[str, Any]) -> None:
    doc = as_json("runs", "--store", store["store"])
    assert doc["schema"] == 1 and doc["warnings"] == []
    by_job = {r["job"]: r for r in doc["runs"]}
    assert set(by_job) == {"Finishes", "Fails", "Fibonacci checkpointing job (fast)"}
    for row in doc["runs"]:
        assert set(row) == RUN_FIELDS
    assert by_job["Finishes"]["status"] == "finished"
    assert by_job["Fails"]["status"] == "failed"
    fib = by_job["Fibonacci checkpointing job (fast)"]
    assert fib["status"] == "suspended" and fib["parameters"]["N"] == "400"
    assert fib["tasks_with_checkpoints"] == fib["tasks_resumable"] == 1
    assert by_job["Finishes"]["attempts"] == 1  # the refused resume did not count as one


def test_runs_and_checkpoints_list_differ(store: dict[str, Any]) -> None:
    runs = cli("runs", "--store", store["store"]).stdout
    assert all(run_id in runs for run_id in store["ids"].values())
    assert "suspended" in runs and "finished" in runs and "failed" in runs
    doc = as_json("checkpoints", "list", "--store", store["store"])
    (row,) = doc["checkpoints"]
    assert set(row) == CHECKPOINT_FIELDS
    assert row["run_id"] == store["ids"]["Fibonacci checkpointing job (fast)"]
    assert row["step"] == row["task"] == "ResumableFibonacci"
    assert row["generation"] >= 1 and row["state_bytes"] > 0
    listing = cli("checkpoints", "list", "--store", store["store"]).stdout
    assert row["run_id"] in listing and store["ids"]["Finishes"] not in listing


def test_checkpoints_show_is_a_table_and_json_the_raw_records(store: dict[str, Any]) -> None:
    for job, run_id in store["ids"].items():
        doc = as_json("checkpoints", "show", run_id, "--store", store["store"])
        assert doc["run_id"] == run_id and doc["job_name"] == job
        assert {"status", "status_words", "tasks", "outputs", "warnings", "attempt"} <= set(doc)
    fib = store["ids"]["Fibonacci checkpointing job (fast)"]
    doc = as_json("checkpoints", "show", fib, "--store", store["store"])
    (task,) = doc["tasks"]
    assert task["label"] == "ResumableFibonacci" and task["generations"]
    assert doc["job_status"] is None  # suspended: no Job.Status until the run ends
    table = cli("checkpoints", "show", fib, "--store", store["store"])
    assert table.returncode == 0
    assert f"run {fib}: suspended" in table.stdout
    assert "ResumableFibonacci" in table.stdout and "gen " in table.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(table.stdout)


def test_a_refused_resume_prints_nothing_that_looks_like_a_start(store: dict[str, Any]) -> None:
    refused = store["refused"]
    assert "Running job" not in refused.stderr
    assert "not-failed" in refused.stderr or "refused" in refused.stderr


def test_unknown_run_exits_2_with_json_too(store: dict[str, Any]) -> None:
    proc = cli("checkpoints", "show", "nope", "--json", "--store", store["store"])
    assert proc.returncode == 2 and "no run 'nope'" in proc.stderr and proc.stdout == ""


def test_empty_store_json(tmp_path: Path) -> None:
    assert as_json("runs", "--store", str(tmp_path / "none"))["runs"] == []
    assert as_json("checkpoints", "list", "--store", str(tmp_path / "none"))["checkpoints"] == []


def test_damaged_times_in_records_show_as_unknown(store: dict[str, Any], tmp_path: Path) -> None:
    """A run record whose times are no time (1e300, NaN) and a checkpoint saved at 1e300: every
    reading command still answers (the time unknown), none ends in a traceback (exit 70)."""
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store["store"], copy)
    fib = store["ids"]["Fibonacci checkpointing job (fast)"]
    (run_file,) = copy.glob(f"jobs/*/runs/{fib}/run.json")
    doc = json.loads(run_file.read_text())
    doc["created_at"], doc["updated_at"] = 1e300, float("nan")
    run_file.write_text(json.dumps(doc))
    for task_file in run_file.parent.glob("tasks/*.json"):
        rec = json.loads(task_file.read_text())
        if rec.get("checkpoint"):
            rec["checkpoint"]["saved_at"] = 1e300
            task_file.write_text(json.dumps(rec))
    for args in (["runs"], ["checkpoints", "list"], ["checkpoints", "show", fib]):
        table = cli(*args, "--store", str(copy))
        assert table.returncode == 0, (args, table.stderr)
        assert "Traceback" not in table.stderr
        json.loads(cli(*args, "--json", "--store", str(copy)).stdout)  # valid JSON: no NaN


def test_runs_counts_as_resumable_what_checkpoints_list_lists(tmp_path: Path) -> None:
    """A chunk suspended with finished frames and no checkpoint: ``runs --json`` counts it in
    ``tasks_resumable`` (not in ``tasks_with_checkpoints``), and ``checkpoints list`` lists it."""
    store = str(tmp_path / "store")
    sus = CliProcess(
        "run", str(EXAMPLES / "chunked-frames" / "chunked-frames.yaml"), "--store", store,
        "-p", "Frames=1-8", "-p", "FramesPerChunk=8", "-p", "FrameSeconds=0.3",
        "-p", f"OutputDir={tmp_path / 'out'}",
    )  # fmt: skip
    sus.wait_for('openjd_task_complete: {"Frame": 2}')
    sus.proc.send_signal(signal.SIGINT)
    assert sus.wait(60) == 75, sus.stderr
    (run,) = as_json("runs", "--store", store)["runs"]
    (row,) = as_json("checkpoints", "list", "--store", store)["checkpoints"]
    assert row["generation"] is None and row["frames_done"]
    assert (run["tasks_with_checkpoints"], run["tasks_resumable"]) == (0, 1)


def test_reading_commands_change_nothing_in_a_damaged_store(
    store: dict[str, Any], tmp_path: Path
) -> None:
    """An unreadable task record and run record: ``runs``, ``checkpoints list|show`` and
    ``logs`` report them and leave every file as it was (no setting aside, no rebuilding);
    the next ``resume`` is what sets them aside and rebuilds the task's record."""
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store["store"], copy)
    fib = store["ids"]["Fibonacci checkpointing job (fast)"]
    (run_file,) = copy.glob(f"jobs/*/runs/{fib}/run.json")
    (task_file,) = [p for p in run_file.parent.glob("tasks/*.json") if ".gen-" not in p.name]
    task_file.write_text("{ torn")
    finished = store["ids"]["Finishes"]
    (other_run,) = copy.glob(f"jobs/*/runs/{finished}/run.json")
    other_run.write_text("[]")

    def snapshot() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in copy.rglob("*") if p.is_file()}

    before = snapshot()
    for args in (["runs"], ["checkpoints", "list"], ["checkpoints", "show", fib], ["logs", fib]):
        proc = cli(*args, "--store", str(copy))
        assert proc.returncode == 0, (args, proc.stderr)
        if args[0] != "logs":
            assert "unreadable" in proc.stderr and "left as it is" in proc.stderr, (args, proc)
        assert snapshot() == before, args


def test_a_link_in_one_run_s_folder_hides_no_other_run(
    store: dict[str, Any], tmp_path: Path
) -> None:
    """One run's ``tasks`` folder replaced by a symbolic link (the store follows none): ``runs``
    and ``checkpoints list`` still list every run, with a warning naming the link; ``gc``
    removes the other runs it may, keeps that one and every checkpoint file (the run's
    records, unread, may name them), says why, and exits 3. Nothing outside the store is
    touched."""
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store["store"], copy)
    fib = store["ids"]["Fibonacci checkpointing job (fast)"]
    (run_dir,) = copy.glob(f"jobs/*/runs/{fib}")
    elsewhere = tmp_path / "elsewhere"
    (run_dir / "tasks").rename(elsewhere)
    (run_dir / "tasks").symlink_to(elsewhere)
    outside = sorted(p.name for p in elsewhere.iterdir())
    listed = as_json("runs", "--store", str(copy))
    assert fib in {r["run_id"] for r in listed["runs"]}
    assert len(listed["runs"]) == len(store["ids"]), listed
    assert any("symbolic link" in w and fib in w for w in listed["warnings"]), listed
    plain = cli("checkpoints", "list", "--store", str(copy))
    assert plain.returncode == 0 and "symbolic link" in plain.stderr, plain.stderr
    swept = cli("gc", "--retention-days", "0", "--grace-seconds", "0", "--store", str(copy))
    assert swept.returncode == 3, swept
    assert f"run {fib} kept" in swept.stderr and "none removed" in swept.stderr, swept.stderr
    assert "run(s) removed; kept 1" in swept.stdout, swept.stdout
    assert [p.name for p in copy.glob("jobs/*/runs/*")] == [fib]
    assert sorted(p.name for p in elsewhere.iterdir()) == outside


def test_a_run_a_scheduler_drives_is_running_not_interrupted(tmp_path: Path) -> None:
    """A run begun by a scheduler (Airflow's ``openjd_begin``, Prefect's flow: an external key,
    no driving process, no run lease; its tasks run in the scheduler's workers) is ``running``
    in ``runs`` and ``checkpoints show`` until it ends, as on the plugin's page, not
    ``interrupted`` (which is for a CLI run whose process died)."""
    from core import CheckpointStore, begin_attempt, prepare_job

    store = tmp_path / "store"
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "Scheduled", "print(1)"), {})
    run_id = begin_attempt(CheckpointStore(store), job, external_key="dag/run-1").run_id
    (row,) = as_json("runs", "--store", str(store))["runs"]
    assert (row["run_id"], row["stored_status"], row["status"]) == (run_id, "running", "running")
    shown = as_json("checkpoints", "show", run_id, "--store", str(store))
    assert (shown["external_key"], shown["status_words"]) == ("dag/run-1", "running")
    assert "running" in cli("runs", "--store", str(store)).stdout.splitlines()[1].split()


MODES_JOB = """\
specificationVersion: jobtemplate-2023-09
extensions: [TASK_CHUNKING, CHECKPOINT]
name: Modes
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - name: Frame
      type: CHUNK[INT]
      range: "1-6"
      chunks: {defaultTaskCount: 2, rangeConstraint: CONTIGUOUS}
  script:
    actions:
      onRun:
        command: python3
        args: [-c, %s, "{{Task.Param.Frame}}"]
"""
# Frames 1-2 save a checkpoint; 3-4 save nothing and succeed; 5-6 finish frame 5 and fail
MODES_CODE = """
import json, sys
first = int(sys.argv[1].split("-")[0])
if first == 1:
    print("openjd_checkpoint_save: " + json.dumps({"state": "one"}), flush=True)
if first == 5:
    print("openjd_task_complete: " + json.dumps({"Frame": 5}), flush=True)
    sys.exit(1)
"""


def test_every_task_of_a_managed_run_says_managed_saved_or_not(tmp_path: Path) -> None:
    """A run with ``--files managed`` keeps its checkpoint files managed for all of its tasks:
    ``checkpoints show --json`` says ``files_mode: managed`` for each task record, those that
    saved no checkpoint too (it said ``shared``), and ``checkpoints list --json`` for the chunk
    that kept only finished frames too (it said null)."""
    store = str(tmp_path / "store")
    template = tmp_path / "modes.yaml"
    template.write_text(MODES_JOB % json.dumps(MODES_CODE))
    done = cli("run", str(template), "--store", store, "--files", "managed")
    assert done.returncode == 1, done.stderr  # frames 5-6 failed
    (run,) = as_json("runs", "--store", store)["runs"]
    shown = as_json("checkpoints", "show", run["run_id"], "--store", store)
    assert shown["file_data_flow"] == "managed"
    tasks = {t["label"]: t for t in shown["tasks"]}
    assert set(tasks) == {"Render[Frame=1-2]", "Render[Frame=3-4]", "Render[Frame=5-6]"}
    assert tasks["Render[Frame=1-2]"]["checkpoint"] is not None
    assert tasks["Render[Frame=3-4]"]["checkpoint"] is None  # saved nothing
    assert tasks["Render[Frame=5-6]"]["completed_frames"] == [5]
    assert {label: t["files_mode"] for label, t in tasks.items()} == dict.fromkeys(tasks, "managed")
    rows = {r["task"]: r for r in as_json("checkpoints", "list", "--store", store)["checkpoints"]}
    assert set(rows) == {"Render[Frame=1-2]", "Render[Frame=5-6]"}
    assert rows["Render[Frame=5-6]"]["generation"] is None  # only the finished frame kept
    assert rows["Render[Frame=5-6]"]["frames_done"] == 1  # a count; show lists them
    assert {r["files_mode"] for r in rows.values()} == {"managed"}


def test_a_killed_runs_duration_reaches_its_last_task_change(tmp_path: Path) -> None:
    """A CLI run killed midway wrote its run record last when it started: its duration in
    ``runs`` is up to its tasks' last change, not 0 s."""
    template = tmp_path / "two.yaml"
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "name: Killed\n"
        "steps:\n"
        "- name: S\n"
        "  parameterSpace:\n"
        "    taskParameterDefinitions:\n"
        "    - {name: F, type: INT, range: '1-2'}\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, 'import time; time.sleep(1.5)']}\n"
    )
    store = str(tmp_path / "store")
    run = CliProcess("run", str(template), "--store", store, "--max-parallel", "1")
    # "S[F=1] succeeded", not "S[F=2] started": the second task starts while the first one's
    # end is being stored, and is reported only once stored (a kill right after the start
    # found neither task's record changed: CI saw 0.02 s)
    run.wait_for("S[F=1] succeeded", timeout=60, stream="err")
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.wait(30)
    [row] = as_json("runs", "--store", store)["runs"]
    assert row["status"] == "interrupted"
    assert row["duration_seconds"] >= 1.4, row  # task 1 ran 1.5 s before task 2 started
