"""The CLI under a closed pipe (``| head``) and a closed terminal (SIGHUP): real subprocesses,
real signals, a real store."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import EXAMPLES, ROOT, CliProcess, cli_cmd, one_step_template, run_cli

from core import CheckpointStore
from core._records import TaskStatus

# one xdist worker runs the module (--dist loadgroup): its module-scoped fixture is made once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli_pipes_signals")]


def with_closed_stdout(*args: str) -> tuple[int, str]:
    """Run the CLI with a stdout pipe whose reader has already gone (as after ``| head -1``
    read its line): every write to stdout fails with EPIPE. Returns (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            cli_cmd(*args),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        os.close(write_end)
    return proc.returncode, proc.stderr


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("pipes")
    store = tmp / "store"
    lines = "for i in range(300): print('line', i)"
    tmpl = one_step_template(tmp / "lines.yaml", "Lines", lines)
    done = run_cli("run", str(tmpl), "--store", str(store))
    assert done.returncode == 0, done.stderr
    (run,), _ = CheckpointStore(store).list_runs()
    return store, run.run_id


@pytest.mark.parametrize(
    "command",
    [
        ("runs",),
        ("checkpoints", "list"),
        ("checkpoints", "show", "{run}"),
        ("logs", "{run}"),
    ],
)
def test_reading_commands_end_quietly_on_a_closed_pipe(
    finished_run: tuple[Path, str], command: tuple[str, ...]
) -> None:
    store, run_id = finished_run
    args = [c.format(run=run_id) for c in command] + ["--store", str(store)]
    code, err = with_closed_stdout(*args)
    assert err == ""
    assert code == 141  # 128 + SIGPIPE, as a shell reports 'yes | head -1'


@pytest.mark.parametrize(
    "command", [("runs",), ("checkpoints", "show", "{run}"), ("logs", "{run}")]
)
def test_reading_commands_piped_into_head(
    finished_run: tuple[Path, str], command: tuple[str, ...]
) -> None:
    """The shell pipeline itself: one line out, nothing on stderr, a conventional status."""
    store, run_id = finished_run
    cmd = " ".join(cli_cmd(*[c.format(run=run_id) for c in command], "--store", str(store)))
    proc = subprocess.run(
        ["bash", "-c", f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.stderr == ""
    assert len(proc.stdout.splitlines()) == 1
    assert proc.returncode in (0, 141)


def test_a_store_that_is_a_file_is_reported_without_a_traceback(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    proc = run_cli("runs", "--store", str(not_a_folder / "store"))
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (2, 3), proc.stderr
    assert proc.stderr.startswith("openjd-checkpoint: ")


def test_sighup_suspends_the_run_like_sigterm(store: Path) -> None:
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    cli = CliProcess(
        "run", str(template), "-p", "N=100000", "-p", "StepSeconds=0.05",
        "-p", "CheckpointSeconds=600", "--store", str(store),
    )  # fmt: skip
    cli.wait_for("Fibonacci number 3 is", timeout=60, stream="out")
    tasks = psutil.Process(cli.proc.pid).children(recursive=True)
    assert tasks, "the task process should be running"
    cli.proc.send_signal(signal.SIGHUP)
    assert cli.wait(60) == 75, cli.stderr
    assert "SIGHUP: suspending the run" in cli.stderr
    # not "press Ctrl-C" to a process that may have no terminal
    assert "(a SIGINT (Ctrl-C), or two more signals, cancel it)" in cli.stderr
    (run,), _ = CheckpointStore(store).list_runs()
    assert run.status.value == "interrupted"
    (task,), _ = CheckpointStore(store).read_tasks(run.job_key, run.run_id)
    assert task.status == TaskStatus.INTERRUPTED
    assert task.checkpoint is not None  # periodic saves are 600 s apart: this one is SIGUSR1's
    gone, alive = psutil.wait_procs(tasks, timeout=10)
    assert not alive, alive
    # said in the words `runs` uses for it: suspended
    stop = run_cli("stop", run.run_id, "--mode", "Cancelled", "--store", str(store))
    assert stop.returncode == 4, stop.stderr
    assert f"run {run.run_id} has ended (suspended, reason Suspended)" in stop.stderr
    gc = run_cli("gc", "--retention-days", "0", "--store", str(store))
    assert f"removed run {run.run_id} (suspended, " in gc.stdout, gc.stdout + gc.stderr


def test_a_ctrl_c_after_the_run_ended_changes_nothing(tmp_path: Path) -> None:
    """The second Ctrl-C of an impatient user often lands while the CLI is exiting: the exit
    status stays the run's (75), never a death by SIGINT."""
    tmpl = one_step_template(tmp_path / "s.yaml", "Sleeper",
                             "import time; print('ready', flush=True); time.sleep(60)")  # fmt: skip
    cli = CliProcess("run", str(tmpl), "--store", str(tmp_path / "store"))
    cli.wait_for("ready", timeout=60, stream="out")
    cli.proc.send_signal(signal.SIGINT)
    cli.wait_for("  suspended: no task finished", timeout=60, stream="err")
    if cli.proc.poll() is None:
        cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75, cli.stderr
