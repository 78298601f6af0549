"""``openjd-checkpoint logs``: task output kept with the run (compressed, capped), shown in the
order written, filtered by step, task and attempt, followed while the run goes on, removed with
the run. Real subprocesses, real signals, a real store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, CliProcess, run_cli

from core import CheckpointStore

# one xdist worker runs the module (--dist loadgroup): its module-scoped fixture is made once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli_logs")]

TWO_STEPS = {
    "specificationVersion": "jobtemplate-2023-09",
    "name": "Two steps",
    "steps": [
        {
            "name": "First",
            "parameterSpace": {"taskParameterDefinitions": [
                {"name": "N", "type": "INT", "range": "1-2"}]},
            "script": {"actions": {"onRun": {"command": "python3", "args": ["-c",
                "import sys\n"
                "for i in range(5):\n"
                "    print('first', sys.argv[1], 'line', i, flush=True)\n"
                "    print('first', sys.argv[1], 'err', i, file=sys.stderr, flush=True)\n",
                "{{Task.Param.N}}"]}}},
        },
        {
            "name": "Second",
            "dependencies": [{"dependsOn": "First"}],
            "script": {"actions": {"onRun": {"command": "python3", "args": ["-c",
                "print('second line 0'); print('x' * 3000); print('after the cap')"]}}},
        },
    ],
}  # fmt: skip


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=dict(os.environ, **(env or {})))


def only_run_id(store: str) -> str:
    (run,), _ = CheckpointStore(store).list_runs()
    return run.run_id


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("logs")
    tmpl = tmp / "two.json"
    tmpl.write_text(json.dumps(TWO_STEPS))
    store = str(tmp / "store")
    # A cap of 2,000 bytes per task attempt: the Second step's 3,000-byte line is cut.
    done = cli("run", str(tmpl), "--store", store, env={"OPENJD_CHECKPOINT_MAX_LOG_BYTES": "2000"})
    assert done.returncode == 0, done.stderr
    return store, only_run_id(store)


def texts(out: str) -> list[str]:
    """The text of each printed log line (after ``HH:MM:SS.mmm [task] #attempt``)."""
    return [ln.split(" ", 3)[3] for ln in out.splitlines() if not ln.startswith("openjd-")]


def test_logs_show_both_streams_of_every_task_in_the_order_written(
    finished: tuple[str, str],
) -> None:
    store, run_id = finished
    proc = cli("logs", run_id, "--store", store)
    assert proc.returncode == 0, proc.stderr
    lines = texts(proc.stdout)
    for n in ("1", "2"):
        mine = [t for t in lines if t.startswith(f"first {n} ")]
        expected = [f"first {n} {kind} {i}" for i in range(5) for kind in ("line", "err")]
        assert mine == expected
    # Every line of the First step was written before the Second step started.
    last_first = max(i for i, t in enumerate(lines) if t.startswith("first"))
    assert lines.index("second line 0") > last_first
    assert "[Second] #1 second line 0" in proc.stdout


def test_logs_cut_at_the_cap_with_a_note(finished: tuple[str, str]) -> None:
    store, run_id = finished
    proc = cli("logs", run_id, "--step", "Second", "--store", store)
    assert texts(proc.stdout) == ["second line 0"]
    assert "output cut: 2 more line(s), 3,015 bytes" in proc.stdout
    doc = json.loads(cli("logs", run_id, "--step", "Second", "--json", "--store", store).stdout)
    (log,) = doc["logs"]
    assert log["cut_lines"] == 2 and log["cut_bytes"] == 3015


def test_logs_filter_by_step_and_task(finished: tuple[str, str]) -> None:
    store, run_id = finished
    first = texts(cli("logs", run_id, "--step", "First", "--store", store).stdout)
    assert len(first) == 20 and all(t.startswith("first") for t in first)
    one = texts(cli("logs", run_id, "--task", "First[N=2]", "--store", store).stdout)
    assert one == [f"first 2 {k} {i}" for i in range(5) for k in ("line", "err")]
    none = cli("logs", run_id, "--attempt", "2", "--store", store)
    assert none.returncode == 0 and none.stdout == ""
    assert "has output, but none matches --attempt 2" in none.stderr  # the filter, not the run
    doc = json.loads(cli("logs", run_id, "--json", "--store", store).stdout)
    assert {"schema", "run_id", "logs", "lines"} <= set(doc)
    assert {"at", "time", "step", "task", "attempt", "text"} == set(doc["lines"][0])
    assert sorted(lg["task"] for lg in doc["logs"]) == ["First[N=1]", "First[N=2]", "Second"]


def test_logs_of_two_attempts_and_follow_while_running(store: Path) -> None:
    fib = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    args = ("run", str(fib), "-p", "N=150", "-p", "StepSeconds=0.05", "--store", str(store))
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 1 stored", timeout=60, stream="err")
    run_id = only_run_id(str(store))
    follow = CliProcess("logs", run_id, "--follow", "--store", str(store))
    follow.wait_for("Fibonacci number", timeout=60, stream="out")  # read while it runs
    assert follow.proc.poll() is None
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 75
    assert follow.wait(60) == 0  # ends on its own once the run has ended
    followed = texts(follow.stdout)
    second = cli(*args)
    assert second.returncode == 0, second.stderr
    one = texts(cli("logs", run_id, "--attempt", "1", "--store", str(store)).stdout)
    two = texts(cli("logs", run_id, "--attempt", "2", "--store", str(store)).stdout)
    assert one and two
    assert followed == one  # --follow printed all of attempt 1, in order, nothing twice
    assert any("RESUMED" in t for t in two) and not any("RESUMED" in t for t in one)
    assert any("Final answer" in t for t in two)


def test_a_damaged_log_is_left_out_with_a_warning_naming_it(
    finished: tuple[str, str], tmp_path: Path
) -> None:
    import shutil

    src, run_id = finished
    store = tmp_path / "store"
    shutil.copytree(src, store)
    logs = sorted(store.rglob("*.log.gz"))
    assert len(logs) == 3, logs  # First (two tasks) and Second
    logs[0].write_bytes(b"not gzip at all")
    fifo_name = logs[1].name
    logs[1].unlink()
    os.mkfifo(logs[1])
    proc = cli("logs", run_id, "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert f"log {logs[0].name} of run {run_id} is damaged: not a gzip stream" in proc.stderr
    assert f"log {fifo_name} of run {run_id} is not a regular file" in proc.stderr
    assert len(texts(proc.stdout)) >= 1  # the good log is still shown
    doc = json.loads(cli("logs", run_id, "--json", "--store", str(store)).stdout)
    assert len(doc["warnings"]) == 2 and len(doc["logs"]) == 1


def test_gc_removes_the_logs_with_the_run(finished: tuple[str, str], tmp_path: Path) -> None:
    store, run_id = finished
    (run,), _ = CheckpointStore(store).list_runs()
    assert CheckpointStore(store).logs.list_logs(run.job_key, run_id)
    gone = cli("gc", "--retention-days", "0", "--store", store)
    assert gone.returncode == 0, gone.stderr
    assert not list(Path(store).rglob("*.log.gz"))
    assert cli("logs", run_id, "--store", store).returncode == 2


def test_logs_on_an_s3_store(s3_store: str, tmp_path: Path) -> None:
    tmpl = tmp_path / "two.json"
    tmpl.write_text(json.dumps(TWO_STEPS))
    done = cli("run", str(tmpl), "--store", s3_store)
    assert done.returncode == 0, done.stderr
    run_id = only_run_id(s3_store)
    lines = texts(cli("logs", run_id, "--task", "First[N=1]", "--store", s3_store).stdout)
    assert lines == [f"first 1 {k} {i}" for i in range(5) for k in ("line", "err")]


def test_logs_of_a_chunk_include_the_rest_of_it_run_on_a_resume(
    store: Path, tmp_path: Path
) -> None:
    """The rest of an interrupted chunk runs on the resume under a label of its own
    (``Render[Frame=4-10]``); ``--task`` with the chunk's label shows both attempts."""
    chunked = EXAMPLES / "chunked-frames" / "chunked-frames.yaml"
    args = ("run", str(chunked), "-p", "Frames=1-10", "-p", "FramesPerChunk=10",
            "-p", "FrameSeconds=0.4", "-p", f"OutputDir={tmp_path / 'out'}",
            "--store", str(store))  # fmt: skip
    first = CliProcess(*args)
    first.wait_for("openjd_task_complete", timeout=60, stream="out")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 75, first.stderr
    second = cli(*args)
    assert second.returncode == 0, second.stderr
    run_id = only_run_id(str(store))
    shown = cli("logs", run_id, "--task", "Render[Frame=1-10]", "--json", "--store", str(store))
    assert shown.returncode == 0, shown.stderr
    logs = json.loads(shown.stdout)["logs"]
    assert sorted(log["attempt"] for log in logs) == [1, 2], logs
    rest = next(log for log in logs if log["attempt"] == 2)
    assert rest["task"] != "Render[Frame=1-10]" and rest["task"].startswith("Render[Frame="), rest
