"""What ``openjd-checkpoint run`` shows while it runs: plain lines when stderr is not a terminal,
a live display (read back from a real terminal, tmux's) when it is, ``-q`` and ``-v``."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, CliProcess, cli_cmd, run_cli

pytestmark = pytest.mark.slow

RENDER = (
    "import sys, time\n"
    "first, _, last = sys.argv[1].partition('-')\n"
    "for f in range(int(first), int(last or first) + 1):\n"
    "    print('openjd_status: frame', f, flush=True)\n"
    "    time.sleep(float(sys.argv[2]))\n"
    "    print('openjd_task_complete: {\"Frame\": %d}' % f, flush=True)\n"
    '    print(\'openjd_checkpoint_save: {"state": "%d"}\' % f, flush=True)\n'
)
TWO_STEPS = {
    "specificationVersion": "jobtemplate-2023-09",
    "extensions": ["TASK_CHUNKING", "CHECKPOINT"],
    "name": "Two steps",
    "parameterDefinitions": [{"name": "FrameSeconds", "type": "FLOAT", "default": 0.01}],
    "steps": [
        {"name": "Prepare", "script": {"actions": {"onRun": {
            "command": "python3", "args": ["-c", "print('prepared')"]}}}},
        {
            "name": "Render",
            "dependencies": [{"dependsOn": "Prepare"}],
            "parameterSpace": {"taskParameterDefinitions": [{
                "name": "Frame", "type": "CHUNK[INT]", "range": "1-6",
                "chunks": {"defaultTaskCount": 3, "rangeConstraint": "CONTIGUOUS"}}]},
            "script": {"actions": {
                "onRun": {"command": "python3",
                          "args": ["-c", RENDER, "{{Task.Param.Frame}}", "{{Param.FrameSeconds}}"],
                          "checkpointCancelation": {"mode": "NOTIFY_THEN_TERMINATE",
                                                    "notifyPeriodInSeconds": 5}},
                "onCheckpointResume": {"command": "python3",
                                       "args": ["-c", RENDER, "{{Task.Param.Frame}}",
                                                "{{Param.FrameSeconds}}"]}}},
        },
    ],
}  # fmt: skip


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "two.json"
    path.write_text(json.dumps(TWO_STEPS))
    return path


def progress_lines(stderr: str) -> list[str]:
    return [ln.removeprefix("openjd-checkpoint: ") for ln in stderr.splitlines()]


def test_plain_lines_when_not_a_terminal(template: Path, tmp_path: Path) -> None:
    proc = run_cli("run", str(template), "--store", str(tmp_path / "store"), cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = progress_lines(proc.stderr)
    assert "\x1b[" not in proc.stderr  # no terminal control codes in a log file
    order = [
        "step Prepare started", "Prepare started", "Prepare succeeded",
        "step Prepare ended: 1 succeeded", "step Render started",
    ]  # fmt: skip
    assert [ln for ln in lines if ln in order] == order
    for chunk in ("Render[Frame=1-3]", "Render[Frame=4-6]"):
        assert f"{chunk} started" in lines and f"{chunk} succeeded" in lines
        gens = [ln for ln in lines if ln.startswith(f"{chunk}: checkpoint generation")]
        # Three saves; saves read in one batch of lines commit once (the latest wins), so one
        # to three generations, numbered from 1.
        assert 1 <= len(gens) <= 3, lines
        assert gens == [
            f"{chunk}: checkpoint generation {g} stored" for g in range(1, len(gens) + 1)
        ]
    assert lines.index("step Render ended: 2 succeeded") > max(
        i for i, ln in enumerate(lines) if ln.startswith("Render[")
    )
    assert "[Prepare] prepared" in proc.stdout  # task output stays on stdout


def test_plain_lines_name_an_interrupted_chunk_and_what_it_kept(
    template: Path, tmp_path: Path
) -> None:
    cli = CliProcess(
        "run", str(template), "-p", "FrameSeconds=0.5", "--store", str(tmp_path / "store"),
        "--max-parallel", "1",
    )  # fmt: skip
    cli.wait_for("Render[Frame=1-3]: checkpoint generation 1 stored", stream="err", timeout=60)
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75, cli.stderr
    lines = progress_lines(cli.stderr)
    assert any(ln.startswith("Render[Frame=1-3] suspended with a checkpoint") for ln in lines)
    (ended,) = [ln for ln in lines if ln.startswith("step Render ended:")]
    assert "1 suspended with a checkpoint" in ended
    assert "  suspended: 1 task done, 1 task checkpointed; run again to continue" in cli.stderr


def test_a_chunk_that_kept_only_finished_frames_is_not_said_to_have_a_checkpoint(
    tmp_path: Path,
) -> None:
    from conftest import EXAMPLES

    cli = CliProcess(
        "run", str(EXAMPLES / "chunked-frames" / "chunked-frames.yaml"), "-p", "Frames=1-10",
        "-p", "FrameSeconds=0.4", "-p", f"OutputDir={tmp_path / 'out'}",
        "--store", str(tmp_path / "store"), "--max-parallel", "1",
    )  # fmt: skip
    cli.wait_for("openjd_task_complete", stream="out", timeout=60)
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75, cli.stderr
    lines = progress_lines(cli.stderr)
    (ended,) = [ln for ln in lines if ln.startswith("step Render ended:")]
    assert "1 suspended with finished frames kept" in ended, ended
    assert "checkpoint" not in ended, ended


def test_quiet_and_verbose(template: Path, tmp_path: Path) -> None:
    def run(flag: str, store: str) -> subprocess.CompletedProcess[str]:
        return run_cli(
            "run", str(template), flag, "--store", str(tmp_path / store), cwd=ROOT, timeout=120
        )

    quiet = run("-q", "q")
    assert quiet.returncode == 0
    assert "started" not in quiet.stderr and "checkpoint generation" not in quiet.stderr
    assert "step Prepare started" not in quiet.stderr  # -q: no progress lines
    assert "condition" not in quiet.stderr and "reason=" not in quiet.stderr  # plain words
    assert "[Prepare] prepared" in quiet.stdout
    verbose = run("-v", "v")
    assert "Render[Frame=1-3]: frame 2 finished" in verbose.stderr
    assert "Render[Frame=1-3]: frame 3" in verbose.stderr  # openjd_status, each one


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal")
def test_live_display_final_screen_on_a_terminal(template: Path, tmp_path: Path) -> None:
    sock = f"openjd-test-{os.getpid()}"
    cmd = shlex.join(cli_cmd("run", str(template), "-p", "FrameSeconds=0.2", "--store",
                             str(tmp_path / "store")))  # fmt: skip
    script = tmp_path / "go.sh"
    script.write_text(f"cd {shlex.quote(str(ROOT))}\n{cmd} > {tmp_path / 'out.txt'}\n"
                      "echo EXIT=$?\nsleep 600\n")  # fmt: skip
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    env = dict(os.environ, TERM="xterm-256color")
    subprocess.run([*tmux, "new-session", "-d", "-x", "110", "-y", "30", "bash", str(script)],
                   check=True, env=env)  # fmt: skip
    try:
        screen = ""
        for _ in range(600):
            screen = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True,
                                    text=True, check=True).stdout  # fmt: skip
            if "EXIT=" in screen:
                break
            time.sleep(0.2)
        assert "EXIT=0" in screen, screen
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    rows = {m.group(1): line for line in screen.splitlines()
            if (m := re.search(r"\b(Prepare|Render)\b", line))}  # fmt: skip
    # six saves, two chunks: saves read in one batch commit once (the latest wins)
    assert "Two steps" in screen and re.search(r"checkpoints stored: [2-6]\b", screen), screen
    assert re.search(r"Prepare\W+1\W+0\W+0\b", rows["Prepare"]), screen
    assert re.search(r"Render\W+2\W+0\W+0\W+6/6", rows["Render"]), screen
    assert "2 succeeded" in rows["Render"], screen
    assert "step Render started" not in screen  # the live display, not plain lines
    assert "[Prepare] prepared" in (tmp_path / "out.txt").read_text()
