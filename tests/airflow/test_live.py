"""The adapter on a live Airflow (scheduler, dag-processor, api-server; LocalExecutor): a task
marked failed checkpoints within the kill budget through on_kill, and clearing it resumes; no
process of the task is left behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import airflow_helpers as ah
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
FIBONACCI = ROOT / "examples" / "fibonacci" / "fibonacci-fast.yaml"
MARKER = "OPENJD_CHECKPOINT_SESSION"
TASK = "ResumableFibonacci"

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r})
"""


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def task_records(store: Path) -> list[dict]:
    return [
        json.loads(p.read_text())
        for p in store.glob("jobs/*/runs/*/tasks/*.json")
        if ".gen-" not in p.name
    ]


def marked(markers: set[str]) -> list[psutil.Process]:
    """Live processes whose OPENJD_CHECKPOINT_SESSION is one of ``markers``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) in markers:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def running_record(store: Path) -> dict:
    def ready() -> dict | None:
        for rec in task_records(store):
            # pid 0: the record names the process about to start (it is not running yet)
            if rec["status"] == "running" and (rec.get("process") or {}).get("pid"):
                return rec
        return None

    return dict(ah.wait_until(ready, timeout=90, what="the task to start its process"))


def computed(client: ah.AirflowClient, dag_id: str, run_id: str, n: int = 5) -> None:
    """Wait until the first try's log shows Fibonacci number ``n``: the task is well under way
    (its signal handled, some numbers computed)."""

    def seen() -> bool:
        try:
            log = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
        except (ah.AirflowApiError, httpx.HTTPError, ValueError):
            return False  # no log yet
        return f"Fibonacci number {n} is" in log

    ah.wait_until(seen, timeout=60, interval=0.1, what=f"Fibonacci number {n} in the log")


def test_marked_failed_checkpoints_then_clear_resumes(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "live_fibonacci"
    store = tmp_path / "store"
    source = DAG_FILE.format(template=str(FIBONACCI), dag_id=dag_id, store=str(store))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    n = 120
    run_id = client.trigger(dag_id, conf={"N": n, "StepSeconds": 0.1, "CheckpointSeconds": 600})

    rec = running_record(store)  # the mapped instance exists only once expanded
    assert client.task_instance(dag_id, run_id, TASK, 0)["state"] == "running"
    markers = {rec["process"]["marker"]}
    assert marked(markers), "the task's processes carry the core's marker"
    computed(client, dag_id, run_id)  # some Fibonacci numbers later
    client.set_task_instance_state(dag_id, run_id, TASK, "failed", map_index=0)

    def checkpointed() -> dict | None:
        return next(
            (r for r in task_records(store) if r.get("checkpoint") and r["status"] != "running"),
            None,
        )

    rec = ah.wait_until(checkpointed, timeout=30, what="the on_kill checkpoint, task ended")
    assert rec["checkpoint"]["generation"] == 1  # periodic checkpoints are 600 s apart
    assert rec["status"] == "interrupted"
    ah.wait_until(lambda: not marked(markers), timeout=10, what="the task's processes to end")
    run = client.wait_dag_run(dag_id, run_id, timeout=90)
    assert run["state"] == "failed"
    log1 = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
    stored = re.search(r"checkpoint generation 1 stored ([0-9.]+) s after the stop", log1)
    assert stored, log1[-3000:]
    assert float(stored.group(1)) < 4.0  # inside the kill budget (SIGKILL comes at 5 s)
    assert "on_kill: the task instance" in log1 and "marked failed" in log1
    ah.TIMINGS["live: on_kill request to checkpoint stored"] = float(stored.group(1))

    client.clear_task_instances(dag_id, run_id, [(TASK, 0)])
    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    states = {
        (t["task_id"], t["map_index"]): t["state"] for t in client.task_instances(dag_id, run_id)
    }
    assert run["state"] == "success", states
    ti = client.task_instance(dag_id, run_id, TASK, 0)
    log2 = client.task_log(dag_id, run_id, TASK, ti["try_number"], map_index=0)
    assert "resuming from checkpoint generation 1" in log2
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in log2
    assert "Fibonacci number 0 is 0" not in log2  # it did not start over
    summary = client.state_store_get(dag_id, run_id, TASK, "openjd_checkpoint", map_index=0)
    assert summary["tasks"][0]["resume_status"] == "RESUMED"
    assert not marked(markers)


def _start_fibonacci(
    airflow_live: ah.AirflowStack, tmp_path: Path, dag_id: str, n: int
) -> tuple[str, Path, set[str]]:
    """Add a Fibonacci DAG with its own store, trigger it, wait until its task process runs;
    return the DAG run id, the store and the task's marker."""
    store = tmp_path / "store"
    source = DAG_FILE.format(template=str(FIBONACCI), dag_id=dag_id, store=str(store))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    run_id = airflow_live.client.trigger(
        dag_id, conf={"N": n, "StepSeconds": 0.1, "CheckpointSeconds": 600}
    )
    rec = running_record(store)
    return run_id, store, {rec["process"]["marker"]}


def test_marked_success_is_recorded_done_and_leaves_no_process(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "live_fibonacci_success"
    run_id, store, markers = _start_fibonacci(airflow_live, tmp_path, dag_id, 150)
    assert marked(markers)
    computed(client, dag_id, run_id)
    client.set_task_instance_state(dag_id, run_id, TASK, "success", map_index=0)

    ah.wait_until(lambda: not marked(markers), timeout=15, what="the task's processes to end")
    run = client.wait_dag_run(dag_id, run_id, timeout=90)
    assert run["state"] == "success"  # the user declared the work done
    [core_run] = [json.loads(p.read_text()) for p in store.glob("jobs/*/runs/*/run.json")]
    assert core_run["status"] == "succeeded"  # not resumable: complete, checkpoints deleted
    assert task_records(store) == []
    log = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
    assert "marked success" in log and "recorded as done" in log


def test_cleared_while_running_resumes_and_leaves_no_process(
    airflow_live: ah.AirflowStack, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "live_fibonacci_clear"
    n = 90
    run_id, store, markers = _start_fibonacci(airflow_live, tmp_path, dag_id, n)
    computed(client, dag_id, run_id)
    client.clear_task_instances(dag_id, run_id, [(TASK, 0)])

    ah.wait_until(lambda: not marked(markers), timeout=15, what="the first try's processes")
    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert run["state"] == "success"
    ti = client.task_instance(dag_id, run_id, TASK, 0)
    assert ti["try_number"] >= 2
    log = client.task_log(dag_id, run_id, TASK, ti["try_number"], map_index=0)
    assert "resuming from checkpoint generation 1" in log
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in log
    first = client.task_log(dag_id, run_id, TASK, 1, map_index=0)
    assert "running task instance was cleared" in first
    assert not marked(markers)
