"""Smoke tests of the Airflow test infrastructure: dag.test(), the live stack, its REST API."""

from __future__ import annotations

import secrets
import time

import airflow_helpers as ah
import psutil
import pytest

BASH_DAG = """
from datetime import datetime

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG("{dag_id}", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         default_args={{"retries": {retries}}}):
    first = BashOperator(task_id="first", bash_command="echo first-says-$((6 * 7))")
    mapped = BashOperator.partial(task_id="mapped").expand(
        bash_command=["echo item-0", "echo item-1", "{last_command}"]
    )
    first >> mapped
"""


def test_dag_test_runs_a_bash_dag(dag_tester: ah.DagTester, capfd) -> None:
    result = dag_tester.run(
        "smoke_bash.py",
        source=BASH_DAG.format(dag_id="smoke_bash", retries=0, last_command="echo item-2"),
    )

    assert result.state == "success", result.states()
    assert result.states() == {
        ("first", -1): "success",
        ("mapped", 0): "success",
        ("mapped", 1): "success",
        ("mapped", 2): "success",
    }
    assert result.map_indexes("mapped") == [0, 1, 2]
    assert {ti.try_number for ti in result.tis} == {1}
    assert result.dag.task_dict["first"].downstream_task_ids == {"mapped"}
    out = capfd.readouterr().out
    assert "first-says-42" in out
    assert "item-2" in out


def test_dag_test_reports_failures_and_tries(dag_tester: ah.DagTester) -> None:
    result = dag_tester.run(
        "smoke_bash_fails.py",
        source=BASH_DAG.format(dag_id="smoke_bash_fails", retries=1, last_command="exit 3"),
    )

    assert result.state == "failed"
    assert result.ti("mapped", 2).state == "failed"
    assert result.ti("mapped", 2).try_number == 2  # the retry ran, 1 s later
    assert [(h.task_id, h.map_index, h.try_number) for h in result.history] == [("mapped", 2, 1)]
    assert result.history[0].state == "failed"
    assert result.ti("mapped", 0).state == "success"
    assert result.ti("first").try_number == 1


LIVE_DAG = """
from datetime import datetime

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, task

with DAG("{dag_id}", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         params={{"who": "nobody"}}):
    hello = BashOperator(task_id="hello", bash_command="echo hello-{{{{ params.who }}}}")

    @task
    def remember(n, task_state_store=None, params=None):
        task_state_store.set("greeted", {{"who": params["who"], "n": n}})

    hello >> remember.expand(n=[10, 20])
"""


def test_live_stack_runs_a_triggered_dag(airflow_live: ah.AirflowStack) -> None:
    client = airflow_live.client
    airflow_live.add_dag("smoke_live.py", LIVE_DAG.format(dag_id="smoke_live"), dag_id="smoke_live")

    run_id = client.trigger("smoke_live", conf={"who": "world"})
    run = client.wait_dag_run("smoke_live", run_id, timeout=90)

    assert run["state"] == "success"
    assert run["conf"] == {"who": "world"}
    tis = client.task_instances("smoke_live", run_id)
    assert sorted((t["task_id"], t["map_index"], t["state"], t["try_number"]) for t in tis) == [
        ("hello", -1, "success", 1),
        ("remember", 0, "success", 1),
        ("remember", 1, "success", 1),
    ]
    assert client.task_instance("smoke_live", run_id, "remember", 1)["map_index"] == 1
    assert "hello-world" in client.task_log("smoke_live", run_id, "hello", 1)
    for map_index, n in [(0, 10), (1, 20)]:
        assert client.state_store("smoke_live", run_id, "remember", map_index=map_index) == {
            "greeted": {"who": "world", "n": n}
        }
    got = client.state_store_get("smoke_live", run_id, "remember", "greeted", map_index=1)
    assert got == {"who": "world", "n": 20}
    assert client.state_store_get("smoke_live", run_id, "remember", "missing") is None
    # Nothing of the stack listens beyond 127.0.0.1.
    listening = airflow_live.listening_addresses()
    assert ("127.0.0.1", airflow_live.port) in {(ip, port) for ip, port, _ in listening}
    assert {ip for ip, _, _ in listening} == {"127.0.0.1"}, listening


