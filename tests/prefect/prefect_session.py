"""The implementation of conftest.py (see its docstring): imported only where Prefect is
installed, and before Prefect itself, since it sets Prefect's environment when imported."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- environment (before Prefect)

SESSION_HOME = Path(tempfile.mkdtemp(prefix="openjd-prefect-test-"))
PREFECT_HOME = SESSION_HOME / "prefect-home"
LOG_DIR = SESSION_HOME / "logs"
POOL_LEASE_SECONDS = 10.0
"""``$OPENJD_CHECKPOINT_LEASE_SECONDS`` of the work pool's workers (and their flow runs)."""
PREFECT_HOME.mkdir()
LOG_DIR.mkdir()


def _one_ca_file() -> str:
    """A CA file with a single certificate. Every Prefect client builds an SSL context from
    ``PREFECT_API_SSL_CERT_FILE`` (default: certifi's bundle, 0.1 to 0.4 s to load, several times
    per flow run), even for an http:// API URL as here."""
    import certifi

    bundle = Path(certifi.where()).read_text()
    end = bundle.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
    first = bundle[bundle.index("-----BEGIN CERTIFICATE-----") : end]
    path = SESSION_HOME / "one-ca.pem"
    path.write_text(first + "\n")
    return str(path)


# No profile, key or URL of the developer's may leak in (logging settings may).
for _key in [k for k in os.environ if k.startswith("PREFECT_")]:
    if not _key.startswith("PREFECT_LOGGING_"):
        del os.environ[_key]

TEST_ENV = {
    "OPENJD_PREFECT_TEST_SESSION": uuid.uuid4().hex,
    "PREFECT_HOME": str(PREFECT_HOME),
    "PREFECT_API_URL": f"http://127.0.0.1:{_free_port()}/api",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_CLI_PROMPT": "false",
    "PREFECT_API_SSL_CERT_FILE": _one_ca_file(),
    # flow.serve() and workers look for scheduled runs every N s (defaults: 10 s)
    "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    "PREFECT_WORKER_QUERY_SECONDS": "1",
    # run logs reach the API in batches every N s (default 2 s)
    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
    "NO_PROXY": ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"])),
}
os.environ.update(TEST_ENV)
os.environ["no_proxy"] = os.environ["NO_PROXY"]

DB_CACHE = Path(sys.prefix) / "openjd-prefect-test-db" / importlib.metadata.version("prefect")
SERVER_START_TIMEOUT = 180.0  # a fresh database migrates in about 10 to 30 s on a busy machine
SERVER_LOG = LOG_DIR / "prefect-server.log"


def _seed_database(home: Path) -> bool:
    """Copy the cached migrated database into ``home``; False when there is none."""
    if os.environ.get("OPENJD_PREFECT_TEST_DB_CACHE") == "0":
        return False
    files = [DB_CACHE / "prefect.db", DB_CACHE / "memo_store.toml"]
    if not all(f.is_file() for f in files):
        return False
    for f in files:
        shutil.copyfile(f, home / f.name)
    return True


def _spawn_server(api_url: str) -> subprocess.Popen[bytes]:
    port = api_url.rsplit(":", 1)[1].split("/")[0]
    with open(SERVER_LOG, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start"]
            + ["--host", "127.0.0.1", "--port", port, "--no-ui"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ),
            start_new_session=True,
        )


# The server starts now, while pytest imports Prefect and collects: the fixture waits for it.
_SEEDED = _seed_database(PREFECT_HOME)
_EARLY_SERVER = (_spawn_server(os.environ["PREFECT_API_URL"]), time.monotonic())

import prefect_helpers as ph  # noqa: E402  (imports Prefect: after the environment is set)


@dataclass
class PrefectServer:
    api_url: str
    home: Path
    process: ph.ManagedProcess
    start_seconds: float  # from spawning to a healthy /api/health
    seeded: bool  # started from the cached migrated database

    @property
    def log_path(self) -> Path:
        return self.process.log_path


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _save_database(home: Path) -> None:
    """Copy the freshly migrated, still empty database (a consistent sqlite backup, WAL included)
    and the block registration memo into the cache."""
    if os.environ.get("OPENJD_PREFECT_TEST_DB_CACHE") == "0":
        return
    try:
        DB_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = DB_CACHE / f"prefect.db.{os.getpid()}.tmp"
        src = sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True)
        dst = sqlite3.connect(tmp)
        with dst:
            src.backup(dst)
        src.close()
        dst.close()
        shutil.copyfile(home / "memo_store.toml", DB_CACHE / "memo_store.toml")
        os.replace(tmp, DB_CACHE / "prefect.db")
    except (OSError, sqlite3.Error) as exc:  # only a lost speed-up
        print(f"note: could not cache the Prefect test database: {exc}", file=sys.stderr)


