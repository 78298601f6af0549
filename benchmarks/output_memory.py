"""Peak memory of the runner while a task prints many malformed protocol messages.

Each case runs ``TaskExecution`` (with a checkpoint store in a temporary directory) in a child
Python process and prints that process's peak resident memory (``ru_maxrss``; the task's own
processes are not counted) for a task printing:
  - nothing;
  - LINES plain output lines;
  - LINES malformed messages (``openjd_progress: bogus N``), each one a warning.
Goal: the malformed case within 1.5x of the silent one (not asserted).

Usage:  .venv/bin/python benchmarks/output_memory.py [LINES]   (default 4,000,000)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.job import plan_tasks

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LINES = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--child" else 4_000_000

TASKS = {
    "silent": "pass\n",
    "plain": (
        "import sys\nw = sys.stdout.write\n"
        "for i in range({n}):\n    w(f'line {{i}} of plain output\\n')\n"
    ),
    "malformed": (
        "import sys\nw = sys.stdout.write\n"
        "for i in range({n}):\n    w(f'openjd_progress: bogus {{i}}\\n')\n"
    ),
}


def child(kind: str, n: int) -> None:
    from _templates import python_step_document

    from core import CheckpointStore, TaskExecution, prepare_job
    from core.job._template import parse_template

    doc = python_step_document(TASKS[kind].format(n=n))
    job = prepare_job(parse_template(doc))
    spec = plan_tasks(job, "S")[0]
    count = 0

    def on_output(_ex: TaskExecution, lines: list[str]) -> None:
        nonlocal count
        count += len(lines)

    with tempfile.TemporaryDirectory() as tmp:
        ex = TaskExecution(
            job,
            spec,
            run_id="bench",
            store=CheckpointStore(os.path.join(tmp, "s")),
            on_output=on_output,
        )
        t0 = time.perf_counter()
        result = ex.run()
        took = time.perf_counter() - t0
    assert result.outcome.value == "succeeded", result
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"{peak:.1f} {took:.2f} {count} {len(ex.warnings)}")


def measure(kind: str, n: int) -> tuple[float, float, int, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(n)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3])


def main() -> None:
    print(f"runner peak memory (ru_maxrss of the process running TaskExecution), {LINES:,} lines")
    base = None
    for kind in ("silent", "plain", "malformed"):
        peak, took, lines, warnings = measure(kind, 0 if kind == "silent" else LINES)
        base = base or peak
        print(
            f"  {kind:<10} {peak:8.1f} MiB  {peak / base:4.2f}x  ({took:6.2f} s, {lines:,} lines, "
            f"{warnings:,} warnings kept)"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
