"""Airflow test fixtures and hooks, shared by every Airflow test of one pytest session.

Loaded by ``conftest.py`` when Airflow is installed.

- The environment is set when pytest loads this file, before Airflow is imported: an isolated
  ``AIRFLOW_HOME`` in a temp folder (sqlite database, dags, plugins and logs folders), examples
  off, the simple auth manager with one known user, 1 s retry delay, 1 s heartbeats.
- ``airflow_home`` (session): that home with its database migrated. The migrated empty
  database is cached in the virtualenv (``<venv>/openjd-airflow-test-db/<airflow version>/``)
  and copied into the next session's home, which saves ``airflow db migrate`` (about 6 s);
  ``OPENJD_AIRFLOW_TEST_DB_CACHE=0`` turns that off.
- ``dag_tester`` (session): runs ``dag.test()`` in this process on DAG files in that home's
  dags folder (``airflow_helpers.DagTester``).
- ``airflow_live`` (session): a live stack (scheduler, dag-processor, api-server on
  127.0.0.1, LocalExecutor, parallelism 4) in a home of its own with its own copy of the
  database, so that ``dag.test()`` runs and the scheduler never share a sqlite file. Only when
  a selected test uses it: started on a thread right after collection (so that the first tests
  run meanwhile; ``OPENJD_AIRFLOW_EARLY_STACK=0`` starts it at first use), stopped at the end
  of the session (running tasks and components get SIGTERM, what is left SIGKILL after 15 s;
  no process of it is left). ``airflow_client`` is its REST client. ``new_stack`` and
  ``start_stack``/``stop_stack`` make further stacks (other settings, other executors).
- A failing test that used a stack gets the paths and tails of the stack's logs in its report.
- The session ends with the measured durations; the temp folder is removed unless a test
  failed or ``OPENJD_AIRFLOW_KEEP_HOME=1``.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

AIRFLOW_VERSION = importlib.metadata.version("apache-airflow-core")

# ---------------------------------------------------------------- environment (before Airflow)

SESSION_ROOT = Path(tempfile.mkdtemp(prefix="openjd-airflow-test-"))
HOME = SESSION_ROOT / "home"
PLUGINS = Path(__file__).resolve().parent / "plugins"

for _key in [k for k in os.environ if k.startswith("AIRFLOW")]:  # nothing of the developer's
    del os.environ[_key]

import airflow_helpers as ah  # noqa: E402  (does not import Airflow itself)

os.environ.update(ah.airflow_env(HOME))
ah.prepare_home(HOME)

DB_CACHE = Path(sys.prefix) / "openjd-airflow-test-db" / AIRFLOW_VERSION
_STACKS: list[ah.AirflowStack] = []
_MIGRATE_LOCK = threading.Lock()


def _migrated_database() -> Path:
    """A pristine migrated database for this session (from the cache, or migrated now)."""
    with _MIGRATE_LOCK:
        pristine = SESSION_ROOT / "migrated-airflow.db"
        if not pristine.is_file():
            _migrate(pristine)
        return pristine


def _migrate(pristine: Path) -> None:
    cached = DB_CACHE / "airflow.db"
    use_cache = os.environ.get("OPENJD_AIRFLOW_TEST_DB_CACHE") != "0"
    started = time.monotonic()
    if use_cache and cached.is_file():
        ah.copy_sqlite(cached, pristine)
        ah.TIMINGS["database copied from the cache"] = time.monotonic() - started
        return
    scratch = SESSION_ROOT / "migrate"
    ah.prepare_home(scratch)
    env = {**ah.clean_environ(), **ah.airflow_env(scratch)}
    ah.run_airflow_cli(["db", "migrate"], env, timeout=300, cwd=scratch)
    ah.TIMINGS["airflow db migrate"] = time.monotonic() - started
    ah.copy_sqlite(scratch / "airflow.db", pristine)
    shutil.rmtree(scratch, ignore_errors=True)
    if use_cache:
        try:
            DB_CACHE.mkdir(parents=True, exist_ok=True)
            ah.copy_sqlite(pristine, cached)
        except OSError as exc:  # only a lost speed-up
            print(f"note: could not cache the Airflow test database: {exc}", file=sys.stderr)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def migrated_db() -> Path:
    return _migrated_database()


@pytest.fixture(scope="session")
def airflow_home(migrated_db: Path) -> Path:
    """The in-process Airflow home, its database migrated (before this process touches it)."""
    ah.copy_sqlite(migrated_db, HOME / "airflow.db")
    return HOME


@pytest.fixture(scope="session")
def dag_tester(airflow_home: Path) -> ah.DagTester:
    """Runs ``dag.test()`` on DAG files written to the in-process home's dags folder."""
    tester = ah.DagTester(airflow_home / "dags")
    tester.warm_up()  # imports Airflow outside any test's capture, builds the execution API
    return tester


