"""Equal records (issue 24), Airflow's part: the scenario of ``tests/equal_records.py`` under
``dag.test()``. The notice fails ``Work[1]``'s first try; Airflow's retry resumes it, the
termination request cancels it, the teardown runs ``Cleanup``. The records must equal the CLI's
(the golden file), ids and times aside."""

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
"""
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.xfail(raises=RecordsDifferError, strict=True, reason=KNOWN),
]

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id="equal_records", store={store!r}, default_args={{"retries": 1}},
    interruption_notices={notices!r}, notice_poll_seconds=0.1,
)
"""


def test_the_airflow_records_equal_the_golden_file(dag_tester: ah.DagTester, tmp_path: Path):
    store = tmp_path / "store"
    notice = tmp_path / "notice"
    source = DAG_FILE.format(template=str(JOB), store=str(store), notices=f"file:{notice}")
    conductor = Conductor(store, notice, sessions=1, timeout=120).start()
    try:
        result = dag_tester.run("equal_records.py", source=source, run_conf={})
    finally:
        conductor.join()
    assert result.state == "failed", (result.states(), result.history)
    assert_equal_records(store, tmp_path, "airflow")
