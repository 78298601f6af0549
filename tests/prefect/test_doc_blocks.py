"""The ``docs/prefect.md`` shell blocks marked ``<!-- doc-test: run prefect -->`` run as
written (``tests/doc_blocks.py``), in this suite's environment: its Prefect server (on a free
loopback port, ``PREFECT_API_URL``), the Dask ports of the doc (8786, 8787) replaced by free
ones, a checkpoint store of their own; whatever a block starts in the background is killed
when it ends."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from doc_blocks import all_blocks  # noqa: E402
from doc_runner import free_port, run_block  # noqa: E402

pytestmark = pytest.mark.slow

BLOCKS = [b for b in all_blocks() if b.marker == "run prefect"]
CHECKS = {
    "dask_flow.py": ("host=farm-a", "host=farm-b", "Completed"),
    "fibonacci/fibonacci": ("Completed",),
}


def test_there_are_prefect_blocks_to_run() -> None:
    assert len(BLOCKS) >= 2, BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_a_prefect_block_runs_as_written(block, tmp_path: Path) -> None:
    env = dict(os.environ, OPENJD_CHECKPOINT_STORE=str(tmp_path / "store"))
    ports = {8786: free_port(), 8787: free_port()}
    done = run_block(block, venv=Path(sys.prefix), env=env, ports=ports, timeout=420)
    assert done.returncode == 0, f"{block.where} failed ({done.returncode}):\n{done.stdout[-4000:]}"
    [expected] = [want for key, want in CHECKS.items() if key in block.text]
    for text in expected:
        assert text in done.stdout, f"{block.where}: no {text!r} in:\n{done.stdout[-4000:]}"
    assert "Traceback" not in _ours(done.stdout), done.stdout[-4000:]
    assert "progress artifact of" not in done.stdout, done.stdout[-4000:]  # none lost


_SHUTDOWN = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t].*\n)*"
    r"(?:tornado\.iostream\.StreamClosedError|distributed\.comm\.core\.CommClosedError)(?:: .*)?\n"
    r"(?:[ \t]*\nThe above exception was the direct cause of the following exception:\n[ \t]*\n)?"
)


def _ours(out: str) -> str:
    """``out`` without Dask's own shutdown noise: a worker stopped by the block's last line
    while a batched send is in flight logs a ``CommClosedError`` traceback (distributed's
    ``BatchedSend``), and so may the scheduler, for its side of that connection (a
    ``StreamClosedError`` chained to a ``CommClosedError``), after the flow run has ended; any
    other traceback stays."""
    tail = out.find("Received signal SIGTERM")  # the block stops its workers
    if tail < 0:
        return out
    return out[:tail] + _SHUTDOWN.sub("", out[tail:])
