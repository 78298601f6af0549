"""Equal records (issue 24), Prefect's part: the scenario of ``tests/equal_records.py`` on the
session's Prefect server. The notice fails ``Work[I=2]``'s task run; its task retry resumes it,
the termination request cancels it, ``Cleanup`` runs after the steps' futures. The records must
equal ``expected_for_adapter`` of the CLI's (the golden file), ids and times aside: the golden
with the two differences the runners' models make (the notice's retry within attempt 1, one
session per unit), field by field as its docstring lists them."""

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
    assert_equal_records,
)

pytestmark = pytest.mark.timeout(240)


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
