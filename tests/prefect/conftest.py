"""One real Prefect server per test session, and the fixtures the Prefect tests stand on.

- The environment is set when pytest loads this file, before Prefect is imported: an isolated
  ``PREFECT_HOME`` (a temp folder: sqlite database, local result storage, profiles),
  ``PREFECT_API_URL`` at a free port on 127.0.0.1, analytics and UI off, 1 s polling for runners
  and workers. Every subprocess inherits it, with a marker (``OPENJD_PREFECT_TEST_SESSION``) that
  finds the processes a test leaves behind.
- ``prefect_server`` (session, autouse): ``prefect server start`` in a subprocess, ready when
  ``/api/health`` answers; stopped at the end with its process tree. Its log is a file, shown
  (its tail) with every failing test. The migrated empty database is kept in the virtualenv
  (``<venv>/openjd-prefect-test-db/<prefect version>/``) and copied into the next session's home,
  which saves the migrations (about 10 s); ``OPENJD_PREFECT_TEST_DB_CACHE=0`` turns that off.
- ``process_work_pool`` (session, lazy): a process work pool with two ``prefect worker start``
  processes standing in for two hosts (own folder, own ``TMPDIR``, ``OPENJD_CHECKPOINT_HOST_ID``
  ``host-a`` / ``host-b``), each polling the pool's ``default`` queue and a queue named after its
  host. The session's S3 server (``s3_server`` in ``tests/conftest.py``: moto, one per session)
  starts before them: they share stores on it.
- After every test, the processes it started are stopped, and processes of the session that are
  still alive outside the server's and workers' trees fail the test (they are killed).

- ``dask_cluster`` (session, lazy): a Dask scheduler and two ``dask worker`` processes standing
  in for two machines of a farm (``dask_session.py``).

The fixtures are in ``prefect_session.py``; the helpers (run, serve, cancel, read) in
``prefect_helpers.py``.
"""

import importlib.util

# In a virtualenv without Prefect (``pytest tests`` from .venv) this folder is skipped. (The
# folder itself is a namespace package named "prefect" when tests/ is on sys.path, hence the
# origin check.)
_spec = importlib.util.find_spec("prefect")
if _spec is None or _spec.origin is None:
    collect_ignore_glob = ["*.py"]
else:
    from dask_session import dask_cluster  # noqa: F401  (a fixture for pytest)
    from prefect_session import (  # noqa: F401  (fixtures and hooks for pytest)
        PrefectServer,
        ProcessWorkPool,
        flows_dir,
        per_test_processes,
        prefect_server,
        proc_log_dir,
        process_work_pool,
        pytest_runtest_makereport,
        pytest_sessionfinish,
    )
