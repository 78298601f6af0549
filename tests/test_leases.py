"""Leases and the run's and job's locks on each kind of store: a local folder (flocks),
``memory://`` (threading locks), ``s3://`` (conditional writes, on the session's moto server)
and, where the test says so, ``gs://`` (conditional writes on generations, on the session's
GCS emulator); and the store's credentials, which are never shown."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

import psutil
import pytest
from conftest import ROOT, run_cli

import core.fs._objects as objects_module
import core.fs._s3 as s3_module
import core.store._lease as lease_module
from core import CheckpointStore, RunRecord, StoreError, TaskRecord
from core._records import StopRequest
from core.fs import redact_location
from core.fs._objects import Support

JK = "0123456789abcdef"
RID = "20260101-000000-abcdef"
LOCAL_AND_OBJECTS = pytest.mark.parametrize("store_url", ["local", "s3", "gcs"], indirect=True)
OBJECT_STORES = pytest.mark.parametrize("store_url", ["s3", "gcs"], indirect=True)
"""The stores with conditional writes: S3 (moto) and GCS (fake-gcs-server)."""
FORK = multiprocessing.get_context("fork")


def run_record() -> RunRecord:
    return RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h")


def take(store: str, task_key: str = "{}", ttl: float = 60.0):
    return CheckpointStore(store).acquire_task_lease(JK, RID, "S", task_key, ttl_seconds=ttl)


def test_a_lease_is_exclusive_until_released(store_url: str) -> None:
    first = take(store_url)
    assert first is not None
    assert take(store_url) is None
    assert CheckpointStore(store_url).task_lease_held(JK, RID, "S", "{}")
    assert take(store_url, task_key="other") is not None  # leases are per task
    first.release()
    first.release()  # a second release does nothing
    again = take(store_url)
    assert again is not None
    again.release()


def _abandoned(store: str, ttl: float) -> None:
    """A lease whose holder is gone: taken, then neither renewed nor released (a local flock is
    dropped, as when its process dies)."""
    lease = take(store, ttl=ttl)
    assert lease is not None
    lease_module._KEEPER.discard(lease)
    if not lease._expires:  # an flock
        lease.release()


def _race(st: CheckpointStore, start: threading.Barrier, won: list) -> None:
    start.wait(30)
    won.append(st.acquire_task_lease(JK, RID, "S", "{}"))


@LOCAL_AND_OBJECTS
def test_racers_for_one_expired_lease_end_with_one_holder(store_url: str) -> None:
    """The holder is gone; eight threads, each with a store of its own, try to take its lease at
    once, three times over: each time exactly one wins (on S3: all read one ETag, and only one
    ``If-Match`` write of it succeeds)."""
    for _round in range(3):
        _abandoned(store_url, ttl=0.01)
        if "://" in store_url:
            # an S3 lease's age is counted in whole seconds by the server, up to 1 s more
            # than it is: a lease is taken once that age is over its ttl rounded up (1 s)
            time.sleep(2.1)
        stores = [CheckpointStore(store_url) for _ in range(8)]
        start = threading.Barrier(len(stores))
        won: list = []
        threads = [threading.Thread(target=_race, args=(st, start, won)) for st in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [lease for lease in won if lease is not None]
        assert len(won) == 8 and len(winners) == 1, won
        winners[0].release()


def _hold(store: str, ttl: float, ready: multiprocessing.synchronize.Event) -> None:
    lease = take(store, ttl=ttl)
    assert lease is not None
    ready.set()
    time.sleep(600)


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_lease_lives_as_long_as_its_process_and_then_its_ttl(store_url: str) -> None:
    """Its process renews it on its own past its ttl (3 s); once the process is killed, the
    lease is taken over after its ttl, not at once."""
    ready = FORK.Event()
    holder = FORK.Process(target=_hold, args=(store_url, 3.0, ready))
    holder.start()
    try:
        assert ready.wait(30)
        time.sleep(4.0)  # past the ttl: still held, since its process renews it
        assert take(store_url) is None
    finally:
        holder.kill()
        holder.join(10)
    died = time.monotonic()
    assert take(store_url) is None  # a dead holder's lease lasts its ttl
    end = died + 10
    while (lease := take(store_url)) is None and time.monotonic() < end:
        time.sleep(0.2)
    assert lease is not None, "the dead holder's lease never expired"
    assert time.monotonic() - died <= 6.0
    lease.release()


@pytest.mark.parametrize(
    ("store_url", "ttl"), [("memory", 0.2), ("s3", 1.0), ("gcs", 1.0)], indirect=["store_url"]
)
def test_a_lost_lease_says_so_and_leaves_the_new_holder_alone(store_url: str, ttl: float) -> None:
    stalled = take(store_url, ttl=ttl)
    assert stalled is not None
    lease_module._KEEPER.discard(stalled)  # its process stalls: nothing renews it
    time.sleep(ttl + 1.2)
    winner = take(store_url)
    assert winner is not None
    with pytest.raises(StoreError, match="was lost: it expired"):
        stalled.renew()
    assert stalled.lost
    stalled.release()  # must not delete the winner's lease
    assert take(store_url) is None
    winner.release()
    assert take(store_url) is not None


@OBJECT_STORES
def test_a_lease_is_not_taken_while_its_stalled_holder_still_counts_on_it(store_url: str) -> None:
    """A holder counts on its lease for its whole ttl since it last wrote it (``Lease.expired``;
    ``Lease.confirm`` does no I/O before a fenced write meanwhile), so no other process may take
    it sooner. The server tells a lease's age in whole seconds (``Date`` less ``LastModified``):
    with a ttl of 1.5 s, a lease written at .8 of a second read as 2 s old, over its ttl, 1.2 s
    after it was written, and was taken while its holder still counted on it."""
    ttl = 1.5
    warm = take(store_url, task_key="warm")  # the client made, the server probed
    assert warm is not None
    warm.release()
    while not 0.75 < time.time() % 1 < 0.85:  # the server's clock is this machine's
        time.sleep(0.01)
    stalled = take(store_url, ttl=ttl)
    assert stalled is not None
    lease_module._KEEPER.discard(stalled)  # its process stalls: nothing renews it
    end = time.monotonic() + 10
    while (taker := take(store_url)) is None:
        assert time.monotonic() < end, "the stalled holder's lease never expired"
        time.sleep(0.02)
    try:
        assert stalled.expired, "taken while its holder still counted on it"
    finally:
        taker.release()
        stalled.release()


@OBJECT_STORES
def test_a_renewal_answered_after_a_stall_vouches_only_for_the_time_since_it_was_sent(
    store_url: str,
) -> None:
    """A holder stalled (SIGSTOP) between sending a renewal and reading its answer may have been
    taken over meanwhile: the renewal counts from when it was sent, so once the stall outlasted
    the ttl the lease is expired and the next fenced write confirms it with the store
    (``Lease.confirm``), which finds the new holder. Counted from the answer, it read as fresh
    and the run's record was written over the new holder's (CI, issue 36)."""
    ttl = 1.0
    stalled = take(store_url, ttl=ttl)
    assert stalled is not None
    lease_module._KEEPER.discard(stalled)
    s3 = stalled._fs.backend.objects
    sent_then_stalled = s3.replace

    def replace(path, body, etag):
        out = sent_then_stalled(path, body, etag)  # the server applied it ...
        time.sleep(ttl + 1.5)  # ... and its answer is read after a stall past the ttl
        return out

    s3.replace = replace
    try:
        stalled.renew()
    finally:
        del s3.replace
    assert stalled.expired, "a renewal answered after the stall counted as fresh"
    winner = None
    try:
        end = time.monotonic() + 10
        while (winner := take(store_url)) is None:
            assert time.monotonic() < end, "the stalled holder's lease never expired"
            time.sleep(0.05)
        with pytest.raises(StoreError, match="was lost"):
            stalled.confirm()
    finally:
        if winner is not None:
            winner.release()
        stalled.release()


@pytest.mark.parametrize("lock", ["run", "job"])
def test_a_lock_makes_read_change_write_exclusive(store_url: str, lock: str) -> None:
    """Four threads, each with a store of its own, add 1 to a run record five times each under
    the run's lock, or the job's."""
    CheckpointStore(store_url).write_run(run_record())
    errors: list[BaseException] = []

    def add() -> None:
        st = CheckpointStore(store_url)
        try:
            for _ in range(5):
                with st.run_lock(JK, RID) if lock == "run" else st.job_lock(JK):
                    rec = st.read_run(JK, RID)
                    assert rec is not None
                    rec.attempt += 1
                    time.sleep(0.005)
                    st.write_run(rec)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    rec = CheckpointStore(store_url).read_run(JK, RID)
    assert rec is not None and rec.attempt == 1 + 4 * 5


def _lock_and_die(store: str) -> None:
    lock = CheckpointStore(store).run_lock(JK, RID)
    lock.__enter__()
    os._exit(0)


@OBJECT_STORES
def test_a_run_lock_left_by_a_dead_process_is_taken_over_when_stale(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lease_module, "LOCK_STALE_SECONDS", 1.0)
    dead = FORK.Process(target=_lock_and_die, args=(store_url,))
    dead.start()
    dead.join(30)
    st = CheckpointStore(store_url)
    with pytest.raises(StoreError, match="stayed locked for 0.2 s"):
        with st.run_lock(JK, RID, timeout=0.2):
            pass
    started = time.monotonic()
    with st.run_lock(JK, RID, timeout=10):
        assert time.monotonic() - started < 4


def _stall_inside_the_lock(store: str, wrote: multiprocessing.synchronize.Event) -> None:
    """Take the run's lock, read the run, stall (SIGSTOP) past the lock's staleness, then write
    what was read, with its own change; ``wrote`` is set if the write went through."""
    st = CheckpointStore(store)
    try:
        with st.run_lock(JK, RID):
            rec = st.read_run(JK, RID)
            assert rec is not None
            os.kill(os.getpid(), signal.SIGSTOP)
            rec.termination = "Cancelled"
            st.write_run(rec)
            wrote.set()
    except StoreError:
        pass
    os._exit(0)


@OBJECT_STORES
def test_a_holder_of_a_run_lock_taken_over_when_stale_writes_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that read a run under its lock and then stalled past the lock's staleness
    (30 s, 1 s here) lost the lock to the next process, which changed the run (a runner ending
    it). Woken, it must not write what it read before (a ``stop`` would have put a finished run
    back to running): its write is refused."""
    monkeypatch.setattr(lease_module, "LOCK_STALE_SECONDS", 1.0)
    st = CheckpointStore(store_url)
    st.write_run(run_record())
    wrote = FORK.Event()
    stalled = FORK.Process(target=_stall_inside_the_lock, args=(store_url, wrote))
    stalled.start()
    try:
        end = time.monotonic() + 30
        while psutil.Process(stalled.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < end, "the process never stalled in the lock"
            time.sleep(0.02)
        with st.run_lock(JK, RID, timeout=10):  # taken over once stale
            rec = st.read_run(JK, RID)
            assert rec is not None
            rec.attempt = 7
            st.write_run(rec)
        os.kill(stalled.pid, signal.SIGCONT)
        stalled.join(30)
    finally:
        if stalled.is_alive():
            stalled.kill()
    assert not wrote.is_set(), "the stalled holder wrote over the run after losing its lock"
    rec = st.read_run(JK, RID)
    assert rec is not None and rec.attempt == 7 and rec.termination is None, rec


def _write_from_elsewhere(store: str) -> None:
    st = CheckpointStore(store)
    st.add_stop_request(run_record(), StopRequest(mode="Cancelled"))
    st.write_task(TaskRecord(job_key=JK, run_id=RID, step="S", task_key="{}", parameters={}))
    os._exit(0)


@LOCAL_AND_OBJECTS
def test_what_another_process_writes_is_seen_at_once(store_url: str) -> None:
    """No listing comes from a cache: a stop request and a task record written by another
    process are seen by a store that listed the folders before."""
    st = CheckpointStore(store_url)
    st.write_run(run_record())
    st.add_stop_request(run_record(), StopRequest(mode="Suspended"))
    assert [r.mode for r in st.read_stop_requests(JK, RID)] == ["Suspended"]
    assert st.read_tasks(JK, RID) == ([], [])
    other = FORK.Process(target=_write_from_elsewhere, args=(store_url,))
    other.start()
    other.join(30)
    assert other.exitcode == 0
    assert [r.mode for r in st.read_stop_requests(JK, RID)] == ["Suspended", "Cancelled"]
    assert len(st.read_tasks(JK, RID)[0]) == 1


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_server_without_conditional_writes_gets_best_effort_leases_and_a_warning(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(objects_module, "SUPPORT", {})
    monkeypatch.setattr(
        s3_module.S3Objects, "probe", lambda self, path: Support(writes=False, deletes=False)
    )
    caplog.set_level(logging.WARNING, logger="core.store._store")
    first = take(store_url)
    assert first is not None and first._claim.version is None  # the read-then-write lease file
    assert take(store_url) is None
    with CheckpointStore(store_url).run_lock(JK, RID):
        with CheckpointStore(store_url).run_lock(JK, RID, timeout=0.1):
            pass  # no lock at all: best effort
    first.release()
    warned = [r for r in caplog.records if "does not honour conditional writes" in r.message]
    assert len(warned) == 1


# --- credentials ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("/var/lib/store", "/var/lib/store"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("s3://AKIAKEY:s3cr3t@bucket/prefix", "s3://***@bucket/prefix"),
        ("ftp://user:pw@host/path?token=abc&x", "ftp://***@host/path?token=***&x"),
        ("simplecache::s3://k:s@bucket/p", "simplecache::s3://***@bucket/p"),
    ],
)
def test_a_location_is_shown_without_its_credentials(location: str, shown: str) -> None:
    assert redact_location(location) == shown


