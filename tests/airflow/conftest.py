"""The Airflow tests' fixtures and hooks are in ``airflow_fixtures.py`` (read its docstring).

Importing it sets the environment (an isolated AIRFLOW_HOME) before anything imports Airflow.
From a virtualenv without Airflow (``make test-core``, ``make test-prefect``), nothing here is
collected. Not ``find_spec("airflow")``: this very folder passes for a namespace package
``airflow`` when ``tests/`` is on sys.path.
"""

import importlib.metadata

try:
    importlib.metadata.version("apache-airflow-core")
except importlib.metadata.PackageNotFoundError:
    collect_ignore_glob = ["*"]
else:
    from airflow_fixtures import *  # noqa: F403  (fixtures and pytest hooks)
