"""core._threads: daemon threads started once and reused by the per-task helpers."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time

import pytest

from core import _threads
from core._threads import start_daemon


def _wait_idle(seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if any(t.name == "openjd-idle" for t in threading.enumerate()):
            return
        time.sleep(0.01)
    raise AssertionError("no worker went idle")


def test_a_job_runs_on_a_daemon_thread_named_for_it_and_join_waits_for_it() -> None:
    seen: list[tuple[str, bool]] = []
    gate = threading.Event()

    def job() -> None:
        gate.wait(5)
        me = threading.current_thread()
        seen.append((me.name, me.daemon))

    handle = start_daemon(job, "openjd-test-job")
    assert handle.is_alive()
    handle.join(0.05)
    assert handle.is_alive() and seen == []
    gate.set()
    handle.join(5)
    assert not handle.is_alive()
    assert seen == [("openjd-test-job", True)]


def test_an_idle_worker_takes_the_next_job_instead_of_a_new_thread() -> None:
    idents: list[int] = []
    first = start_daemon(lambda: idents.append(threading.get_ident()), "a")
    first.join(5)
    _wait_idle()
    second = start_daemon(lambda: idents.append(threading.get_ident()), "b")
    second.join(5)
    assert len(idents) == 2 and idents[0] == idents[1]


def test_jobs_at_once_each_get_a_thread_of_their_own() -> None:
    barrier = threading.Barrier(4, timeout=5)
    jobs = [start_daemon(barrier.wait, f"j{i}") for i in range(3)]
    barrier.wait()  # would time out (BrokenBarrierError) if the three ran one after another
    for job in jobs:
        job.join(5)
        assert not job.is_alive()


def test_a_job_that_raises_ends_its_worker_and_the_pool_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooked: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_value))

    def boom() -> None:
        raise RuntimeError("boom")

    bad = start_daemon(boom, "bad")
    bad.join(5)
    assert not bad.is_alive()
    end = time.monotonic() + 5
    while not hooked and time.monotonic() < end:
        time.sleep(0.01)
    assert [str(e) for e in hooked] == ["boom"]
    out: list[int] = []
    start_daemon(lambda: out.append(1), "after").join(5)
    assert out == [1]


def test_an_idle_worker_ends_after_idle_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)
    ran: list[threading.Thread] = []
    start_daemon(lambda: ran.append(threading.current_thread()), "short").join(5)
    worker = ran[0]
    worker.join(5)  # a worker already idle with the old timeout may take a job meanwhile
    assert not worker.is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_its_own_workers() -> None:
    start_daemon(lambda: None, "parent").join(5)
    _wait_idle()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's idle worker is not here
        try:
            done = threading.Event()
            start_daemon(done.set, "child")
            os.write(write, b"1" if done.wait(5) else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_the_pool_s_lock_was_held_can_start_jobs() -> None:
    read, write = os.pipe()
    with _threads._POOL._lock:  # as another thread handing out a job at the fork would hold it
        pid = os.fork()
        if pid == 0:
            try:
                done = threading.Event()
                start_daemon(done.set, "child")
                os.write(write, b"1" if done.wait(5) else b"0")
            finally:
                os._exit(0)
    os.close(write)
    try:
        ready = select.select([read], [], [], 10)[0]
        assert ready and os.read(read, 1) == b"1"  # before: the child hung on the copied lock
    finally:
        os.close(read)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
