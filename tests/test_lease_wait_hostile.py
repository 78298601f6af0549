"""Hostile cases of a claim's wait for a held task lease (``core.run._claim.claim_task``) and of
its setting, ``$OPENJD_CHECKPOINT_LEASE_SECONDS`` (``core.store._lease.lease_seconds_setting``): bad
values of the setting (in the CLI too), lease objects on S3 with garbage content, a holder
killed while a claim waits for it, and two claims waiting for the same dead holder."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import one_step_template, run_cli
from test_lease_wait import start_holder

from core import (
    CheckpointStore,
    ResumeRefusedError,
    begin_attempt,
    plan_step,
    prepare_job,
    run_tasks,
)
from core._errors import StoreError
from core.run._claim import LEASE_WAIT_MARGIN_SECONDS, NotStartedError, claim_task
from core.store._lease import DEFAULT_LEASE_SECONDS, LEASE_SECONDS_ENV, lease_seconds_setting

FORK = multiprocessing.get_context("fork")


# --- the setting ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value", ["abc", "inf", "1e400", "-1", "1" * 500], ids=["abc", "inf", "1e400", "-1", "500-ones"]
)
def test_a_bad_lease_setting_is_a_clean_cli_error_not_an_internal_one(
    value: str, tmp_path: Path
) -> None:
    template = one_step_template(tmp_path / "t.yaml", "bad", "print('TASK-RAN')")
    env = dict(os.environ, **{LEASE_SECONDS_ENV: value})
    proc = run_cli("run", template, "--store", tmp_path / "store", env=env, timeout=60)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert LEASE_SECONDS_ENV in proc.stderr, proc.stderr
    assert "TASK-RAN" not in proc.stdout


@pytest.mark.parametrize(("value", "seconds"), [("", DEFAULT_LEASE_SECONDS), (" 5 ", 5.0)])
def test_an_empty_or_padded_setting(value: str, seconds: float, monkeypatch) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, value)
    assert lease_seconds_setting() == seconds


@pytest.mark.parametrize("value", [10**400, 10**5000], ids=["400-digits", "5000-digits"])
def test_a_huge_int_argument_is_a_value_error_not_an_overflow(value: int) -> None:
    with pytest.raises(ValueError, match="lease_seconds") as info:
        lease_seconds_setting(value)
    assert isinstance(info.value, StoreError)  # the CLI reports it as a store setting


# --- lease objects with garbage content ----------------------------------------------------------
def _one_task(location: str, tmp_path: Path, code: str = "print('TASK-RAN', flush=True)"):
    template = one_step_template(tmp_path / "t.yaml", "held", code)
    job = prepare_job(template)
    st = CheckpointStore(location, lease_seconds=2)
    attempt = begin_attempt(st, job, external_key="lease/hostile")
    [spec] = plan_step(st, job, attempt.run_id, "S")
    return st, job, attempt.run_id, spec


def _write_lease_object(st: CheckpointStore, job, run_id: str, spec, body: bytes) -> None:
    base = st._task_lease_base(job.job_key, run_id, spec.step_name, spec.task_key)
    path = st.fs.confined(base + ".lease.json")
    objects = st.fs.conditional()
    assert objects is not None
    assert objects.create(path, body) is not None


def _renewals(st: CheckpointStore, job, run_id: str, spec) -> int:
    """How many times the holder of the task's lease renewed it (the lease object says)."""
    base = st._task_lease_base(job.job_key, run_id, spec.step_name, spec.task_key)
    objects = st.fs.conditional()
    assert objects is not None
    got = objects.get(st.fs.confined(base + ".lease.json"))
    assert got is not None, "the lease object is gone"
    return int(json.loads(got[0])["renewals"])


