"""A claim that finds the task's lease held (``core.run._claim.claim_task``): on S3 it waits for a
holder that died (its lease frees after its ttl, ``$OPENJD_CHECKPOINT_LEASE_SECONDS``), up to
that ttl plus 10 s, and says so; a live holder is refused after the wait, a stop request ends
the wait with the task not started; a local folder refuses at once. The holders are forked
processes that take the task's lease and keep renewing it, as a runner does."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import one_step_template

from core import (
    CheckpointStore,
    ResumeRefusedError,
    begin_attempt,
    host_id,
    plan_step,
    prepare_job,
    request_termination,
    run_tasks,
)
from core.run._claim import LEASE_WAIT_MARGIN_SECONDS
from core.store._lease import LEASE_SECONDS_ENV

FORK = multiprocessing.get_context("fork")
HOLDER_TTL = 2.0


def _hold(location: str, job_key: str, run_id: str, task_key: str, ttl: float, ready) -> None:
    lease = CheckpointStore(location, lease_seconds=ttl).acquire_task_lease(
        job_key, run_id, "S", task_key
    )
    assert lease is not None
    ready.set()
    time.sleep(600)


def _job_and_holder(location: str, tmp_path: Path, *, ttl: float = HOLDER_TTL):
    """A one-task run on ``location`` and a forked process that holds its task's lease."""
    template = one_step_template(tmp_path / "t.yaml", "held", "print('TASK-RAN', flush=True)")
    job = prepare_job(template)
    st = CheckpointStore(location, lease_seconds=ttl)
    attempt = begin_attempt(st, job, external_key="lease/wait")
    [spec] = plan_step(st, job, attempt.run_id, "S")
    holder = start_holder(location, job, attempt.run_id, spec, ttl)
    return st, job, attempt.run_id, spec, holder


def start_holder(location: str, job, run_id: str, spec, ttl: float = HOLDER_TTL):
    """A forked process that takes the task's lease (ttl ``ttl`` s) and keeps renewing it."""
    ready = FORK.Event()
    holder = FORK.Process(
        target=_hold, args=(location, job.job_key, run_id, spec.task_key, ttl, ready)
    )
    holder.start()
    assert ready.wait(30), "the holder never took the lease"
    return holder


def _refused(st, job, run_id: str, spec, holder) -> tuple[ResumeRefusedError, float]:
    """Run the task while ``holder`` holds its lease: the refusal and how long it took (s);
    the holder is killed afterwards."""
    try:
        began = time.monotonic()
        with pytest.raises(ResumeRefusedError) as info:
            run_tasks(st, job, run_id, [spec])
        return info.value, time.monotonic() - began
    finally:
        holder.kill()
        holder.join(10)


@pytest.fixture
def s3_location(s3_store: str) -> str:
    return s3_store


def test_a_dead_holders_lease_is_waited_for_then_the_task_runs(s3_location, tmp_path) -> None:
    st, job, run_id, spec, holder = _job_and_holder(s3_location, tmp_path)
    os.kill(holder.pid, signal.SIGKILL)  # nothing renews or releases its lease now
    holder.join(10)
    notes: list[str] = []
    lines: list[str] = []
    began = time.monotonic()
    [result] = run_tasks(
        st,
        job,
        run_id,
        [spec],
        on_note=notes.append,
        on_output=lambda _ex, out: lines.extend(out),
    )
    waited = time.monotonic() - began
    assert result.outcome.value == "succeeded", (result.message, notes)
    assert any("TASK-RAN" in line for line in lines), lines
    bound = HOLDER_TTL + LEASE_WAIT_MARGIN_SECONDS
    [before] = [n for n in notes if "waiting up to" in n]
    assert f"process {holder.pid} on host {host_id()}" in before, before
    assert f"waiting up to {bound:g} s" in before, before
    assert any("its lease freed after" in n for n in notes), notes
    assert 1.0 <= waited < bound, waited  # the ttl ran out (counted in whole seconds by S3)


