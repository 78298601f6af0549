"""The Prefect integration's costs, each printed beside a baseline measured in the same run
(no pass/fail: goals are printed, not asserted).

1. Building the flow of a 10,000-task template (``flow_from_template``) and planning its
   tasks into task runs (what a flow run does before it submits anything), against
   openjd-model alone doing the least it can (decode the template, create the job, iterate
   the step's parameter space).
2. A trivial task (``bash -c true``) through the integration against a plain Prefect task
   running the same command in a subprocess, both in flows of TASKS task runs on Prefect's
   ephemeral server: the median task run time (Prefect's ``total_run_time``, seconds) and the
   whole flow run. Goal: at most 1.5x. Beside them, the floor: the plain task with what a
   task run of ours cannot do without (its result persisted under a cache key, as
   ``run_group``'s; one durable write, as a task's end record is stored). When the goal is
   missed, one more flow run of ours, timed phase by phase (``_phases``), says where a task
   run's time goes; and, where actions run in cgroups, what moving a process into one costs
   (back to back, and spaced as task runs are; an action becomes a spare already moved in,
   ``core.process._spares``, when one is ready).

Usage (in the Prefect virtualenv):
    .venv-prefect/bin/python benchmarks/prefect_integration_costs.py [TASKS]   (default 30)
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
HOME = Path(tempfile.mkdtemp(prefix="openjd-prefect-bench-"))
os.environ["PREFECT_HOME"] = str(HOME / "prefect")
os.environ.pop("PREFECT_API_URL", None)  # Prefect's ephemeral server
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # migrations
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from _phases import PhaseTimes  # noqa: E402  (benchmarks/, the script's folder)
from _templates import trivial_template  # noqa: E402
from _writes import durable_write  # noqa: E402
from prefect import flow, get_client, task  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from core.job import plan_tasks  # noqa: E402


def model_floor(path: Path) -> float:
    """openjd-model alone: decode, create the job, walk the parameter space."""
    import yaml
    from openjd.model import (
        StepParameterSpaceIterator,
        create_job,
        decode_job_template,
        preprocess_job_parameters,
    )

    started = time.perf_counter()
    template = decode_job_template(template=yaml.safe_load(path.read_text()))
    params = preprocess_job_parameters(
        job_template=template,
        job_parameter_values={},
        environment_templates=[],
        job_template_dir=path.parent,
        current_working_dir=path.parent,
    )
    job = create_job(job_template=template, job_parameter_values=params)
    count = sum(1 for _ in StepParameterSpaceIterator(space=job.steps[0].parameterSpace))
    assert count == 10_000
    return time.perf_counter() - started


def ours_build_and_plan(path: Path) -> float:
    import core
    from prefect_integration import flow_from_template

    started = time.perf_counter()
    flow_from_template(path, store=str(HOME / "store"))
    job = core.prepare_job(path, {})
    groups = core.group_tasks(plan_tasks(job, "Render"), 100)
    [core.group_label(g) for g in groups]
    assert sum(len(g) for g in groups) == 10_000
    return time.perf_counter() - started


@task
def plain_task(command: str) -> int:
    return subprocess.run(["bash", "-c", command], check=True).returncode


@flow(task_runner=ThreadPoolTaskRunner(max_workers=1))
def plain_flow(tasks: int) -> None:
    futures = [plain_task.submit("true") for _ in range(tasks)]
    for f in futures:
        f.result()


FLOOR_RECORD = b'{"status": "succeeded"' + b" " * 1000 + b"}\n"
"""About the size of a task's end record (bytes)."""


def _floor_key(_context: object, parameters: dict) -> str:
    return f"floor-{parameters['i']}-{time.time_ns()}"  # never a hit: every run runs


@task(cache_key_fn=_floor_key, persist_result=True, task_run_name="floor-{i}")
def floor_task(i: int) -> int:
    """The least a task run can do and keep what ours keeps: the plain task's command, its
    result persisted under a cache key (as ``run_group``'s), and one durable write (a task's
    end record)."""
    code = subprocess.run(["bash", "-c", "true"], check=True).returncode
    folder = HOME / "floor"
    folder.mkdir(exist_ok=True)
    durable_write(folder / f"{i}.json", FLOOR_RECORD)
    return code


