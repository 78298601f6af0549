"""This project's own conformance data (``conformance/2023-09``: CHECKPOINT and FINALLY), run
through the CLI with ``tests/conformance_interrupt.py``: every case must pass.

The cases interrupt runs and run them again, so the folder takes a few minutes on a loaded
2-core machine (two cases at a time); the summary goes to the real stdout, as in
``test_conformance.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conformance import OURS_ROOT, PASS, CaseResult, format_case, summary_lines  # noqa: E402
from tests.conformance_interrupt import OURS_DIRS, run_ours  # noqa: E402

# one xdist worker runs the module (--dist loadgroup): its module-scoped fixture is made once
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("conformance_ours"),
    pytest.mark.timeout(1800),  # the first test's set-up runs every case
]


def _report(res: list[CaseResult]) -> None:
    out = sys.__stdout__
    if out is None:
        return
    out.write("\n\nOur conformance data (python -m tests.conformance_interrupt):\n")
    for r in res:
        if r.status != PASS:
            out.write(f"  {format_case(r)}\n")
    for line in summary_lines(res):
        out.write(f"  {line}\n")
    out.flush()


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest) -> list[CaseResult]:
    res = run_ours(OURS_DIRS, workers=2)
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            _report(res)
    else:
        _report(res)
    return res


def test_every_folder_has_cases(results: list[CaseResult]) -> None:
    for folder in OURS_DIRS:
        assert any(r.group == folder for r in results), f"no case in {OURS_ROOT / folder}"


def test_every_case_passes(results: list[CaseResult]) -> None:
    failed = [r for r in results if r.status != PASS]
    detail = "\n\n".join(
        format_case(r)
        + ("\n    | " + r.output.rstrip().replace("\n", "\n    | ") if r.output else "")
        for r in failed
    )
    assert not failed, f"{len(failed)} of {len(results)} cases did not pass:\n{detail}"
