"""Cost of ``openjd_checkpoint_files``: a task declaring N files, one message each, then saving.

Prints the wall time of the task (with a checkpoint store in a temporary directory) for 10,000
and 100,000 messages, their ratio (linear is about 10x), and the size of the task record and of
the committed generation. A second pair of runs sends a save after every 1,000 files.

Usage:  .venv/bin/python benchmarks/checkpoint_files_scaling.py [SMALL LARGE]
        (default 10000 100000)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _templates import python_step_document  # noqa: E402  (benchmarks/, the script's folder)

from core import CheckpointStore, TaskExecution, prepare_job  # noqa: E402
from core.job import plan_tasks
from core.job._template import parse_template  # noqa: E402

SMALL, LARGE = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (10_000, 100_000)


def script(n: int, save_every: int) -> str:
    return (
        "import json, sys\n"
        "w = sys.stdout.write\n"
        f"for i in range({n}):\n"
        "    w('openjd_checkpoint_files: ' + json.dumps({'files': [f'/data/out/part-{i:07d}.bin']})"
        " + '\\n')\n"
        f"    if {save_every} and (i + 1) % {save_every} == 0:\n"
        "        w('openjd_checkpoint_save: ' + json.dumps({'state': str(i)}) + '\\n')\n"
        "w('openjd_checkpoint_save: ' + json.dumps({'state': 'done'}) + '\\n')\n"
    )


def run(n: int, save_every: int = 0) -> tuple[float, int, int, int]:
    doc = python_step_document(script(n, save_every))
    job = prepare_job(parse_template(doc))
    spec = plan_tasks(job, "S")[0]
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(os.path.join(tmp, "store"))
        t0 = time.perf_counter()
        result = TaskExecution(job, spec, run_id="bench", store=store).run()
        took = time.perf_counter() - t0
        assert result.outcome.value == "succeeded", result
        ck = result.record.checkpoint
        assert ck is not None and len(ck.files) == n, (ck and len(ck.files), n)
        sizes = {p.name: p.stat().st_size for p in Path(tmp).rglob("*.json")}
        record = max((s for name, s in sizes.items() if ".gen-" not in name), default=0)
        gen = max((s for name, s in sizes.items() if ".gen-" in name), default=0)
    return took, len(ck.files), record, gen


def main() -> None:
    for save_every in (0, 1000):
        label = "one save at the end" if not save_every else f"a save every {save_every:,} files"
        print(f"openjd_checkpoint_files, one file per message, {label}:")
        times = []
        for n in (SMALL, LARGE):
            took, files, record, gen = run(n, save_every)
            times.append(took)
            print(
                f"  {n:>9,} messages: {took:7.2f} s  ({files:,} files committed; task record "
                f"{record / 1e6:.2f} MB, generation {gen / 1e6:.2f} MB)"
            )
        ratio = times[1] / times[0]
        print(f"  ratio {LARGE:,}/{SMALL:,}: {ratio:.1f}x (linear: {LARGE / SMALL:.0f}x)")


if __name__ == "__main__":
    main()
