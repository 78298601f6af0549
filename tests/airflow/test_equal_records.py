"""Equal records (issue 24), Airflow's part: the scenario of ``tests/equal_records.py`` under
``dag.test()``. The notice fails ``Work[1]``'s first try; Airflow's retry resumes it, the
termination request cancels it, the teardown runs ``Cleanup``. The records must equal
``expected_for_adapter`` of the CLI's (the golden file), ids and times aside: the golden with
the two differences the runners' models make (the notice's retry within attempt 1, one session
per unit), field by field as its docstring lists them."""

from __future__ import annotations

import sys
from pathlib import Path

import airflow_helpers as ah
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from equal_records import (  # noqa: E402  (tests/)
    JOB,
    Conductor,
    assert_equal_records,
)

pytestmark = pytest.mark.timeout(240)

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id="equal_records", store={store!r}, default_args={{"retries": 1}},
    interruption_notices={notices!r}, notice_poll_seconds=0.1,
)
"""


def test_the_airflow_records_equal_the_golden_file(
    dag_tester: ah.DagTester, tmp_path_factory: pytest.TempPathFactory
):
    """``dag.test()`` runs ``Work[I=1]`` and ``Work[I=2]`` one at a time, in the order of a
    Python set: when it picks ``Work[I=2]`` first the conductor cancels that run and the test
    runs the DAG again on a fresh store (see ``Conductor``'s ``sequential``), up to three
    tries; the records of the try that played the scenario are compared."""
    for _ in range(3):
        tmp = tmp_path_factory.mktemp("equal")
        store = tmp / "store"
        notice = tmp / "notice"
        source = DAG_FILE.format(template=str(JOB), store=str(store), notices=f"file:{notice}")
        conductor = Conductor(store, notice, sessions=1, timeout=120, sequential=True).start()
        try:
            result = dag_tester.run("equal_records.py", source=source, run_conf={})
        finally:
            conductor.join()
        if not conductor.out_of_order.is_set():
            break
    else:
        pytest.fail("dag.test() ran Work[I=2] before Work[I=1] three times in a row")
    assert result.state == "failed", (result.states(), result.history)
    assert_equal_records(store, tmp, "airflow")
