"""Where a task's time goes in the CLI's runner, phase by phase (``_phases``): the profile
``python -m benchmarks`` prints when the 1,000-task goal against ``openjd run`` is missed.

Runs TASKS trivial tasks (``true``, one step, ``--max-parallel 1``) through ``core.cli.main``
in this process with each phase's function wrapped with a timer, and prints the thread time
per task of each phase, largest first, beside the run's wall time per task. Two threads do a
task's work: the runner's (``TaskExecutor.run``: it claims the next task and hands it over)
and a task's (``TaskExecution.run``: the action, the records); once a task succeeded, the next
one starts while its end is stored (``core.run._in_flight``), so their times overlap and add up
to more than the wall time. What the runner's thread spends waiting for a task's outcome is
shown as such (idle, not work).

Usage (in the core virtualenv): ``.venv/bin/python benchmarks/cli_phases.py [TASKS]`` (300).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phases import PhaseTimes  # noqa: E402  (benchmarks/, the script's folder)
from _templates import TRIVIAL  # noqa: E402


def phases() -> tuple[list[tuple[str, object, str]], list[tuple[str, object, str]]]:
    """(roots, phases): the functions timed, each as (label, owner, attribute)."""
    import core.process._process as process
    import core.run._executor as executor
    import core.run._in_flight as in_flight
    import core.task._session as session
    import core.task._task as task_module
    from core.store import CheckpointStore, _lease
    from core.task._recorder import ActionProcessNames

    roots = [
        ("the rest of the runner's loop (TaskExecutor.run)", executor.TaskExecutor, "run"),
        ("the rest of the task's run (symbols, events, outcome)", task_module.TaskExecution,
         "run"),
    ]  # fmt: skip
    timed = [
        ("runner: waiting for a task's outcome (idle)", in_flight, "_take_events"),
        ("runner: claim the task (its lease, its record)", executor, "claim_task"),
        ("runner: hand the task to its thread", in_flight.InFlight, "start"),
        ("runner: make the next task's lease file ahead", CheckpointStore, "prepare_task_lease"),
        ("runner: the task's end counted, its lease let go", executor.TaskExecutor, "_ended"),
        ("release a lease", _lease.Lease, "release"),
        ("make the task's execution (TaskExecution)", task_module.TaskExecution, "__init__"),
        ("enter the session (once)", session.Session, "prepare"),
        ("record: the action's process named (not durable)", ActionProcessNames, "starting"),
        ("record: the task's end (durable)", task_module.TaskExecution, "_finish"),
        ("fsync (of record writes)", os, "fsync"),
        ("make the action's cgroup (no spare ready)", process, "action_cgroup"),
        ("remove the action's cgroup (handed to a thread)", process, "release_cgroup_later"),
        ("draw a marker (reserve the spare)", process, "reserve_spare"),
        ("hand the action to the spare", process, "take_spare"),
        ("start the action (fork, exec; no spare ready)", subprocess.Popen, "_execute_child"),
        ("start a thread", threading.Thread, "start"),
        ("hand a helper to a reused thread (output reader)", process, "start_daemon"),
        ("action running (true; waited for)", task_module, "supervise"),
        ("collect the action (kill what is left)", process.ActionProcess, "finish"),
    ]
    return roots, timed


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    from core.cli import main as cli

    roots, timed = phases()
    timer = PhaseTimes(roots[0], timed, more_roots=roots[1:])
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "trivial.yaml"
        template.write_text(TRIVIAL)
        base = ["run", str(template), "--max-parallel", "1", "-q"]
        code = cli([*base, "-p", "Frames=20", "--store", str(Path(tmp) / "warm")])  # imports
        if code:
            raise SystemExit(f"cli_phases: the warm-up run exited {code}")
        gc.freeze()  # as the command does (core.cli.main with no arguments given)
        with timer.installed():
            started = time.perf_counter()
            code = cli([*base, "-p", f"Frames={tasks}", "--store", str(Path(tmp) / "store")])
            wall = time.perf_counter() - started
        if code:
            raise SystemExit(f"cli_phases: the run exited {code}")
    busy = sum(timer.seconds.values()) / tasks
    print(f"{tasks} trivial tasks through core.cli.main, each phase timed: wall "
          f"{wall / tasks * 1000:.2f} ms per task; thread time {busy * 1000:.2f} ms per task "
          "(two threads, overlapping)")  # fmt: skip
    for line in timer.lines(tasks):
        print("   " + line)


if __name__ == "__main__":
    main()
