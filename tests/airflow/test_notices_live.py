"""Interruption notices on a live Airflow (the session's stack): a notice from a test metadata
server on 127.0.0.1 (Google Cloud) reaches a running OpenJD task instance, which checkpoints
and fails its try; Airflow's retry resumes it."""

from __future__ import annotations

import sys
from pathlib import Path

import airflow_helpers as ah
from test_live import FIBONACCI, TASK, fib, running_record, task_records

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from metadata_server import MetadataServer  # noqa: E402  (tests/)

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r},
                        interruption_notices={notices!r}, notice_poll_seconds=0.2)
"""


def test_a_notice_checkpoints_the_task_and_the_retry_resumes(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    server = MetadataServer()
    try:
        dag_id = "live_fibonacci_notice"
        store = tmp_path / "store"
        source = DAG_FILE.format(
            template=str(FIBONACCI), dag_id=dag_id, store=str(store), notices=f"gcp:{server.url}"
        )
        airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
        n = 60
        run_id = client.trigger(dag_id, conf={"N": n, "StepSeconds": 0.1, "CheckpointSeconds": 600})
        running_record(store)
        ah.wait_until(
            lambda: ("GET", "/computeMetadata/v1/instance/preempted") in server.requests,
            timeout=30,
            what="the task instance to ask the metadata server",
        )
        server.trigger("gcp", once=True)  # the retry's host is a new one: no notice there

        def checkpointed() -> dict | None:
            return next((r for r in task_records(store) if r.get("checkpoint")), None)

        ah.wait_until(checkpointed, timeout=30, what="the notice's checkpoint")
        run = client.wait_dag_run(dag_id, run_id, timeout=120)
        assert run["state"] == "success"
        ti = client.task_instance(dag_id, run_id, TASK, 0)
        assert ti["try_number"] == 2
        log1 = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
        assert "interruption notice from gcp" in log1, log1[-3000:]
        assert "stopped by an interruption notice" in log1
        assert "tasks asked to checkpoint and stopped in" in log1
        log2 = client.task_log(dag_id, run_id, TASK, 2, map_index=0)
        assert "resuming from checkpoint generation 1" in log2
        assert f"Final answer: Fibonacci number {n} is {fib(n)}" in log2
        assert "Fibonacci number 0 is 0" not in log2
        assert not server.rejected, server.rejected
    finally:
        server.close()


def test_notice_settings_come_from_the_config_section(monkeypatch) -> None:
    import pytest

    from airflow_plugin._config import notice_settings
    from core.run._notices import AwsSource, FileSource

    monkeypatch.setenv("AIRFLOW__OPENJD_CHECKPOINT__INTERRUPTION_NOTICES", "aws,file:/tmp/n")
    monkeypatch.setenv("AIRFLOW__OPENJD_CHECKPOINT__NOTICE_POLL_SECONDS", "2")
    sources, poll = notice_settings()
    assert [type(s) for s in sources] == [AwsSource, FileSource] and poll == 2.0
    sources, poll = notice_settings("gcp", 0.5)  # the operator's own arguments win
    assert [s.name for s in sources] == ["gcp"] and poll == 0.5
    monkeypatch.setenv("AIRFLOW__OPENJD_CHECKPOINT__INTERRUPTION_NOTICES", "ec2")
    with pytest.raises(ValueError, match=r"\[openjd_checkpoint\] interruption_notices: unknown"):
        notice_settings()
