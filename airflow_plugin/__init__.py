"""openjd-checkpoint on Apache Airflow 3.3: DAGs from OpenJD job templates (extra ``[airflow]``).

A DAG file is two lines::

    from airflow_plugin import dag_from_template
    dag = dag_from_template("render.yaml", dag_id="render")

See ``docs/airflow.md``. The operators are in ``airflow_plugin.operators``; the Airflow plugin
(REST endpoints and a UI page) in ``airflow_plugin.plugin``.
"""

try:
    import airflow  # noqa: F401  (the framework this adapter maps the core onto)
except ModuleNotFoundError as exc:
    if exc.name != "airflow":
        raise
    raise ImportError(
        "airflow_plugin needs Apache Airflow, which is not installed in this environment: "
        "pip install 'openjd-checkpoint[airflow]' (from a checkout: pip install -e '.[airflow]')"
    ) from exc

from .dag import dag_from_template, job_params
from .operators import (
    OpenJDBeginOperator,
    OpenJDFinishOperator,
    OpenJDPlanOperator,
    OpenJDTaskOperator,
    group_tasks,
)

__all__ = (
    "OpenJDBeginOperator",
    "OpenJDFinishOperator",
    "OpenJDPlanOperator",
    "OpenJDTaskOperator",
    "dag_from_template",
    "group_tasks",
    "job_params",
)
