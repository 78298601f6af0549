"""The sessions samples run side by side with the reference runtime, ``openjd run`` (openjd-cli,
installed by the Makefile in ``.venv-reference``; ``$OPENJD_REFERENCE_CLI`` names another):
environments entered as often, daemons shared the same way, the same output."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import DATA, ROOT, cli_cmd
from test_sessions import _wheel, daemon_pids, wait_gone

pytestmark = pytest.mark.slow
REFERENCE = Path(
    os.environ.get("OPENJD_REFERENCE_CLI", str(ROOT / ".venv-reference" / "bin" / "openjd"))
)
if not REFERENCE.exists():
    pytest.skip(
        f"the reference runtime is not installed at {REFERENCE} ('make test' installs it)",
        allow_module_level=True,
    )


def both(template: Path, params: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Run ``template`` under ``openjd run`` and under ours (one session, as the reference
    runs one); return each one's output. ``{which}`` in a parameter value is replaced."""
    outputs: dict[str, str] = {}
    for which in ("reference", "ours"):
        values = {k: v.replace("{which}", which) for k, v in params.items()}
        flags = [f"{k}={v}" for k, v in values.items()]
        if which == "reference":
            cmd = [str(REFERENCE), "run", str(template)]
            for f in flags:
                cmd += ["-p", f]
        else:
            cmd = cli_cmd("run", str(template), "--store", str(tmp_path / "store"))
            cmd += ["--max-parallel", "1", "-q"]
            for f in flags:
                cmd += ["-p", f]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, f"{which}: {done.stdout}\n{done.stderr}"
        outputs[which] = done.stdout + done.stderr
    return outputs


def test_job_environment_entered_as_often_as_under_openjd_run(tmp_path: Path) -> None:
    both(DATA / "sessions_job_env.yaml", {"Log": str(tmp_path / "{which}.log")}, tmp_path)
    logs = {
        which: (tmp_path / f"{which}.log").read_text().splitlines()
        for which in ("reference", "ours")
    }
    for which, lines in logs.items():
        assert lines.count("enter") == 1 and lines.count("exit") == 1, (which, lines)
        assert len({line.split()[2] for line in lines if line.startswith("task")}) == 1
    assert [line.split()[:2] for line in logs["ours"]] == [
        line.split()[:2] for line in logs["reference"]
    ]


def test_a_daemon_is_shared_as_under_openjd_run(tmp_path: Path) -> None:
    for which in ("reference", "ours"):
        (tmp_path / which).mkdir()
    out = both(DATA / "sessions_daemon.yaml", {"Dir": str(tmp_path / "{which}")}, tmp_path)
    for which, text in out.items():
        served = re.findall(r"rendered (\d) by daemon (\d+) \(request (\d)\)", text)
        assert [(f, r) for f, _pid, r in served] == [(str(i), str(i)) for i in range(1, 5)]
        assert len({pid for _f, pid, _r in served}) == 1, (which, served)
        assert text.count("DAEMON-STOPPED") == 1
        assert wait_gone(daemon_pids(tmp_path / which)) == []


def test_a_package_installed_in_a_job_environment_as_under_openjd_run(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    out = both(
        DATA / "sessions_pip.yaml",
        {"Wheel": str(wheel), "Log": str(tmp_path / "{which}.log")},
        tmp_path,
    )
    for which in ("reference", "ours"):
        assert (tmp_path / f"{which}.log").read_text().splitlines() == ["install"]
        got = sorted(re.findall(r"TINYLIB processed ([\w ]+)", out[which]))
        assert got == ["init", "part 1", "part 2", "part 3"], (which, got)
