"""A probe plugin the live stack loads from its plugins folder: a FastAPI app under
``/openjd-probe`` whose routes use Airflow's own auth dependencies, as the real plugin must.

- ``GET /openjd-probe/whoami``: any authenticated user (``GetUserDep``).
- ``GET /openjd-probe/dags/{dag_id}/runs``: the user may read the DAG's runs
  (``requires_access_dag("GET", DagAccessEntity.RUN)``, which reads ``dag_id`` from the path).
"""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI

app = FastAPI(title="openjd probe")


@app.get("/whoami")
def whoami(user: GetUserDep) -> dict[str, str]:
    return {"user": user.get_name()}


@app.get(
    "/dags/{dag_id}/runs",
    dependencies=[Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN))],
)
def dag_runs(dag_id: str) -> dict[str, str]:
    return {"dag_id": dag_id}


class OpenJDProbePlugin(AirflowPlugin):
    name = "openjd_probe"
    fastapi_apps = [{"app": app, "url_prefix": "/openjd-probe", "name": "openjd probe"}]