@flow(task_runner=ThreadPoolTaskRunner(max_workers=1))
def floor_flow(tasks: int) -> None:
    futures = [floor_task.submit(i) for i in range(tasks)]
    for f in futures:
        f.result()


async def run_times(flow_run_id) -> list[float]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    wanted = [r for r in runs if r.name.startswith(("Render", "plain", "floor")) and r.end_time]
    return [r.total_run_time.total_seconds() for r in wanted]


def timed(fn, **params) -> tuple[list[float], float]:
    started = time.perf_counter()
    state = fn(return_state=True, **params)
    seconds = time.perf_counter() - started
    assert state.is_completed(), state
    deadline = time.monotonic() + 120  # the server records task runs from events, in batches
    while len(times := asyncio.run(run_times(state.state_details.flow_run_id))) < TASKS:
        assert time.monotonic() < deadline, f"{len(times)} of {TASKS} task runs recorded"
        time.sleep(0.5)
    return times, seconds


def task_run_phases(ours_flow) -> tuple[PhaseTimes, list[float]]:
    """One more flow run of ours, its task runs timed phase by phase (exclusive times)."""
    import core
    import core.process._process as process
    import core.run._executor as executor
    import core.task._session as session
    import core.task._task as task_module
    from core.store import _lease
    from core.task._recorder import ActionProcessNames
    from prefect_integration import _artifacts, _tasks

    phases = [
        ("open the store (unless the flow's is reused)", core.CheckpointStore, "__init__"),
        ("read the run record", core.CheckpointStore, "read_run"),
        ("plan the group (read its task records)", core, "plan_group"),
        ("start the progress artifact (no thread)", _artifacts.GroupProgress, "start"),
        ("end the progress artifact (a thread if it sends)", _artifacts.GroupProgress, "close"),
        ("watch termination requests and notices (start)", executor.TaskExecutor, "start"),
        ("watch ... (stop), end the session", executor.TaskExecutor, "close"),
        ("claim the task: its lease, its record", executor, "claim_task"),
        ("release the lease", _lease.Lease, "release"),
        ("make the session folder", session.Session, "open"),
        ("remove the session folder", session, "remove_tree"),
        ("record: the action's process named (not durable)", ActionProcessNames, "starting"),
        ("record: ... named once started, if not a spare", ActionProcessNames, "started"),
        ("record: the task's end (durable)", task_module.TaskExecution, "_finish"),
        ("fsync (of record writes)", os, "fsync"),
        ("make the action's cgroup", process, "action_cgroup"),
        ("remove the action's cgroup (handed to a thread)", process, "release_cgroup_later"),
        ("draw a marker (reserve the spare)", process, "reserve_spare"),
        ("hand the action to the spare", process, "take_spare"),
        ("start the action (fork, exec; no spare ready)", subprocess.Popen, "_execute_child"),
        ("start a thread (adapter's watchers)", threading.Thread, "start"),
        ("hand a helper to a reused thread (output reader)", process, "start_daemon"),
        ("action running (its cgroup move, bash -c true)", task_module, "supervise"),
        ("collect the action (kill what is left)", process.ActionProcess, "finish"),
        ("the rest of the task's run (symbols, events)", task_module.TaskExecution, "run"),
        ("the rest of run_tasks (executor)", core, "run_tasks"),
    ]
    timer = PhaseTimes(("the rest of run_group (adapter)", _tasks.run_group, "fn"), phases)
    with timer.installed():
        times, _ = timed(ours_flow)
    return timer, times


