"""The EXPR sample job (``tests/data/expr-test-job.yaml``, after the openjd-specifications
sample ``expr-test-job.yaml``: expressions in arguments, ``let`` bindings, list parameters, path
functions) checks and runs with our CLI, with the same output as the reference runtime
(``openjd run``, in ``.venv-reference`` or ``$OPENJD_REFERENCE_CLI``) when it is installed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import DATA, ROOT, cli_cmd, run_cli

pytestmark = pytest.mark.slow
SAMPLE = DATA / "expr-test-job.yaml"
PARAMS = ["-p", "Scene=/projects/show/scene_010.blend", "-p", "OutputDir=/out"]
REFERENCE = Path(
    os.environ.get("OPENJD_REFERENCE_CLI", str(ROOT / ".venv-reference" / "bin" / "openjd"))
)
EXPECTED = [
    "job=ExprTest-shot step=Render",
    "count=3 last=3 sum=6",
    "camera=LEFT out=shot_left.3",
    "stem=scene_010 suffix=.blend parent=/projects/show",
    "name=scene_010.blend joined=/projects/show/renders/shot_left.3",
    "doubled=[2, 4, 6]",
    "left",
    "right",
    "odd",
]


def out_lines(text: str) -> list[str]:
    return re.findall(r"OUT:(.*)$", text, flags=re.MULTILINE)


def ours(tmp_path: Path) -> list[str]:
    cmd = cli_cmd("run", str(SAMPLE), "--store", str(tmp_path / "store"), "--max-parallel", "1")
    done = subprocess.run(cmd + PARAMS, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return out_lines(done.stdout + done.stderr)


def test_sample_checks_and_runs(tmp_path: Path) -> None:
    check = run_cli("check", str(SAMPLE), cwd=ROOT, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = ours(tmp_path)
    assert lines[: len(EXPECTED)] == EXPECTED
    assert "camera=RIGHT out=shot_right.3" in lines
    assert len(lines) == 2 * len(EXPECTED) + 3
    assert lines[-3:] == [f"/out/scene_010_{f}.exr" for f in (1, 2, 3)]


@pytest.mark.skipif(not REFERENCE.exists(), reason=f"no reference runtime at {REFERENCE}")
def test_sample_output_matches_the_reference_runtime(tmp_path: Path) -> None:
    ref = subprocess.run(
        [str(REFERENCE), "run", str(SAMPLE), *PARAMS],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert out_lines(ref.stdout + ref.stderr) == ours(tmp_path)


def test_finally_step_let_sees_the_run_outcome(tmp_path: Path) -> None:
    template = DATA / "finally_let.yaml"
    cmd = cli_cmd("run", str(template), "--store", str(tmp_path / "store"))
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cleanup after succeeded Succeeded" in done.stdout + done.stderr
