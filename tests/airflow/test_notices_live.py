"""Interruption notices on a live Airflow (the session's stack): a notice from a test metadata
server on 127.0.0.1 (Google Cloud) reaches a running OpenJD task instance, which checkpoints
and is rescheduled (up for reschedule: not a retry); its next run, the same try, resumes it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import airflow_helpers as ah
import psutil
from test_live import FIBONACCI, TASK, computed, fib, running_record, task_records

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from metadata_server import MetadataServer  # noqa: E402  (tests/)

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r},
                        interruption_notices={notices!r}, notice_poll_seconds=0.2)
"""


def test_a_notice_checkpoints_the_task_and_the_rescheduled_try_resumes(
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
        assert ti["try_number"] == 1  # rescheduled, no retry used
        log = client.task_log(dag_id, run_id, TASK, 1, map_index=0)  # both runs of try 1
        assert "interruption notice from gcp" in log, log[-3000:]
        assert "stopped by an interruption notice" in log
        assert "tasks asked to checkpoint and stopped in" in log
        assert "interruption 1 of 10 that resume without using a retry: rescheduled" in log
        resumed = log.split("resuming from checkpoint generation 1", 1)
        assert len(resumed) == 2, log[-3000:]
        assert f"Final answer: Fibonacci number {n} is {fib(n)}" in resumed[1]
        assert "Fibonacci number 0 is 0" not in resumed[1]
        assert not server.rejected, server.rejected
    finally:
        server.close()


SHUTDOWN_DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r})
"""
# The default delay (5 s): a shorter one lets the worker's late report of the first run (1.6 s
# after it ended on a loaded CI machine) reach the scheduler after the rescheduled run was
# queued, which Airflow counts as a failure of it (UP_FOR_RETRY; docs/airflow.md).


def test_a_worker_shutdown_checkpoints_and_reschedules(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    """The worker's supervisor gets SIGTERM (a worker shutting down: it forwards the signal to
    the task's process, whose on_kill runs while the task instance is still running): the task
    checkpoints, the task instance is rescheduled with its try number kept, and resumes."""
    client = airflow_live.client
    dag_id = "live_fibonacci_shutdown"
    store = tmp_path / "store"
    source = SHUTDOWN_DAG_FILE.format(template=str(FIBONACCI), dag_id=dag_id, store=str(store))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    n = 80
    run_id = client.trigger(dag_id, conf={"N": n, "StepSeconds": 0.1, "CheckpointSeconds": 600})
    rec = running_record(store)
    computed(client, dag_id, run_id)  # its SIGUSR1 handler is in place
    action = psutil.Process(rec["process"]["pid"])
    runner = action.parent()  # the task runner: the operator's process
    supervisor = runner.parent()  # the LocalExecutor worker that supervises it
    assert "airflow" in " ".join(supervisor.cmdline()), supervisor.cmdline()
    os.kill(supervisor.pid, signal.SIGTERM)

    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert run["state"] == "success"
    ti = client.task_instance(dag_id, run_id, TASK, 0)
    assert ti["try_number"] == 1  # rescheduled, no retry used
    log = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
    assert "on_kill: worker shutdown (the task instance is still running)" in log, log[-3000:]
    assert "interruption 1 of 10 that resume without using a retry: rescheduled" in log
    resumed = log.split("resuming from checkpoint generation 1", 1)
    assert len(resumed) == 2, log[-3000:]
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in resumed[1]
    assert supervisor.is_running()  # the worker forwarded the signal and went on


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
