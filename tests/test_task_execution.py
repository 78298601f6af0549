"""The thread-safe task API (``TaskExecution``) with real processes and real signals.

These are the operations the Airflow operator and the Prefect task map: run one task in a worker
thread, ask it to stop from another thread with either intent, read its outcome and events.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from core import (
    CheckpointData,
    CheckpointStore,
    StopIntent,
    TaskExecution,
    TaskOutcome,
    prepare_job,
)
from core.job import TaskSpec, plan_tasks
from core.job._template import parse_template

pytestmark = pytest.mark.slow
RUN_ID = "20260101-000000-000001"


def make_job(
    on_run: dict[str, Any], *, files: dict[str, str] | None = None, resume: dict | None = None
):
    actions: dict[str, Any] = {"onRun": on_run}
    if resume is not None:
        actions["onCheckpointResume"] = resume
    doc: dict[str, Any] = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "task api test",
        "steps": [{"name": "S", "script": {"actions": actions}}],
    }
    if files:
        doc["steps"][0]["script"]["embeddedFiles"] = [
            {"name": name, "type": "TEXT", "data": textwrap.dedent(data)}
            for name, data in files.items()
        ]
    return prepare_job(parse_template(doc))


class Runner:
    """Runs a TaskExecution on a worker thread and collects its output."""

    def __init__(self, job, store: CheckpointStore | None, resume: CheckpointData | None = None):
        spec = next(iter(plan_tasks(job, "S")))
        if resume is not None:
            spec = TaskSpec(spec.step_name, spec.task_key, spec.parameters, spec.parameters, resume)
        self.lines: list[str] = []
        self.events: list[Any] = []
        self.ex = TaskExecution(
            job,
            spec,
            run_id=RUN_ID,
            store=store,
            on_output=lambda _ex, lines: self.lines.extend(lines),
            on_event=lambda _ex, ev: self.events.append(ev),
        )
        self.result = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.ex.run()

    def wait_line(self, text: str, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines):
                return
            time.sleep(0.02)
        raise AssertionError(f"no {text!r} in {self.lines}")

    def join(self, timeout: float = 60):
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return self.result

    def pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"PID (\d+)", "\n".join(self.lines))]

    def ended_at(self) -> float:
        """When the outcome was decided (the ``ended`` event), seconds since the epoch."""
        [ended] = [ev for ev in self.events if ev.kind == "ended"]
        return ended.time


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def all_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """Wait until every process of ``pids`` is gone (or a zombie); those still alive after
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while (alive := [p for p in pids if not gone(p)]) and time.monotonic() < end:
        time.sleep(0.02)
    return alive


WORKER = """
import json, os, signal, sys, time
print(f"PID {os.getpid()}", flush=True)
def on_signal(sig, frame):
    print(f"GOT {signal.Signals(sig).name}", flush=True)
    print("openjd_checkpoint_save: " + json.dumps({"state": "worker-state"}), flush=True)
    time.sleep(0.5)  # saving takes a while; the bash leader is already gone
    sys.exit(3)
signal.signal(signal.SIGUSR2, on_signal)
print("READY", flush=True)
time.sleep(60)
"""


def test_signal_to_notify_reaches_worker_behind_bash_c(tmp_path: Path) -> None:
    job = make_job(
        {
            "command": "bash",
            "args": ["-c", "python3 {{Task.File.Worker}}; echo bash-after"],
            "checkpointCancelation": {
                "mode": "NOTIFY_THEN_TERMINATE",
                "notifyPeriodInSeconds": 20,
                "signalToNotify": "SIGUSR2",
            },
        },
        files={"Worker": WORKER},
    )
    store = CheckpointStore(tmp_path / "store")
    r = Runner(job, store)
    r.wait_line("READY")
    stopped_at = time.time()
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    assert "GOT SIGUSR2" in r.lines
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT
    assert result.record.checkpoint is not None
    assert result.record.checkpoint.state == "worker-state"
    # it did not wait out the 20 s notify period: it ended before the period did
    assert r.ended_at() < stopped_at + 20
    assert all(gone(p) for p in r.pids())


