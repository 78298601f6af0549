"""The runner's per-task overhead with interruption notice sources on and off, side by side.

A step of trivial tasks (``bash -c true``) runs through ``JobRunner`` one task at a time,
with:

- no notice source (the baseline);
- ``aws,gcp,azure`` pointed at a closed port on 127.0.0.1 (a laptop with no metadata service:
  each source fails once, says so once, then backs off), and a notice file that never appears;
- the same sources pointed at a metadata server on 127.0.0.1 that announces nothing (a cloud
  machine that is not being reclaimed), at the default poll interval (5 s) and at 0.2 s.

Configurations are interleaved, ``ROUNDS`` times each, each run with a store of its own; the
median wall time per task is printed with its ratio to the baseline. The baseline runs twice:
its second row shows how far two identical runs differ on this machine (the noise). No
pass/fail: the goal (the ratios as close to 1.0 as the noise row) is printed, not asserted.
The real link-local addresses are never contacted.

Usage:
    .venv/bin/python benchmarks/interruption_notices.py [TASKS] [ROUNDS]   (default 40, 3)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _templates import trivial_template  # noqa: E402  (benchmarks/, the script's folder)
from metadata_server import MetadataServer, closed_port_url  # noqa: E402  (tests/)

from core import CheckpointStore, prepare_job  # noqa: E402
from core.cli._runner import JobRunner  # noqa: E402
from core.run import parse_notice_sources  # noqa: E402

TASKS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def run_once(template: Path, store: Path, sources: str, poll: float) -> tuple[float, int]:
    """Seconds per task of one run, and the notes the run logged about notices."""
    job = prepare_job(template, {})
    notes: list[str] = []
    runner = JobRunner(
        job,
        store=CheckpointStore(store),
        fresh=True,
        max_parallel=1,
        on_note=notes.append,
        notices=parse_notice_sources(sources, where="benchmark"),
        notice_poll_seconds=poll,
    )
    start = time.perf_counter()
    result = runner.run()
    took = time.perf_counter() - start
    assert result.exit_code == 0, result.condition
    return took / TASKS, sum("interruption notices" in n for n in notes)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="openjd-notices-bench-"))
    template = work / "bench.yaml"
    template.write_text(trivial_template(TASKS))
    server = MetadataServer()
    closed = closed_port_url()
    missing = work / "never-written"
    configs = {
        "off": ("", 5.0),
        "closed port (5 s)": (f"aws:{closed},gcp:{closed},azure:{closed},file:{missing}", 5.0),
        "live, no notice (5 s)": (f"aws:{server.url},gcp:{server.url},azure:{server.url}", 5.0),
        "live, no notice (0.2 s)": (f"aws:{server.url},gcp:{server.url},azure:{server.url}", 0.2),
        "off (again: the noise)": ("", 5.0),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    notes: dict[str, int] = {}
    try:
        for i in range(ROUNDS):
            for j, (name, (sources, poll)) in enumerate(configs.items()):
                # a store of its own: a later run in a shared store would list more runs
                per_task, logged = run_once(template, work / f"store-{i}-{j}", sources, poll)
                times[name].append(per_task)
                notes[name] = logged
    finally:
        server.close()
    base = statistics.median(times["off"])
    print(f"per-task overhead, {TASKS} trivial tasks one at a time, median of {ROUNDS} runs")
    print(f"{'sources':<26} {'ms/task':>9} {'ratio':>7} {'notes/run':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<26} {med * 1000:>9.1f} {med / base:>7.3f} {notes[name]:>10}")
    print(f"metadata server requests, all runs: {len(server.requests)}")
    print("goal: every ratio as close to 1.0 as 'off (again)' is; notes/run at most one per source")


if __name__ == "__main__":
    main()
