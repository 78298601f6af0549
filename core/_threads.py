"""Daemon threads that are started once and reused: each task run needs a few short-lived
helpers (its output reader, its run's watcher), and ``threading.Thread.start`` waits until the
new thread has run; in a process whose other threads hold the interpreter lock (Prefect's event
loops, an API client) that wait is a switch interval (5 ms) or more, per thread, per task run.

``start_daemon(fn, name)`` hands ``fn`` to an idle worker of this process if there is one
(returning at once) and starts a new one otherwise; a worker that stays idle for
``IDLE_SECONDS`` ends. The workers are daemon threads, as the helpers they replace were: at
interpreter exit nothing waits for them (an output reader blocked on a pipe that a process
outside our reach holds must not hold the exit up). That is what ``concurrent.futures``'
``ThreadPoolExecutor`` lacks: its workers are joined at exit, and it has no per-job
``join``/``is_alive``; so this small pool is ours.

After a ``fork`` the child starts with a pool of its own, empty (the parent's workers are not
there, and another thread may have held the pool's lock at the fork).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ("IDLE_SECONDS", "DaemonJob", "prestart", "run_beside", "start_daemon")

IDLE_SECONDS = 30.0
"""How long a worker waits for another job before it ends, in seconds."""


class DaemonJob:
    """One ``fn`` handed to a worker: ``join`` and ``is_alive`` as a ``threading.Thread``'s."""

    def __init__(self, fn: Callable[[], object], name: str) -> None:
        self.name = name
        self._fn = fn
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: for ever) for ``fn`` to return."""
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        """True until ``fn`` has returned (or raised)."""
        return not self._done.is_set()

    def _run(self) -> None:
        me = threading.current_thread()
        me.name = self.name
        try:
            self._fn()
        finally:
            me.name = "openjd-idle"
            self._done.set()


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def submit(self, job: DaemonJob) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is not None:
            worker.give(job)
            return
        _Worker(self, job).start()

    def idle(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def leave(self, worker: _Worker) -> bool:
        """An idle worker that timed out asks to end: False if a job was handed to it."""
        with self._lock:
            if worker in self._idle:
                self._idle.remove(worker)
                return True
            return False


class _Worker(threading.Thread):
    def __init__(self, pool: _Pool, job: DaemonJob) -> None:
        super().__init__(name=job.name, daemon=True)
        self._pool = pool
        self._job: DaemonJob | None = job
        self._wake = threading.Condition()

    def give(self, job: DaemonJob) -> None:
        with self._wake:
            self._job = job
            self._wake.notify()

    def run(self) -> None:
        while True:
            job = self._job
            assert job is not None
            self._job = None
            job._run()
            with self._wake:
                self._pool.idle(self)
                while self._job is None:
                    if not self._wake.wait(IDLE_SECONDS) and self._job is None:
                        if self._pool.leave(self):
                            return


_POOL = _Pool()


def _after_fork() -> None:
    global _POOL
    _POOL = _Pool()  # another thread may have held the pool's lock at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def start_daemon(fn: Callable[[], object], name: str) -> DaemonJob:
    """Run ``fn`` on a daemon thread of this process's pool (see the module docstring), named
    ``name`` while it runs. Returns at once, without waiting for ``fn`` to begin. What ``fn``
    raises is reported as an uncaught exception of its thread (``threading.excepthook``), and
    the worker ends."""
    job = DaemonJob(fn, name)
    _POOL.submit(job)
    return job


def run_beside(fn: Callable[[], object], name: str) -> Callable[[], BaseException | None]:
    """Run ``fn`` on a worker of this process's pool while the caller goes on (an fsync, a
    file written beside another one). Returns the wait for it: it blocks until ``fn`` has
    ended and gives what it raised (None: it returned); nothing ``fn`` raises reaches
    ``threading.excepthook``, and the worker stays in the pool."""
    failed: list[BaseException] = []

    def job() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the waiting caller
            failed.append(exc)

    running = start_daemon(job, name)

    def wait() -> BaseException | None:
        running.join()
        return failed[0] if failed else None

    return wait


def prestart(count: int) -> None:
    """Start workers until this process's pool has ``count`` idle ones (an idle worker ends
    after ``IDLE_SECONDS``): a caller that will hand out ``count`` jobs at once later (the
    fsyncs of a checkpoint's files) does not pay for starting threads then. Each new worker
    is started here (``threading.Thread.start`` waits until it runs)."""
    for _ in range(count - _POOL.idle_count()):
        _Worker(_POOL, DaemonJob(_nothing, "openjd-idle")).start()


def _nothing() -> None:
    pass
