"""Run-level core operations (issue 6), driven as a distributed scheduler drives them: every
task in a separate OS process (``tests/run_worker.py`` stands in for an Airflow or Prefect
worker), termination requests from yet another process, the store as the only thing shared.

The lease and concurrency tests run on a local store and on an S3 store (the ``store_url``
fixture: a moto server), where leases and the run's lock are conditional writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import DATA, ROOT, cli_cmd, run_cli

from core import (
    CheckpointStore,
    ResumeRefusedError,
    RunStatus,
    TaskSpec,
    begin_attempt,
    finish_attempt,
    plan_step,
    prepare_job,
    request_termination,
)
from core.cli._runner import JobRunner
from core.job import plan_tasks
from core.job._template import parse_template
from core.local import enter_finally

pytestmark = pytest.mark.slow
THREE = DATA / "three_steps.yaml"
COUNTER = DATA / "counter.yaml"
WORKER = str(Path(__file__).resolve().parent / "run_worker.py")
LOCAL_AND_S3 = pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)


class Worker:
    """One worker process running one task."""

    def __init__(self, store: Path | str, job_key: str, run_id: str, spec: TaskSpec) -> None:
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, str(store), job_key, run_id, json.dumps(spec.to_dict())],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            start_new_session=True,
        )
        self.output = ""

    def wait(self, timeout: float = 60) -> dict:
        self.output, _ = self.proc.communicate(timeout=timeout)
        last = self.output.strip().splitlines()[-1] if self.output.strip() else "{}"
        try:
            return json.loads(last)
        except ValueError:
            return {"crash": self.output}


def drive(store: Path, job, *, key: str = "test/run-1", stop_during=None) -> dict:
    """Drive one attempt through the operations, every task in its own worker process."""
    attempt = begin_attempt(CheckpointStore(store), job, external_key=key)
    st = CheckpointStore(store)
    outputs: list[str] = []
    for step in job.step_order():
        if job.template.is_finally(step):
            continue
        specs = plan_step(st, job, attempt.run_id, step)
        workers = [Worker(store, attempt.job_key, attempt.run_id, s) for s in specs]
        if stop_during is not None and step == stop_during[0]:
            stop_during[1](attempt)
        results = [w.wait() for w in workers]
        outputs += [w.output for w in workers]
        if any(r.get("outcome") != "succeeded" for r in results):
            break
    decision = enter_finally(st, job, attempt.run_id)
    if decision.run_finally:
        for step in job.template.finally_steps:
            for s in plan_step(st, job, attempt.run_id, step):
                w = Worker(store, attempt.job_key, attempt.run_id, s)
                w.wait()
                outputs.append(w.output)
    outcome = finish_attempt(st, job, attempt.run_id)
    return {
        "attempt": attempt,
        "decision": decision,
        "outcome": outcome,
        "output": "\n".join(outputs),
    }


def cleanup_status(out: Path) -> str:
    path = out / "cleanup-status"
    return path.read_text().strip() if path.exists() else ""


@pytest.mark.parametrize("fail_frame", [0, 4])
def test_three_steps_in_separate_processes_end_as_the_job_runner(
    tmp_path: Path, fail_frame: int
) -> None:
    out_ops, out_runner = tmp_path / "ops", tmp_path / "runner"
    out_ops.mkdir()
    out_runner.mkdir()
    params = {"FailFrame": fail_frame, "FrameSeconds": 0.05}
    (out_ops / "fail-now").touch()
    (out_runner / "fail-now").touch()
    job = prepare_job(THREE, dict(params, Out=str(out_ops)))
    got = drive(tmp_path / "store-ops", job)
    labels = [s.label for s in plan_tasks(job, "Render")]
    assert labels == ["Render[Frame=1-2]", "Render[Frame=3-4]", "Render[Frame=5-6]"]

    runner_job = prepare_job(THREE, dict(params, Out=str(out_runner)))
    ref = JobRunner(runner_job, store=CheckpointStore(tmp_path / "store-runner")).run()

    outcome = got["outcome"]
    assert outcome.status == ref.status
    assert outcome.condition.reason == ref.condition.reason
    assert outcome.condition.message == ref.condition.message
    assert outcome.exit_code == ref.exit_code
    expected = "Succeeded" if not fail_frame else "Failed"
    assert got["decision"].job_status == expected
    assert cleanup_status(out_ops) == cleanup_status(out_runner) == expected
    store = CheckpointStore(tmp_path / "store-ops")
    runs, _ = store.list_runs()
    tasks, _ = store.read_tasks(runs[0].job_key, runs[0].run_id)
    if fail_frame:
        assert "ASSEMBLED" not in got["output"]
        assert any(t.completed_frames == [3] for t in tasks)  # the failed chunk's finished frame
    else:
        assert "ASSEMBLED" in got["output"]
        assert tasks == []  # a succeeded run deletes its checkpoints and task records


@LOCAL_AND_S3
def test_two_processes_claim_one_task_and_exactly_one_runs(store_url: str) -> None:
    store = store_url
    job = prepare_job(COUNTER, {"N": 10, "StepSeconds": 0.2})
    attempt = begin_attempt(CheckpointStore(store), job, external_key="claim")
    [spec] = plan_step(CheckpointStore(store), job, attempt.run_id, "Count")
    a = Worker(store, attempt.job_key, attempt.run_id, spec)
    b = Worker(store, attempt.job_key, attempt.run_id, spec)
    results = [a.wait(), b.wait()]
    ran = [r for r in results if r.get("outcome") == "succeeded"]
    refused = [r for r in results if r.get("refused")]
    assert len(ran) == 1 and len(refused) == 1, results
    assert refused[0]["refused"] == "already-resumed"
    assert "is being run by another process" in refused[0]["message"]


def _wait_for_checkpoint(store: Path, job_key: str, run_id: str, generation: int) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        tasks, _ = CheckpointStore(store).read_tasks(job_key, run_id)
        if tasks and tasks[0].checkpoint and tasks[0].checkpoint.generation >= generation:
            return
        time.sleep(0.05)
    raise AssertionError("no checkpoint was stored")


def test_a_killed_worker_is_replaced_and_the_task_resumes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    lock = tmp_path / "counter.lock"
    # 0.5 s a step: the orphan still runs when the second worker claims the task, however
    # slowly a loaded machine starts it (at 0.1 s it could finish first)
    job = prepare_job(COUNTER, {"N": 40, "StepSeconds": 0.5, "LockFile": str(lock)})
    attempt = begin_attempt(CheckpointStore(store), job, external_key="kill")
    [spec] = plan_step(CheckpointStore(store), job, attempt.run_id, "Count")
    first = Worker(store, attempt.job_key, attempt.run_id, spec)
    _wait_for_checkpoint(store, attempt.job_key, attempt.run_id, 3)
    [record] = CheckpointStore(store).read_tasks(attempt.job_key, attempt.run_id)[0]
    assert record.process is not None
    orphan_pid = record.process.pid
    first.proc.send_signal(signal.SIGKILL)  # the worker only: its task runs on, unsupervised
    first.proc.wait(10)
    assert psutil.pid_exists(orphan_pid)

    # The framework retries on another worker: it plans again and claims the task.
    [again] = plan_step(CheckpointStore(store), job, attempt.run_id, "Count")
    assert again.resume is not None and again.resume.generation >= 3
    second = Worker(store, attempt.job_key, attempt.run_id, again)
    result = second.wait(timeout=180)  # a hang bound; the orphan runs to its end first
    assert result.get("outcome") == "succeeded", second.output
    assert "left running by an earlier attempt" in second.output
    assert "COUNTER-CONCURRENT" not in second.output  # never two copies at once
    assert f"COUNTER-DONE n=40 sum={sum(range(1, 41))}" in second.output
    assert not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == "zombie"


# mode -> (Render's tasks end as, Job.Status of the finally step or "" if it did not run,
#          run status)
MODES = {
    "Suspended": ("interrupted_with_checkpoint", "", "interrupted"),
    "Cancelled": ("canceled", "", "canceled"),
    "CancelledRunFinally": ("canceled", "Cancelled", "canceled"),
    "StoppedRunFinally": ("succeeded", "Stopped", "stopped"),
}


@pytest.mark.parametrize(
    ("store_url", "mode"),
    [("local", mode) for mode in MODES] + [("s3", "Suspended")],
    indirect=["store_url"],
)
def test_a_request_from_a_third_process_reaches_tasks_in_two_others(
    tmp_path: Path, store_url: str, mode: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    store = store_url
    # Two chunks of two frames: both run at once in two workers. The modes that stop running
    # tasks get frames long enough that no chunk can end before the request has come through a
    # loaded machine (30 s: they are stopped within a second of it); StoppedRunFinally lets
    # them finish, so its frames are short.
    seconds = 2.5 if mode == "StoppedRunFinally" else 30
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": seconds})
    attempt = begin_attempt(CheckpointStore(store), job, external_key=f"modes-{mode}")
    st = CheckpointStore(store)
    specs = plan_step(st, job, attempt.run_id, "Render")[:2]
    workers = [Worker(store, attempt.job_key, attempt.run_id, s) for s in specs]
    end = time.monotonic() + 30
    # both chunks running (a stop that lands before one starts skips it: the CLI's 1.8 s start-up
    # used to give it that time)
    while not all(f"RENDER-START {c}" in _started(store) for c in ("1-2", "3-4")):
        assert time.monotonic() < end, _started(store)
        time.sleep(0.05)
    sent = run_cli(
        "stop", attempt.run_id, "--mode", mode, "--store", str(store), cwd=ROOT, timeout=30
    )
    assert sent.returncode == 0, sent.stderr
    results = [w.wait() for w in workers]
    want_task, want_status, want_run = MODES[mode]
    assert [r.get("outcome") for r in results] == [want_task, want_task], results
    decision = enter_finally(st, job, attempt.run_id)
    if decision.run_finally:
        for s in plan_step(st, job, attempt.run_id, "Cleanup"):
            assert Worker(store, attempt.job_key, attempt.run_id, s).wait()["outcome"] == (
                "succeeded"
            )
    outcome = finish_attempt(st, job, attempt.run_id)
    assert cleanup_status(out) == want_status
    assert outcome.status.value == want_run
    assert outcome.condition.reason == mode
    # Checkpoints survive every ending but full success.
    tasks, _ = st.read_tasks(attempt.job_key, attempt.run_id)
    assert tasks, "task records must survive a stopped run"
    if mode == "Suspended":
        assert all(t.checkpoint is not None for t in tasks if t.step == "Render")


def _started(store: Path | str) -> str:
    """Which Render chunks have a running process that can take its checkpoint signal (their
    task records name a process, and it has installed its SIGUSR1 handler: a process started
    but not yet that far, as on a loaded machine, dies of the signal's default action)."""
    st = CheckpointStore(store)
    runs, _ = st.list_runs()
    names = [
        "RENDER-START " + t.parameters["Frame"]["value"]
        for r in runs
        for t in st.read_tasks(r.job_key, r.run_id)[0]
        if t.process is not None and _catches(t.process.pid, signal.SIGUSR1)
    ]
    return " ".join(names)


def _catches(pid: int, sig: int) -> bool:
    """True if process ``pid`` has a handler of its own for ``sig`` (``SigCgt`` in
    /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            caught = next(line for line in fh if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


def test_checkpoints_survive_a_failure_and_go_after_success(tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    job = prepare_job(THREE, {"Out": str(out), "FailFrame": 4, "FrameSeconds": 0.01})
    got = drive(store, job, key="survive")
    assert got["outcome"].status.value == "failed"
    st = CheckpointStore(store)
    run_id = got["attempt"].run_id
    tasks, _ = st.read_tasks(got["attempt"].job_key, run_id)
    assert any(t.completed_frames == [3] for t in tasks)
    # The framework's retry of the same run (same external key) resumes it and succeeds:
    # only frame 4 runs again, and the run's records are gone after the success.
    (out / "fail-now").unlink()
    again = drive(store, job, key="survive")
    assert again["attempt"].run_id == run_id and again["attempt"].attempt == 2
    assert again["outcome"].status.value == "succeeded"
    assert "RENDER-START 4" in again["output"]
    assert [p.read_text() for p in sorted(out.glob("frame-*"))] == ["x"] * 6
    assert st.read_tasks(got["attempt"].job_key, run_id)[0] == []


def test_framework_retry_continues_the_run_and_a_new_key_starts_fresh(tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = tmp_path / "out"
    out.mkdir()
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": 0.01})
    st = CheckpointStore(store)
    first = begin_attempt(st, job, external_key="dag/run-a")
    again = begin_attempt(st, job, external_key="dag/run-a")
    other = begin_attempt(st, job, external_key="dag/run-b")
    assert again.run_id == first.run_id and again.attempt == 2
    assert other.run_id != first.run_id and other.attempt == 1


def test_runner_killed_before_first_checkpoint_leaves_nothing_for_the_next_run(
    tmp_path: Path,
) -> None:
    for fresh in (False, True):
        store = tmp_path / f"store-{fresh}"
        lock = tmp_path / f"lock-{fresh}"
        args = ["run", str(COUNTER), "--store", str(store), "-q"]
        args += ["-p", "N=40", "-p", "StepSeconds=0.1", "-p", "SaveEvery=0"]
        args += ["-p", f"LockFile={lock}"]
        first = subprocess.Popen(
            cli_cmd(*args),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        pid = _task_pid(store)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # paused, so that on a slow machine it cannot finish its 4 s before the next run looks
        os.kill(pid, signal.SIGSTOP)
        assert psutil.pid_exists(pid)
        second = run_cli(*args, *(["--fresh"] if fresh else []), cwd=ROOT, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "COUNTER-CONCURRENT" not in second.stdout
        assert f"COUNTER-DONE n=40 sum={sum(range(1, 41))}" in second.stdout
        assert "left running by a dead runner" in second.stderr, second.stderr
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def _task_pid(store: Path | str) -> int:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        st = CheckpointStore(store)
        runs, _ = st.list_runs()
        for run in runs:
            tasks, _ = st.read_tasks(run.job_key, run.run_id)
            for t in tasks:
                if t.process is not None and t.process.pid:  # 0: about to start
                    return t.process.pid
        time.sleep(0.05)
    raise AssertionError("the task never started")


def _wait_locked(lock: Path, timeout: float = 30.0) -> None:
    """Wait until the counter's action holds its flock on ``lock`` (it is running)."""
    import fcntl

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lock.exists():
            with open(lock, "rb") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # held: the action runs
        time.sleep(0.05)
    raise AssertionError(f"no action locked {lock} within {timeout:g} s")


def _when_gone(pid: int, timeout: float) -> float:
    """The time (``time.time()``) at which process ``pid`` was first seen gone or a zombie."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return time.time()
        if state in ("Z", "X"):
            return time.time()
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs after {timeout} s")


def test_ten_concurrent_fresh_runs_of_one_job_run_it_once(tmp_path: Path) -> None:
    """(On S3 the job's lock is tested in test_leases.py: ten CLI processes that import s3fs
    take too long to start on a small machine.)"""
    store = tmp_path / "store"
    args = ["run", str(COUNTER), "--store", str(store), "-q", "--fresh"]
    # 15 s of work: the run still runs when the last of the ten has started on a loaded machine
    # (at 3 s a process started 5 s late found it ended, and rightly ran the job again)
    args += ["-p", "N=10", "-p", "StepSeconds=1.5", "-p", f"LockFile={tmp_path / 'lock'}"]
    procs = [
        subprocess.Popen(
            cli_cmd(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(10)
    ]
    results = [(p.wait(120), *p.communicate()) for p in procs]
    ran = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] == 4]
    assert len(ran) == 1 and len(refused) == 9, [(r[0], r[2][-300:]) for r in results]
    for _code, _out, err in refused:
        assert "already-resumed" in err and "is being run now" in err
        # the stop command to paste names the store the run is in (a hostile trial)
        assert f" --mode Suspended --store {store}')" in err, err
    assert all("COUNTER-CONCURRENT" not in out for _c, out, _e in results)


def test_a_stop_deadline_shortens_the_notify_period(tmp_path: Path) -> None:
    import threading

    from core import StopIntent, TaskExecution

    job = prepare_job(COUNTER, {"N": 1000, "StepSeconds": 0.1, "IgnoreSignal": 1})
    [spec] = plan_tasks(job, "Count")
    lines: list[str] = []
    ex = TaskExecution(job, spec, run_id="deadline-run", on_output=lambda _e, ls: lines.extend(ls))
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", ex.run()))
    t.start()
    end = time.monotonic() + 20
    while not any("COUNTER-STEP" in line for line in lines) and time.monotonic() < end:
        time.sleep(0.02)
    started = time.time()
    deadline = started + 2.0
    ex.stop(StopIntent.CHECKPOINT, deadline=deadline)
    t.join(30)
    ended = time.time()
    assert "COUNTER-IGNORING" in lines  # it was notified first
    assert ended < deadline, f"still running {ended - deadline:.2f} s after the deadline"
    assert ended - started > 1.0  # after the shortened notify period, not at once
    warning = next(w for w in ex.warnings if "would outlast the stop deadline" in w)
    assert "notifyPeriodInSeconds 10 s" in warning
    seconds = float(re.search(r"deadline, ([0-9.]+) s from now", warning).group(1))
    assert 0 < seconds <= 2.0  # the time left when the stop was applied, as it was then


def test_a_stop_request_with_a_deadline_reaches_another_process(tmp_path: Path) -> None:
    store = tmp_path / "store"
    job = prepare_job(COUNTER, {"N": 1000, "StepSeconds": 0.1, "IgnoreSignal": 1})
    attempt = begin_attempt(CheckpointStore(store), job, external_key="deadline")
    [spec] = plan_step(CheckpointStore(store), job, attempt.run_id, "Count")
    w = Worker(store, attempt.job_key, attempt.run_id, spec)
    pid = _task_pid(store)  # the task runs
    deadline = time.time() + 3
    request_termination(
        CheckpointStore(store), attempt.job_key, attempt.run_id, "Suspended", deadline=deadline
    )
    gone = _when_gone(pid, 30)
    result = w.wait(30)
    # the deadline bounds the task's process; the worker then writes its records and exits,
    # which on a loaded CI machine took another 0.9 s, so the worker gets a looser bound
    assert gone < deadline + 0.5, f"the task ran {gone - deadline:.2f} s past the deadline"
    assert time.time() < deadline + 5
    assert result["outcome"] in ("interrupted", "interrupted_with_checkpoint"), w.output
    assert "would outlast the stop deadline" in w.output or result, w.output


def test_refused_claims_do_not_break_the_holder(tmp_path: Path) -> None:
    """The refused process must not touch the holder's processes or record."""
    store = tmp_path / "store"
    job = prepare_job(COUNTER, {"N": 8, "StepSeconds": 0.25})
    st = CheckpointStore(store)
    attempt = begin_attempt(st, job, external_key="holder")
    [spec] = plan_step(st, job, attempt.run_id, "Count")
    holder = Worker(store, attempt.job_key, attempt.run_id, spec)
    _task_pid(store)
    from core.run._claim import claim_task

    with pytest.raises(ResumeRefusedError) as info:
        claim_task(st, job, attempt.run_id, spec)
    assert info.value.code.value == "already-resumed"
    assert holder.wait()["outcome"] == "succeeded"


def _send(store: str, job_key: str, run_id: str, mode: str, at: float) -> str:
    """In a pool process: ask for ``mode`` at wall time ``at``."""
    from core import RunError

    time.sleep(max(0.0, at - time.time()))
    try:
        request_termination(CheckpointStore(store), job_key, run_id, mode)
    except RunError as exc:
        return f"refused: {exc}"
    return "accepted"


def _supersede(store: str, job_key: str, run_id: str, at: float) -> str:
    time.sleep(max(0.0, at - time.time()))
    CheckpointStore(store).update_run(job_key, run_id, superseded_by="a-later-run")
    return "done"


# (first, second, the mode the run must end in), for the regular phase and start-up
PAIRS = [
    ("StoppedRunFinally", "Cancelled", "Cancelled"),
    ("CancelledRunFinally", "Cancelled", "Cancelled"),
    ("StoppedRunFinally", "CancelledRunFinally", "CancelledRunFinally"),
    ("Suspended", "Cancelled", "Cancelled"),
]
# while finally steps run, CancelledRunFinally and StoppedRunFinally change nothing
FINALLY_PAIRS = [
    ("StoppedRunFinally", "Cancelled", "Cancelled"),
    ("CancelledRunFinally", "Cancelled", "Cancelled"),
    ("Suspended", "Cancelled", "Cancelled"),
]


@pytest.mark.parametrize(
    ("store_url", "phase", "reps"),
    [("local", phase, 24) for phase in ("start-up", "regular", "finally")] + [("s3", "regular", 4)],
    indirect=["store_url"],
)
def test_concurrent_stop_requests_end_in_the_more_forceful_mode(
    tmp_path: Path, store_url: str, phase: str, reps: int
) -> None:
    """Two stop requests and a record update at once, from three processes: the run's lock
    keeps every one. Two rounds of the pairs try each in both orders (on S3, whose rounds are
    slower, one round: each pair once)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    out = tmp_path / "out"
    out.mkdir()
    store = store_url
    job = prepare_job(THREE, {"Out": str(out)})
    st = CheckpointStore(store)
    pairs = FINALLY_PAIRS if phase == "finally" else PAIRS
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=3, mp_context=ctx) as pool:
        for rep in range(reps):
            first, second, want = pairs[rep % len(pairs)]
            if (rep // len(pairs)) % 2:
                first, second = second, first  # both orders
            attempt = begin_attempt(st, job, external_key=f"{phase}-{rep}")
            args = (str(store), attempt.job_key, attempt.run_id)
            if phase == "regular":
                # a task of the run is mid-way: its record says it runs
                [spec, *_] = plan_step(st, job, attempt.run_id, "Render")
                from core.task import TaskExecution

                rec = TaskExecution(job, spec, run_id=attempt.run_id).record
                rec.status = rec.status.RUNNING
                st.write_task(rec)
            elif phase == "finally":
                assert enter_finally(st, job, attempt.run_id).run_finally
            t0 = time.time() + 0.15
            futures = [
                pool.submit(_send, *args, first, t0),
                pool.submit(_send, *args, second, t0 + 0.05),
                pool.submit(_supersede, *args, t0 + 0.02),
            ]
            answers = [f.result(30) for f in futures]
            if phase != "finally":
                enter_finally(st, job, attempt.run_id)
            outcome = finish_attempt(st, job, attempt.run_id)
            assert outcome.mode is not None and outcome.mode.value == want, (rep, answers)
            rec = st.read_run(attempt.job_key, attempt.run_id)
            assert rec is not None and rec.superseded_by == "a-later-run", rep
            assert rec.condition.reason == want
            assert "accepted" in answers


def test_a_late_request_is_refused_not_dropped(tmp_path: Path) -> None:
    from core import RunError

    out = tmp_path / "out"
    out.mkdir()
    store = tmp_path / "store"
    job = prepare_job(THREE, {"Out": str(out)})
    st = CheckpointStore(store)
    attempt = begin_attempt(st, job, external_key="late")
    enter_finally(st, job, attempt.run_id)
    finish_attempt(st, job, attempt.run_id)
    with pytest.raises(RunError, match="has ended"):
        request_termination(st, attempt.job_key, attempt.run_id, "Cancelled")


def test_a_group_of_tasks_runs_in_one_session_and_replans_by_original_task(
    tmp_path: Path,
) -> None:
    import threading

    from core import plan_group, run_tasks

    log = tmp_path / "log"
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(DATA / "sessions_job_env.yaml", {"Log": str(log)})
    attempt = begin_attempt(st, job, external_key="group")
    originals = plan_tasks(job, "Work")  # the stable list an adapter maps over
    assert [s.label for s in originals] == [f"Work[I={i}]" for i in range(1, 9)]
    ran_in: list[threading.Thread] = []
    first = run_tasks(
        st,
        job,
        attempt.run_id,
        plan_group(st, job, attempt.run_id, originals[:3]),
        on_event=lambda ex, ev: ev.kind == "started" and ran_in.append(threading.current_thread()),
    )
    assert [r.outcome.value for r in first] == ["succeeded"] * 3
    # Called from the main thread (where signal handlers run), the tasks run in a pool thread.
    assert len(ran_in) == 3 and threading.main_thread() not in ran_in
    lines = log.read_text().splitlines()
    assert lines.count("enter") == 1 and lines.count("exit") == 1 and len(lines) == 5
    # Re-planned, the same originals name the same tasks: the finished ones drop out.
    assert plan_group(st, job, attempt.run_id, originals[:3]) == []
    rest = plan_group(st, job, attempt.run_id, originals)
    assert [s.label for s in rest] == [f"Work[I={i}]" for i in range(4, 9)]


def test_a_stop_asked_in_this_process_reaches_its_running_task_at_once(tmp_path: Path) -> None:
    """A task run by ``run_tasks`` in this process (a Prefect task run in the flow run's
    process) whose executor reads the store's requests only once an hour: a
    ``request_termination`` made in this process, through another ``CheckpointStore`` of the
    same location (the flow's), reaches it directly, not at that read. It checkpoints and
    stops long before it would have counted to its end (60 s)."""
    import threading

    from core import TaskOutcome, run_tasks

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(COUNTER, {"N": 300, "StepSeconds": 0.2, "SaveEvery": 0})
    attempt = begin_attempt(st, job, external_key="here")
    [spec] = plan_step(st, job, attempt.run_id, "Count")
    counting = threading.Event()
    results: list = []

    def work() -> None:
        results.extend(
            run_tasks(
                st,
                job,
                attempt.run_id,
                [spec],
                poll_seconds=3600,
                on_output=lambda ex, lines: (
                    any("COUNTER-STEP" in x for x in lines) and counting.set()
                ),
            )
        )

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert counting.wait(60), "the task did not start counting"
    flows_store = CheckpointStore(tmp_path / "store")
    term, note = request_termination(flows_store, attempt.job_key, attempt.run_id, "Suspended")
    assert term.mode is not None and term.mode.value == "Suspended" and note is None
    worker.join(30)
    assert not worker.is_alive(), "the stop did not reach the task"
    [result] = results
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, result
    assert result.record.checkpoint is not None


def test_a_chunk_remainder_stays_with_its_original_task(tmp_path: Path) -> None:
    from core import plan_group

    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(THREE, {"Out": str(out), "FailFrame": 4, "FrameSeconds": 0.01})
    attempt = begin_attempt(st, job, external_key="remainder")
    originals = plan_tasks(job, "Render")
    [res] = run_task_in_process(st, job, attempt.run_id, originals[1])
    assert res.outcome.value == "failed"
    assert [s.label for s in plan_group(st, job, attempt.run_id, originals[1:2])] == [
        "Render[Frame=4]"
    ]
    assert [s.label for s in plan_group(st, job, attempt.run_id, originals[:1])] == [
        "Render[Frame=1-2]"
    ]


def run_task_in_process(st: CheckpointStore, job, run_id: str, spec: TaskSpec) -> list:
    from core import run_tasks

    return run_tasks(st, job, run_id, [spec])


def test_wait_tasks_released_waits_for_the_running_task(tmp_path: Path) -> None:
    import threading

    from core import run_tasks
    from core.run._phases import wait_tasks_released

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(ROOT / "examples" / "fibonacci" / "fibonacci-fast.yaml", {"N": 15})
    attempt = begin_attempt(st, job, external_key="released")
    started = threading.Event()
    ran_in: list[threading.Thread] = []

    def work() -> None:
        run_tasks(
            st,
            job,
            attempt.run_id,
            plan_tasks(job, "ResumableFibonacci"),
            on_start=lambda ex: started.set(),
            on_event=lambda ex, ev: (
                ev.kind == "started" and ran_in.append(threading.current_thread())
            ),
        )

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(10)
    pid = _running_task(st, job.job_key, attempt.run_id, "ResumableFibonacci").process.pid
    held = wait_tasks_released(st, job, attempt.run_id, ["ResumableFibonacci"], timeout=0)
    assert held == ["ResumableFibonacci {}"]
    assert wait_tasks_released(st, job, attempt.run_id, ["Other"], timeout=0) == []
    assert wait_tasks_released(st, job, attempt.run_id, ["ResumableFibonacci"], timeout=30) == []
    # released as the task ended, not before: its process was gone by then
    assert _gone(pid), f"released while the task's process {pid} still ran"
    worker.join(30)
    assert not worker.is_alive()
    assert ran_in == [worker]  # a worker thread runs its one task itself, no pool thread


def _running_task(st: CheckpointStore, job_key: str, run_id: str, step: str, timeout: float = 30):
    """The record of a task of ``step`` once it says running, names its process and its lease
    is held (what ``wait_tasks_released`` and ``start_finally`` read)."""
    end = time.monotonic() + timeout
    while True:
        for rec in st.read_tasks(job_key, run_id)[0]:
            if (
                rec.step == step
                and rec.status.value == "running"
                and rec.process is not None
                and rec.process.pid
                and st.task_lease_held(job_key, run_id, rec.step, rec.task_key)
            ):
                return rec
        assert time.monotonic() < end, f"no running {step} task in the store"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_task_declared_done_while_it_runs_ends_recorded_done_under_its_lease(
    tmp_path: Path,
) -> None:
    """Airflow's "mark success" on a running task instance: the task's own end record says it
    finished, so a finish teardown that waits for the lease never reads it unfinished (CI saw
    a DAG run fail when it read the record between the task's end and ``declare_done``)."""
    import threading

    from core import StopIntent, plan_group, run_tasks

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(
        ROOT / "examples" / "fibonacci" / "fibonacci-fast.yaml",
        {"N": 150, "StepSeconds": 0.1, "CheckpointSeconds": 600},
    )
    attempt = begin_attempt(st, job, external_key="declared-running")
    [spec] = plan_tasks(job, "ResumableFibonacci")
    started = threading.Event()
    execution: list = []

    def on_event(ex, ev) -> None:
        if ev.kind == "output" or ev.kind == "progress" or ev.kind == "action_started":
            started.set()

    def work() -> None:
        execution.extend(
            run_tasks(
                st,
                job,
                attempt.run_id,
                [spec],
                on_start=lambda ex: execution.append(ex),
                on_output=lambda ex, lines: started.set(),
                on_event=on_event,
            )
        )

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(20)
    execution[0].stop(StopIntent.CANCEL, declared_done="marked success in Airflow")
    worker.join(30)
    assert not worker.is_alive()
    result = execution[1]
    assert result.outcome.value == "canceled"  # the process was canceled ...
    assert result.message == "canceled; recorded as done (marked success in Airflow)"
    rec = st.read_task(job.job_key, attempt.run_id, spec.step_name, spec.task_key)
    assert rec is not None and rec.status.value == "succeeded"  # ... and the task counts done
    assert rec.message == result.message
    assert plan_group(st, job, attempt.run_id, plan_tasks(job, "ResumableFibonacci")) == []


def test_record_task_done_counts_the_task_finished(tmp_path: Path) -> None:
    from core import plan_group, run_tasks
    from core.run._phases import record_task_done

    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(THREE, {"Out": str(out), "FailFrame": 3, "FrameSeconds": 0.01})
    attempt = begin_attempt(st, job, external_key="done")
    originals = plan_tasks(job, "Render")
    [result] = run_tasks(
        st, job, attempt.run_id, plan_group(st, job, attempt.run_id, originals[1:2])
    )
    assert result.outcome.value == "failed"
    assert [s.label for s in plan_group(st, job, attempt.run_id, originals)] == [
        "Render[Frame=1-2]",
        "Render[Frame=3-4]",
        "Render[Frame=5-6]",
    ]
    rec = record_task_done(st, job, attempt.run_id, originals[1], "marked success")
    assert rec.status.value == "succeeded" and rec.completed_frames == [3, 4]
    # Neither run again nor resumed, whether it had a record (3-4) or not (5-6).
    record_task_done(st, job, attempt.run_id, originals[2], "marked success")
    assert [s.label for s in plan_group(st, job, attempt.run_id, originals)] == [
        "Render[Frame=1-2]"
    ]
    lease = st.acquire_task_lease(job.job_key, attempt.run_id, "Render", originals[0].task_key)
    assert lease is not None
    with pytest.raises(ResumeRefusedError):
        record_task_done(st, job, attempt.run_id, originals[0], "marked success")
    lease.release()


# --- findings of a hostile review ------------------------------------------------------------
def test_a_forced_stop_reaches_an_on_exit_that_hangs_at_the_end_of_the_run(tmp_path: Path) -> None:
    from conftest import CliProcess

    template = tmp_path / "hang.yaml"
    template.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\n"
        "name: hanging exit\n"
        "jobEnvironments:\n"
        "- name: E\n"
        "  script:\n"
        "    actions:\n"
        "      onExit: {command: bash, args: [-c, \"echo EXIT-START $$; trap '' TERM INT; "
        'sleep 1000"]}\n'
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, \"print('RAN')\"]}\n"
    )
    cli = CliProcess("run", str(template), "--store", str(tmp_path / "store"), "-q")
    cli.wait_for("EXIT-START")
    [exit_pid] = [int(p) for p in re.findall(r"EXIT-START (\d+)", cli.stdout)]
    cli.proc.send_signal(signal.SIGINT)
    # Two signals sent back to back may reach a process as one: the second is sent once the
    # first is being handled.
    cli.wait_for("suspending the run", stream="err")
    cli.proc.send_signal(signal.SIGINT)  # the second Ctrl-C abandons the onExit
    cli.wait(30)  # the onExit would sleep 1000 s
    assert "onExit (environment 'E'): killed by the stop" in cli.stderr, cli.stderr
    assert _gone(exit_pid)


def test_a_deadline_reaches_an_on_exit_in_a_worker(tmp_path: Path) -> None:
    template = tmp_path / "hang.yaml"
    hanging = tmp_path / "hanging"
    template.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\n"
        "name: hanging exit in a worker\n"
        "jobEnvironments:\n"
        "- name: E\n"
        "  script:\n"
        "    actions:\n"
        f"      onExit: {{command: bash, args: [-c, \"trap '' TERM INT; echo > {hanging}; "
        'sleep 1000"]}\n'
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, \"print('RAN')\"]}\n"
    )
    store = tmp_path / "store"
    job = prepare_job(template)
    attempt = begin_attempt(CheckpointStore(store), job, external_key="exit-deadline")
    [spec] = plan_step(CheckpointStore(store), job, attempt.run_id, "S")
    w = Worker(store, attempt.job_key, attempt.run_id, spec)
    end = time.monotonic() + 30
    while not hanging.exists():  # the task ran; the onExit hangs
        assert w.proc.poll() is None and time.monotonic() < end, "the onExit never started"
        time.sleep(0.02)
    deadline = time.time() + 2
    request_termination(
        CheckpointStore(store), attempt.job_key, attempt.run_id, "Cancelled", deadline=deadline
    )
    w.wait(30)
    assert time.time() < deadline + 3  # killed at the deadline, then the worker ended


def test_the_cli_does_not_take_over_or_supersede_a_scheduled_run(tmp_path: Path) -> None:
    store = tmp_path / "store"
    job = prepare_job(COUNTER, {"N": 30, "StepSeconds": 0.1})
    st = CheckpointStore(store)
    attempt = begin_attempt(st, job, external_key="dag/live")
    resumed = run_cli("resume", attempt.run_id, "--store", str(store), cwd=ROOT, timeout=60)
    assert resumed.returncode == 4 and "belongs to 'dag/live'" in resumed.stderr
    fresh = run_cli(
        "run",
        str(COUNTER),
        "-p",
        "N=1",
        "--store",
        str(store),
        "-q",
        "--fresh",
        cwd=ROOT,
        timeout=60,
    )
    assert fresh.returncode == 0, fresh.stderr
    rec = st.read_run(attempt.job_key, attempt.run_id)
    assert rec is not None and rec.superseded_by is None and rec.status.value == "running"
    again = begin_attempt(st, job, external_key="dag/live")
    assert again.run_id == attempt.run_id


def test_a_request_of_an_unfinished_attempt_holds_for_the_schedulers_next(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(THREE, {"Out": str(out)})
    first = begin_attempt(st, job, external_key="dag/carry")
    request_termination(st, first.job_key, first.run_id, "Cancelled")
    # the driver dies here; the scheduler retries the run
    second = begin_attempt(st, job, external_key="dag/carry")
    assert any("still holds" in n for n in second.notes)
    enter_finally(st, job, second.run_id)
    assert finish_attempt(st, job, second.run_id).condition.reason == "Cancelled"


def test_delete_kills_what_a_dead_runner_left(tmp_path: Path) -> None:
    store = tmp_path / "store"
    lock = tmp_path / "lock"
    args = ["run", str(COUNTER), "--store", str(store), "-q"]
    args += ["-p", "N=200", "-p", "StepSeconds=0.1", "-p", f"LockFile={lock}"]
    first = subprocess.Popen(cli_cmd(*args), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    pid = _task_pid(store)
    _wait_locked(lock)  # the action runs (the record names a spare's pid before it does)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    [run] = CheckpointStore(store).list_runs()[0]
    deleted = run_cli(
        "checkpoints", "delete", run.run_id, "--store", str(store), cwd=ROOT, timeout=60
    )
    assert deleted.returncode == 0, deleted.stderr
    assert "left running by a dead runner" in deleted.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_an_edited_record_never_kills_a_group_its_process_does_not_lead() -> None:
    from core._host import host_id
    from core._records import ProcessInfo
    from core.process import kill_recorded_process

    a = subprocess.Popen(["sleep", "60"], start_new_session=True)
    b = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        info = ProcessInfo(
            pid=a.pid, pgid=b.pid, start_time=psutil.Process(a.pid).create_time(),
            host=host_id(), marker=None,
        )  # fmt: skip
        kill_recorded_process(info)
        assert a.wait(10) == -signal.SIGKILL  # the record's own process is killed ...
        assert b.poll() is None  # ... the other group is untouched
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_stopped_run_finally_starts_no_more_tasks_of_a_group(tmp_path: Path) -> None:
    import threading

    from core import run_tasks

    st = CheckpointStore(tmp_path / "store")
    log = tmp_path / "log"
    job = prepare_job(DATA / "sessions_job_env.yaml", {"Log": str(log)})
    attempt = begin_attempt(st, job, external_key="srf-group")
    # Eight tasks of at least 0.2 s: the request (seen within about 0.5 s) lands before the
    # last one starts, however loaded the machine.
    specs = plan_tasks(job, "Work")
    box: dict = {}
    t = threading.Thread(
        target=lambda: box.setdefault("r", run_tasks(st, job, attempt.run_id, specs))
    )
    t.start()
    end = time.monotonic() + 20
    while not log.exists() or "task" not in log.read_text():
        assert time.monotonic() < end
        time.sleep(0.02)
    request_termination(st, attempt.job_key, attempt.run_id, "StoppedRunFinally")
    t.join(30)
    outcomes = [r.outcome.value for r in box["r"]]
    assert outcomes[0] == "succeeded" and "skipped" in outcomes, outcomes


def test_a_session_secret_is_redacted_in_every_later_task(tmp_path: Path) -> None:
    template = tmp_path / "secret.yaml"
    template.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\n"
        "extensions: [REDACTED_ENV_VARS]\n"
        "name: secret in a session\n"
        "jobEnvironments:\n"
        "- name: E\n"
        "  script:\n"
        "    actions:\n"
        "      onEnter:\n"
        "        {command: bash, args: [-c, 'echo openjd_redacted_env: TOKEN=hunter2hunter2']}\n"
        "steps:\n"
        "- name: S\n"
        "  parameterSpace:\n"
        "    taskParameterDefinitions: [{name: I, type: INT, range: '1-3'}]\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: bash, args: [-c, 'echo token is $TOKEN']}\n"
    )
    done = run_cli(
        "run",
        str(template),
        "--store",
        str(tmp_path / "s"),
        "--max-parallel",
        "1",
        "-q",
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("token is ********") == 3, done.stdout
    assert "hunter2" not in done.stdout + done.stderr


def test_two_quick_ctrl_cs_always_cancel(tmp_path: Path) -> None:
    """The second Ctrl-C may come while the first is being handled: it still cancels."""
    from conftest import CliProcess

    for i, gap in enumerate((0.0, 0.01, 0.05, 0.0, 0.02)):  # after the first was seen
        cli = CliProcess(
            "run", str(COUNTER), "-p", "N=300", "-p", "StepSeconds=0.1",
            "-p", "IgnoreSignal=1",  # still in its notify period when the second comes
            "--store", str(tmp_path / f"s{i}"), "-q",
        )  # fmt: skip
        cli.wait_for("COUNTER-STEP 2")
        cli.proc.send_signal(signal.SIGINT)
        # Two signals sent back to back may reach a process as one (POSIX does not queue
        # them): the second is sent once the first is being handled.
        cli.wait_for("suspending the run", stream="err")
        time.sleep(gap)
        cli.proc.send_signal(signal.SIGINT)
        assert cli.wait(30) == 130, (gap, cli.stderr)
        assert "stayed locked" not in cli.stderr


def test_a_task_whose_lease_expires_is_canceled(tmp_path: Path, monkeypatch) -> None:
    """The adapters' path (``run_tasks``): a task lease that cannot be renewed for its ttl
    (here 1.5 s; the store refuses the lease's writes from the moment the task runs) may be
    taken by another process, so the task is stopped and nothing more of it is written
    (``not_stored``), with a note saying why."""
    from core import run_tasks

    st = CheckpointStore(f"memory://lease-expiry-{os.getpid()}", lease_seconds=1.5)
    template = tmp_path / "long.yaml"
    from conftest import one_step_template

    one_step_template(template, "long", "import time; print('LONG-START', flush=True); "
                      "time.sleep(60); print('LONG-END', flush=True)")  # fmt: skip
    job = prepare_job(template)
    attempt = begin_attempt(st, job, external_key="dag/lease")
    real_write = st.fs.backend.replace_file  # how a lease file is written (core.fs seam)

    def refuse_leases(path, *args, **kwargs):
        if "/tasks/" in path and path.endswith(".lease.json") and started:
            raise OSError(5, "the store cannot be reached")
        return real_write(path, *args, **kwargs)

    started: list[bool] = []
    monkeypatch.setattr(st.fs.backend, "replace_file", refuse_leases)
    notes: list[str] = []
    lines: list[str] = []
    [result] = run_tasks(
        st, job, attempt.run_id, plan_step(st, job, attempt.run_id, "S"),
        on_note=notes.append, on_start=lambda _ex: started.append(True),
        on_output=lambda _ex, out: lines.extend(out),
    )  # fmt: skip
    assert result.outcome.value == "not_stored", (result.message, notes)
    # stopped, not run to its end (its own 60 s)
    assert any("LONG-START" in line for line in lines), lines
    assert not any("LONG-END" in line for line in lines), lines
    assert any("could not be renewed for its whole ttl" in n for n in notes), notes


def test_start_finally_waits_for_regular_tasks_then_enters_finally(tmp_path: Path) -> None:
    import threading

    from core import run_tasks, start_finally

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(DATA / "finally.yaml", {"LongSeconds": "2"})
    attempt = begin_attempt(st, job, external_key="finally-wait")
    regular = job.template.regular_steps[0]
    started = threading.Event()
    ended: list[float] = []

    def work() -> None:
        run_tasks(
            st, job, attempt.run_id, plan_tasks(job, regular), on_start=lambda ex: started.set()
        )
        ended.append(time.monotonic())

    worker = threading.Thread(target=work)
    worker.start()
    assert started.wait(10)
    _running_task(st, job.job_key, attempt.run_id, regular)
    early = start_finally(st, job, attempt.run_id, wait_seconds=0)
    assert early.still_running  # the regular task still runs: said, not waited for
    worker.join()
    st2 = CheckpointStore(tmp_path / "store2")
    attempt2 = begin_attempt(st2, job, external_key="finally-wait-2")
    started.clear()
    worker = threading.Thread(
        target=lambda: run_tasks(
            st2, job, attempt2.run_id, plan_tasks(job, regular), on_start=lambda ex: started.set()
        )
    )
    worker.start()
    assert started.wait(10)
    _running_task(st2, job.job_key, attempt2.run_id, regular)  # what the wait reads
    decision = start_finally(st2, job, attempt2.run_id, wait_seconds=60)
    [long_task] = st2.read_tasks(job.job_key, attempt2.run_id)[0]
    assert long_task.status.value == "succeeded"  # the phase began only once it had ended
    assert decision.still_running == ()
    worker.join()
    # Later never ran: the run failed, and the finally steps are told so
    assert decision.run_finally and decision.job_status == "Failed"
    assert decision.describe() == "Job.Status Failed"
    assert st2.read_run(job.job_key, attempt2.run_id).phase == "finally"


def _three_steps_run(tmp_path: Path, key: str, fail_frame: int = 3):  # noqa: ANN202
    """A run of THREE (its Render step fails at ``fail_frame``): (store, job, attempt)."""
    out = tmp_path / "out"
    out.mkdir()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(THREE, {"Out": str(out), "FailFrame": fail_frame, "FrameSeconds": 0.01})
    return st, job, begin_attempt(st, job, external_key=key)


def test_declare_done_records_each_task_and_says_so(tmp_path: Path) -> None:
    from core import declare_done, plan_group

    st, job, attempt = _three_steps_run(tmp_path, "declared")
    originals = plan_tasks(job, "Render")
    lines = declare_done(st, job, attempt.run_id, originals[1:], "marked success in Airflow")
    assert lines == [
        "Render[Frame=3-4]: recorded as done (marked success in Airflow); not resumable",
        "Render[Frame=5-6]: recorded as done (marked success in Airflow); not resumable",
    ]
    assert [s.label for s in plan_group(st, job, attempt.run_id, originals)] == [
        "Render[Frame=1-2]"
    ]
    lease = st.acquire_task_lease(job.job_key, attempt.run_id, "Render", originals[0].task_key)
    assert lease is not None
    try:  # held by another process: said as a warning, the call does not raise
        [line] = declare_done(st, job, attempt.run_id, originals[:1], "marked success")
    finally:
        lease.release()
    assert line.startswith("warning: Render[Frame=1-2]: not recorded as done:")


def test_declare_done_waits_for_the_run_s_lock_once_for_all_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled holder of the run's lock (a SIGSTOPped process) costs ``declare_done`` one
    wait, not one per task (a hostile trial saw 3 tasks take 90 s): the lock is taken once,
    and when it is not had every task is said not recorded, without a lock file made."""
    import contextlib

    from core import StoreError, declare_done, plan_group

    st, job, attempt = _three_steps_run(tmp_path, "declared-locked")
    originals = plan_tasks(job, "Render")
    taken: list[str] = []
    real_lock = st.run_lock

    @contextlib.contextmanager
    def counted(job_key: str, run_id: str, **kw):  # noqa: ANN202
        taken.append(run_id)
        with real_lock(job_key, run_id, **kw):
            yield

    monkeypatch.setattr(st, "run_lock", counted)
    lines = declare_done(st, job, attempt.run_id, originals, "marked success")
    assert len(lines) == 3 and all("recorded as done" in line for line in lines), lines
    assert taken == [attempt.run_id]
    assert plan_group(st, job, attempt.run_id, originals) == []

    @contextlib.contextmanager
    def stalled(job_key: str, run_id: str, **kw):  # noqa: ANN202
        taken.append(run_id)
        raise StoreError(f"{run_id}/run.lock stayed locked for 30 s")
        yield

    monkeypatch.setattr(st, "run_lock", stalled)
    taken.clear()
    lines = declare_done(st, job, attempt.run_id, originals, "marked success")
    assert taken == [attempt.run_id]
    assert [line.split(":", 2)[:2] for line in lines] == [
        ["warning", f" {spec.label}"] for spec in originals
    ], lines
    assert all("stayed locked" in line for line in lines), lines


def test_a_task_declared_done_after_its_run_ended_succeeded_leaves_no_record(
    tmp_path: Path,
) -> None:
    """Airflow starts the finish teardown as soon as a task instance is marked success, so it
    can end the run (succeeded: its records and checkpoints deleted) before the marked task's
    process records its tasks done. That late record must not be written: it would be left
    over under an ended run (CI saw one in test_marked_success_is_recorded_done_...)."""
    from core import declare_done, run_tasks

    st, job, attempt = _three_steps_run(tmp_path, "declared-late", fail_frame=99)
    for name in job.step_order():
        for result in run_tasks(st, job, attempt.run_id, plan_tasks(job, name)):
            assert result.outcome.value == "succeeded"
    assert finish_attempt(st, job, attempt.run_id).status.value == "succeeded"
    run_dir = tmp_path / "store" / "jobs" / job.job_key / "runs" / attempt.run_id
    assert not list(run_dir.glob("tasks/*.json"))  # deleted with the run's checkpoints
    originals = plan_tasks(job, "Render")
    lines = declare_done(st, job, attempt.run_id, originals[:1], "marked success in Airflow")
    assert lines == ["Render[Frame=1-2]: not recorded: the run has already ended succeeded"]
    assert not list(run_dir.glob("tasks/*.json"))
    assert st.read_run(job.job_key, attempt.run_id).status.value == "succeeded"


def test_the_job_runner_counts_succeeded_tasks_and_keeps_the_others(tmp_path: Path) -> None:
    """RunResult keeps the results of the tasks that did not succeed and a count of those
    that did (a run of any size ends in memory that does not grow with its task count)."""
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "Counted",
        "steps": [
            {
                "name": "R",
                "parameterSpace": {
                    "taskParameterDefinitions": [{"name": "Frame", "type": "INT", "range": "1-4"}]
                },
                "script": {
                    "actions": {
                        "onRun": {
                            "command": sys.executable,
                            "args": ["-c", "import sys; sys.exit({{Task.Param.Frame}} == 3)"],
                        }
                    }
                },
            }
        ],
    }
    job = prepare_job(parse_template(doc))
    result = JobRunner(job, store=CheckpointStore(tmp_path / "store"), max_parallel=1).run()
    assert result.status == RunStatus.FAILED
    assert result.succeeded == 2 and result.ran == 3
    assert [(spec.label, res.outcome.value) for spec, res in result.results] == [
        ("R[Frame=3]", "failed")
    ]
    assert result.skipped == ["R[Frame=4]"]


# A task that saves one more than it resumed from (1 from the top) and then fails, so that each
# run of it leaves a newer checkpoint to resume from. It says where it started.
STEPPING = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: Stepping
steps:
- name: S
  script:
    embeddedFiles:
    - name: Step
      type: TEXT
      data: |
        import sys
        n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
        print(f"STARTED-FROM {n}", flush=True)
        print('openjd_checkpoint_save: {"state": "%d"}' % (n + 1), flush=True)
        sys.exit(int(n + 1 < 3))
    actions:
      onRun: {command: python3, args: ["{{Task.File.Step}}"]}
      onCheckpointResume:
        command: python3
        args: ["{{Task.File.Step}}", "{{Task.Checkpoint.State}}"]
"""


def test_a_claim_runs_the_task_as_its_record_says_now_not_as_it_was_planned(
    tmp_path: Path,
) -> None:
    """A scheduler plans a task (``plan_group``, ``plan_step``) before its worker claims it,
    and another worker may run it meanwhile (a second try of the same task, a runner woken
    after its lease expired). The claim reads the task's record under the task's lease: the
    task resumes from the newest checkpoint stored, not from the one it was planned with (nor
    from the top), and a task that ran to its end meanwhile is not run again."""
    from core.run._executor import run_task

    st = CheckpointStore(tmp_path / "store")
    template = tmp_path / "stepping.yaml"
    template.write_text(STEPPING)
    job = prepare_job(template, {})
    run_id = begin_attempt(st, job, external_key="k").run_id

    def run(spec: TaskSpec) -> tuple[str, list[str]]:
        lines: list[str] = []
        res = run_task(st, job, run_id, spec, on_output=lambda _ex, new: lines.extend(new))
        return res.outcome.value, [line for line in lines if line.startswith("STARTED-FROM")]

    [from_top] = plan_step(st, job, run_id, "S")
    assert from_top.resume is None
    assert run(from_top) == ("failed", ["STARTED-FROM 0"])  # another worker: saved 1
    assert run(from_top) == ("failed", ["STARTED-FROM 1"])  # not from the top: saved 2
    [stale] = plan_step(st, job, run_id, "S")
    assert stale.resume is not None and stale.resume.state == "2"
    assert run(stale) == ("succeeded", ["STARTED-FROM 2"])  # another worker: ran to its end
    with pytest.raises(ResumeRefusedError) as info:
        run(stale)
    assert info.value.code.value == "already-resumed", info.value
    assert "run to its end by another process" in str(info.value), info.value
    [rec] = st.read_tasks(job.job_key, run_id)[0]
    assert rec.status.value == "succeeded" and rec.checkpoint is not None
    assert rec.checkpoint.state == "3"


# A chunk of frames 1-4 that reports its first two frames finished, saves, and fails; it says
# which frames it was given and from which state.
CHUNK_STEPPING = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT, TASK_CHUNKING]
name: Chunk stepping
steps:
- name: R
  parameterSpace:
    taskParameterDefinitions:
    - name: F
      type: CHUNK[INT]
      range: "1-4"
      chunks: {defaultTaskCount: 4, rangeConstraint: CONTIGUOUS}
  script:
    embeddedFiles:
    - name: R
      type: TEXT
      data: |
        import sys
        frames = []
        for part in sys.argv[1].split(","):
            a, _, b = part.partition("-")
            frames.extend(range(int(a), int(b or a) + 1))
        print("FRAMES", frames, "FROM", sys.argv[2] if len(sys.argv) > 2 else None, flush=True)
        for f in frames[:2]:
            print('openjd_task_complete: {"F": %d}' % f, flush=True)
        print('openjd_checkpoint_save: {"state": "after-%d"}' % frames[1], flush=True)
        sys.exit(1)
    actions:
      onRun: {command: python3, args: ["{{Task.File.R}}", "{{Task.Param.F}}"]}
      onCheckpointResume:
        command: python3
        args: ["{{Task.File.R}}", "{{Task.Param.F}}", "{{Task.Checkpoint.State}}"]
"""


def test_a_claimed_chunk_runs_no_frame_reported_finished_since_it_was_planned(
    tmp_path: Path,
) -> None:
    """The frames of a chunk planned before another process ran it are planned again at its
    claim: it resumes with the frames not reported finished, from the checkpoint stored."""
    from core.run._executor import run_task

    st = CheckpointStore(tmp_path / "store")
    template = tmp_path / "chunk.yaml"
    template.write_text(CHUNK_STEPPING)
    job = prepare_job(template, {})
    run_id = begin_attempt(st, job, external_key="k").run_id
    [planned] = plan_step(st, job, run_id, "R")

    def run(spec: TaskSpec) -> list[str]:
        lines: list[str] = []
        run_task(st, job, run_id, spec, on_output=lambda _ex, new: lines.extend(new))
        return [line for line in lines if line.startswith("FRAMES")]

    assert run(planned) == ["FRAMES [1, 2, 3, 4] FROM None"]  # another worker
    assert run(planned) == ["FRAMES [3, 4] FROM after-2"]
