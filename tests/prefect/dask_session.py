"""A real Dask cluster standing in for a farm of machines: a ``dask scheduler`` and two
``dask worker`` processes, each started as its own process (as on its own machine) with its own
host id (``OPENJD_CHECKPOINT_HOST_ID`` ``dask-a`` / ``dask-b``), folder, ``TMPDIR`` and
``--nthreads 1``, and ``--no-nanny`` (so that a worker killed stays dead: no nanny restarts it
under the same host id). They share the session's Prefect server (``PREFECT_API_URL``) and S3
server (its endpoint and credentials, for stores on it), as machines of a farm share them.

``dask_cluster`` (session, lazy) starts them on first use; ``start_workers`` brings back one a
test killed. The task lease expiry on them is short (``LEASE_SECONDS``), so that a retry after a
killed worker waits seconds, not the default minute, for the dead worker's lease.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

if TYPE_CHECKING:  # imported when used: it imports Prefect, which must wait for the test env
    import prefect_helpers as ph

DASK_HOSTS = ("dask-a", "dask-b")
LEASE_SECONDS = 5
"""``OPENJD_CHECKPOINT_LEASE_SECONDS`` of the workers (and of the flow run processes)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_cli() -> list[str]:
    return [str(Path(sys.executable).with_name("dask"))]


@dataclass
class DaskCluster:
    """The scheduler's address and the worker processes by host id."""

    root: Path
    log_dir: Path
    address: str = ""
    scheduler: ph.ManagedProcess | None = None
    workers: dict[str, ph.ManagedProcess] = field(default_factory=dict)

    def host_dir(self, host: str) -> Path:
        return self.root / host

    def env(self) -> dict[str, str]:
        """What every process of the farm has (flow run processes too)."""
        env = dict(os.environ)
        env.update(OPENJD_CHECKPOINT_LEASE_SECONDS=str(LEASE_SECONDS), PYTHONUNBUFFERED="1")
        return env

    def start(self) -> None:
        import prefect_helpers as ph

        port = _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        self.scheduler = ph.ManagedProcess(
            name="dask-scheduler",
            cmd=_dask_cli()
            + ["scheduler", "--host", "127.0.0.1", "--port", str(port)]
            + ["--dashboard-address", "127.0.0.1:0"],
            log_path=self.log_dir / "dask-scheduler.log",
            env=self.env(),
            keep=True,
        )
        self.start_workers(*DASK_HOSTS)

    def _spawn_worker(self, host: str) -> ph.ManagedProcess:
        import prefect_helpers as ph

        folder = self.host_dir(host)
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        env = self.env()
        env.update(
            OPENJD_CHECKPOINT_HOST_ID=host,
            OPENJD_CHECKPOINT_WORK_DIR=str(folder),
            TMPDIR=str(folder / "tmp"),
        )
        proc = ph.ManagedProcess(
            name=f"dask-worker-{host}",
            cmd=_dask_cli()
            + ["worker", self.address, "--name", host, "--nthreads", "1", "--no-nanny"]
            + ["--dashboard-address", "127.0.0.1:0", "--local-directory", str(folder / "dask")],
            log_path=self.log_dir / f"dask-worker-{host}.log",
            cwd=folder,
            env=env,
            keep=True,
        )
        self.workers[host] = proc
        return proc

    def start_workers(self, *hosts: str, timeout: float = 90.0) -> None:
        """Start the hosts' workers (those not running), return once the scheduler lists
        each."""
        for host in hosts:
            old = self.workers.get(host)
            if old is None or not old.running():
                self._spawn_worker(host)
        deadline = time.monotonic() + timeout
        while set(hosts) - set(self.worker_names()):
            for host in hosts:
                if not self.workers[host].running():
                    raise RuntimeError(f"dask worker {host} exited:\n{self.workers[host].log(60)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dask workers {hosts} did not register in {timeout} s")
            time.sleep(0.3)

    def worker_names(self) -> list[str]:
        """The names of the workers the scheduler lists now."""
        from distributed import Client

        with Client(self.address, timeout=30) as client:
            info = client.scheduler_info(n_workers=-1)
        return [w["name"] for w in info["workers"].values()]

    def task_processes(self, host: str | None = None) -> list[psutil.Process]:
        """The processes under the workers (``host``'s, else every worker's): OpenJD task
        processes and their children. None once the flow run's tasks have stopped."""
        hosts = [host] if host else list(self.workers)
        found = []
        for h in hosts:
            proc = self.workers.get(h)
            if proc is not None and proc.running():
                found.extend(p for p in proc.tree() if p.pid != proc.pid)  # not the worker
        return [p for p in found if _alive(p) and _of_a_task(p)]

    def kill_worker(self, host: str) -> None:
        """SIGKILL the host's worker process alone (its task processes, in sessions of their
        own, live on: the caller kills them as it chooses)."""
        proc = self.workers[host]
        proc.proc.kill()
        proc.proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.workers.values():
            proc.stop(timeout=15)
        if self.scheduler is not None:
            self.scheduler.stop(timeout=15)


def _of_a_task(proc: psutil.Process) -> bool:
    """A process an OpenJD action started (it carries the session marker), not one of Dask's
    own helpers."""
    try:
        return "OPENJD_CHECKPOINT_SESSION" in proc.environ()
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="session")
def dask_cluster(prefect_server: Any, s3_server: Any) -> Iterator[DaskCluster]:
    """Started on first use, after the Prefect and S3 servers (whose settings the workers
    inherit): a scheduler and the workers of dask-a and dask-b."""
    from prefect_session import LOG_DIR, SESSION_HOME

    cluster = DaskCluster(root=SESSION_HOME / "dask", log_dir=LOG_DIR)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