def _set_api_url(api_url: str) -> None:
    os.environ["PREFECT_API_URL"] = api_url
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


def start_server() -> PrefectServer:
    """Wait for the server spawned at import; on a port taken meanwhile, start another."""
    api_url = os.environ["PREFECT_API_URL"]
    popen, started = _EARLY_SERVER
    for attempt in range(3):
        if attempt:
            api_url = f"http://127.0.0.1:{_free_port()}/api"
            _set_api_url(api_url)
            popen, started = _spawn_server(api_url), time.monotonic()
        proc = ph.ManagedProcess(
            name="prefect-server", cmd=[], log_path=SERVER_LOG, proc=popen, keep=True
        )
        deadline = started + SERVER_START_TIMEOUT
        while proc.running() and time.monotonic() < deadline and not _healthy(api_url):
            time.sleep(0.1)
        if proc.running() and _healthy(api_url):
            server = PrefectServer(
                api_url=api_url,
                home=PREFECT_HOME,
                process=proc,
                start_seconds=time.monotonic() - started,
                seeded=_SEEDED,
            )
            if not _SEEDED:
                _save_database(PREFECT_HOME)
            return server
        proc.stop(timeout=5)
        log = proc.log(60)
        if "address already in use" not in log.lower():
            break
    raise RuntimeError(f"Prefect server did not become healthy; log {SERVER_LOG}:\n{log}")


@pytest.fixture(scope="session", autouse=True)
def prefect_server() -> Iterator[PrefectServer]:
    """The session's Prefect server (started once; every test has it)."""
    server = start_server()
    print(
        f"\nPrefect server at {server.api_url} healthy after {server.start_seconds:.1f} s"
        f" ({'cached' if server.seeded else 'fresh'} database), log {server.log_path}",
        file=sys.stderr,
    )
    try:
        yield server
    finally:
        _drain_prefect_workers()
        for proc in reversed(ph.REGISTRY):
            if proc is not server.process and proc.running():
                proc.stop(timeout=10)
        server.process.stop(timeout=15)
        leftovers = ph.marked_processes()
        if leftovers:
            described = _describe(leftovers)
            ph.kill_processes(leftovers)
            pytest.fail(f"processes left after the Prefect test session: {described}")


