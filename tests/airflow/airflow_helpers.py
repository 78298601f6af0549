"""Helpers for the Airflow tests: ``dag.test()`` runs, a live Airflow stack, its REST API.

Nothing here imports Airflow at module level: ``airflow_fixtures.py`` sets the environment
first.

- ``airflow_env(home, ...)``: the ``AIRFLOW__*`` settings of one isolated Airflow home.
- ``DagTester``: writes DAG files into the in-process home's dags folder and runs ``dag.test()``
  on them, returning the DAG run and its task instances as plain records.
- ``AirflowStack``: ``airflow scheduler``, ``dag-processor`` and ``api-server`` as subprocesses
  on 127.0.0.1 (LocalExecutor, sqlite), each logging to a file; stopped with SIGTERM, then
  SIGKILL, leaving none of its processes (tracked by process tree and a marker variable).
- ``AirflowClient``: the public REST API (``/api/v2``) with a JWT from ``POST /auth/token``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

VENV_BIN = Path(sys.executable).parent
AIRFLOW_BIN = VENV_BIN / "airflow"
USERNAME = "admin"
PASSWORD = "openjd-test-password"  # written to the simple auth manager's passwords file
STACK_MARKER = "OPENJD_AIRFLOW_TEST_STACK"  # every process of a live stack inherits it
TERMINAL_RUN_STATES = ("success", "failed")
FINISHED_TI_STATES = ("success", "failed", "skipped", "upstream_failed", "removed")

# Named durations and notes, printed at the end of the session (airflow_fixtures.py).
TIMINGS: dict[str, float] = {}
NOTES: dict[str, str] = {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fernet_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


# One secret set per test session, shared by the in-process home and every stack.
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(64),
    "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
    "AIRFLOW__CORE__FERNET_KEY": _fernet_key(),
}


def airflow_env(home: Path, *, port: int | None = None) -> dict[str, str]:
    """The configuration of one isolated Airflow home (the env vars beat any airflow.cfg)."""
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # Simple auth manager with one known user; never ALL_ADMINS: that mode adds a middleware
        # that authenticates every request, so nothing would ever be refused.
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        # Retries wait [core] default_task_retry_delay (300 s) unless a task says otherwise.
        "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "1",
        # The supervisor learns that its task was marked failed/success or cleared at its next
        # heartbeat ([workers] min_heartbeat_interval, default 5 s).
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        # New DAG files are listed every refresh_interval (default 300 s); changed files are
        # parsed again after min_file_process_interval (default 30 s).
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "1",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "600",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
        **SECRETS,
    }
    if port is not None:
        env.update(
            {
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            }
        )
    return env


def prepare_home(home: Path) -> None:
    for sub in ("dags", "plugins", "logs"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    (home / "passwords.json").write_text(json.dumps({USERNAME: PASSWORD}) + "\n")


def clean_environ() -> dict[str, str]:
    """os.environ without any Airflow setting (a stack gets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}


def copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent copy of a sqlite database (the backup API, not a file copy)."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    target = sqlite3.connect(tmp)
    try:
        with target:
            source.backup(target)
    finally:
        source.close()
        target.close()
    os.replace(tmp, dst)


