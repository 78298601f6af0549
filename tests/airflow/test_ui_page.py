"""The plugin's UI page in a real browser (headless Chromium, driven through the DevTools
protocol: ``browser.py``) against the live stack: without a session the page shows the API's
401; with the session cookie its script fills the table with what only the live API knows (the
job run id, the task's checkpoint generation and state size); its Suspended button ends the
run, and the page then shows the run interrupted with the checkpoint the store keeps."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import airflow_helpers as ah
import pytest
from browser import CHROMIUM, Chromium, Page

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "tests" / "data" / "counter.yaml"
COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r})
"""

# What the page shows, read in the page after its scripts ran.
SNAPSHOT = """(() => {
  const text = (id) => document.getElementById(id).textContent;
  return {
    jobRun: text("job-run"), status: text("status"), condition: text("condition"),
    error: text("error"), result: text("result"),
    rows: [...document.querySelectorAll("#tasks tr.task")].map(
      (row) => [...row.cells].map((cell) => cell.textContent)),
  };
})()"""
COLUMNS = ("task", "status", "generation", "saved", "state bytes", "files", "frames", "resume")


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    if not CHROMIUM.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (CI installs Debian's chromium: .ci/run)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); not in CI")
    browser = Chromium(CHROMIUM)
    try:
        yield browser.start()
    finally:
        browser.close()
    assert not browser.leftovers, browser.leftovers
    assert not browser.root.exists()


def rows(snapshot: dict[str, Any]) -> list[dict[str, str]]:
    return [dict(zip(COLUMNS, row, strict=True)) for row in snapshot["rows"]]


def test_page_in_headless_chromium(
    airflow_live: ah.AirflowStack, chromium: Chromium, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "ui_page_counter"
    store = tmp_path / "store"
    source = DAG_FILE.format(template=str(COUNTER), dag_id=dag_id, store=str(store))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    # Counts for far longer than the test, storing a checkpoint every 5 steps (1 s).
    run_id = client.trigger(dag_id, conf={"N": 100000, "StepSeconds": 0.2, "SaveEvery": 5})
    api = f"/openjd/dags/{dag_id}/dagRuns/{run_id}/checkpoints"

    def checkpointed() -> dict[str, Any] | None:
        for p in store.glob("jobs/*/runs/*/tasks/*.json"):
            if ".gen-" not in p.name:
                rec = json.loads(p.read_text())
                if rec["status"] == "running" and rec.get("checkpoint"):
                    return rec
        return None

    first = ah.wait_until(checkpointed, timeout=120, what="the Count task to store a checkpoint")
    url = f"{airflow_live.base_url}/openjd/ui/runs/{dag_id}/{run_id}"
    page: Page = chromium.new_page()

    # No session: the page's script shows the API's refusal.
    page.navigate(url)
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the error", check=lambda s: s["error"])
    assert shown["error"].startswith("401 "), shown
    assert "Not authenticated" in shown["error"], shown
    assert shown["jobRun"] == "…" and shown["status"] == "loading" and not shown["rows"], shown

    # Once the session cookie is there (what Airflow's login leaves), the page's next reload
    # (every 3 s) fills the table from the live API and clears the error.
    page.set_cookie(airflow_live.base_url + "/", COOKIE, client.token())
    shown = page.wait_for(
        SNAPSHOT, timeout=60, what="the table to fill", check=lambda s: s["rows"] and s["jobRun"]
    )
    listing = client.request("GET", api).json()
    assert shown["error"] == "", shown
    assert shown["jobRun"] == listing["run_id"] == first["run_id"], shown
    assert shown["status"] == "running"
    [row] = rows(shown)
    assert row["task"] == "Count" and row["status"] == "running", row
    # Checkpoints keep coming while it runs: what the page showed is from the store, and no
    # later than what the endpoint says now.
    [task] = listing["tasks"]
    assert 1 <= int(row["generation"]) <= task["checkpoints"][-1]["generation"], (row, task)
    assert int(row["state bytes"]) > 0

    # The Suspended button: the endpoint's answer is shown, and the run ends interrupted.
    page.evaluate('terminate("Suspended")')
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the result", check=lambda s: s["result"])
    assert shown["result"].startswith("200 "), shown
    assert json.loads(shown["result"][4:])["mode"] == "Suspended"
    run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert run["state"] == "failed"
    listing = client.request("GET", api).json()
    assert listing["status"] == "interrupted" and listing["condition"]["reason"] == "Suspended"
    [task] = listing["tasks"]
    last = task["checkpoints"][-1]
    [record] = [
        json.loads(p.read_text())
        for p in store.glob("jobs/*/runs/*/tasks/*.json")
        if ".gen-" not in p.name
    ]
    assert record["checkpoint"]["generation"] == last["generation"]
    assert len(record["checkpoint"]["state"].encode()) == last["state_bytes"]

    # The page reloads every 3 s: it now shows the ended run and its last checkpoint.
    shown = page.wait_for(
        SNAPSHOT,
        timeout=60,
        what="the page to show the run interrupted",
        check=lambda s: s["status"] == "interrupted",
    )
    assert shown["condition"].startswith("Suspended"), shown
    [row] = rows(shown)
    assert row["status"] == "interrupted", row
    assert row["generation"] == str(last["generation"]), (row, last)
    assert row["state bytes"] == str(last["state_bytes"]), (row, last)
