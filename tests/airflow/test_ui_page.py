"""The plugin's UI page in a real browser (headless Chromium, driven through the DevTools
protocol: ``browser.py``) against the live stack, through one job run's life:

1. running: without a session the page says to sign in to Airflow (its fragment answers
   401); with the session cookie it shows what only the live API knows (the job run id, the
   task's checkpoint generations and state sizes), the task's timeline (one ``.attempt`` bar,
   a ``.checkpoint`` mark per stored generation) and the buttons of the four termination
   modes, each saying what it does;
2. suspended (its Suspend button clicked): states in the CLI's words (``suspended``), the
   checkpoint history the store keeps, the resume hint, no end buttons, and no more polling;
3. succeeded (a new DAG run with ``resume=latest``): the run ``finished``, the note that its
   checkpoints were deleted at its end and what was kept until then, the timeline of both
   attempts from the run record's summary (``RunRecord.kept``), no end buttons;
4. the same run in Airflow's own UI (its React app, signed in by the same cookie): the DAG
   run's "OpenJD checkpoints" tab holds the page in an iframe, filled as above.

A screenshot of each (1000 px wide) is taken; with ``OPENJD_WRITE_SCREENSHOTS=1`` they are
written to ``docs/images/airflow-page-{running,suspended,succeeded}.png`` (the doc's pictures).
"""

from __future__ import annotations

import base64
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import airflow_helpers as ah
import pytest
from browser import CHROMIUM, Chromium, Page

