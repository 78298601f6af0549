"""The attempt of a DAG run's setup task kept by the process that ran it (``_inputs.BeginMemo``,
issue 38): the task instances after it in that process read it there instead of from XCom,
and a cleared task instance never gets a stale one.

``dag.test()`` again with the same logical date and ``run_after`` is the case that a memo keyed
by the DAG run alone gets wrong: it runs the same DAG run (same run id) again in the same
process, clearing its task instances without counting a clear (``DagRun.clear_number`` stays
0), and its setup task begins attempt 2 of the same core run; attempt 1, kept from the first
``dag.test()``, would be stale (a memo that kept what the first task instances read from XCom
fails this test: they read attempt 1). The setup task drops it as it starts, so the mapped
task instances of the second ``dag.test()`` get attempt 2."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import airflow_helpers as ah

TEMPLATE = """
specificationVersion: 'jobtemplate-2023-09'
name: Begin memo
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - {name: Frame, type: INT, range: "1-2"}
  script:
    actions:
      onRun: {command: "true"}
"""

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r},
                        default_args={{"retries": 0}})
"""


def _begin_xcom(dag_id: str, run_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == "openjd_begin",
                XComModel.key == "return_value",
            )
        )
    return value if isinstance(value, dict) else json.loads(value)


def _clear_number(dag_id: str, run_id: str) -> int:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return int(
            session.scalar(
                select(DagRun.clear_number).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
            )
        )


def _summary_attempts(dag_id: str, run_id: str) -> dict[int, int]:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(TaskStateStoreModel).where(
                TaskStateStoreModel.dag_id == dag_id,
                TaskStateStoreModel.run_id == run_id,
                TaskStateStoreModel.task_id == "Render",
            )
        )
        return {row.map_index: json.loads(row.value)["attempt"] for row in rows}


def test_dag_test_again_on_the_same_date_gets_the_new_attempt(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    from airflow_plugin._inputs import BEGIN_MEMO, BeginMemo

    template = tmp_path / "memo.yaml"
    template.write_text(TEMPLATE)
    dag_id = "begin_memo"
    source = DAG_FILE.format(template=str(template), dag_id=dag_id, store=str(tmp_path / "s"))
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)

    first = dag_tester.run(f"{dag_id}.py", source=source, logical_date=when, run_after=when)
    assert first.state == "success", first.states()
    key = (dag_id, first.run_id, "openjd_begin")
    kept_first = BEGIN_MEMO.get(key)
    assert kept_first is not None and kept_first["attempt"] == 1  # kept by the setup task
    assert kept_first == _begin_xcom(dag_id, first.run_id)
    assert f"(attempt 1) of job {kept_first['job_key']}" in capfd.readouterr().out

    second = dag_tester.run(f"{dag_id}.py", logical_date=when, run_after=when)
    assert second.state == "success", second.states()
    # The same DAG run, not counted as cleared: a memo keyed by (dag_id, run_id) or by
    # (dag_id, run_id, clear_number) would hand attempt 1 to its task instances ...
    assert second.run_id == first.run_id
    assert _clear_number(dag_id, second.run_id) == 0
    xcom = _begin_xcom(dag_id, second.run_id)
    assert (xcom["run_id"], xcom["attempt"]) == (kept_first["run_id"], 2)
    # ... but the setup task replaced it before any of them ran: they read attempt 2.
    assert BEGIN_MEMO.get(BeginMemo.key(_Ti(dag_id, second.run_id), "openjd_begin")) == xcom
    printed = capfd.readouterr().out
    assert f"core run {xcom['run_id']} (attempt 2) of job" in printed
    assert f"(attempt 1) of job {xcom['job_key']}" not in printed
    assert _summary_attempts(dag_id, second.run_id) == {0: 2, 1: 2}  # a second try writes one


class _Ti:
    def __init__(self, dag_id: str, run_id: str) -> None:
        self.dag_id, self.run_id = dag_id, run_id


def test_a_forked_process_does_not_use_what_its_parent_kept() -> None:
    """A worker forked from a process that ran ``dag.test()`` (LocalExecutor under
    ``dag.test(use_executor=True)``) forks each task instance's process in turn: none of them
    ran the setup task whose attempt the first process kept, and no setup task run of theirs
    drops it."""
    from airflow_plugin._inputs import BeginMemo

    memo = BeginMemo()
    key = ("dag", "run", "openjd_begin")
    memo.put(key, {"job_key": "j", "run_id": "r", "attempt": 1})
    assert memo.get(key) is not None
    os.register_at_fork(after_in_child=memo.clear)
    pid = os.fork()
    if pid == 0:  # the child: nothing kept, whether by the fork hook or by the pid check
        kept_here = memo.get(key) is not None
        memo.put(key, {"attempt": 2})  # what it keeps is its own
        os._exit(3 if kept_here else (0 if memo.get(key) == {"attempt": 2} else 4))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert memo.get(key) == {"job_key": "j", "run_id": "r", "attempt": 1}

    # The pid check alone, for a copy a fork hook did not empty (a fork outside os.fork).
    other = BeginMemo()
    other.put(key, {"attempt": 1})
    other._kept[key] = (os.getpid() + 1, other._kept[key][1])
    assert other.get(key) is None
