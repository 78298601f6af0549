"""Output reading speed: a task printing many short lines, read three ways in the same run.

Prints the wall time and the ratio against the baseline (the same command writing to
/dev/null) for:
  - openjd-checkpoint's TaskExecution (every line decoded, checked for a message, handed on);
  - openjd-sessions 0.14's Session (the reference runner; every line becomes a log record).

Usage:  .venv/bin/python benchmarks/output_throughput.py [LINES]   (default 1,000,000)
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import TaskExecution, prepare_job  # noqa: E402
from core.job import plan_tasks
from core.job._template import parse_template  # noqa: E402

LINES = 1_000_000


def script(lines: int) -> str:
    """A Python program printing ``lines`` short lines."""
    return (
        "import sys\n"
        "w = sys.stdout.write\n"
        f"for i in range({lines}):\n"
        "    w(f'line {i} of output\\n')\n"
    )


def baseline(lines: int = LINES) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", script(lines)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def ours(lines: int = LINES) -> tuple[float, int]:
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "bench",
        "steps": [
            {
                "name": "S",
                "script": {
                    "actions": {"onRun": {"command": sys.executable, "args": ["-c", script(lines)]}}
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    count = 0

    def on_output(_ex: TaskExecution, lines: list[str]) -> None:
        nonlocal count
        count += len(lines)

    spec = plan_tasks(job, "S")[0]
    t0 = time.perf_counter()
    result = TaskExecution(job, spec, run_id="bench", on_output=on_output).run()
    took = time.perf_counter() - t0
    assert result.outcome.value == "succeeded", result
    return took, count


def sessions(lines: int = LINES) -> tuple[float, int]:
    from openjd.model import parse_model
    from openjd.model.v2023_09 import StepScript
    from openjd.sessions import LOG, ActionState, Session

    count = 0

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal count
            count += 1

    handler = Counter()
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    step_script = parse_model(
        model=StepScript,
        obj={"actions": {"onRun": {"command": sys.executable, "args": ["-c", script(lines)]}}},
    )
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        with Session(
            session_id="bench",
            job_parameter_values={},
            callback=lambda _sid, status: done.append(status),
            session_root_directory=Path(tmp),
        ) as session:
            t0 = time.perf_counter()
            session.run_task(step_script=step_script, task_parameter_values={})
            while session.action_status is None or session.action_status.state == (
                ActionState.RUNNING
            ):
                time.sleep(0.01)
            took = time.perf_counter() - t0
    LOG.removeHandler(handler)
    return took, count


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else LINES
    base = baseline(lines)
    print(f"lines: {lines:,}")
    print(f"baseline (to /dev/null):      {base:7.2f} s   1.0x")
    t, n = ours(lines)
    print(f"openjd-checkpoint TaskExecution: {t:7.2f} s  {t / base:5.1f}x  ({n:,} lines read)")
    t, n = sessions(lines)
    print(f"openjd-sessions 0.14 Session:    {t:7.2f} s  {t / base:5.1f}x  ({n:,} log records)")


if __name__ == "__main__":
    main()