def cgroup_moves() -> list[str]:
    """What moving a process into a fresh cgroup costs here, against the same start without
    one: back to back, and 20 ms apart (as task runs come). Empty without cgroups."""
    from core.process._cgroups import containment

    found = containment()
    if not found.cgroups or found.folder is None:
        return []

    def start(move: bool) -> float:
        path = os.path.join(found.folder, f"bench-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(path)
        try:
            started = time.perf_counter()
            script = 'echo 0 > "$1/cgroup.procs"; exec true' if move else "exec true"
            subprocess.run(["/bin/sh", "-c", script, "sh", path], check=True)
            return time.perf_counter() - started
        finally:
            os.rmdir(path)

    lines = []
    for gap in (0.0, 0.02):
        row = {}
        for move in (False, True):
            took = []
            for _ in range(15):
                time.sleep(gap)
                took.append(start(move))
            row[move] = statistics.median(took) * 1000
        lines.append(
            f"{'back to back' if not gap else f'{gap * 1000:.0f} ms apart':>12s}: sh started "
            f"into a cgroup {row[True]:6.2f} ms, without {row[False]:6.2f} ms"
        )
    return lines


def main() -> None:
    big = HOME / "big.yaml"
    big.write_text(trivial_template(10_000))
    small = HOME / "small.yaml"
    small.write_text(trivial_template(TASKS))

    model_floor(big)  # imports
    ours_build_and_plan(big)
    floor = statistics.median(model_floor(big) for _ in range(3))
    ours = statistics.median(ours_build_and_plan(big) for _ in range(3))
    print("\n1. a 10,000-task template: build the flow and plan its tasks (median of 3)")
    print(f"   openjd-model alone (decode, create, iterate)  {floor * 1000:8.1f} ms")
    print(f"   flow_from_template + plan + group (ours)      {ours * 1000:8.1f} ms"
          f"   ratio {ours / floor:.2f}")  # fmt: skip

    from prefect_integration import flow_from_template

    ours_flow = flow_from_template(
        small, store=str(HOME / "store"), max_task_runs_per_step=TASKS, max_workers=1
    )
    print(f"\nstarting Prefect's ephemeral server and running {TASKS}-task flows...", flush=True)
    results: dict[str, list[tuple[list[float], float]]] = {"plain": [], "ours": [], "floor": []}
    timed(plain_flow, tasks=TASKS)  # warm-up (the server starts), not counted
    timed(ours_flow)
    timed(floor_flow, tasks=TASKS)
    for name in ("plain", "ours", "floor", "plain", "ours", "floor"):  # interleaved
        if name == "plain":
            results[name].append(timed(plain_flow, tasks=TASKS))
        elif name == "floor":
            results[name].append(timed(floor_flow, tasks=TASKS))
        else:
            results[name].append(timed(ours_flow))
    print(f"\n2. a trivial task (bash -c true), {TASKS} task runs per flow run, x2")
    per = {}
    for name, label in (("plain", "plain Prefect task"), ("ours", "prefect_integration")):
        per[name] = statistics.median(t for times, _ in results[name] for t in times)
        whole = statistics.median(s for _, s in results[name])
        print(f"   {label:20s} per task run {per[name] * 1000:7.1f} ms   "
              f"whole flow run {whole:6.2f} s")  # fmt: skip
    ratio = per["ours"] / per["plain"]
    print(f"   ratio per task run {ratio:.2f}   goal <= 1.5: "
          f"{'met' if ratio <= 1.5 else 'NOT met'}")  # fmt: skip
    floor = statistics.median(t for times, _ in results["floor"] for t in times)
    print(f"   the floor: the plain task with its result persisted under a cache key and one\n"
          f"   durable write (a task's end record)   per task run {floor * 1000:7.1f} ms   "
          f"ratio {floor / per['plain']:.2f} (of the 1.5 the goal allows)")  # fmt: skip
    print(f"   load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if ratio <= 1.5:
        return
    timer, times = task_run_phases(ours_flow)
    mean = statistics.mean(times)
    print(f"\n   goal missed: where a task run of ours goes (one more flow run, each phase timed;"
          f"\n   mean task run {mean * 1000:.1f} ms, median {statistics.median(times) * 1000:.1f}"
          f" ms; a plain task run {per['plain'] * 1000:.1f} ms), per task run:")  # fmt: skip
    for line in timer.lines(len(times), total=mean, outside="Prefect's task engine"):
        print("   " + line)
    moves = cgroup_moves()
    if moves:
        print("\n   moving a process into its cgroup (each action's is, before it runs):")
        for line in moves:
            print("   " + line)


if __name__ == "__main__":
    main()
