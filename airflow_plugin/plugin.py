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
- ``GET /openjd/dags/{dag_id}/dagRuns/{dag_run_id}/page``: the same job run as an HTML fragment
  for the UI page (``_page.fragment``: states in the CLI's words, each task's timeline and
  checkpoint history, buttons for the termination modes that can still act). Needs permission
  to read the DAG's task instances. A DAG run with no job run (yet) gets a fragment that says
  so, not a 404.
- ``GET /openjd/ui/runs/{dag_id}/{dag_run_id}``: the page, shown as the "OpenJD checkpoints"
  tab of a DAG run (``external_views``). It holds no data and answers without credentials; its
  script fetches the fragment with the UI's session cookie every 3 s until the run has ended
  (``_page.shell``), and says "sign in to Airflow" on a 401 or 403.

Unauthenticated calls get 401, calls with a bad token 403.
"""

from __future__ import annotations

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


def _read(
    session: Any, dag_id: str, dag_run_id: str
) -> tuple[core.CheckpointStore, core.RunRecord, list[core.TaskRecord], list[str]]:
    """The DAG run's job run: its store, run record, task records (regular steps first, then
    finally steps, each by step and task) and the warnings of records that could not be read.

    Raises:
        HTTPException: 404, the DAG run has no job run, or the store no longer has it.
    """
    attempt = _attempt(session, dag_id, dag_run_id)
    store = _store(attempt)
    run = store.read_run(attempt["job_key"], attempt["run_id"])
    if run is None:
        raise HTTPException(404, f"job run {attempt['run_id']} is not in the store")
    records, warnings = store.read_tasks(attempt["job_key"], attempt["run_id"])
    records.sort(key=lambda r: (run.finally_steps.count(r.step), r.step, r.task_key))
    return store, run, records, warnings


_READ_TASKS = [
    Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))
]


@app.get("/dags/{dag_id}/dagRuns/{dag_run_id}/checkpoints", dependencies=_READ_TASKS)
def checkpoints(dag_id: str, dag_run_id: str, session: SessionDep) -> dict[str, Any]:
    import core

    store, run, records, warnings = _read(session, dag_id, dag_run_id)
    tasks = []
    for rec in records:
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
                        "file_bytes": g.file_bytes,
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


@app.get(
    "/dags/{dag_id}/dagRuns/{dag_run_id}/page",
    response_class=HTMLResponse,
    dependencies=_READ_TASKS,
)
def page_fragment(dag_id: str, dag_run_id: str, session: SessionDep) -> str:
    """The page's content for the DAG run, as an HTML fragment (``_page.fragment``)."""
    import core

    from . import _page

    try:
        store, run, records, warnings = _read(session, dag_id, dag_run_id)
    except HTTPException as exc:
        if exc.status_code != 404:
            raise
        return _page.waiting_fragment(str(exc.detail))
    return _page.fragment(
        run,
        [(rec, store.list_generations(rec)) for rec in records],
        file_data_flow=store.file_flow.value,
        choices=core.termination_choices(store, run),
        warnings=warnings,
        keep_generations=store.keep_generations,
    )


@app.get("/ui/runs/{dag_id}/{dag_run_id}", response_class=HTMLResponse)
def page(dag_id: str, dag_run_id: str) -> str:
    """The page (no data in it: its script reads the fragment with the user's credentials)."""
    import urllib.parse

    from . import _page

    quote = urllib.parse.quote
    base = f"{URL_PREFIX}/dags/{quote(dag_id, safe='')}/dagRuns/{quote(dag_run_id, safe='')}"
    return _page.shell(dag_id, dag_run_id, base)


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
