"""Leases and the run's and job's locks on each kind of store: a local folder (flocks),
``memory://`` (threading locks) and ``s3://`` (conditional writes, on the session's moto server);
and the store's credentials, which are never shown."""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import threading
import time

import pytest
from conftest import ROOT, cli_cmd

import core._store as store_module
from core import CheckpointStore, RunRecord, StoreError, TaskRecord
from core._store import StopRequest, _S3Support, redact_location

JK = "0123456789abcdef"
RID = "20260101-000000-abcdef"
LOCAL_AND_S3 = pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
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


def _take_and_die(store: str, ttl: float) -> None:
    """In a forked process: take the lease and die holding it."""
    assert take(store, ttl=ttl) is not None
    os._exit(0)


def _race(store: str, ready, tried, results) -> None:  # noqa: ANN001
    """In a forked process: get ready (a client, the server's support probed), try once to take
    the lease when all are ready, and hold it until all have tried."""
    warm = take(store, task_key=f"warm-{os.getpid()}")
    assert warm is not None
    warm.release()
    ready.wait(30)
    lease = take(store)
    tried.wait(30)
    results.put(lease is not None)
    if lease is not None:
        lease.release()


@LOCAL_AND_S3
def test_processes_racing_for_one_expired_lease_end_with_one_holder(store_url: str) -> None:
    """The holder died; six processes try to take its lease at the same instant, three times
    over: each time exactly one wins (S3: ``If-Match`` on the ETag all of them read)."""
    for _round in range(3):
        dead = FORK.Process(target=_take_and_die, args=(store_url, 0.01))
        dead.start()
        dead.join(30)
        assert dead.exitcode == 0
        time.sleep(1.1)  # an S3 lease's age is counted in whole seconds by the server
        ready, tried, results = FORK.Barrier(6), FORK.Barrier(6), FORK.Queue()
        racers = [
            FORK.Process(target=_race, args=(store_url, ready, tried, results)) for _ in range(6)
        ]
        for racer in racers:
            racer.start()
        wins = [results.get(timeout=60) for _ in racers]
        for racer in racers:
            racer.join(30)
        assert wins.count(True) == 1, wins


def _hold(store: str, ttl: float, ready: multiprocessing.synchronize.Event) -> None:
    lease = take(store, ttl=ttl)
    assert lease is not None
    ready.set()
    time.sleep(600)


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_lease_lives_as_long_as_its_process_and_then_its_ttl(store_url: str) -> None:
    """Its process renews it on its own past its ttl; once the process is killed, the lease is
    taken over after its ttl, not before."""
    ready = FORK.Event()
    holder = FORK.Process(target=_hold, args=(store_url, 2.0, ready))
    holder.start()
    try:
        assert ready.wait(30)
        time.sleep(3.5)  # past the ttl: still held, since its process renews it
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
    assert 1.0 <= time.monotonic() - died <= 4.5
    lease.release()


@pytest.mark.parametrize(
    ("store_url", "ttl"), [("memory", 0.2), ("s3", 1.0)], indirect=["store_url"]
)
def test_a_lost_lease_says_so_and_leaves_the_new_holder_alone(store_url: str, ttl: float) -> None:
    stalled = take(store_url, ttl=ttl)
    assert stalled is not None
    store_module._KEEPER.discard(stalled)  # its process stalls: nothing renews it
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


def test_the_run_lock_makes_read_change_write_exclusive(store_url: str) -> None:
    """Four threads, each with a store of its own, add 1 to a run record five times each."""
    CheckpointStore(store_url).write_run(run_record())
    errors: list[BaseException] = []

    def add() -> None:
        st = CheckpointStore(store_url)
        try:
            for _ in range(5):
                with st.run_lock(JK, RID):
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


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_run_lock_left_by_a_dead_process_is_taken_over_when_stale(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "LOCK_STALE_SECONDS", 1.0)
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


def _write_from_elsewhere(store: str) -> None:
    st = CheckpointStore(store)
    st.add_stop_request(run_record(), StopRequest(mode="Cancelled"))
    st.write_task(TaskRecord(job_key=JK, run_id=RID, step="S", task_key="{}", parameters={}))
    os._exit(0)


@LOCAL_AND_S3
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
    monkeypatch.setattr(store_module, "_S3_SUPPORT", {})
    monkeypatch.setattr(
        store_module._S3Objects, "probe", lambda self, path: _S3Support(writes=False, deletes=False)
    )
    caplog.set_level(logging.WARNING, logger="core._store")
    first = take(store_url)
    assert first is not None and first._etag is None  # the read-then-write lease file
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
        with store_module._os_errors(object()):
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
    done = subprocess.run(
        cli_cmd("runs", "--store", s3_server.new_store()),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "checkpoint store 's3://openjd-test/" in done.stderr
    assert "Could not connect" in done.stderr and "Traceback" not in done.stderr
    assert secret not in done.stdout + done.stderr