IGNORER = """
import os, signal, subprocess, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(s, signal.SIG_IGN)
print(f"PID {os.getpid()}", flush=True)
if len(sys.argv) == 1:
    # a child in the same group, and a grandchild that leaves the group with setsid
    subprocess.Popen([sys.executable, __file__, "child"])
    subprocess.Popen([sys.executable, __file__, "child", "setsid"], start_new_session=True)
time.sleep(120)
"""


def test_task_ignoring_every_signal_is_killed_with_its_tree_after_notify_period() -> None:
    job = make_job(
        {
            "command": "bash",
            "args": ["-c", "trap '' TERM INT HUP USR1; python3 {{Task.File.Ignorer}}; sleep 100"],
            "checkpointCancelation": {
                "mode": "NOTIFY_THEN_TERMINATE",
                "notifyPeriodInSeconds": 2,
                "signalToNotify": "SIGUSR1",
            },
        },
        files={"Ignorer": IGNORER},
    )
    r = Runner(job, None)
    end = time.monotonic() + 20
    while len(r.pids()) < 3 and time.monotonic() < end:
        time.sleep(0.05)
    pids = r.pids()
    assert len(pids) == 3, r.lines
    t0 = time.monotonic()
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    took = time.monotonic() - t0
    assert 1.8 <= took < 8, took
    assert result.outcome == TaskOutcome.INTERRUPTED
    assert all_gone(pids) == []


# Says which signal it got and goes on: a notify (SIGTERM) is seen, and only a kill ends it.
NOTED_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('GOT SIGTERM', flush=True))\n"
    "print('READY', flush=True)\n"
    "time.sleep(60)\n"
)


