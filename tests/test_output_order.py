"""A task's log reads in the order the task wrote it (stderr shares stdout's pipe, as in
openjd-sessions), and a message line written in one write is still parsed whatever the other
stream does at the same time. Each task runs through the real ``TaskExecution``."""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pytest

from core import TaskEvent, TaskExecution, TaskOutcome, TaskResult, prepare_job
from core.job import plan_tasks
from core.job._template import parse_template

pytestmark = pytest.mark.slow
RUN_ID = "20260101-000000-000007"


def run_task(
    on_run: dict[str, Any],
    *,
    files: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[TaskResult, list[str], list[TaskEvent]]:
    """Run a one-task job whose onRun is ``on_run``; return its result, output lines, events."""
    script: dict[str, Any] = {"actions": {"onRun": on_run}}
    if files:
        script["embeddedFiles"] = [
            {"name": name, "type": "TEXT", "data": textwrap.dedent(data)}
            for name, data in files.items()
        ]
    job = prepare_job(
        parse_template(
            {
                "specificationVersion": "jobtemplate-2023-09",
                "name": "output order test",
                "steps": [{"name": "S", "script": script}],
            }
        )
    )
    lines: list[str] = []
    events: list[TaskEvent] = []
    execution = TaskExecution(
        job,
        plan_tasks(job, "S")[0],
        run_id=RUN_ID,
        on_output=lambda _ex, batch: lines.extend(batch),
        on_event=lambda _ex, event: events.append(event),
        os_env=env,
    )
    return execution.run(), lines, events


def test_bash_trace_comes_before_the_output_it_belongs_to() -> None:
    result, lines, _ = run_task({"command": "bash", "args": ["-c", "set -x; echo a; echo b"]})
    assert result.outcome is TaskOutcome.SUCCEEDED, result.message
    assert lines == ["+ echo a", "a", "+ echo b", "b"]


def test_a_long_bash_trace_interleaves_line_by_line() -> None:
    # 300 alternations: with one pipe per stream the reader would see each pipe's backlog as a
    # block, so a run this long would not keep the alternation by chance.
    result, lines, _ = run_task(
        {"command": "bash", "args": ["-c", "set -x; for i in $(seq 300); do echo line-$i; done"]}
    )
    assert result.outcome is TaskOutcome.SUCCEEDED, result.message
    echoes = [line for line in lines if "echo line-" in line or line.startswith("line-")]
    expected: list[str] = []
    for i in range(1, 301):
        expected += [f"+ echo line-{i}", f"line-{i}"]
    assert echoes == expected


PRINT_THEN_RAISE = """
print("computing the answer")
print("still computing")
raise RuntimeError("no answer")
"""


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered-stdout", "PYTHONUNBUFFERED"])
def test_python_prints_come_before_its_traceback(unbuffered: bool) -> None:
    # Python flushes stdout before it writes the traceback, so even a block-buffered stdout (the
    # default on a pipe) reads in order once both share the pipe.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    result, lines, _ = run_task(
        {"command": "python3", "args": ["{{Task.File.Main}}"]},
        files={"Main": PRINT_THEN_RAISE},
        env=env,
    )
    assert result.outcome is TaskOutcome.FAILED
    assert lines[:3] == [
        "computing the answer",
        "still computing",
        "Traceback (most recent call last):",
    ]
    assert lines[-1] == "RuntimeError: no answer"


def test_python_writes_to_both_streams_read_in_the_order_written() -> None:
    code = (
        "import sys\n"
        "for i in range(200):\n"
        "    stream = sys.stderr if i % 3 == 0 else sys.stdout\n"
        "    print(f'write {i}', file=stream, flush=True)\n"
    )
    result, lines, _ = run_task({"command": "python3", "args": ["-c", code]})
    assert result.outcome is TaskOutcome.SUCCEEDED, result.message
    assert lines == [f"write {i}" for i in range(200)]


FLOOD = """
import os, signal, sys, time
MESSAGES = int(sys.argv[1])
NOISE = b"noise on stderr " + b"x" * 48 + b"\\n"

# A second process floods stderr, so the two streams really write at the same time (a thread
# could be held off by the GIL on a quiet machine). Whole lines, one write each: what Python's
# line-buffered stderr, bash's set -x trace or a logging handler do.
child = os.fork()
if child == 0:
    while True:
        os.write(2, NOISE)
time.sleep(0.05)
for i in range(MESSAGES):
    os.write(1, f"openjd_status: message {i}\\n".encode())
    if i % 50 == 0:
        time.sleep(0.002)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
"""


def test_a_message_written_in_one_write_is_parsed_while_the_other_stream_floods() -> None:
    messages = 500
    raced = 0
    for _ in range(4):
        result, lines, events = run_task(
            {"command": "python3", "args": ["{{Task.File.Flood}}", str(messages)]},
            files={"Flood": FLOOD},
        )
        assert result.outcome is TaskOutcome.SUCCEEDED, result.message
        statuses = [e.value for e in events if e.kind == "status"]
        assert statuses == [f"message {i}" for i in range(messages)]
        # Every line is whole: a message or a noise line, never a mix of the two.
        noise = "noise on stderr " + "x" * 48
        assert {line for line in lines if not line.startswith("openjd_status: ")} == {noise}
        # And the two streams did race: noise lines landed between the messages.
        first = lines.index("openjd_status: message 0")
        last = lines.index(f"openjd_status: message {messages - 1}")
        raced += sum(1 for line in lines[first:last] if line == noise)
    assert raced > 0


def test_a_partial_line_on_one_stream_joins_a_message_written_on_the_other() -> None:
    # The trade-off of one pipe (docs/decisions.md): a line left unfinished on stderr takes the
    # next write on stdout as its continuation. The joined line does not start with the message,
    # so it is output, not a message; the next message line is parsed again.
    code = (
        "import sys\n"
        "sys.stderr.write('progress 50%'); sys.stderr.flush()\n"
        "print('openjd_status: joined', flush=True)\n"
        "print('openjd_status: parsed', flush=True)\n"
    )
    result, lines, events = run_task({"command": "python3", "args": ["-c", code]})
    assert result.outcome is TaskOutcome.SUCCEEDED, result.message
    assert lines == ["progress 50%openjd_status: joined", "openjd_status: parsed"]
    assert [e.value for e in events if e.kind == "status"] == ["parsed"]


def test_the_lines_before_a_message_are_shown_before_what_the_message_does() -> None:
    # One write: the reader takes the three lines as one batch. What the status message does
    # (its event) comes after the line printed before it, and before the line after it.
    job_lines: list[tuple[str, str]] = []
    on_run = {
        "command": "python3",
        "args": [
            "-c",
            "import sys; sys.stdout.write('before\\nopenjd_status: middle\\nafter\\n')",
        ],
    }
    script: dict[str, Any] = {"actions": {"onRun": on_run}}
    job = prepare_job(
        parse_template(
            {
                "specificationVersion": "jobtemplate-2023-09",
                "name": "output order test",
                "steps": [{"name": "S", "script": script}],
            }
        )
    )
    execution = TaskExecution(
        job,
        plan_tasks(job, "S")[0],
        run_id=RUN_ID,
        on_output=lambda _ex, batch: job_lines.extend(("line", text) for text in batch),
        on_event=lambda _ex, event: (
            job_lines.append(("event", str(event.value))) if event.kind == "status" else None
        ),
    )
    assert execution.run().outcome is TaskOutcome.SUCCEEDED
    assert job_lines == [
        ("line", "before"),
        ("event", "middle"),
        ("line", "openjd_status: middle"),
        ("line", "after"),
    ]
