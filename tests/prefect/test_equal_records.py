"""Equal records (issue 24), Prefect's part: the scenario of ``tests/equal_records.py`` on the
session's Prefect server. The notice fails ``Work[I=2]``'s task run; its task retry resumes it,
the termination request cancels it, ``Cleanup`` runs after the steps' futures. The records must
equal the CLI's (the golden file), ids and times aside."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prefect_integration import flow_from_template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from equal_records import (  # noqa: E402  (tests/)
    JOB,
    Conductor,
    RecordsDifferError,
    assert_equal_records,
)

# Known differences from the CLI's records (issue 24: the core is to make them equal; then drop
# this mark, which fails the test as soon as the records are equal):
KNOWN = """the CLI records differently:
    - a notice: the CLI makes it a run-level Suspended stop request (stop_requests gains
      {mode: Suspended, attempt: 1}; the run ends interrupted, its next run is attempt 2); here
      the unit's try fails and the framework's task retry resumes in attempt 1 (run.attempt,
      environment_failures[].attempt, Cleanup's run_attempt, Work[I=2]'s run_attempt and its
      last generation's attempt: 1 here, 2 on the CLI)
    - environment_failures: 4 here (one session per unit: Work[I=1], Work[I=2] twice,
      Cleanup), 3 on the CLI (one session per slot, kept for the finally step)
    - run.skipped_tasks: ["Work[I=2]"] here (finish_attempt's default, every task still
      planned, the canceled one too), [] on the CLI (it passes the tasks it never started)
    - run.parameters: {"WaitSeconds": "40.0"} here, "40" on the CLI and Airflow (a FLOAT job
      parameter given by its default reaches the core as Python's float, stringified)
"""
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.xfail(raises=RecordsDifferError, strict=True, reason=KNOWN),
]


def test_the_prefect_records_equal_the_golden_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    notice = tmp_path / "notice"
    flow = flow_from_template(
        JOB,
        store=store,
        task_retries=1,
        interruption_notices=f"file:{notice}",
        notice_poll_seconds=0.1,
    )
    conductor = Conductor(store, notice, sessions=1, timeout=120).start()
    try:
        state = flow(return_state=True)
    finally:
        conductor.join()
    assert state.is_cancelled(), state
    assert_equal_records(store, tmp_path, "prefect")
