"""The Airflow plugin: REST endpoints (behind Airflow's own authentication) and a UI page.

Mounted by the api-server under ``/openjd`` (register ``OpenJDCheckpointPlugin`` through the
``airflow.plugins`` entry point, or import it from a file in the plugins folder):

- ``POST /openjd/dags/{dag_id}/dagRuns/{dag_run_id}/termination`` with ``{"mode": MODE}``
  (``Cancelled``, ``CancelledRunFinally``, ``StoppedRunFinally``, ``Suspended``): asks the DAG
  run's job run to end in that mode through the core's cooperative request
  (``core.request_termination``; running tasks apply it within about a second, with their full
  notify periods: no 5 s cap). 200 ``{"mode", "note"}``; 404 when the DAG run has no job run;
  409 when the run has ended or is already stopping in a mode this one may not replace; 422
  for an unknown mode. Needs permission to edit the DAG's runs.
- ``GET /openjd/dags/{dag_id}/dagRuns/{dag_run_id}/checkpoints``: the job run's status, the
  store's file data flow (``file_data_flow``: ``shared`` or ``managed``, as the setup task saw
  it) and, per OpenJD task, its status, finished frames, resume status and checkpoint
  generations (number, time, state size in bytes, files, ``files_mode``: ``managed`` when the
  store keeps the files); never checkpoint states. Needs permission to read the DAG's task
  instances.
- ``GET /openjd/ui/runs/{dag_id}/{dag_run_id}``: a page showing the above, with buttons for the
  termination modes; shown as the "OpenJD checkpoints" tab of a DAG run (``external_views``). It
  calls the endpoints with the UI's session cookie.

Unauthenticated calls get 401, calls with a bad token 403.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Body, Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from ._config import BEGIN_TASK_ID, FILE_MODES

if TYPE_CHECKING:
    import core

URL_PREFIX = "/openjd"
MODES = ("Suspended", "StoppedRunFinally", "CancelledRunFinally", "Cancelled")

app = FastAPI(title="openjd-checkpoint", description=__doc__)


def _attempt(session: Any, dag_id: str, dag_run_id: str) -> dict[str, Any]:
    """The attempt the DAG run's setup task pushed (job key, run id, store)."""
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(
        run_id=dag_run_id, key="return_value", task_ids=BEGIN_TASK_ID, dag_ids=dag_id
    )
    row = session.scalars(query).first()
    value = XComModel.deserialize_value(row) if row is not None else None
    if not isinstance(value, dict) or "run_id" not in value or "store" not in value:
        raise HTTPException(
            404, f"DAG run {dag_id}/{dag_run_id} has no OpenJD job run (no {BEGIN_TASK_ID} XCom)"
        )
    return value


def _store(attempt: dict[str, Any]) -> core.CheckpointStore:
    """The store the setup task used (read only here: the file data flow it pushed is passed
    on, so that this process's ``$OPENJD_CHECKPOINT_FILES`` plays no part)."""
    import core

    files = attempt.get("files")
    return core.CheckpointStore(
        attempt["store"], create=False, files=files if files in FILE_MODES else None
    )


@app.post(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/termination",
    dependencies=[Depends(requires_access_dag(method="PUT", access_entity=DagAccessEntity.RUN))],
)
def terminate(
    dag_id: str,
    dag_run_id: str,
    session: SessionDep,
    mode: str = Body(..., embed=True),
) -> dict[str, Any]:
    import core

    if mode not in MODES:
        raise HTTPException(422, f"unknown termination mode {mode!r}; one of {list(MODES)}")
    attempt = _attempt(session, dag_id, dag_run_id)
    store = _store(attempt)
    try:
        term, note = core.request_termination(store, attempt["job_key"], attempt["run_id"], mode)
    except core.RunError as exc:
        raise HTTPException(409, str(exc)) from None
    return {
        "run_id": attempt["run_id"],
        "mode": term.mode.value if term.mode else None,
        "note": note,
    }