def _drain_prefect_workers() -> None:
    """Send this process's queued run logs and events while the server is still up (otherwise
    they fail with "Error logging to API" at exit)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=5)
        except Exception as exc:  # best effort at shutdown
            print(f"note: draining {worker.__name__} failed: {exc}", file=sys.stderr)


def _describe(procs: list) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except Exception:
            out.append(str(p.pid))
    return out


@pytest.fixture(autouse=True)
def per_test_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop what a test started and did not stop; fail it when it left processes behind."""
    first = len(ph.REGISTRY)
    request.node.openjd_first_process = first
    yield
    for proc in ph.REGISTRY[first:]:
        if not proc.keep and proc.running():
            proc.stop(timeout=10)
    # a process can be between its parent's exit and its own: look again for up to 3 s
    deadline = time.monotonic() + 3.0
    while True:
        kept = {p.pid for proc in ph.REGISTRY if proc.keep for p in proc.tree()}
        leftovers = ph.marked_processes(exclude=kept)
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if leftovers:
        described = _describe(leftovers)
        ph.kill_processes(leftovers)
        pytest.fail(f"the test left processes behind (now killed): {described}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    """On a failure, show the tails of the server's log and of the logs of the processes the
    test started (and of the workers), with their paths."""
    report = yield
    if report.failed:
        first = getattr(item, "openjd_first_process", len(ph.REGISTRY))
        procs = [p for p in ph.REGISTRY if p.keep] + [p for p in ph.REGISTRY[first:] if not p.keep]
        for proc in procs:
            report.sections.append(
                (f"{proc.name} log (tail) {proc.log_path}", proc.log(tail=60) or "(empty)")
            )
    return report


# ---------------------------------------------------------------- workers standing in for hosts

HOSTS = ("host-a", "host-b")


@dataclass
class ProcessWorkPool:
    """A process work pool with one ``prefect worker start`` per host. Each host has its own
    folder (the worker's cwd; its ``TMPDIR`` is ``<folder>/tmp``, where the worker makes each
    flow run's working directory) and ``OPENJD_CHECKPOINT_HOST_ID``; every flow run inherits the
    environment of the worker that runs it."""

    name: str
    root: Path
    workers: dict[str, ph.ManagedProcess] = field(default_factory=dict)

    def host_dir(self, host: str) -> Path:
        return self.root / host

    def worker_name(self, host: str) -> str:
        return f"worker-{host}"

    def start_workers(self, *hosts: str, timeout: float = 90.0) -> None:
        """Start (or restart) the hosts' workers together; return once each has registered with
        the pool (a worker that is running already is left alone)."""
        started = time.time()
        spawned = [(host, self._spawn_worker(host)) for host in hosts]
        for host, proc in spawned:
            self._wait_registered(host, proc, started, timeout)

    def _spawn_worker(self, host: str) -> ph.ManagedProcess:
        old = self.workers.get(host)
        if old is not None and old.running():
            return old
        folder = self.host_dir(host)
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            OPENJD_CHECKPOINT_HOST_ID=host,
            OPENJD_CHECKPOINT_WORK_DIR=str(folder),
            TMPDIR=str(folder / "tmp"),
            PYTHONUNBUFFERED="1",
            # a dead runner's task lease on S3 frees after 10 s, not the default minute
            OPENJD_CHECKPOINT_LEASE_SECONDS=str(int(POOL_LEASE_SECONDS)),
        )
        proc = ph.ManagedProcess(
            name=self.worker_name(host),
            cmd=[sys.executable, "-m", "prefect", "worker", "start", "--pool", self.name]
            + ["--type", "process", "--name", self.worker_name(host)]
            + ["--work-queue", "default", "--work-queue", host],
            log_path=LOG_DIR / f"{self.worker_name(host)}.log",
            cwd=folder,
            env=env,
            keep=True,
        )
        self.workers[host] = proc
        return proc

    def _wait_registered(
        self, host: str, proc: ph.ManagedProcess, since: float, timeout: float
    ) -> None:
        from prefect import get_client

        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                if not proc.running():
                    raise RuntimeError(f"worker {host} exited:\n{proc.log(60)}")
                for w in client.read_workers_for_work_pool(self.name):
                    if (
                        w.name == self.worker_name(host)
                        and w.last_heartbeat_time is not None
                        and w.last_heartbeat_time.timestamp() >= since - 1
                    ):
                        return
                time.sleep(0.3)
        raise RuntimeError(f"worker {host} did not register in {timeout} s:\n{proc.log(60)}")

    def stop_worker(self, host: str, timeout: float = 40.0) -> None:
        proc = self.workers.get(host)
        if proc is not None:
            proc.stop(timeout=timeout)

    def kill_worker_tree(self, host: str) -> None:
        """SIGKILL the host's worker with every flow run process under it (the host dies)."""
        proc = self.workers.get(host)
        if proc is not None:
            proc.kill_tree()

    def stop(self) -> None:
        for host in list(self.workers):
            self.stop_worker(host)


def create_process_work_pool(name: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name=name,
                type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
            ),
            overwrite=True,
        )
        for host in HOSTS:
            client.create_work_queue(name=host, work_pool_name=name)


@pytest.fixture(scope="session")
def process_work_pool(prefect_server: PrefectServer, s3_server: Any) -> Iterator[ProcessWorkPool]:
    """Started on first use: the pool ``openjd-process`` and the workers of host-a and host-b.

    The session's S3 server (``s3_server``, ``tests/s3server.py``) starts first: the workers,
    and the flow runs they start, inherit its endpoint and credentials, so that the hosts can
    share a store on it (``s3_server.new_store()``)."""
    pool = ProcessWorkPool(name="openjd-process", root=SESSION_HOME / "hosts")
    create_process_work_pool(pool.name)
    try:
        pool.start_workers(*HOSTS)
        yield pool
    finally:
        pool.stop()


# ---------------------------------------------------------------- small fixtures


@pytest.fixture
def flows_dir(tmp_path: Path) -> Path:
    """A folder for the test's flow modules (see ``prefect_helpers.write_module``)."""
    d = tmp_path / "flows"
    d.mkdir()
    return d


@pytest.fixture
def proc_log_dir(tmp_path: Path) -> Path:
    """Where the test's subprocess logs go."""
    d = LOG_DIR / tmp_path.name
    d.mkdir(parents=True, exist_ok=True)
    return d


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's folder, unless something failed (or OPENJD_PREFECT_TEST_KEEP_HOME=1):
    then keep it for its logs."""
    early = _EARLY_SERVER[0]
    if early.poll() is None:  # the fixture never ran (nothing collected, --collect-only)
        os.killpg(early.pid, signal.SIGTERM)
        try:
            early.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(early.pid, signal.SIGKILL)
            early.wait(timeout=10)
    if exitstatus == 0 and os.environ.get("OPENJD_PREFECT_TEST_KEEP_HOME") != "1":
        shutil.rmtree(SESSION_HOME, ignore_errors=True)
    else:
        print(f"\nPrefect test session files kept in {SESSION_HOME}", file=sys.stderr)
