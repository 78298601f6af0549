"""Adaptive chunks in a real run (issue 7): with ``targetRuntimeSeconds`` the chunk size follows
the measured time per frame, and an interrupted run, run again, runs exactly the frames that
were not reported complete."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from conftest import DATA, ROOT, CliProcess, run_cli

from core import CheckpointStore

pytestmark = pytest.mark.slow
TEMPLATE = str(DATA / "adaptive.yaml")


def chunks(output: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"CHUNK (\d+)-(\d+)", output)]


def test_chunk_sizes_follow_the_time_per_frame(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        TEMPLATE,
        "--store",
        str(tmp_path / "s"),
        "--max-parallel",
        "1",
        "-q",
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = chunks(done.stdout)
    sizes = [b - a + 1 for a, b in got]
    assert sizes[0] == 2  # defaultTaskCount until something was measured
    assert max(sizes) >= 6, sizes  # 0.05 s a frame (plus start-up) against 5 s: chunks grow
    frames = sorted(f for a, b in got for f in range(a, b + 1))
    assert frames == list(range(1, 61))  # every frame once
    assert "next chunks of" in done.stderr


def test_an_interrupted_adaptive_step_runs_exactly_the_unreported_frames(tmp_path: Path) -> None:
    store = tmp_path / "s"
    args = ["run", TEMPLATE, "--store", str(store), "--max-parallel", "2", "-q"]
    cli = CliProcess(*args, "-p", "FrameSeconds=0.1")
    cli.wait_for("next chunks of", stream="err")
    cli.wait_for("CHUNK", stream="out")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75
    st = CheckpointStore(store)
    [run] = st.list_runs()[0]
    reported = {f for t in st.read_tasks(run.job_key, run.run_id)[0] for f in t.completed_frames}
    assert reported and len(reported) < 60
    again = run_cli(*args, "-p", "FrameSeconds=0.1", cwd=ROOT, timeout=120)
    assert again.returncode == 0, again.stderr
    second = sorted(f for a, b in chunks(again.stdout) for f in range(a, b + 1))
    assert second == sorted(set(range(1, 61)) - reported)