GARBAGE = {
    "not-json": b"garbage\x00\xff",
    "a-list": b"[1, 2]",
    "ttl-abc": b'{"ttl": "abc", "token": "t"}',
    "ttl-negative": b'{"ttl": -5, "token": "t"}',
    "ttl-1e9": b'{"ttl": 1e9, "token": "t"}',
    "ttl-huge-int": b'{"ttl": 1' + b"0" * 400 + b', "token": "t"}',
    "ttl-nan": b'{"ttl": NaN, "token": "t"}',
    "no-owner": b'{"ttl": 60, "token": "t", "expires_at": 0}',
    "owner-garbage": b'{"ttl": 60, "owner": {"pid": "x"}, "token": "t"}',
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_garbage_lease_object_is_waited_for_by_the_default_ttl_and_harms_nothing(
    kind: str, s3_store: str, tmp_path: Path
) -> None:
    """The holder of a lease object that says nothing usable is 'another process' whose ttl is
    the default (60 s): waited for (here: stopped at once), never a traceback, and the task's
    stored record is left as it was."""
    st, job, run_id, spec = _one_task(s3_store, tmp_path)
    [first] = run_tasks(st, job, run_id, [spec])
    assert first.outcome.value == "succeeded"
    before = st.read_task(job.job_key, run_id, "S", spec.task_key)
    _write_lease_object(st, job, run_id, spec, GARBAGE[kind])
    held = st.task_lease_holder(job.job_key, run_id, "S", spec.task_key)
    assert held is not None and held.ttl == DEFAULT_LEASE_SECONDS
    if kind != "owner-garbage" and kind != "no-owner":
        assert held.describe() == "another process"
    notes: list[str] = []
    asked: list[int] = []

    def should_stop() -> str | None:
        asked.append(1)
        return "stop" if len(asked) > 1 else None

    with pytest.raises(NotStartedError):
        claim_task(st, job, run_id, spec, note=notes.append, should_stop=should_stop)
    assert len(asked) == 2  # stopped at the first "stop", not waited out
    bound = DEFAULT_LEASE_SECONDS + LEASE_WAIT_MARGIN_SECONDS
    assert any(f"waiting up to {bound:g} s" in n for n in notes), notes
    after = st.read_task(job.job_key, run_id, "S", spec.task_key)
    assert after is not None and before is not None
    assert after.model_dump() == before.model_dump()


def test_a_lease_object_with_a_zero_ttl_is_taken_over_soon(s3_store: str, tmp_path) -> None:
    st, job, run_id, spec = _one_task(s3_store, tmp_path)
    _write_lease_object(st, job, run_id, spec, json.dumps({"ttl": 0, "token": "t"}).encode())
    began = time.monotonic()
    lease, _record = claim_task(st, job, run_id, spec)
    try:
        assert time.monotonic() - began < LEASE_WAIT_MARGIN_SECONDS
    finally:
        lease.release()


# --- holders that die at awkward moments --------------------------------------------------------
def test_a_holder_killed_while_the_claim_waits_frees_the_task_soon(s3_store, tmp_path) -> None:
    st, job, run_id, spec = _one_task(s3_store, tmp_path)
    holder = start_holder(s3_store, job, run_id, spec)
    waiting = threading.Event()
    notes: list[str] = []
    lines: list[str] = []
    results: list = []

    def note(text: str) -> None:
        notes.append(text)
        if "waiting up to" in text:
            waiting.set()

    runner = threading.Thread(
        target=lambda: results.extend(
            run_tasks(
                st, job, run_id, [spec], on_note=note, on_output=lambda _e, o: lines.extend(o)
            )
        )
    )
    try:
        runner.start()
        assert waiting.wait(30), notes
        before = _renewals(st, job, run_id, spec)
        end = time.monotonic() + 30
        while _renewals(st, job, run_id, spec) <= before:
            assert runner.is_alive() and time.monotonic() < end, notes
            time.sleep(0.05)
        assert runner.is_alive(), notes  # the holder renewed meanwhile: the claim still waits
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        runner.join(30)
        freed_after = time.monotonic() - killed
    finally:
        holder.kill()
        holder.join(10)
    [result] = results
    assert result.outcome.value == "succeeded", (result.message, notes)
    assert any("TASK-RAN" in line for line in lines), lines
    assert freed_after < 2.0 + 4, freed_after  # its ttl (2 s), counted in whole seconds by S3


def _wait_and_run(location: str, job_key_path: str, run_id: str, spec_dict, out) -> None:
    from core import TaskSpec

    job = prepare_job(job_key_path)
    st = CheckpointStore(location, lease_seconds=2)
    spec = TaskSpec.from_dict(spec_dict)
    try:
        [result] = run_tasks(st, job, run_id, [spec])
        out.put(("ran", result.outcome.value, result.message))
    except ResumeRefusedError as exc:
        out.put(("refused", exc.code.value, str(exc)))
    except BaseException as exc:  # pragma: no cover - reported to the test
        out.put(("error", type(exc).__name__, str(exc)))


def test_two_claims_waiting_for_one_dead_holder_run_the_task_once(s3_store, tmp_path) -> None:
    ran = tmp_path / "ran.txt"
    code = f"import time; time.sleep(0.5); open({str(ran)!r}, 'a').write('x\\n')"
    st, job, run_id, spec = _one_task(s3_store, tmp_path, code)
    holder = start_holder(s3_store, job, run_id, spec)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    out = FORK.Queue()
    waiters = [
        FORK.Process(
            target=_wait_and_run,
            args=(s3_store, str(tmp_path / "t.yaml"), run_id, spec.to_dict(), out),
        )
        for _ in range(2)
    ]
    try:
        for w in waiters:
            w.start()
        answers = [out.get(timeout=40) for _ in waiters]
    finally:
        for w in waiters:
            w.kill()
            w.join(10)
    kinds = sorted(a[0] for a in answers)
    assert kinds == ["ran", "refused"], answers
    [ran_answer] = [a for a in answers if a[0] == "ran"]
    assert ran_answer[1] == "succeeded", answers
    [refused] = [a for a in answers if a[0] == "refused"]
    assert refused[1] == "already-resumed", answers
    assert ran.read_text() == "x\n"  # once
