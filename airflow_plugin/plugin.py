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


class _NoJobRun(HTTPException):
    """404: the DAG run has no OpenJD job run (yet): no setup task XCom."""


def _attempt(session: Any, dag_id: str, dag_run_id: str) -> dict[str, Any]:
    """The attempt the DAG run's setup task pushed (job key, run id, store)."""
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(
        run_id=dag_run_id, key="return_value", task_ids=BEGIN_TASK_ID, dag_ids=dag_id
    )
    row = session.scalars(query).first()
    value = XComModel.deserialize_value(row) if row is not None else None
    if not isinstance(value, dict) or "run_id" not in value or "store" not in value:
        raise _NoJobRun(
            404, f"DAG run {dag_id}/{dag_run_id} has no OpenJD job run (no {BEGIN_TASK_ID} XCom)"
        )
    return value


def _store(attempt: dict[str, Any], *, read_only: bool = False) -> core.CheckpointStore:
    """The store the setup task used (the file data flow it pushed is passed on, so that this
    process's ``$OPENJD_CHECKPOINT_FILES`` plays no part). ``read_only`` for what only reads:
    a damaged record is reported and left as it is, never set aside or rebuilt by a viewer."""
    import core

    files = attempt.get("files")
    return core.CheckpointStore(
        attempt["store"],
        create=False,
        read_only=read_only,
        files=files if files in FILE_MODES else None,
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
    try:
        store = _store(attempt)
        term, note = core.request_termination(store, attempt["job_key"], attempt["run_id"], mode)
    except core.RunError as exc:
        raise HTTPException(409, str(exc)) from None
    except core.StoreError as exc:
        raise HTTPException(503, f"DAG run {dag_id}/{dag_run_id}: {exc}") from None
    return {
        "run_id": attempt["run_id"],
        "mode": term.mode.value if term.mode else None,
        "note": note,
    }


Tasks = list[tuple["core.TaskRecord", list["core.CheckpointData"]]]


def _read(
    session: Any, dag_id: str, dag_run_id: str
) -> tuple[core.CheckpointStore, core.RunRecord, Tasks, list[str]]:
    """The DAG run's job run (``read_job_run``)."""
    return read_job_run(_attempt(session, dag_id, dag_run_id), f"DAG run {dag_id}/{dag_run_id}")


def read_job_run(
    attempt: dict[str, Any], where: str, latest: int | None = None
) -> tuple[core.CheckpointStore, core.RunRecord, Tasks, list[str]]:
    """The job run of the setup task's XCom ``attempt``, read only: its store, run record, task
    records with their stored generations (``latest``: only that many of each task's newest;
    regular steps first, then finally steps, each by step and task) and the warnings of records
    that could not be read (left as they are).

    Raises:
        HTTPException: 404, the store no longer has the run; 503, the store cannot be read or
            the run's record is unreadable (the message names the record and the store).
    """
    import core

    try:
        store = _store(attempt, read_only=True)
        run = store.read_run(attempt["job_key"], attempt["run_id"])
        if run is None:
            raise HTTPException(
                404,
                f"{where}: its job run {attempt['run_id']} is not in the checkpoint store "
                f"{store.location}: it was deleted (openjd-checkpoint checkpoints delete or "
                "gc), or this API server does not see the store the DAG's tasks use",
            )
        records, warnings = store.read_tasks(attempt["job_key"], attempt["run_id"])
        records.sort(key=lambda r: (run.finally_steps.count(r.step), r.step, r.task_key))
        tasks = [(rec, store.list_generations(rec, latest)) for rec in records]
    except core.StoreError as exc:
        raise HTTPException(503, f"{where}: {exc}") from None
    return store, run, tasks, warnings


_READ_TASKS = [
    Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))
]


@app.get("/dags/{dag_id}/dagRuns/{dag_run_id}/checkpoints", dependencies=_READ_TASKS)
def checkpoints(dag_id: str, dag_run_id: str, session: SessionDep) -> dict[str, Any]:
    import core

    store, run, records, warnings = _read(session, dag_id, dag_run_id)
    tasks = []
    for rec, stored in records:
        generations = [core.report.summarize_checkpoint(g) for g in stored]
        task = core.report.summarize_task(rec)
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
    """The page's content for the DAG run, as an HTML fragment (``fragment_of``)."""
    from . import _page

    try:
        attempt = _attempt(session, dag_id, dag_run_id)
    except _NoJobRun as exc:
        return _page.waiting_fragment(str(exc.detail))
    return fragment_of(attempt, f"DAG run {dag_id}/{dag_run_id}")


def fragment_of(attempt: dict[str, Any], where: str) -> str:
    """The job run of the setup task's XCom ``attempt`` as the page's fragment
    (``_page.fragment``); a run the store no longer has, or a store or run record that cannot
    be read, as a fragment that says so (``_page.problem_fragment``), never an error page."""
    import core

    from . import _page

    try:
        # the newest generations the page lists, and one more: it says that older ones exist
        store, run, tasks, warnings = read_job_run(attempt, where, _page.MAX_HISTORY_ROWS + 1)
        choices = core.termination_choices(store, run)
    except core.StoreError as exc:
        return _page.problem_fragment(f"{where}: {exc}", again=True)
    except HTTPException as exc:
        return _page.problem_fragment(str(exc.detail), again=exc.status_code == 503)
    return _page.fragment(
        run,
        tasks,
        file_data_flow=store.file_flow.value,
        choices=choices,
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