import core

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "tests" / "data" / "counter.yaml"
COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN
IMAGES = ROOT / "docs" / "images"
WIDTH = 1000

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template({template!r}, dag_id={dag_id!r}, store={store!r})
"""

# What the page shows, read in the page after its scripts ran.
SNAPSHOT = """(() => {
  const q = (sel, root = document) => root.querySelector(sel);
  const text = (sel, root = document) => {
    const e = q(sel, root);
    return e ? e.textContent : null;
  };
  const run = q("#openjd .run");
  return {
    error: text("#error"), result: text("#result"),
    jobRun: text("#job-run"), status: text("#status"), condition: text("#condition"),
    live: run ? run.dataset.live : null, runStatus: run ? run.dataset.status : null,
    ended: text("#ended-note"), hint: text("#resume-hint"),
    buttons: [...document.querySelectorAll("button[data-mode]")].map(
      (b) => [b.dataset.mode, b.textContent]),
    theme: document.documentElement.dataset.theme,
    background: getComputedStyle(document.body).backgroundColor,
    fetches: performance.getEntriesByType("resource").filter(
      (e) => e.name.endsWith("/page")).length,
    tasks: [...document.querySelectorAll("article.task")].map((a) => ({
      label: a.dataset.label, status: text(".state", a), facts: text(".facts", a),
      attempts: [...a.querySelectorAll(".track .attempt")].map((b) => ({
        left: parseFloat(b.style.left), width: parseFloat(b.style.width),
        klass: b.className})),
      checkpoints: [...a.querySelectorAll(".track .checkpoint")].map(
        (c) => [Number(c.dataset.generation), parseFloat(c.style.left)]),
      lines: [...a.querySelectorAll(".attempt-line")].map((l) => l.textContent),
      rows: [...a.querySelectorAll("tr.generation")].map(
        (r) => [...r.cells].map((c) => c.textContent)),
    })),
  };
})()"""
HISTORY = ("generation", "saved", "attempt", "state bytes", "files", "resume")


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


def history(task: dict[str, Any]) -> list[dict[str, str]]:
    return [dict(zip(HISTORY, row, strict=True)) for row in task["rows"]]


def screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    """A PNG of the whole page, ``WIDTH`` px wide; copied to ``docs/images`` when
    ``OPENJD_WRITE_SCREENSHOTS=1``."""
    height = int(page.evaluate("Math.ceil(document.body.getBoundingClientRect().bottom)"))
    page.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    data = base64.b64decode(page.call("Page.captureScreenshot", {"format": "png"})["data"])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">I", data[16:20])[0] == WIDTH  # the IHDR's width
    path = tmp_path / f"airflow-page-{name}.png"
    path.write_bytes(data)
    if os.environ.get("OPENJD_WRITE_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, IMAGES / path.name)
    return path


def _keys(store: core.CheckpointStore) -> tuple[str, str]:
    [run] = store.list_runs()[0]
    return run.job_key, run.run_id


def only_record(store: core.CheckpointStore) -> tuple[core.RunRecord, core.TaskRecord]:
    [run] = store.list_runs()[0]
    [rec] = store.read_tasks(run.job_key, run.run_id)[0]
    return run, rec


def test_page_in_headless_chromium(
    airflow_live: ah.AirflowStack, chromium: Chromium, tmp_path: Path
) -> None:
    client = airflow_live.client
    dag_id = "ui_page_counter"
    store_path = tmp_path / "store"
    source = DAG_FILE.format(template=str(COUNTER), dag_id=dag_id, store=str(store_path))
    airflow_live.add_dag(f"{dag_id}.py", source, dag_id=dag_id)
    # 300 steps of 0.1 s (30 s), a checkpoint every 10 steps (1 s): long enough for the page
    # to be read while it runs, short enough to finish once resumed.
    conf = {"N": 300, "StepSeconds": 0.1, "SaveEvery": 10}
    run_id = client.trigger(dag_id, conf=conf)
    api = f"/openjd/dags/{dag_id}/dagRuns/{run_id}/checkpoints"

    def checkpointed() -> core.TaskRecord | None:
        if not (store_path / "jobs").is_dir():
            return None
        store = core.CheckpointStore(store_path, create=False)
        if not store.list_runs()[0] or not store.read_tasks(*_keys(store))[0]:
            return None
        _run, rec = only_record(store)
        ck = rec.checkpoint
        return rec if rec.status.value == "running" and ck and ck.generation >= 2 else None

    first = ah.wait_until(checkpointed, timeout=120, what="the Count task to store 2 checkpoints")
    store = core.CheckpointStore(store_path, create=False)
    url = f"{airflow_live.base_url}/openjd/ui/runs/{dag_id}/{run_id}"
    page: Page = chromium.new_page()
    page.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )

    # --- no session: the shell answers, and says to sign in; no data in it ---
    page.navigate(url)
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the error", check=lambda s: s["error"])
    assert shown["error"].startswith("Sign in to Airflow"), shown
    assert "401" in shown["error"] and "Not authenticated" in shown["error"], shown
    assert shown["jobRun"] is None and not shown["tasks"] and not shown["buttons"], shown
    assert shown["theme"] == "light"  # headless Chromium prefers light; no Airflow mode stored

    # --- running: once the session cookie is there (what Airflow's login leaves), the page's
    # next load (every 3 s) fills it from the live API and clears the error ---
    page.set_cookie(airflow_live.base_url + "/", COOKIE, client.token())
    shown = page.wait_for(
        SNAPSHOT, timeout=60, what="the page to fill", check=lambda s: s["tasks"] and s["jobRun"]
    )
    listing = client.request("GET", api).json()
    assert shown["error"] == "", shown
    assert shown["jobRun"] == listing["run_id"] == first.run_id, shown
    assert shown["status"] == "running" and shown["live"] == "1", shown
    [task] = shown["tasks"]
    assert task["label"] == "Count" and task["status"] == "running", task
    assert [m for m, _ in shown["buttons"]] == [
        "Suspended",
        "StoppedRunFinally",
        "CancelledRunFinally",
        "Cancelled",
    ]
    assert dict(shown["buttons"])["Suspended"].startswith("Suspend: checkpoint running tasks")
    assert shown["ended"] is None and shown["hint"] is None
    # one attempt, running; a mark per stored generation, placed on the attempt's bar
    [bar] = task["attempts"]
    assert "running" in bar["klass"] and bar["left"] == 0 and bar["width"] > 50, bar
    rows = history(task)
    assert rows and [int(r["generation"]) for r in rows] == sorted(
        (int(r["generation"]) for r in rows), reverse=True
    )
    assert sorted(g for g, _ in task["checkpoints"]) == sorted(int(r["generation"]) for r in rows)
    assert all(0 <= left <= 100 for _, left in task["checkpoints"])
    # checkpoints keep coming while it runs: what the page showed is from the store, no later
    # than what the endpoint says now
    [listed] = listing["tasks"]
    assert 2 <= int(rows[0]["generation"]) <= listed["checkpoints"][-1]["generation"], rows
    assert all(int(r["state bytes"]) > 0 for r in rows)
    assert task["lines"][0].startswith("#1 from the top") and "running" in task["lines"][0]
    screenshot(page, "running", tmp_path)

    # --- suspended: its button ends the run; the endpoint's answer is shown ---
    page.evaluate('document.querySelector("button[data-mode=Suspended]").click()')
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the result", check=lambda s: s["result"])
    assert shown["result"] == "Asked the run to end: Suspended.", shown
    dag_run = client.wait_dag_run(dag_id, run_id, timeout=120)
    assert dag_run["state"] == "failed"
    listing = client.request("GET", api).json()
    assert listing["status"] == "interrupted" and listing["condition"]["reason"] == "Suspended"
    run, rec = only_record(store)
    stored = store.list_generations(rec)
    assert rec.checkpoint is not None and rec.checkpoint.generation == stored[-1].generation

    # the page loads again until it sees the run ended, then stops
    shown = page.wait_for(
        SNAPSHOT, timeout=60, what="the page to show the run ended", check=lambda s: s["ended"]
    )
    assert shown["status"] == "suspended" and shown["live"] == "0", shown
    assert shown["condition"].startswith("Suspended"), shown
    assert shown["buttons"] == [], shown
    assert "Clear" in shown["hint"] and "resume" in shown["hint"] and "latest" in shown["hint"]
    assert run.run_id in shown["hint"]
    [task] = shown["tasks"]
    assert task["status"] == "suspended", task  # the CLI's word, not "interrupted"
    assert len(task["attempts"]) == len(rec.history) == 1
    assert "interrupted" in task["attempts"][0]["klass"]
    assert task["lines"][0].startswith("#1 from the top: interrupted"), task["lines"]
    assert sorted(g for g, _ in task["checkpoints"]) == [g.generation for g in stored]
    rows = history(task)
    assert [int(r["generation"]) for r in rows] == [g.generation for g in reversed(stored)]
    assert rows[0]["state bytes"] == str(len(rec.checkpoint.state.encode())), rows
    assert rows[0]["attempt"] == "1"
    fetches = shown["fetches"]
    page.wait_for("new Promise((ok) => setTimeout(() => ok(true), 4000))", timeout=10)
    assert page.evaluate(SNAPSHOT)["fetches"] == fetches  # no more polling
    screenshot(page, "suspended", tmp_path)

    # --- succeeded: a new DAG run resumes the job run (resume=latest) and finishes it ---
    resumed_from = rec.checkpoint.generation
    second = client.trigger(dag_id, conf={**conf, "resume": "latest"})
    dag_run = client.wait_dag_run(dag_id, second, timeout=180)
    assert dag_run["state"] == "success", dag_run
    [run] = store.list_runs()[0]
    assert run.status == core.RunStatus.SUCCEEDED and run.kept is not None
    assert store.read_tasks(run.job_key, run.run_id)[0] == []  # deleted at the end
    [kept] = run.kept.tasks
    page.navigate(f"{airflow_live.base_url}/openjd/ui/runs/{dag_id}/{second}")
    shown = page.wait_for(
        SNAPSHOT, timeout=60, what="the succeeded run", check=lambda s: s["ended"]
    )
    assert shown["jobRun"] == run.run_id == first.run_id, shown
    assert shown["status"] == "finished" and shown["live"] == "0", shown
    assert shown["buttons"] == [] and shown["hint"] is None, shown
    assert "deleted its checkpoints at its end" in shown["ended"], shown
    assert f"stored {run.kept.generations} checkpoint generations" in shown["ended"], shown
    assert "1 interruption, 1 resume" in shown["ended"], shown
    [task] = shown["tasks"]
    assert task["label"] == "Count" and task["status"] == "succeeded", task
    assert len(task["attempts"]) == len(kept.history) == 2
    assert [a["klass"].split()[1] for a in task["attempts"]] == ["interrupted", "succeeded"]
    assert task["attempts"][0]["left"] == 0
    assert task["attempts"][1]["left"] > task["attempts"][0]["left"]
    assert sorted(g for g, _ in task["checkpoints"]) == [c.generation for c in kept.checkpoints]
    assert [int(r["generation"]) for r in history(task)] == [
        c.generation for c in reversed(kept.checkpoints)
    ]
    assert task["lines"][1].startswith(f"#2 resumed from generation {resumed_from}, saved "), task
    assert "succeeded" in task["lines"][1]
    assert "resume status RESUMED" in task["facts"], task
    screenshot(page, "succeeded", tmp_path)

    # Airflow's dark mode (the UI keeps it in localStorage, same origin): the page follows it.
    page.evaluate('localStorage.setItem("chakra-ui-color-mode", "dark")')
    page.navigate(f"{airflow_live.base_url}/openjd/ui/runs/{dag_id}/{second}")
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the dark page", check=lambda s: s["ended"])
    assert shown["theme"] == "dark" and shown["background"] == "rgb(17, 18, 23)", shown
    # No mode stored: the browser's preference (prefers-color-scheme) decides.
    page.evaluate('localStorage.removeItem("chakra-ui-color-mode")')
    page.call(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    page.navigate(f"{airflow_live.base_url}/openjd/ui/runs/{dag_id}/{second}")
    shown = page.wait_for(SNAPSHOT, timeout=60, what="the dark page", check=lambda s: s["ended"])
    assert shown["theme"] == "dark", shown
    page.call(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "light"}]},
    )
    assert page.wait_for(
        "document.documentElement.dataset.theme", timeout=10, check=lambda t: t == "light"
    )

    # --- the tab inside Airflow's own UI (its React app, signed in with the same cookie): the
    # DAG run's "OpenJD checkpoints" tab is an iframe of the page, which fills as above ---
    page.navigate(f"{airflow_live.base_url}/dags/{dag_id}/runs/{second}/plugin/openjd-checkpoints")
    framed = page.wait_for(
        """(() => {
          const f = document.querySelector('iframe[src*="/openjd/ui/runs/"]');
          const d = f && f.contentDocument;
          if (!d || !d.querySelector("#ended-note")) return null;
          const tab = [...document.querySelectorAll("a, button")].find(
            (e) => e.textContent.trim() === "OpenJD checkpoints");
          return {src: f.getAttribute("src"), tab: !!tab,
                   status: d.querySelector("#status").textContent,
                   tasks: [...d.querySelectorAll("article.task")].map((a) => a.dataset.label)};
        })()""",
        timeout=90,
        what="the OpenJD checkpoints tab's iframe in Airflow's UI",
    )
    # Airflow fills the href's {RUN_ID} URL-encoded (encodeURIComponent)
    assert unquote(framed["src"]).endswith(f"/openjd/ui/runs/{dag_id}/{second}"), framed
    assert framed["tab"], framed  # the tab is there, named as the plugin names it
    assert framed["status"] == "finished" and framed["tasks"] == ["Count"], framed
