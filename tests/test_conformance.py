"""The OpenJD conformance test data, run through the CLI: a pass-rate floor against regressions.

Runs ``tests/conformance.py`` once over every folder of the data, ``proposed/`` ones included
(482 cases, each a CLI subprocess, two at a time: job tests with ``run``, template fixtures with
``check``) and writes its summary to the real stdout, so the rate shows in CI output without
``-s``.
Skipped when the conformance data is absent (see ``tests/conformance.py`` for where it is read).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conformance import (  # noqa: E402
    ALL_DIRS,
    DEFAULT_ROOT,
    FAIL,
    PASS,
    SKIP,
    CaseResult,
    fixture_dirs,
    format_case,
    run_suite,
    summary_lines,
    tally,
)

# Pass rate over every folder outside proposed/ (base, TASK_CHUNKING and the extensions' job
# tests, job templates and environment templates): every POSIX case passes, so any regression
# fails. proposed/ cases must each pass or be skipped with a reason (test_proposed_cases).
MIN_MAIN_PASS_RATE = 1.0

pytestmark = [
    pytest.mark.slow,
    # one worker runs the module, so the suite runs once (pytest-xdist, --dist loadgroup)
    pytest.mark.xdist_group("conformance"),
    pytest.mark.timeout(1800),  # the first test's set-up runs every case
    pytest.mark.skipif(not DEFAULT_ROOT.is_dir(), reason=f"no conformance data at {DEFAULT_ROOT}"),
]


def _report(res: list[CaseResult]) -> None:
    out = sys.__stdout__
    if out is None:
        return
    out.write("\n\nOpenJD conformance (python -m tests.conformance):\n")
    for r in res:
        if r.status != PASS:
            out.write(f"  {'(proposed) ' if r.proposed else ''}{format_case(r)}\n")
    for line in summary_lines(res):
        out.write(f"  {line}\n")
    out.flush()


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest) -> list[CaseResult]:
    res = run_suite(DEFAULT_ROOT, list(ALL_DIRS), workers=2)
    # pytest captures file descriptor 1 itself, so sys.__stdout__ is captured too: suspend the
    # capture (what capsys.disabled() does) so the rate shows in CI output without -s.
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            _report(res)
    else:
        _report(res)
    return res


def test_main_pass_rate_floor(results: list[CaseResult]) -> None:
    main = [r for r in results if not r.proposed]
    t = tally(main)
    assert t.run > 0, "no conformance case ran"
    failures = "\n".join(format_case(r) for r in main if r.status == FAIL)
    assert t.rate >= MIN_MAIN_PASS_RATE, (
        f"conformance pass rate {t.passed}/{t.run} ({100 * t.rate:.1f}%) fell below the floor "
        f"{100 * MIN_MAIN_PASS_RATE:.1f}%:\n{failures}"
    )


def test_task_chunking_template_validation(results: list[CaseResult]) -> None:
    cases = [r for r in results if r.group == "TASK_CHUNKING/job_templates"]
    assert cases, "no TASK_CHUNKING/job_templates case ran"
    failed = [format_case(r) for r in cases if r.status != PASS]
    assert not failed, "\n".join(failed)


def test_every_folder_of_the_data_is_run() -> None:
    """ALL_DIRS names each folder that holds fixtures (a new folder in the data is not silently
    left out), and only those."""
    assert sorted(ALL_DIRS) == fixture_dirs(DEFAULT_ROOT)


def test_every_folder_ran_cases(results: list[CaseResult]) -> None:
    ran = {r.group for r in results}
    assert not [d for d in ALL_DIRS if d not in ran], "folders where no case was found"


def test_proposed_cases_pass_or_are_skipped_with_a_reason(results: list[CaseResult]) -> None:
    proposed = [r for r in results if r.proposed]
    assert proposed, "no proposed/ case ran"
    failed = [format_case(r) for r in proposed if r.status == FAIL]
    assert not failed, "\n".join(failed)
    unexplained = [r.name for r in proposed if r.status == SKIP and not r.reason.strip()]
    assert not unexplained, unexplained


def test_every_skip_has_a_reason(results: list[CaseResult]) -> None:
    assert not [r.name for r in results if r.status == SKIP and not r.reason.strip()]
