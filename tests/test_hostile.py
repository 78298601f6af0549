"""Regression tests for what a hostile review found: process escapes, pid reuse, hung onExit,
a closed stdout, two fresh starts at once, saves that could never be resumed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, CliProcess, cli_cmd, one_step_template
from test_task_execution import Runner, gone, make_job

from core import CheckpointStore, StopIntent, TaskOutcome
from core._messages import MessageWarning, parse_line
from core._records import ProcessInfo
from core.job import plan_tasks
from core.process import kill_recorded_process

pytestmark = pytest.mark.slow

ESCAPER = """
import os, subprocess, sys, time
# a child that leaves the group, and a double-forked daemon
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
said, say = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(f"PID {os.getpid()}", flush=True)
        os.close(say)  # its pid is printed: the main process may end
        time.sleep(300)
    os._exit(0)
os.close(say)
os.read(said, 1)  # end of file once the daemon closed its end (and its parent is gone)
print("MAIN DONE", flush=True)
"""


def test_processes_that_left_the_group_die_with_the_task() -> None:
    job = make_job(
        {"command": "python3", "args": ["{{Task.File.Escaper}}"]}, files={"Escaper": ESCAPER}
    )
    r = Runner(job, None)
    result = r.join()
    assert result.outcome == TaskOutcome.SUCCEEDED
    marker = r.ex._actions._marker
    from core.process._process import processes_with_marker

    end = time.monotonic() + 10  # killed: gone once the kernel has taken them down
    while processes_with_marker(marker) and time.monotonic() < end:
        time.sleep(0.02)
    assert processes_with_marker(marker) == []
    assert len(r.pids()) == 1 and all(gone(p) for p in r.pids())


def test_recorded_process_with_a_reused_pid_is_not_killed() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)  # fmt: skip
    try:
        started = psutil.Process(victim.pid).create_time()
        info = ProcessInfo(
            pid=victim.pid, pgid=victim.pid, start_time=started - 5,
            host=__import__("socket").gethostname(), marker="not-this-one",
        )  # fmt: skip
        assert kill_recorded_process(info) is False
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_second_stop_abandons_a_hung_on_exit() -> None:
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "hung exit",
        "jobEnvironments": [
            {
                "name": "E",
                "script": {
                    "actions": {
                        "onExit": {
                            "command": "python3",
                            "args": [
                                "-c",
                                "import os, time; print('EXIT', os.getpid(), flush=True); "
                                "time.sleep(300)",
                            ],
                        }
                    }
                },
            }
        ],
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": [
                                "-c",
                                "import time; print('READY', flush=True); time.sleep(300)",
                            ],
                        }
                    }
                },
            }
        ],
    }
    from core import prepare_job
    from core.job._template import parse_template

    r = Runner(prepare_job(parse_template(doc)), None)
    r.wait_line("READY")
    r.ex.stop(StopIntent.CHECKPOINT)
    r.wait_line("EXIT")
    [exit_pid] = [int(line.split()[1]) for line in r.lines if line.startswith("EXIT ")]
    r.ex.stop(StopIntent.CANCEL, force=True)
    result = r.join(30)  # the onExit would sleep 300 s
    assert result.outcome == TaskOutcome.CANCELED
    assert gone(exit_pid)  # abandoned: killed, not waited for


def test_failing_output_consumer_does_not_stop_reading(tmp_path: Path) -> None:
    job = make_job(
        {
            "command": "python3",
            "args": [
                "-c",
                "import json\nfor i in range(20000):\n    print('line', i)\n"
                "print('openjd_checkpoint_save: ' + json.dumps({'state': 'last'}), flush=True)",
            ],
        }
    )
    store = CheckpointStore(tmp_path / "store")
    from core import TaskExecution

    spec = plan_tasks(job, "S")[0]

    def broken(_ex, _lines):
        raise BrokenPipeError(32, "Broken pipe")

    done: list = []
    ex = TaskExecution(job, spec, run_id="20260101-000000-000002", store=store, on_output=broken)
    t = threading.Thread(target=lambda: done.append(ex.run()))
    t.start()
    t.join(60)
    assert not t.is_alive(), "the run hung"
    assert done[0].outcome == TaskOutcome.SUCCEEDED
    assert done[0].record.checkpoint.state == "last"


def test_cli_piped_into_head_does_not_hang(tmp_path: Path) -> None:
    template = one_step_template(
        tmp_path / "chatty.yaml", "chatty", "for i in range(200000): print('line', i)"
    )
    cmd = " ".join(cli_cmd("run", str(template), "--store", str(tmp_path / "s")))
    r = subprocess.run(
        f"{cmd} | head -2", shell=True, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert r.stdout.count("\n") == 2


def test_two_fresh_starts_at_once_run_the_job_once(tmp_path: Path) -> None:
    template = one_step_template(
        tmp_path / "slow.yaml", "slow", "import time; print('STARTED', flush=True); time.sleep(3)"
    )
    store = tmp_path / "store"
    for _ in range(3):
        a = CliProcess("run", str(template), "--store", str(store), "-q")
        b = CliProcess("run", str(template), "--store", str(store), "-q")
        codes = sorted([a.wait(60), b.wait(60)])
        assert codes == [0, 4], (codes, a.stderr, b.stderr)
        assert (a.stdout + b.stdout).count("STARTED") == 1


@pytest.mark.parametrize(
    "line",
    [
        'openjd_checkpoint_save: {"state": "\\ud800"}',
        'openjd_checkpoint_save: {"file": "/tmp/\\udcff"}',
    ],
)
def test_saves_that_could_never_be_resumed_are_refused(line: str) -> None:
    result = parse_line(line)
    assert isinstance(result, MessageWarning) and "surrogate" in result.reason


def test_checkpoint_file_in_the_session_directory_is_refused(tmp_path: Path) -> None:
    job = make_job(
        {
            "command": "python3",
            "args": [
                "-c",
                "import json, os; open('ck.bin', 'w').write('x'); p = os.path.abspath('ck.bin'); "
                "print('openjd_checkpoint_save: ' + json.dumps({'file': p}))",
            ],
        }
    )
    r = Runner(job, CheckpointStore(tmp_path / "store"))
    result = r.join()
    assert result.record.checkpoint is None
    assert any("session working directory" in w for w in r.ex.warnings)


def test_ctrl_c_before_the_run_starts_is_not_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        cli_cmd("run", str(ROOT / "examples/fibonacci/fibonacci.yaml"), "--store", str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    # Once the CLI's own imports are under way (pydantic's compiled core mapped into the
    # process), its Ctrl-C handler is in place; before that the interpreter itself is starting,
    # where no Python program handles a signal. A fixed sleep sent it there on a loaded machine.
    maps = Path(f"/proc/{proc.pid}/maps")
    end = time.monotonic() + 60
    while "_pydantic_core" not in maps.read_text():
        assert proc.poll() is None and time.monotonic() < end, "the CLI never loaded pydantic"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed test leaves no run behind
            proc.kill()
            proc.communicate()
    assert "Traceback" not in err, err
    assert proc.returncode in (75, 130), (proc.returncode, err)
