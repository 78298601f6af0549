"""The core suite's own assumption: under ``--dist loadgroup`` (``make test-core``) the tests of
one ``xdist_group`` run on one worker, one after the other. Modules that share a module-scoped
fixture (the conformance suite, the CLI's read commands) or a fixed folder rely on it; on
pytest 9.2 with pytest-xdist 3.8 the marks were silently ignored (pytest-dev/pytest-xdist#1386),
so pyproject.toml keeps pytest below 9.2 and this test fails if grouping breaks again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import os, time, pytest
pytestmark = [pytest.mark.xdist_group("one")]
{tests}
"""
LOOSE = """
import os, time
{tests}
"""
TEST = (
    "def test_{n}():\n    time.sleep(0.2)\n    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n"
)


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(
        GROUPED.format(tests="\n".join(TEST.format(n=n) for n in range(6)))
    )
    (tmp_path / "test_loose.py").write_text(
        LOOSE.format(tests="\n".join(TEST.format(n=n) for n in range(6)))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
         "loadgroup", "-v", "-rA", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = re.findall(
        r"\[(gw\d+)\] .*PASSED .*(test_grouped|test_loose)\.py::test_(\d)", proc.stdout
    )
    grouped = {worker for worker, module, _ in ran if module == "test_grouped"}
    assert len([r for r in ran if r[1] == "test_grouped"]) == 6, proc.stdout[-3000:]
    assert len(grouped) == 1, f"one xdist_group ran on {sorted(grouped)}:\n{proc.stdout[-3000:]}"
    assert len({worker for worker, _, _ in ran}) == 2, proc.stdout[-3000:]  # two workers were used