def run_airflow_cli(
    args: Sequence[str], env: dict[str, str], *, timeout: float = 120.0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(AIRFLOW_BIN), *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.25, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        time.sleep(interval)


def _state(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


# ------------------------------------------------------------------------------ dag.test()


@dataclass(frozen=True)
class TaskInstanceRecord:
    """One task instance (or one earlier try of it, from the history table)."""

    task_id: str
    map_index: int
    state: str | None
    try_number: int
    max_tries: int
    rendered_map_index: str | None


@dataclass
class DagTestResult:
    dag: Any  # airflow.sdk.DAG, as parsed from the file
    run_id: str
    state: str | None
    tis: list[TaskInstanceRecord]
    history: list[TaskInstanceRecord]  # earlier tries (TaskInstanceHistory)
    seconds: float

    def ti(self, task_id: str, map_index: int = -1) -> TaskInstanceRecord:
        for ti in self.tis:
            if ti.task_id == task_id and ti.map_index == map_index:
                return ti
        raise KeyError(f"no task instance {task_id}[{map_index}] in {self.states()}")

    def states(self) -> dict[tuple[str, int], str | None]:
        return {(ti.task_id, ti.map_index): ti.state for ti in self.tis}

    def map_indexes(self, task_id: str) -> list[int]:
        return sorted(ti.map_index for ti in self.tis if ti.task_id == task_id)


class DagImportError(Exception):
    pass


@contextmanager
def real_std_streams() -> Iterator[None]:
    """Point sys.stdout/stderr at the process's real streams (file descriptors 1 and 2).

    Airflow binds its log handlers to sys.stdout when it is imported, and loggers made during a
    run bind it again. Under pytest, sys.stdout is then a capture object that may be closed
    later (``capfd`` closes its own after each test: "I/O operation on closed file"). The real
    streams are never closed, and pytest's default fd-level capture, ``capfd`` included, still
    sees what is written to them.
    """
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        yield
    finally:
        for stream in (sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        sys.stdout, sys.stderr = saved


class DagTester:
    """Runs ``dag.test()`` in this process, on DAG files in the in-process home's dags folder.

    The first run in a session builds the in-process execution API (about 15 s of CPU with the
    imports, mostly cadwyn generating its versioned routers); ``warm_up()`` does that on purpose
    (the ``dag_tester`` fixture calls it) and times it.
    Airflow is imported, and ``dag.test()`` runs, with sys.stdout/stderr on the real file
    descriptors (see ``real_std_streams``): read task output (``print``, task logs) with
    ``capfd``, not ``capsys``.
    """

    def __init__(self, dags_folder: Path) -> None:
        self.dags_folder = dags_folder
        self._warm = False

    def write(self, name: str, source: str) -> Path:
        """Write a DAG file (``name`` relative to the dags folder) and return its path."""
        path = self.dags_folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return path

    def copy(self, src: Path, name: str | None = None) -> Path:
        dst = self.dags_folder / (name or src.name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        return dst

    def load(self, path: Path) -> dict[str, Any]:
        """Parse one DAG file as the dag-processor would; raise DagImportError on errors."""
        with real_std_streams():
            from airflow.dag_processing.dagbag import DagBag

            bag = DagBag(dag_folder=str(path))
        if bag.import_errors:
            raise DagImportError("\n".join(f"{k}: {v}" for k, v in bag.import_errors.items()))
        return dict(bag.dags)

    def warm_up(self) -> None:
        if self._warm:
            return
        started = time.monotonic()
        with real_std_streams():
            import airflow.sdk  # noqa: F401  (configures Airflow's logging, see real_std_streams)
            from airflow.sdk.execution_time.supervisor import in_process_api_server

            api = in_process_api_server()
            with httpx.Client(transport=api.transport, base_url="http://in-process.invalid") as c:
                c.get("/execution/health")
        TIMINGS.setdefault("dag.test in-process execution API warm-up", time.monotonic() - started)
        self._warm = True

    def run(
        self,
        dag_file: Path | str,
        *,
        dag_id: str | None = None,
        source: str | None = None,
        run_conf: dict[str, Any] | None = None,
        **test_kwargs: Any,
    ) -> DagTestResult:
        """Run ``dag.test(run_conf=..., **test_kwargs)`` on a DAG of ``dag_file``.

        ``dag_file`` is a path in the dags folder, or a name to write ``source`` to. ``dag_id``
        is needed only when the file defines several DAGs. ``test_kwargs`` go to ``dag.test()``
        (``logical_date``, ``run_after``, ``mark_success_pattern``, ``use_executor``...).
        """
        if source is not None:
            path = self.write(str(dag_file), source)
        else:
            path = Path(dag_file)
            if not path.is_absolute():
                path = self.dags_folder / path
        dags = self.load(path)
        if dag_id is None:
            if len(dags) != 1:
                raise ValueError(f"{path} defines {sorted(dags)}: pass dag_id")
            dag_id = next(iter(dags))
        dag = dags[dag_id]
        self.warm_up()
        started = time.monotonic()
        with real_std_streams():
            dr = dag.test(run_conf=run_conf, **test_kwargs)
        seconds = time.monotonic() - started
        tis, history = self.task_instances(dag_id, dr.run_id)
        return DagTestResult(
            dag=dag,
            run_id=dr.run_id,
            state=_state(dr.state),
            tis=tis,
            history=history,
            seconds=seconds,
        )

    @staticmethod
    def task_instances(
        dag_id: str, run_id: str
    ) -> tuple[list[TaskInstanceRecord], list[TaskInstanceRecord]]:
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.taskinstancehistory import TaskInstanceHistory
        from airflow.utils.session import create_session
        from sqlalchemy import select

        def records(model: Any) -> list[TaskInstanceRecord]:
            rows = session.scalars(
                select(model).where(model.dag_id == dag_id, model.run_id == run_id)
            )
            return sorted(
                (
                    TaskInstanceRecord(
                        task_id=r.task_id,
                        map_index=r.map_index,
                        state=_state(r.state),
                        try_number=r.try_number,
                        max_tries=r.max_tries,
                        rendered_map_index=r.rendered_map_index,
                    )
                    for r in rows
                ),
                key=lambda r: (r.task_id, r.map_index, r.try_number),
            )

        with create_session() as session:
            return records(TaskInstance), records(TaskInstanceHistory)


# ------------------------------------------------------------------------------ REST client


class AirflowApiError(RuntimeError):
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        super().__init__(
            f"{response.request.method} {response.request.url} -> {response.status_code}: "
            f"{response.text[:2000]}"
        )


def _q(segment: str | int) -> str:
    return urllib.parse.quote(str(segment), safe="")


class AirflowClient:
    """The Airflow 3 public REST API (``/api/v2``), authenticated with a JWT.

    The token comes from ``POST /auth/token`` with the simple auth manager's user and password
    (201, ``{"access_token": ...}``) and goes in ``Authorization: Bearer``. Without it the API
    answers 401 (``Not authenticated``); with a malformed or wrongly signed one, 403.
    """

    def __init__(
        self,
        base_url: str,
        username: str = USERNAME,
        password: str = PASSWORD,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self._token: str | None = None

    def close(self) -> None:
        self.http.close()

    # -- plumbing

    def token(self, *, fresh: bool = False) -> str:
        if self._token is None or fresh:
            resp = self.http.post(
                "/auth/token", json={"username": self.username, "password": self.password}
            )
            if resp.status_code != 201:
                raise AirflowApiError(resp)
            self._token = str(resp.json()["access_token"])
        return self._token

    def request(
        self,
        method: str,
        path: str,
        *,
        auth: bool = True,
        expect: Iterable[int] | None = (200,),
        **kwargs: Any,
    ) -> httpx.Response:
        """One request; ``expect=None`` returns any response, otherwise others raise. A 500
        whose reason is SQLite's "database is locked" (the API server's metadata database is a
        file that the scheduler and the task processes write too; Airflow does not retry it)
        is sent again, for up to 30 s: every request here sets a state or reads one, so
        sending it again does what it would have done."""
        headers = dict(kwargs.pop("headers", None) or {})
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        end = time.monotonic() + 30
        while True:
            resp = self.http.request(method, path, headers=headers, **kwargs)
            locked = resp.status_code == 500 and "database is locked" in resp.text
            if not locked or time.monotonic() > end:
                break
            time.sleep(0.5)
        if expect is not None and resp.status_code not in tuple(expect):
            raise AirflowApiError(resp)
        return resp

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    @staticmethod
    def _run_path(dag_id: str, run_id: str) -> str:
        return f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}"

    def _ti_path(self, dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
        path = f"{self._run_path(dag_id, run_id)}/taskInstances/{_q(task_id)}"
        return path if map_index is None or map_index < 0 else f"{path}/{map_index}"

    # -- health, DAGs

    def health(self) -> dict[str, Any]:
        return dict(self.request("GET", "/api/v2/monitor/health", auth=False).json())

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        resp = self.request("GET", f"/api/v2/dags/{_q(dag_id)}", expect=(200, 404))
        return None if resp.status_code == 404 else dict(resp.json())

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the dag-processor has serialized ``dag_id`` (and it is not stale)."""

        def ready() -> dict[str, Any] | None:
            dag = self.dag(dag_id)
            return dag if dag and not dag.get("is_stale") else None

        return dict(wait_until(ready, timeout=timeout, what=f"DAG {dag_id} to be parsed"))

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{_q(dag_id)}", json={"is_paused": paused})

    def import_errors(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/importErrors")["import_errors"])

    # -- DAG runs

    def trigger(
        self,
        dag_id: str,
        conf: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        note: str | None = None,
    ) -> str:
        """Trigger a run (``conf`` carries the params) and return its run id."""
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        if note:
            body["note"] = note
        resp = self.request("POST", f"/api/v2/dags/{_q(dag_id)}/dagRuns", json=body)
        return str(resp.json()["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(self._run_path(dag_id, run_id)))

    def wait_dag_run(
        self,
        dag_id: str,
        run_id: str,
        states: Sequence[str] = TERMINAL_RUN_STATES,
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            last.update(self.dag_run(dag_id, run_id))
            return dict(last) if last.get("state") in states else None

        try:
            return dict(wait_until(reached, timeout=timeout, interval=0.5))
        except TimeoutError:
            tis = [
                (t["task_id"], t["map_index"], t["state"])
                for t in self.task_instances(dag_id, run_id)
            ]
            raise TimeoutError(
                f"run {dag_id}/{run_id} still {last.get('state')!r} after {timeout:.0f} s "
                f"(wanted {list(states)}); task instances: {tis}"
            ) from None

    def set_dag_run_state(self, dag_id: str, run_id: str, state: str) -> dict[str, Any]:
        """Mark a run ``success``, ``failed`` or ``queued`` (PATCH, as the UI does)."""
        return dict(
            self.request("PATCH", self._run_path(dag_id, run_id), json={"state": state}).json()
        )

    # -- task instances

    def task_instances(
        self, dag_id: str, run_id: str, task_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every task instance of a run, mapped ones included (``map_index``), all pages."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 100, "offset": 0, "order_by": "map_index"}
        if task_id:
            params["task_id"] = task_id
        while True:
            page = self.get(f"{self._run_path(dag_id, run_id)}/taskInstances", params=params)
            out.extend(page["task_instances"])
            params["offset"] += len(page["task_instances"])
            if not page["task_instances"] or params["offset"] >= page["total_entries"]:
                return out

    def task_instance(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> dict[str, Any]:
        return dict(self.get(self._ti_path(dag_id, run_id, task_id, map_index)))

    def wait_task_instance(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        states: Sequence[str],
        *,
        map_index: int = -1,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            last.update(self.task_instance(dag_id, run_id, task_id, map_index))
            return dict(last) if last.get("state") in states else None

        try:
            return dict(wait_until(reached, timeout=timeout, interval=0.25))
        except TimeoutError:
            raise TimeoutError(
                f"{dag_id}/{run_id}/{task_id}[{map_index}] still {last.get('state')!r} "
                f"(try {last.get('try_number')}) after {timeout:.0f} s, wanted {list(states)}"
            ) from None

    def set_task_instance_state(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        state: str,
        *,
        map_index: int | None = None,
    ) -> list[dict[str, Any]]:
        """Mark a task instance ``failed``, ``success`` or ``skipped`` (PATCH, as the UI does).

        A running one is then killed by its supervisor at its next heartbeat (SIGTERM to the task
        process group, SIGKILL 5 s later).
        """
        resp = self.request(
            "PATCH",
            self._ti_path(dag_id, run_id, task_id, map_index),
            json={"new_state": state},
        )
        return list(resp.json()["task_instances"])

    def clear_task_instances(
        self,
        dag_id: str,
        run_id: str,
        task_ids: Sequence[str | tuple[str, int]],
        *,
        only_failed: bool = False,
        include_downstream: bool = False,
        reset_dag_runs: bool = True,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Clear task instances (``(task_id, map_index)`` for one mapped instance), as the UI.

        A running one goes to ``restarting`` and gets a new task instance id; its process is
        killed at its next heartbeat (410 Gone), and the scheduler runs it again.
        """
        body = {
            "dag_run_id": run_id,
            "task_ids": [list(t) if isinstance(t, tuple) else t for t in task_ids],
            "only_failed": only_failed,
            "include_downstream": include_downstream,
            "reset_dag_runs": reset_dag_runs,
            "dry_run": dry_run,
        }
        resp = self.request("POST", f"/api/v2/dags/{_q(dag_id)}/clearTaskInstances", json=body)
        return list(resp.json()["task_instances"])

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, *, map_index: int = -1
    ) -> str:
        """A try's log as text (one line per event: the event text, then its fields)."""
        path = f"{self._ti_path(dag_id, run_id, task_id, None)}/logs/{try_number}"
        data = self.get(
            path,
            params={"map_index": map_index, "full_content": "true"},
            headers={"Accept": "application/json"},
        )
        lines = []
        for item in data.get("content", []):
            if isinstance(item, dict):
                extra = {k: v for k, v in item.items() if k not in ("event", "timestamp")}
                lines.append(f"{item.get('event', '')} {extra if extra else ''}".rstrip())
            else:
                lines.append(str(item))
        return "\n".join(lines)

    # -- task state store (Airflow 3.3)

    def _state_store_path(self, dag_id: str, run_id: str, task_id: str) -> str:
        return f"{self._ti_path(dag_id, run_id, task_id, None)}/state-store"

    def state_store(
        self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
    ) -> dict[str, Any]:
        """All keys of one task instance's state store, as ``{key: value}``."""
        data = self.get(
            self._state_store_path(dag_id, run_id, task_id),
            params={"map_index": map_index, "limit": 100},
        )
        return {e["key"]: e["value"] for e in data["task_state_store"]}

    def state_store_get(
        self, dag_id: str, run_id: str, task_id: str, key: str, *, map_index: int = -1
    ) -> Any:
        """One key's value, or None when it is not set (404)."""
        resp = self.request(
            "GET",
            f"{self._state_store_path(dag_id, run_id, task_id)}/{_q(key)}",
            params={"map_index": map_index},
            expect=(200, 404),
        )
        return None if resp.status_code == 404 else resp.json()["value"]


# ------------------------------------------------------------------------------ live stack


def processes_with_marker(marker_value: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment has STACK_MARKER=marker_value."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(STACK_MARKER) == marker_value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def kill_stray(stray: list[psutil.Process]) -> list[str]:
    """SIGKILL processes a component left behind, wait for them; what was killed, described."""
    killed = [f"SIGKILLed {d}" for d in describe(stray)]
    for p in stray:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(stray, timeout=5)
    return killed


def describe(procs: Iterable[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            out.append(f"{p.pid} (gone)")
    return out


def tail(path: Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 200 * lines))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


class StackError(RuntimeError):
    pass


@dataclass
class AirflowStack:
    """A live Airflow: scheduler, dag-processor and api-server on 127.0.0.1, sqlite, LocalExecutor.

    ``home`` gets its own dags, plugins and logs folders, its own copy of a migrated database
    (``template_db``) and its own port. Components log to ``<home>/<component>.log``.
    ``extra_env`` overrides any setting (for example a CeleryExecutor stack, or a lower
    ``[scheduler] task_instance_heartbeat_timeout``).
    """

    home: Path
    template_db: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    plugin_files: Sequence[Path] = ()
    components: Sequence[str] = ("scheduler", "dag-processor", "api-server")
    # More components: name -> airflow CLI arguments (e.g. {"worker-a": ["celery", "worker"]}),
    # and per-component settings on top of the stack's (e.g. a worker's own TMPDIR or host id).
    extra_commands: dict[str, list[str]] = field(default_factory=dict)
    component_env: dict[str, dict[str, str]] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    marker: str = field(default_factory=lambda: secrets.token_hex(8))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    start_seconds: float | None = None
    stop_seconds: float | None = None
    pss_bytes: int | None = None
    start_cpu_seconds: float | None = None
    leftovers: list[str] = field(default_factory=list)
    _client: AirflowClient | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dags_folder(self) -> Path:
        return self.home / "dags"

    @property
    def logs_folder(self) -> Path:
        return self.home / "logs"

    @property
    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")])
        return {
            **clean_environ(),
            **airflow_env(self.home, port=self.port),
            "PATH": path,
            "PYTHONUNBUFFERED": "1",
            STACK_MARKER: self.marker,
            **self.extra_env,
        }

    def log_path(self, component: str) -> Path:
        return self.home / f"{component}.log"

    @property
    def client(self) -> AirflowClient:
        if self._client is None:
            self._client = AirflowClient(self.base_url)
        return self._client

    def _command(self, component: str) -> list[str]:
        args = {
            "scheduler": ["scheduler", "--skip-serve-logs"],
            "dag-processor": ["dag-processor"],
            "api-server": ["api-server", "--host", "127.0.0.1", "--port", str(self.port)],
            "triggerer": ["triggerer", "--skip-serve-logs"],
            **self.extra_commands,
        }[component]
        return [str(AIRFLOW_BIN), *args]

    # -- start and stop

    def start(self, timeout: float = 180.0) -> None:
        prepare_home(self.home)
        copy_sqlite(self.template_db, self.home / "airflow.db")
        for plugin in self.plugin_files:
            shutil.copyfile(plugin, self.home / "plugins" / plugin.name)
        started = time.monotonic()
        for component in self.components:
            env = {**self.env, **self.component_env.get(component, {})}
            with open(self.log_path(component), "ab") as log:
                self.procs[component] = subprocess.Popen(
                    self._command(component),
                    env=env,
                    cwd=self.home,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, so that stop() finds all
                )
        try:
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.pss_bytes = self.memory()
        self.start_cpu_seconds = self.cpu_seconds()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(
                    f"airflow {name} exited {proc.returncode} while starting; "
                    f"{self.log_path(name)}:\n{tail(self.log_path(name))}"
                )

    def _get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(f"{self.base_url}{path}", timeout=60)
        except httpx.HTTPError:
            return None

    def _wait_ready(self, deadline: float) -> None:
        wanted = {"metadatabase"}
        if "scheduler" in self.components:
            wanted.add("scheduler")
        if "dag-processor" in self.components:
            wanted.add("dag_processor")
        if "triggerer" in self.components:
            wanted.add("triggerer")

        def poll(path: str, ok: Callable[[httpx.Response], bool]) -> httpx.Response:
            while time.monotonic() < deadline:
                self._check_alive()
                resp = self._get(path)
                if resp is not None and ok(resp):
                    return resp
                time.sleep(0.25)
            raise StackError(f"Airflow at {self.base_url} not ready in time ({path})")

        if "api-server" not in self.components:
            return
        # The first request to /execution builds its versioned routers (about 10 s of CPU),
        # during which the api-server answers nothing: do it first, while the scheduler and
        # the dag-processor start, rather than in a test.
        poll("/execution/health", lambda r: r.status_code == 200)
        poll(
            "/api/v2/monitor/health",
            lambda r: (
                r.status_code == 200
                and all((r.json().get(k) or {}).get("status") == "healthy" for k in wanted)
            ),
        )

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the stack; afterwards none of its processes is left.

        Running tasks get SIGTERM first (their ``on_kill`` runs): the scheduler's LocalExecutor
        otherwise waits for them to finish before the scheduler exits. Then each component gets
        SIGTERM; what is still alive after ``timeout`` seconds is SIGKILLed, by process group,
        by the process trees seen before, and by the stack's marker variable.
        """
        if not self.procs:
            return
        started = time.monotonic()
        before = self.processes()
        for p in self.task_processes():
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = started + timeout
        for name, proc in self.procs.items():
            # Once uvicorn is done, the api-server spends seconds in garbage collection at
            # interpreter exit: it has nothing left to do.
            done = f"Finished server process [{proc.pid}]" if name == "api-server" else None
            while proc.poll() is None and time.monotonic() < deadline:
                if done and done in tail(self.log_path(name), 20):
                    proc.kill()
                time.sleep(0.1)
            if proc.poll() is None:
                self.leftovers.append(
                    f"{name} (pid {proc.pid}) still running {timeout} s after SIGTERM"
                )
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its LocalExecutor workers and the like
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        # a process just killed with its group is gone once the kernel has taken it down:
        # look again for up to 3 s before calling what is left a stray
        look_until = time.monotonic() + 3.0
        while True:
            stray = [p for p in before if _alive(p)]
            stray += [p for p in processes_with_marker(self.marker) if p not in stray]
            if not stray or time.monotonic() > look_until:
                break
            time.sleep(0.05)
        self.leftovers.extend(kill_stray(stray))
        self.stop_seconds = time.monotonic() - started
        self.procs = {}
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- using it

    def airflow(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command against this stack's home and database."""
        return run_airflow_cli(args, self.env, timeout=timeout, cwd=self.home)

    def add_dag(
        self,
        name: str,
        source: str | None = None,
        *,
        copy_from: Path | None = None,
        dag_id: str | None = None,
        reserialize: bool = False,
        timeout: float = 60.0,
    ) -> Path:
        """Put a DAG file in the stack's dags folder and wait until ``dag_id`` is parsed.

        The dag-processor lists the folder every second (``refresh_interval``); a changed file
        is parsed again after ``min_file_process_interval`` (5 s): pass ``reserialize=True``
        to run ``airflow dags reserialize`` at once instead (about 5 s, mostly imports).
        """
        path = self.dags_folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if copy_from is not None:
            shutil.copyfile(copy_from, path)
        elif source is not None:
            path.write_text(source)
        else:
            raise ValueError("pass source or copy_from")
        started = time.monotonic()
        if reserialize:
            self.airflow("dags", "reserialize")
        if dag_id:
            self.client.wait_for_dag(dag_id, timeout=timeout)
            how = "airflow dags reserialize" if reserialize else "dag-processor"
            TIMINGS.setdefault(f"new DAG file to parsed DAG ({how})", time.monotonic() - started)
        return path

    def processes(self) -> list[psutil.Process]:
        """Every live process of this stack (components, executor workers, tasks).

        The components' process trees, and any process that carries the stack's marker variable
        (an orphan). The marker alone is not enough: ``setproctitle`` (api-server, LocalExecutor
        workers, task supervisors) overwrites a process's environment block.
        """
        found: dict[int, psutil.Process] = {}
        for proc in self.procs.values():
            try:
                root = psutil.Process(proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    found.setdefault(p.pid, p)
            except psutil.NoSuchProcess:
                continue
        for p in processes_with_marker(self.marker):
            found.setdefault(p.pid, p)
        return [p for p in found.values() if _alive(p)]

    def task_processes(self) -> list[psutil.Process]:
        """Processes of the stack other than the components and their executor workers."""
        keep = set()
        for proc in self.procs.values():
            keep.add(proc.pid)
            try:
                parent = psutil.Process(proc.pid)
                keep.update(c.pid for c in parent.children(recursive=False))
            except psutil.NoSuchProcess:
                pass
        return [p for p in self.processes() if p.pid not in keep]

    def memory(self) -> int:
        """Total PSS of the stack's processes, in bytes."""
        total = 0
        for p in self.processes():
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return total

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the stack's live processes."""
        total = 0.0
        for p in self.processes():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return total

    def listening_addresses(self) -> list[tuple[str, int, str]]:
        """(ip, port, process name) of every listening TCP socket of the stack."""
        out = []
        for p in self.processes():
            try:
                conns = p.net_connections(kind="inet")
                name = " ".join(p.cmdline()[:3])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    out.append((c.laddr.ip, c.laddr.port, name))
        return out

    def report(self, lines: int = 60) -> str:
        """Log paths and tails, for a failing test's report."""
        parts = []
        for component in self.components:
            path = self.log_path(component)
            parts.append(f"===== airflow {component}: {path} (last {lines} lines)")
            parts.append(tail(path, lines))
        parts.append(f"===== task logs under {self.logs_folder}")
        return "\n".join(parts)


# ------------------------------------------------------------------------------ Celery hosts


def redis_server_binary() -> str | None:
    """Debian's ``redis-server`` (the Celery broker of the several-hosts tests), or None."""
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )


@dataclass
class RedisServer:
    """``redis-server`` on 127.0.0.1 and a free port: no persistence, its files in ``folder``."""

    folder: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def log_path(self) -> Path:
        return self.folder / "redis.log"

    def start(self, timeout: float = 30.0) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise StackError("redis-server is not installed (Debian package redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        args += ["no", "--dir", str(self.folder), "--daemonize", "no"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [binary, *args],
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StackError(f"redis-server did not start:\n{tail(self.log_path)}")
            time.sleep(0.1)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class CeleryWorker:
    """``airflow celery worker`` standing in for one host: its own folder (cwd, ``TMPDIR``
    ``<folder>/tmp``), its own ``OPENJD_CHECKPOINT_HOST_ID`` (which every task it runs
    inherits), its own Celery hostname; it consumes the ``default`` queue.

    ``env`` is the stack's environment (``AirflowStack.env``: the Celery settings with it).
    Logs serving is off (``--skip-serve-logs``): both workers share the stack's logs folder
    and port 8793 would clash; the api-server reads the task logs from the files.
    """

    host: str
    folder: Path
    env: dict[str, str]
    concurrency: int = 1
    queues: str = "default"
    proc: subprocess.Popen[bytes] | None = None
    leftovers: list[str] = field(default_factory=list)
    starts: int = 0
    _log_offset: int = 0

    @property
    def log_path(self) -> Path:
        return self.folder / "worker.log"

    def start(self) -> None:
        """Start the worker (not waiting for it: see ``wait_ready``)."""
        if self.running():
            return
        (self.folder / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            **self.env,
            "OPENJD_CHECKPOINT_HOST_ID": self.host,
            "TMPDIR": str(self.folder / "tmp"),
            "PYTHONUNBUFFERED": "1",
        }
        cmd = [str(AIRFLOW_BIN), "celery", "worker", "--celery-hostname", self.host]
        cmd += ["--concurrency", str(self.concurrency), "--queues", self.queues]
        cmd += ["--skip-serve-logs", "--pid", str(self.folder / "worker.pid")]
        cmd += ["--without-mingle", "--without-gossip"]  # no chatter between the workers
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait for Celery's ``celery@<host> ready.`` (connected, consuming)."""
        deadline = time.monotonic() + timeout
        while f"@{self.host} ready." not in self.log_since_start():
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise StackError(f"celery worker {self.host} exited {code}:\n{tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise StackError(f"celery worker {self.host} not ready in {timeout:.0f} s")
            time.sleep(0.25)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tree(self) -> list[psutil.Process]:
        """The worker's main process and all its live descendants (Celery's pool processes,
        the task supervisors, task runners and the OpenJD task processes under them)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [p for p in [root, *root.children(recursive=True)] if _alive(p)]
        except psutil.NoSuchProcess:
            return []

    def kill_tree(self, spare: Callable[[psutil.Process], bool] = lambda p: False) -> list[int]:
        """SIGKILL the worker and every descendant (collected first), except those ``spare``
        says to leave; return the pids killed. With nothing spared, the host died."""
        victims = [p for p in self.tree() if not spare(p)]
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=10)
        if self.proc is not None and any(p.pid == self.proc.pid for p in victims):
            self.proc.wait(10)  # reap the main process (our child)
            self.proc = None  # gone: start() starts it again
        return [p.pid for p in victims]

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL to what is left after ``timeout``;
        afterwards no process of the worker is alive (``leftovers`` tells what was killed)."""
        if self.proc is None:
            return
        before = self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.leftovers.append(f"worker {self.host} still running {timeout} s after SIGTERM")
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.leftovers.extend(kill_stray([p for p in before if _alive(p)]))
        self.proc = None