def test_cancel_uses_cancelation_and_terminate_is_immediate() -> None:
    job = make_job(
        {
            "command": "python3",
            "args": ["-c", NOTED_TERM],
            "cancelation": {"mode": "TERMINATE"},
            "checkpointCancelation": {"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 30},
        }
    )
    r = Runner(job, None)
    r.wait_line("READY")
    stopped_at = time.time()
    r.ex.stop(StopIntent.CANCEL)
    result = r.join()
    assert result.outcome == TaskOutcome.CANCELED
    # killed at once: never notified, and ended before a notify period of 30 s would have
    assert "GOT SIGTERM" not in r.lines, r.lines
    assert r.ended_at() < stopped_at + 30


def test_cancel_during_checkpoint_stop_escalates() -> None:
    job = make_job(
        {
            "command": "python3",
            "args": ["-c", NOTED_TERM],
            "cancelation": {"mode": "TERMINATE"},
            "checkpointCancelation": {"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 30},
        }
    )
    r = Runner(job, None)
    r.wait_line("READY")
    notified_at = time.time()
    r.ex.stop(StopIntent.CHECKPOINT)
    r.wait_line("GOT SIGTERM")  # the notify period runs; the task goes on
    r.ex.stop(StopIntent.CANCEL, force=True)
    result = r.join()
    assert result.outcome == TaskOutcome.CANCELED
    # the cancel ended it, not the end of the 30 s notify period it was in
    assert r.ended_at() < notified_at + 30


NOISY = r"""
import json, os, sys, time
out = sys.stdout.buffer
def w(b):
    out.write(b); out.flush()
# a valid save split over two writes is read whole
w(b'openjd_checkpoint_sa')
time.sleep(0.2)
w(b've: {"state": "good"}\n')
# stdout and stderr share one pipe, so stderr written in the middle of a save joins it: the
# joined line is refused whole (bad JSON) and its tail is plain output; no fragment is stored
w(b'openjd_checkpoint_save: {"state": "fragm')
time.sleep(0.2)
sys.stderr.write("stderr in between\n"); sys.stderr.flush()
w(b'ent"}\n')
time.sleep(0.3)
w(b'openjd_checkpoint_save: {"state": "bad-\xff\xfe"}\n')          # not UTF-8
w(b'\xff\xfe plain output that is not UTF-8\n')
w(b'openjd_checkpoint_save: {"state": ' + b'"x' * 3 + b'\n')       # bad JSON
w(b'openjd_checkpoint_save: {"state": "a\\u0000b"}\n')          # NUL in the state
w(b'openjd_checkpoint_save: {"state": "ok", "extra": 1}\n')       # unknown key
w(b'openjd_checkpoint_save: {"state": 5}\n')                      # wrong type
w(b'openjd_checkpoint_save: {"state": "' + b'y' * (128 * 1024) + b'"}\n')  # over the cap
w(b'openjd_checkpoint_save: {"state": "' + b'z' * (5 * 1024 * 1024) + b'"}\n')  # over the line cap
w(b'openjd_checkpoint_save: {"file": "/no/such/checkpoint.bin"}\n')  # missing file
w(b'openjd_task_complete: {"Frame": 3}\n')                        # no chunk parameter
w(b'openjd_checkpoint_resume_status: {"status": "RESUMED"}\n')    # not in onCheckpointResume
w(b'STILL RUNNING\n')
time.sleep(60)
"""


def test_malformed_output_warns_task_keeps_running_and_checkpoint_stays(tmp_path: Path) -> None:
    job = make_job(
        {"command": "python3", "args": ["{{Task.File.Noisy}}"]},
        files={"Noisy": NOISY},
        resume={"command": "true"},  # resumable: every warning is about an output line
    )
    store = CheckpointStore(tmp_path / "store")
    r = Runner(job, store)
    r.wait_line("STILL RUNNING", timeout=30)
    stored = store.read_tasks(job.job_key, RUN_ID)[0][0]
    assert stored.checkpoint is not None and stored.checkpoint.state == "good"
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT
    assert result.record.checkpoint.state == "good"
    assert result.record.checkpoint.generation == 1
    assert 'openjd_checkpoint_save: {"state": "fragmstderr in between' in r.lines
    assert 'ent"}' in r.lines
    assert any("plain output that is not UTF-8" in line for line in r.lines)
    warnings = "\n".join(r.ex.warnings)
    for expected in (
        "not valid UTF-8",
        "not valid JSON",
        "NUL character",
        "unknown key",
        "must be a string",
        "over the 131071-byte cap",
        "line cap",
        "does not exist",
        "no CHUNK[INT] task parameter",
        "valid only inside onCheckpointResume",
    ):
        assert expected in warnings, (expected, warnings)
    assert all("output line" in w for w in r.ex.warnings)
    # What the store holds on disk is the same good checkpoint.
    again = store.read_tasks(job.job_key, RUN_ID)[0][0]
    assert again.checkpoint.state == "good"


def test_resume_action_gets_checkpoint_values_and_unknown_status_is_recorded(
    tmp_path: Path,
) -> None:
    ck_file = tmp_path / "ck.bin"
    ck_file.write_text("data")
    job = make_job(
        {"command": "python3", "args": ["-c", "print('fresh')"]},
        resume={
            "command": "python3",
            "args": [
                "-c",
                "import sys; print('STATE=' + sys.argv[1]); print('FILE=' + sys.argv[2])",
                "{{Task.Checkpoint.State}}",
                "{{Task.Checkpoint.File}}",
            ],
        },
    )
    ck = CheckpointData(generation=4, state="s,1", file=str(ck_file), saved_at=0.0, attempt=1)
    r = Runner(job, CheckpointStore(tmp_path / "store"), resume=ck)
    result = r.join()
    assert result.outcome == TaskOutcome.SUCCEEDED
    assert "STATE=s,1" in r.lines and f"FILE={ck_file}" in r.lines
    assert result.record.resume_status == "UNKNOWN"
    assert any("recorded as UNKNOWN" in w for w in r.ex.warnings)


def test_a_checkpoint_state_with_a_nul_byte_fails_the_resume_with_where_it_is(
    tmp_path: Path,
) -> None:
    # a state edited by hand (or saved with "\u0000") can be resumed from only by a file, not
    # as an argument: the action fails naming the argument, not with Popen's ValueError
    job = make_job(
        {"command": "python3", "args": ["-c", "print('fresh')"]},
        resume={"command": "python3", "args": ["-c", "print(1)", "{{Task.Checkpoint.State}}"]},
    )
    ck = CheckpointData(generation=2, state="a\0b", file=None, saved_at=0.0, attempt=1)
    r = Runner(job, CheckpointStore(tmp_path / "store"), resume=ck)
    result = r.join()
    assert result.outcome == TaskOutcome.FAILED
    assert result.message.startswith("steps[0].script.actions.onCheckpointResume: args[2] ")
    assert "NUL byte" in result.message and "embedded null byte" not in result.message


def test_unknown_resume_status_is_reported_as_an_event_like_the_others(tmp_path: Path) -> None:
    # GIVEN a resume action that never reports openjd_checkpoint_resume_status
    job = make_job(
        {"command": "python3", "args": ["-c", "print('fresh')"]},
        resume={"command": "python3", "args": ["-c", "print('resumed')"]},
    )
    ck = CheckpointData(generation=1, state="s", file=None, saved_at=0.0, attempt=1)
    r = Runner(job, CheckpointStore(tmp_path / "store"), resume=ck)
    result = r.join()
    # THEN UNKNOWN is recorded and reported as a resume_status event, once, after the record
    assert result.record.resume_status == "UNKNOWN"
    statuses = [ev.value for ev in r.events if ev.kind == "resume_status"]
    assert statuses == ["UNKNOWN"]


def test_progress_status_fail_and_exit_code() -> None:
    job = make_job(
        {
            "command": "python3",
            "args": [
                "-c",
                "print('openjd_progress: 40'); print('openjd_status: half'); "
                "print('openjd_fail: it broke'); raise SystemExit(4)",
            ],
        }
    )
    r = Runner(job, None)
    result = r.join()
    assert result.outcome == TaskOutcome.FAILED
    assert result.exit_code == 4
    assert result.message == "it broke"
    assert r.ex.progress == 40.0 and r.ex.status_message == "half"
    kinds = [e.kind for e in r.events]
    assert "progress" in kinds and "fail" in kinds


def test_action_timeout_fails_the_task() -> None:
    job = make_job(
        {
            "command": "python3",
            "args": ["-c", "import time; time.sleep(30); print('SLEPT', flush=True)"],
            "timeout": 1,
        }
    )
    r = Runner(job, None)
    result = r.join()
    assert result.outcome == TaskOutcome.FAILED
    assert "timed out after 1 s" in result.message
    assert "SLEPT" not in r.lines  # ended by its timeout, not at its own end


def test_missing_command_fails_with_its_name() -> None:
    job = make_job({"command": "no-such-command-xyz"})
    result = Runner(job, None).join()
    assert result.outcome == TaskOutcome.FAILED
    assert "no-such-command-xyz" in result.message


def test_job_environment_variables_and_openjd_env(tmp_path: Path) -> None:
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["REDACTED_ENV_VARS"],
        "name": "envs",
        "jobEnvironments": [
            {
                "name": "E",
                "variables": {"FROM_VARS": "v1"},
                "script": {
                    "actions": {
                        "onEnter": {
                            "command": "python3",
                            "args": [
                                "-c",
                                "print('openjd_env: FROM_ENTER=v2'); "
                                "print('openjd_redacted_env: SECRET=hunter2hunter2')",
                            ],
                        },
                        "onExit": {"command": "python3", "args": ["-c", "print('EXITING')"]},
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
                                "import os; print(os.environ['FROM_VARS'], "
                                "os.environ['FROM_ENTER'], os.environ['SECRET'])",
                            ],
                        }
                    }
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    r = Runner(job, None)
    result = r.join()
    assert result.outcome == TaskOutcome.SUCCEEDED, result.message
    assert "v1 v2 ********" in r.lines
    assert "EXITING" in r.lines
    assert not any("hunter2hunter2" in line for line in r.lines)
    assert json.dumps(result.record.model_dump()).find("hunter2") < 0