def new_stack(name: str, migrated_db: Path, **kwargs) -> ah.AirflowStack:
    """A live stack in ``SESSION_ROOT/name``, not started yet (stopped at session end)."""
    kwargs.setdefault("plugin_files", sorted(PLUGINS.glob("*.py")))
    stack = ah.AirflowStack(home=SESSION_ROOT / name, template_db=migrated_db, **kwargs)
    _STACKS.append(stack)
    return stack


def start_stack(stack: ah.AirflowStack) -> ah.AirflowStack:
    stack.start()
    name = stack.home.name
    ah.TIMINGS[f"{name} stack start (to healthy + execution API warm)"] = stack.start_seconds or 0
    ah.NOTES[f"{name} stack when ready"] = (
        f"{(stack.pss_bytes or 0) >> 20} MiB PSS, {stack.start_cpu_seconds or 0:.0f} s of CPU"
    )
    return stack


def stop_stack(stack: ah.AirflowStack) -> None:
    stack.stop()
    name = stack.home.name
    ah.TIMINGS[f"{name} stack stop"] = stack.stop_seconds or 0
    if stack.leftovers:
        ah.NOTES[f"{name} stack leftovers"] = "; ".join(stack.leftovers)


class _EarlyStart:
    """The session's live stack, started on a thread as soon as the tests are collected."""

    thread: threading.Thread | None = None
    stack: ah.AirflowStack | None = None
    error: BaseException | None = None

    @classmethod
    def begin(cls) -> None:
        cls.stack = new_stack("live", _migrated_database())

        def run() -> None:
            try:
                start_stack(cls.stack)  # type: ignore[arg-type]
            except BaseException as exc:  # raised again by the fixture
                cls.error = exc

        cls.thread = threading.Thread(target=run, name="airflow-live-start", daemon=True)
        cls.thread.start()

    @classmethod
    def join(cls) -> None:
        if cls.thread is not None:
            cls.thread.join()


def pytest_collection_modifyitems(session, config, items) -> None:
    """When a selected test needs the live stack, start it now, while the first tests run.

    Starting takes about 30 s of CPU over three processes, mostly waiting on each other:
    the dag.test() tests run meanwhile. ``OPENJD_AIRFLOW_EARLY_STACK=0``: start at first use.
    ``test_doc_blocks.py`` (which starts an Airflow of its own) is moved to the end.
    """
    # The doc test's Airflow (its own home and ports) runs last, not beside the dag.test() runs.
    items.sort(key=lambda item: item.path.name == "test_doc_blocks.py")
    if config.option.collectonly or os.environ.get("OPENJD_AIRFLOW_EARLY_STACK") == "0":
        return
    if any("airflow_live" in getattr(item, "fixturenames", ()) for item in items):
        _EarlyStart.begin()


@pytest.fixture(scope="session")
def airflow_live(migrated_db: Path) -> Iterator[ah.AirflowStack]:
    """The session's live Airflow (started early, or by the first test that asks for it)."""
    if _EarlyStart.stack is not None:
        waited = time.monotonic()
        _EarlyStart.join()
        ah.TIMINGS["live stack: tests waited for it"] = time.monotonic() - waited
        stack = _EarlyStart.stack
        if _EarlyStart.error is not None:
            stop_stack(stack)
            raise _EarlyStart.error
    else:
        stack = start_stack(new_stack("live", migrated_db))
    try:
        yield stack
    finally:
        stop_stack(stack)


@pytest.fixture(scope="session")
def airflow_client(airflow_live: ah.AirflowStack) -> ah.AirflowClient:
    return airflow_live.client


# ---------------------------------------------------------------- hooks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for stack in _STACKS:
            if stack.procs or stack.stop_seconds is not None:
                report.sections.append((f"airflow stack {stack.home.name}", stack.report()))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not ah.TIMINGS and not ah.NOTES:
        return
    terminalreporter.section("openjd-checkpoint: Airflow test infrastructure")
    for name, seconds in ah.TIMINGS.items():
        terminalreporter.write_line(f"{name}: {seconds:.1f} s")
    for name, text in ah.NOTES.items():
        terminalreporter.write_line(f"{name}: {text}")
    if exitstatus != 0 or os.environ.get("OPENJD_AIRFLOW_KEEP_HOME") == "1":
        terminalreporter.write_line(f"Airflow homes and logs kept in {SESSION_ROOT}")


def pytest_unconfigure(config) -> None:
    _EarlyStart.join()
    for stack in _STACKS:  # an interrupted session
        if stack.running():
            stack.stop()
    failed = getattr(config, "_openjd_airflow_failed", False)
    if not failed and os.environ.get("OPENJD_AIRFLOW_KEEP_HOME") != "1":
        shutil.rmtree(SESSION_ROOT, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus) -> None:
    session.config._openjd_airflow_failed = exitstatus not in (0, 5)
