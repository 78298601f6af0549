"""Shell completion: the bash script from ``completion bash``, run by a real bash against the
real CLI, completes commands, options, choices, run ids and step names."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cli_cmd, one_step_template

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """An ``openjd-checkpoint`` on PATH that runs this source tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "openjd-checkpoint"
    exe.write_text(f"#!/bin/sh\ncd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} "
                   '-m core.cli "$@"\n')  # fmt: skip
    exe.chmod(0o755)
    return bin_dir


def completions(program: Path, line: str) -> list[str]:
    """What bash completes for ``line`` (the cursor at its end)."""
    script = subprocess.run(cli_cmd("completion", "bash"), capture_output=True, text=True,
                            cwd=ROOT, check=True).stdout  # fmt: skip
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    bash = (
        f"{script}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n_openjd_checkpoint\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    env = dict(os.environ, PATH=f"{program}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", "-c", bash], capture_output=True, text=True, env=env,
                         timeout=60).stdout  # fmt: skip
    return [w for w in out.splitlines() if w]


def test_commands_options_and_choices(program: Path) -> None:
    assert completions(program, "openjd-checkpoint ch") == ["check", "checkpoints"]
    assert completions(program, "openjd-checkpoint checkpoints ") == ["delete", "list", "show"]
    assert "--max-parallel" in completions(program, "openjd-checkpoint run x.yaml --max")
    assert completions(program, "openjd-checkpoint stop R --mode Canc") == [
        "Cancelled", "CancelledRunFinally",
    ]  # fmt: skip
    assert completions(program, "openjd-checkpoint stop R --mode Cancelled --f") == ["--force"]


def test_run_ids_and_step_names(program: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    tmpl = one_step_template(tmp_path / "t.yaml", "T", "print('hi')")
    assert subprocess.run(cli_cmd("run", str(tmpl), "--store", str(store)), cwd=ROOT,
                          capture_output=True, timeout=120).returncode == 0  # fmt: skip
    (run_id,) = completions(program, f"openjd-checkpoint --store {store} logs ")
    assert completions(program, f"openjd-checkpoint --store {store} resume {run_id} --from ") == [
        "S"
    ]
    assert completions(program, f"openjd-checkpoint --store {store} logs {run_id} --step ") == ["S"]
