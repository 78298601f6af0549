"""Clearing task instances of a DAG run that has ended, on a live Airflow (issue 22, items 1
and 2): a cleared task instance whose OpenJD task finished runs it again from its start and the
DAG run ends as its tasks did; after the template was edited, the cleared DAG run is refused at
its ``openjd_begin`` (``chain-changed``) before any task of the old plan runs, and the advice it
prints (a new DAG run) works."""

from __future__ import annotations

from pathlib import Path

import airflow_helpers as ah

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id={dag_id!r}, store={store!r}, default_args={{"retries": 0}}
)
"""

# Prepare, then Render (one task instance per frame), then the finally step Report; each writes
# a line to <Out>/log. A frame stores a checkpoint and fails while <Out>/fail-<frame> exists.
TEMPLATE = r"""
specificationVersion: 'jobtemplate-2023-09'
extensions: [CHECKPOINT, FINALLY]
name: Clear finished tasks
parameterDefinitions:
- {name: Out, type: STRING}
steps:
- name: Prepare
  script:
    actions:
      onRun:
        command: python3
        args: ['-c', 'import sys; open(sys.argv[2] + "/log", "a").write(sys.argv[1] + "\n")',
               'prepare', '{{Param.Out}}']
- name: Render
  dependencies: [{dependsOn: Prepare}]
  parameterSpace:
    taskParameterDefinitions:
    - {name: Frame, type: INT, range: "RANGE"}
  script:
    actions:
      onRun:
        command: python3
        args: ['{{Task.File.Render}}', '{{Task.Param.Frame}}', '{{Param.Out}}']
      onCheckpointResume:
        command: python3
        args: ['{{Task.File.Render}}', '{{Task.Param.Frame}}', '{{Param.Out}}']
    embeddedFiles:
    - name: Render
      filename: render.py
      type: TEXT
      data: |
        import os, sys
        frame, out = sys.argv[1:3]
        with open(os.path.join(out, "log"), "a") as fh:
            fh.write(f"render {frame}\n")
        if os.path.exists(os.path.join(out, f"fail-{frame}")):
            print('openjd_checkpoint_save: {"state": "half"}', flush=True)
            sys.exit(1)
finally:
- name: Report
  script:
    actions:
      onRun:
        command: python3
        args: ['-c', 'import sys; open(sys.argv[2] + "/log", "a").write(sys.argv[1] + "\n")',
               'report {{Job.Status}}', '{{Param.Out}}']
"""


def _setup(
    airflow_live: ah.AirflowStack, tmp_path: Path, dag_id: str, frames: str
) -> tuple[Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    template = tmp_path / "clear.yaml"
    template.write_text(TEMPLATE.replace("RANGE", frames))
    source = DAG_FILE.format(template=str(template), dag_id=dag_id, store=str(tmp_path / "store"))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    return out, template


def _lines(out: Path) -> list[str]:
    return (out / "log").read_text().splitlines()


def _states(client: ah.AirflowClient, dag_id: str, run_id: str) -> dict:
    return {
        (t["task_id"], t["map_index"]): t["state"] for t in client.task_instances(dag_id, run_id)
    }


def test_clearing_a_finished_task_of_a_succeeded_dag_run_runs_it_again(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "clear_succeeded"
    out, _ = _setup(airflow_live, tmp_path, dag_id, "1-2")
    run_id = client.trigger(dag_id, conf={"Out": str(out)})
    assert client.wait_dag_run(dag_id, run_id, timeout=120)["state"] == "success"
    assert sorted(_lines(out)) == ["prepare", "render 1", "render 2", "report Succeeded"]

    # A downstream step's task instance (map index 1: Render[Frame=2]) is cleared to run again.
    client.clear_task_instances(dag_id, run_id, [("Render", 1)])
    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert run["state"] == "success", _states(client, dag_id, run_id)
    again = _lines(out)[4:]
    assert again == ["render 2", "report Succeeded"], _lines(out)  # the others keep their outcome
    ti = client.task_instance(dag_id, run_id, "Render", 1)
    log = client.task_log(dag_id, run_id, "Render", ti["try_number"], map_index=1)
    assert "runs again from its start" in log, log[-3000:]
    begin = client.task_instance(dag_id, run_id, "openjd_begin")
    begin_log = client.task_log(dag_id, run_id, "openjd_begin", begin["try_number"])
    assert "attempt 2" in begin_log and "running from the top" not in begin_log


def test_a_template_edited_before_a_clear_is_refused_and_a_new_dag_run_runs_it(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "clear_edited"
    out, template = _setup(airflow_live, tmp_path, dag_id, "1-3")
    (out / "fail-2").touch()
    run_id = client.trigger(dag_id, conf={"Out": str(out)})
    assert client.wait_dag_run(dag_id, run_id, timeout=120)["state"] == "failed"
    assert client.task_instance(dag_id, run_id, "Render", 1)["state"] == "failed"
    (out / "fail-2").unlink()

    # The template is edited to frames 2-4, then map index 1 (Render[Frame=2]) is cleared.
    template.write_text(TEMPLATE.replace("RANGE", "2-4"))
    before = len(_lines(out))
    client.clear_task_instances(dag_id, run_id, [("Render", 1)])
    assert client.wait_dag_run(dag_id, run_id, timeout=120)["state"] == "failed"
    assert _lines(out)[before:] == []  # no task of the old plan ran: not frame 3, not frame 2
    begin = client.task_instance(dag_id, run_id, "openjd_begin")
    assert begin["state"] == "failed"
    begin_log = client.task_log(dag_id, run_id, "openjd_begin", begin["try_number"])
    assert "chain-changed" in begin_log and "Render" in begin_log, begin_log[-3000:]
    assert "trigger a new DAG run" in begin_log, begin_log[-3000:]

    # The advice: a new DAG run, once the DAG file has been parsed again.
    airflow_live.add_dag(
        f"{dag_id}.py",
        DAG_FILE.format(template=str(template), dag_id=dag_id, store=str(tmp_path / "store")),
        dag_id=dag_id,
        reserialize=True,
    )
    new_run = client.trigger(dag_id, conf={"Out": str(out)})
    run = client.wait_dag_run(dag_id, new_run, timeout=120)
    assert run["state"] == "success", _states(client, dag_id, new_run)
    assert sorted(_lines(out)[before:]) == [
        "prepare",
        "render 2",
        "render 3",
        "render 4",
        "report Succeeded",
    ]