def test_an_s3_url_with_credentials_is_refused_without_showing_them() -> None:
    with pytest.raises(StoreError) as info:
        CheckpointStore("s3://AKIAEXAMPLE:wJalrXUtnFEMI@openjd-test/prefix")
    assert "s3://***@openjd-test/prefix" in str(info.value)
    assert "wJalrXUtnFEMI" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)


def test_client_errors_become_os_errors_without_the_secret(monkeypatch) -> None:
    from botocore.exceptions import EndpointConnectionError

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hush-hush-secret")
    with pytest.raises(OSError) as info:
        with s3_module.os_errors(object()):
            raise EndpointConnectionError(endpoint_url="http://host/?k=hush-hush-secret")
    assert "EndpointConnectionError" in str(info.value)
    assert "hush-hush-secret" not in str(info.value)


def test_an_unreachable_s3_store_is_a_store_error_that_shows_no_secret(s3_server) -> None:
    """A wrong endpoint: the CLI exits 3 with one line, and the secret key is nowhere in it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once it is closed
    secret = "wrong-secret-that-must-not-show"
    env = dict(
        os.environ,
        FSSPEC_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_MAX_ATTEMPTS="1",
    )
    done = run_cli("runs", "--store", s3_server.new_store(), cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "checkpoint store 's3://openjd-test/" in done.stderr
    assert "Could not connect" in done.stderr and "Traceback" not in done.stderr
    assert secret not in done.stdout + done.stderr