SLEEP_DAG = """
from datetime import datetime

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG("{dag_id}", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    BashOperator(task_id="sleeper", bash_command="sleep 300", retries=0,
                 env={{"OPENJD_SMOKE_TOKEN": "{token}"}}, append_env=True)
"""


def _task_procs(token: str) -> list[psutil.Process]:
    """The sleeper's bash and sleep processes (they carry the token in their environment)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("OPENJD_SMOKE_TOKEN") == token and proc.status() != "zombie":
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _wait_gone(token: str, timeout: float) -> float:
    started = time.monotonic()
    ah.wait_until(lambda: not _task_procs(token), timeout=timeout, what="task processes to end")
    return time.monotonic() - started


def test_live_stack_kills_a_task_marked_failed_or_success(airflow_live: ah.AirflowStack) -> None:
    client = airflow_live.client
    token = secrets.token_hex(8)
    dag_id = "smoke_sleep"
    source = SLEEP_DAG.format(dag_id=dag_id, token=token)
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    run_id = client.trigger(dag_id)
    client.wait_task_instance(dag_id, run_id, "sleeper", ["running"], timeout=60)
    procs = ah.wait_until(lambda: _task_procs(token), timeout=30, what="sleep to start")
    assert any(p.name() == "sleep" for p in procs), ah.describe(procs)

    # Marked failed: the supervisor sees it at its next heartbeat and kills the process group.
    client.set_task_instance_state(dag_id, run_id, "sleeper", "failed")
    gone_after = _wait_gone(token, timeout=60)  # a hang bound: under load heartbeats slow
    ah.TIMINGS["task marked failed -> its processes gone"] = gone_after
    assert client.task_instance(dag_id, run_id, "sleeper")["state"] == "failed"
    assert client.wait_dag_run(dag_id, run_id, timeout=30)["state"] == "failed"

    # Cleared: it runs again (try 2); then marked success, it is killed again.
    cleared = client.clear_task_instances(dag_id, run_id, ["sleeper"])
    assert [t["task_id"] for t in cleared] == ["sleeper"]
    ti = client.wait_task_instance(dag_id, run_id, "sleeper", ["running"], timeout=60)
    assert ti["try_number"] == 2
    ah.wait_until(lambda: _task_procs(token), timeout=30, what="sleep to start again")
    client.set_task_instance_state(dag_id, run_id, "sleeper", "success")
    _wait_gone(token, timeout=60)
    assert client.task_instance(dag_id, run_id, "sleeper")["state"] == "success"
    assert client.wait_dag_run(dag_id, run_id, timeout=30)["state"] == "success"
    ah.wait_until(
        lambda: airflow_live.task_processes() == [], timeout=15, what="task processes to end"
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v2/dags",
        "/api/v2/dags/smoke_live/dagRuns",
        "/api/v2/dags/smoke_live/dagRuns/x/taskInstances/remember/state-store",
        "/openjd-probe/whoami",
        "/openjd-probe/dags/smoke_live/runs",
    ],
)
def test_live_stack_refuses_unauthenticated_calls(airflow_live: ah.AirflowStack, path) -> None:
    client = airflow_live.client
    assert client.request("GET", path, auth=False, expect=None).status_code == 401
    bad = client.request(
        "GET", path, auth=False, expect=None, headers={"Authorization": "Bearer not.a.jwt"}
    )
    assert bad.status_code == 403
    assert client.request("GET", path, expect=None).status_code in (200, 404)


def test_live_stack_token_needs_the_right_password(airflow_live: ah.AirflowStack) -> None:
    wrong = ah.AirflowClient(airflow_live.base_url, password="wrong")
    with pytest.raises(ah.AirflowApiError) as err:
        wrong.token()
    assert err.value.status_code == 401
    assert airflow_live.client.get("/openjd-probe/whoami") == {"user": ah.USERNAME}
