"""The ``docs/airflow.md`` shell blocks marked ``<!-- doc-test: run airflow -->`` run as written
(``tests/doc_blocks.py``): the shared machine recipe, pasted into one shell as a person would,
with its port (18793) replaced by a free loopback one and ``~`` a temporary folder (so its
``AIRFLOW_HOME`` and the default checkpoint store are ours); then, on one short DAG run of
``openjd_fibonacci`` triggered through the REST API, the token and ``/checkpoints`` block, with
PASSWORD and RUN_ID filled in, whose answer has the keys the doc states; then the doc's stop,
in the same shell, after which no process of that Airflow home is left.

It shares nothing with the other Airflow tests (its own home, database, ports and store) and
runs last in the session (``airflow_fixtures.pytest_collection_modifyitems``), when the other
tests no longer compete with its components for the CPU.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from doc_blocks import Block, all_blocks  # noqa: E402
from doc_runner import Shell, free_port, run_block  # noqa: E402

pytestmark = pytest.mark.slow

DOC = "docs/airflow.md"
DOC_PORT = 18793
DAG_ID = "openjd_fibonacci"
BLOCKS = [b for b in all_blocks() if b.marker == "run airflow"]
ROLES = {"start": "airflow api-server &", "stop": "kill %1", "call": "/auth/token"}


def _block(role: str) -> Block:
    [block] = [b for b in BLOCKS if ROLES[role] in b.text]
    return block


def documented_shape() -> dict[str, Any]:
    """The ``/checkpoints`` answer as the doc states it (``{"dag_id", "tasks": [{...}], ...}``),
    as JSON whose leaves are None."""
    text = (ROOT / DOC).read_text()
    m = re.search(r"`/checkpoints` answers\s+`(\{.*?\})`", text, re.S)
    assert m, f"{DOC}: no '`/checkpoints` answers `{{...}}`'"
    shape = re.sub(r'"(\w+)"(?=\s*[,}\]])', r'"\1": null', " ".join(m.group(1).split()))
    return json.loads(shape)


def assert_shape(doc: Any, got: Any, where: str = "answer") -> None:
    if isinstance(doc, dict):
        assert isinstance(got, dict), f"{where}: {got!r} is not an object"
        assert set(got) == set(doc), f"{where}: keys {sorted(got)}, the doc says {sorted(doc)}"
        for key, value in doc.items():
            if value is not None:
                assert_shape(value, got[key], f"{where}.{key}")
    elif isinstance(doc, list):
        assert isinstance(got, list) and got, f"{where}: {got!r} is not a non-empty list"
        for i, item in enumerate(got):
            assert_shape(doc[0], item, f"{where}[{i}]")


def test_every_airflow_block_is_run_here() -> None:
    assert len(BLOCKS) == len(ROLES), [b.where for b in BLOCKS]
    for role in ROLES:
        _block(role)  # exactly one block each


def test_the_shared_machine_recipe_runs_as_written(tmp_path: Path) -> None:
    port = free_port()
    # nothing of the suite's own Airflow, nor a store of the developer's
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "OPENJD_"))}
    env["HOME"] = str(tmp_path)  # ~/airflow-openjd, ~/.local/state/openjd-checkpoint
    home = tmp_path / "airflow-openjd"
    shell = Shell(
        venv=Path(sys.prefix), log=tmp_path / "shell.log", env=env, ports={DOC_PORT: port}
    )
    api = f"http://127.0.0.1:{port}"

    def waited(what: str, timeout: float, probe):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert shell.alive(), f"the shell ended, waiting for {what}:\n{shell.output()[-4000:]}"
            try:
                value = probe()
            except (httpx.HTTPError, OSError, ValueError, KeyError):
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"no {what} in {timeout} s:\n{shell.output()[-4000:]}")

    try:
        shell.send(_block("start"))
        waited(
            "healthy API server", 240, lambda: httpx.get(f"{api}/api/v2/monitor/health").is_success
        )
        passwords = home / "simple_auth_manager_passwords.json.generated"
        password = waited("password file", 30, lambda: json.loads(passwords.read_text())["admin"])
        token = httpx.post(
            f"{api}/auth/token", json={"username": "admin", "password": password}
        ).json()["access_token"]
        client = httpx.Client(
            base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        waited("parsed DAG", 120, lambda: client.get(f"/api/v2/dags/{DAG_ID}").is_success)
        client.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).raise_for_status()
        run = client.post(
            f"/api/v2/dags/{DAG_ID}/dagRuns",
            json={"logical_date": None, "conf": {"N": 16, "StepSeconds": 0.5}},
        )
        run.raise_for_status()
        run_id = run.json()["dag_run_id"]
        quoted = urllib.parse.quote(run_id, safe="")
        checkpoints = f"/openjd/dags/{DAG_ID}/dagRuns/{quoted}/checkpoints"
        waited(  # a checkpoint stored: the answer then has every key the doc names
            "stored checkpoint",
            120,
            lambda: any(t["checkpoints"] for t in client.get(checkpoints).json()["tasks"]),
        )

        call = _block("call")
        call = replace(call, text=call.text.replace("PASSWORD", password).replace("RUN_ID", run_id))
        done = run_block(call, venv=Path(sys.prefix), env=env, ports={DOC_PORT: port}, timeout=60)
        assert done.returncode == 0, f"{call.where} failed ({done.returncode}):\n{done.stdout}"
        answer = json.loads(done.stdout)
        assert_shape(documented_shape(), answer)
        assert answer["dag_id"] == DAG_ID and answer["dag_run_id"] == run_id, answer
        assert answer["status"] == "running", answer
        assert [t["step"] for t in answer["tasks"]] == ["ResumableFibonacci"], answer

        def ended() -> str | None:
            state = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quoted}").json()["state"]
            return state if state in ("success", "failed") else None

        state = waited("ended DAG run", 120, ended)
        assert state == "success", shell.output()[-4000:]

        shell.send(_block("stop"))
        code = shell.exit(timeout=90)
        assert code == 0, f"the shell ended with {code}:\n{shell.output()[-4000:]}"
        left = _processes_of(home)
        assert not left, f"left running after the doc's stop: {left}"
    finally:
        shell.kill()


def _processes_of(home: Path) -> list[str]:
    """Live processes whose AIRFLOW_HOME is ``home``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("AIRFLOW_HOME") == str(
                home
            ):
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])}")
        except psutil.Error:
            pass
    return found