@app.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/checkpoints",
    dependencies=[
        Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))
    ],
)
def checkpoints(dag_id: str, dag_run_id: str, session: SessionDep) -> dict[str, Any]:
    import core

    attempt = _attempt(session, dag_id, dag_run_id)
    store = _store(attempt)
    run = store.read_run(attempt["job_key"], attempt["run_id"])
    if run is None:
        raise HTTPException(404, f"job run {attempt['run_id']} is not in the store")
    records, warnings = store.read_tasks(attempt["job_key"], attempt["run_id"])
    tasks = []
    for rec in sorted(records, key=lambda r: (run.finally_steps.count(r.step), r.step, r.task_key)):
        generations = [core.summarize_checkpoint(g) for g in store.list_generations(rec)]
        task = core.summarize_task(rec)
        tasks.append(
            {
                "step": task.step,
                "label": task.label,
                "status": task.status,
                "frames_done": list(task.frames_done),
                "resume_status": task.resume_status,
                "checkpoints": [
                    {
                        "generation": g.generation,
                        "saved_at": g.saved_at,
                        "state_bytes": g.state_bytes,
                        "files": list(g.files),
                        "files_mode": g.files_mode,
                        "attempt": g.attempt,
                    }
                    for g in generations
                ],
                "updated_at": task.updated_at,
            }
        )
    return {
        "dag_id": dag_id,
        "dag_run_id": dag_run_id,
        "run_id": run.run_id,
        "status": run.status.value,
        "attempt": run.attempt,
        "condition": run.condition.model_dump(),
        "file_data_flow": store.file_flow.value,
        "termination": run.termination,
        "tasks": tasks,
        "warnings": warnings,
        "read_at": time.time(),
    }


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>OpenJD checkpoints</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
#error {{ color: #b00; }}
</style></head>
<body>
<h2>OpenJD checkpoints: <span id="dag">{dag}</span> / <span id="run">{run}</span></h2>
<p>Job run <b id="job-run">…</b>: <b id="status">loading</b> <span id="condition"></span>;
checkpoint files: <b id="files-mode">…</b></p>
<p id="error"></p>
<table><thead><tr><th>task</th><th>status</th><th>generation</th><th>saved</th>
<th>state bytes</th><th>files</th><th>frames done</th><th>resume</th></tr></thead>
<tbody id="tasks"></tbody></table>
<p>End the run: {buttons}</p>
<p id="result"></p>
<script>
const base = {base};
async function load() {{
  const r = await fetch(base + "/checkpoints", {{credentials: "same-origin"}});
  if (!r.ok) {{
    document.getElementById("error").textContent = r.status + " " + await r.text();
    return;
  }}
  const data = await r.json();
  document.getElementById("error").textContent = "";
  document.getElementById("job-run").textContent = data.run_id;
  document.getElementById("status").textContent = data.status;
  document.getElementById("files-mode").textContent = data.file_data_flow;
  document.getElementById("condition").textContent =
    data.condition.reason + (data.condition.message ? ": " + data.condition.message : "");
  const body = document.getElementById("tasks");
  body.replaceChildren();
  for (const t of data.tasks) {{
    const last = t.checkpoints.length ? t.checkpoints[t.checkpoints.length - 1] : null;
    const cells = [t.label, t.status, last ? last.generation : "",
      last ? new Date(last.saved_at * 1000).toISOString() : "", last ? last.state_bytes : "",
      last ? last.files.join(", ") : "", t.frames_done.length, t.resume_status || ""];
    const row = document.createElement("tr");
    row.className = "task";
    for (const c of cells) {{
      const td = document.createElement("td");
      td.textContent = c;
      row.append(td);
    }}
    body.append(row);
  }}
}}
async function terminate(mode) {{
  const r = await fetch(base + "/termination", {{method: "POST", credentials: "same-origin",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{mode}})}});
  document.getElementById("result").textContent = r.status + " " + await r.text();
  load();
}}
load();
setInterval(load, 3000);
</script></body></html>
"""


@app.get("/ui/runs/{dag_id}/{dag_run_id}", response_class=HTMLResponse)
def page(dag_id: str, dag_run_id: str) -> str:
    """The page (no data in it: its script reads the endpoints with the user's credentials)."""
    import json
    import urllib.parse

    quote = urllib.parse.quote
    base = f"{URL_PREFIX}/dags/{quote(dag_id, safe='')}/dagRuns/{quote(dag_run_id, safe='')}"
    buttons = " ".join(
        f'<button onclick="terminate({html.escape(json.dumps(m))})">{m}</button>' for m in MODES
    )
    return _PAGE.format(
        dag=html.escape(dag_id),
        run=html.escape(dag_run_id),
        base=json.dumps(base).replace("<", "\\u003c"),
        buttons=buttons,
    )


class OpenJDCheckpointPlugin(AirflowPlugin):
    """Registers the endpoints under ``/openjd`` and the "OpenJD checkpoints" DAG run tab."""

    name = "openjd_checkpoint"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "OpenJD checkpoint"}]
    external_views = [
        {
            "name": "OpenJD checkpoints",
            "href": URL_PREFIX + "/ui/runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "openjd-checkpoints",
        }
    ]