def test_a_live_holder_is_refused_after_its_ttl_and_ten_seconds(s3_location, tmp_path) -> None:
    st, job, run_id, spec, holder = _job_and_holder(s3_location, tmp_path)
    refusal, waited = _refused(st, job, run_id, spec, holder)
    assert refusal.code.value == "already-resumed"
    bound = HOLDER_TTL + LEASE_WAIT_MARGIN_SECONDS
    assert bound <= waited < bound + 5, waited
    assert f"process {holder.pid} on host" in str(refusal), refusal
    assert "still renewed after 12 s of waiting" in str(refusal), refusal


def test_a_stop_request_ends_the_wait_and_the_task_is_not_started(s3_location, tmp_path) -> None:
    st, job, run_id, spec, holder = _job_and_holder(s3_location, tmp_path)
    notes: list[str] = []
    waiting = threading.Event()
    waiting_since: list[float] = []

    def note(text: str) -> None:
        notes.append(text)
        if "waiting up to" in text:
            waiting_since.append(time.monotonic())
            waiting.set()

    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(run_tasks(st, job, run_id, [spec], on_note=note))
    )
    try:
        runner.start()
        assert waiting.wait(30), notes
        request_termination(st, job.job_key, run_id, "Suspended")
        runner.join(30)
        ended = time.monotonic()
    finally:
        holder.kill()
        holder.join(10)
    [result] = results
    assert result.outcome.value == "skipped", (result.message, notes)
    assert "the run is stopping (Suspended)" in (result.message or ""), result.message
    # the stop ended the wait, before the wait's own bound (12 s) would have
    bound = HOLDER_TTL + LEASE_WAIT_MARGIN_SECONDS
    assert ended - waiting_since[0] < bound, (ended - waiting_since[0], bound)
    record = st.read_task(job.job_key, run_id, "S", spec.task_key)
    assert record is None or record.process is None  # it never started a process


def test_a_local_store_refuses_a_held_lease_at_once(tmp_path: Path) -> None:
    st, job, run_id, spec, holder = _job_and_holder(str(tmp_path / "store"), tmp_path)
    refusal, waited = _refused(st, job, run_id, spec, holder)
    assert refusal.code.value == "already-resumed"
    assert waited < 3, waited  # the 0.5 s a probe is given, not a ttl


def test_the_lease_object_carries_the_setting_as_its_ttl(
    s3_location, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, "7")
    st = CheckpointStore(s3_location)
    assert st.lease_seconds == 7.0
    lease = st.acquire_task_lease("0123456789abcdef", "20260101-000000-abcdef", "S", "{}")
    assert lease is not None
    try:
        held = st.task_lease_holder("0123456789abcdef", "20260101-000000-abcdef", "S", "{}")
        assert held is not None and held.ttl == 7.0
        assert held.owner is not None and held.owner.pid == os.getpid()
    finally:
        lease.release()
    assert CheckpointStore(s3_location, lease_seconds=3).lease_seconds == 3.0  # the argument wins


@pytest.mark.parametrize("value", ["abc", "0", "0.5", "86401", "nan", "-3"])
def test_a_bad_lease_setting_is_refused_naming_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, value)
    with pytest.raises(ValueError, match=LEASE_SECONDS_ENV) as info:
        CheckpointStore(tmp_path / "store")
    assert repr(value) in str(info.value)
    with pytest.raises(ValueError, match="lease_seconds"):
        CheckpointStore(tmp_path / "store", lease_seconds=float(value) if value != "abc" else 0)


def test_a_dead_local_holder_on_s3_is_described_with_the_setting(
    s3_location, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core._records import ProcessInfo
    from core.store import describe_holder

    st = CheckpointStore(s3_location, lease_seconds=5)
    gone = ProcessInfo(pid=2**22 + 17, pgid=0, start_time=0, host=host_id())
    text = describe_holder(st, gone)
    assert "frees 5 s after its last renewal" in text and LEASE_SECONDS_ENV in text, text
