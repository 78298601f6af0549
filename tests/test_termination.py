"""Finally steps and run termination modes (TEP-0058, seed 002), through the real CLI.

The job (tests/data/finally.yaml): ``Long`` runs for LongSeconds, ``Later`` depends on it and so
has not started while ``Long`` runs, and ``Cleanup`` is the finally step. Every stop request is
sent by a second ``openjd-checkpoint stop`` process, through the store.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import DATA, ROOT, CliProcess, run_cli

from core import CheckpointStore

pytestmark = pytest.mark.slow
TEMPLATE = str(DATA / "finally.yaml")


def start(store: Path, *params: str, extra: tuple[str, ...] = ()) -> CliProcess:
    args = ["run", TEMPLATE, "--store", str(store), "-q", *extra]
    for p in params:
        args += ["-p", p]
    return CliProcess(*args)


def run_id_of(store: Path) -> str:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        runs, _ = CheckpointStore(store).list_runs()
        if runs:
            return runs[-1].run_id
        time.sleep(0.05)
    raise AssertionError("no run appeared in the store")


def stop(store: Path, run_id: str, mode: str) -> subprocess.CompletedProcess[str]:
    return run_cli("stop", run_id, "--mode", mode, "--store", str(store), cwd=ROOT, timeout=30)


def record(store: Path, run_id: str):
    rec = CheckpointStore(store).find_run(run_id)
    assert rec is not None
    return rec


# mode -> (Long's output, Later ran, finally's Job.Status or None, exit code, run status)
MODES = {
    "Cancelled": ("LONG-TERM", False, None, 130, "canceled"),
    "CancelledRunFinally": ("LONG-TERM", False, "Cancelled", 130, "canceled"),
    "StoppedRunFinally": ("LONG-DONE", False, "Stopped", 130, "stopped"),
    "Suspended": ("LONG-CKPT", False, None, 75, "interrupted"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_termination_mode(store: Path, mode: str) -> None:
    long_says, later_runs, finally_status, code, status = MODES[mode]
    cli = start(store, "LongSeconds=8")  # long enough for a second process to ask, under load
    cli.wait_for("LONG-START")
    run_id = run_id_of(store)
    asked = stop(store, run_id, mode)
    assert asked.returncode == 0, asked.stderr
    if mode == "StoppedRunFinally":
        # Long is left to finish; meanwhile the run says it is stopping.
        end = time.monotonic() + 10
        while record(store, run_id).condition.reason != "Stopping":
            assert time.monotonic() < end, record(store, run_id).condition
            time.sleep(0.05)
        assert record(store, run_id).condition.status == "Unknown"
    assert cli.wait(60) == code, cli.stderr
    out = cli.stdout
    assert long_says in out
    for other in {"LONG-TERM", "LONG-DONE", "LONG-CKPT"} - {long_says}:
        assert other not in out
    assert ("LATER-RAN" in out) is later_runs
    if finally_status is None:
        assert "CLEANUP-START" not in out
    else:
        assert f"CLEANUP-START status={finally_status}" in out and "CLEANUP-DONE" in out
    rec = record(store, run_id)
    assert rec.status.value == status
    assert rec.condition.status == "False" and rec.condition.reason == mode
    assert rec.termination == mode
    assert "Later" in rec.skipped_tasks
    if finally_status is None:
        assert "Cleanup" in rec.skipped_tasks
    # After the end, a request is refused.
    late = stop(store, run_id, "Cancelled")
    assert late.returncode == 4 and "has ended" in late.stderr


def test_cancelled_during_stopped_run_finally_stops_the_running_finally_step(store: Path) -> None:
    cli = start(store, "LongSeconds=5", "FinallySeconds=60")
    cli.wait_for("LONG-START")
    run_id = run_id_of(store)
    assert stop(store, run_id, "StoppedRunFinally").returncode == 0  # while Long runs
    cli.wait_for("CLEANUP-START status=Stopped")
    assert stop(store, run_id, "Cancelled").returncode == 0
    assert cli.wait(40) == 130  # the finally step would run 60 s
    assert "CLEANUP-DONE" not in cli.stdout  # stopped, not run to its end
    rec = record(store, run_id)
    assert rec.condition.reason == "Cancelled"


def test_run_timeout_still_runs_finally_within_its_own_budget(store: Path) -> None:
    cli = start(store, "LongSeconds=60", "FinallySeconds=2", extra=("--timeout", "2"))
    assert cli.wait(60) == 1, cli.stderr
    out = cli.stdout
    assert "LONG-TERM" in out and "LATER-RAN" not in out
    assert "CLEANUP-START status=Failed" in out and "CLEANUP-DONE" in out  # 2 s > what was left
    rec = record(store, run_id_of(store))
    assert rec.condition.reason == "Timeout" and rec.status.value == "failed"


def test_finally_timeout_cancels_finally_and_fails_the_run(store: Path) -> None:
    cli = start(store, "LongSeconds=0.2", "FinallySeconds=60", extra=("--finally-timeout", "1"))
    assert cli.wait(60) == 1
    assert "CLEANUP-START status=Succeeded" in cli.stdout and "CLEANUP-DONE" not in cli.stdout
    rec = record(store, run_id_of(store))
    assert rec.condition.reason == "Failed" and "Cleanup" in rec.condition.message


def test_failing_finally_step_fails_the_run_and_keeps_checkpoints(store: Path) -> None:
    cli = start(store, "LongSeconds=0.2", "FinallyExit=3")
    assert cli.wait(60) == 1
    rec = record(store, run_id_of(store))
    assert rec.status.value == "failed" and "finally Cleanup" in rec.condition.message
    tasks, _ = CheckpointStore(store).read_tasks(rec.job_key, rec.run_id)
    assert {t.step for t in tasks} == {"Long", "Later", "Cleanup"}


def test_failed_regular_step_runs_finally_with_failed_status(store: Path, tmp_path: Path) -> None:
    template = tmp_path / "fail.yaml"
    template.write_text(
        (DATA / "finally.yaml").read_text().replace("print('LATER-RAN')", "raise SystemExit(9)")
    )
    r = run_cli(
        "run",
        str(template),
        "-p",
        "LongSeconds=0.1",
        "--store",
        str(store),
        "-q",
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 1
    assert "CLEANUP-START status=Failed" in r.stdout
    assert "exited with code: 9" in r.stderr


def test_suspended_then_run_again_completes_with_no_task_run_twice(store: Path) -> None:
    cli = start(store, "LongSeconds=10")
    cli.wait_for("LONG-START")  # printed once its checkpoint signal is handled
    run_id = run_id_of(store)
    assert stop(store, run_id, "Suspended").returncode == 0
    assert cli.wait(60) == 75
    first = cli.stdout
    assert "LONG-CKPT" in first and "LONG-DONE" not in first

    again = run_cli(
        "run", TEMPLATE, "--store", str(store), "-q", "-p", "LongSeconds=10", cwd=ROOT, timeout=60
    )
    assert again.returncode == 0, again.stderr
    second = again.stdout
    assert '"RESUMED"' in second and "LONG-START from 0.0" not in second
    both = first + second
    for done in ("LONG-DONE", "LATER-RAN", "CLEANUP-DONE"):
        assert both.count(done) == 1, (done, both)
    assert "CLEANUP-START status=Succeeded" in second
    rec = record(store, run_id)
    assert rec.status.value == "succeeded" and rec.attempt == 2


def test_resumed_stopped_run_runs_its_finally_step_again(store: Path) -> None:
    cli = start(store, "LongSeconds=8")
    cli.wait_for("LONG-START")
    run_id = run_id_of(store)
    assert stop(store, run_id, "StoppedRunFinally").returncode == 0
    assert cli.wait(60) == 130
    assert "CLEANUP-START status=Stopped" in cli.stdout
    resumed = run_cli("resume", run_id, "--store", str(store), "-q", cwd=ROOT, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "LATER-RAN" in resumed.stdout and "LONG-START" not in resumed.stdout
    assert "CLEANUP-START status=Succeeded" in resumed.stdout


def test_a_stop_may_only_become_more_forceful(store: Path) -> None:
    cli = start(store, "LongSeconds=8")
    cli.wait_for("LONG-START")
    run_id = run_id_of(store)
    assert stop(store, run_id, "StoppedRunFinally").returncode == 0
    cli.wait_for("StoppedRunFinally requested", stream="err")
    refused = stop(store, run_id, "Suspended")  # refused at once, to the sender
    assert refused.returncode == 4, refused.stderr
    assert "already stopping (StoppedRunFinally)" in refused.stderr
    assert cli.wait(60) == 130
    assert "LONG-DONE" in cli.stdout and "CLEANUP-START status=Stopped" in cli.stdout
    assert record(store, run_id).condition.reason == "StoppedRunFinally"


def test_cancelled_during_finally_is_not_reported_as_a_finally_failure(store: Path) -> None:
    cli = start(store, "LongSeconds=0.2", "FinallySeconds=60")
    cli.wait_for("CLEANUP-START")
    run_id = run_id_of(store)
    assert stop(store, run_id, "Cancelled").returncode == 0
    assert cli.wait(60) == 130
    rec = record(store, run_id)
    assert rec.condition.reason == "Cancelled" and "finally failed" not in rec.condition.message


@pytest.mark.parametrize("mode", ["Cancelled", "Suspended"])
def test_a_stop_that_lands_after_every_task_ended_changes_nothing(store: Path, mode: str) -> None:
    """Issue 22, item 4: the request is accepted (the run is live: its session is closing),
    but every task, the finally step included, has ended; the run ends as its tasks did,
    succeeded, and does not tell the user to run it again."""
    import sys

    done = run_cli(
        "run",
        str(DATA / "late_stop.yaml"),
        "--store",
        str(store),
        "-p",
        f"Store={store}",
        "-p",
        f"Python={sys.executable}",
        "-p",
        f"Mode={mode}",
        cwd=ROOT,
        timeout=120,
    )
    assert "STOP-ASKED 0 asked run" in done.stdout, done.stdout + done.stderr
    assert "WORK-RAN" in done.stdout and "CLEANUP-RAN" in done.stdout
    assert done.returncode == 0, done.stderr
    assert "run again" not in done.stderr and "to resume" not in done.stderr, done.stderr
    assert re.search(r"run \S+ finished \(2 succeeded\)", done.stderr), done.stderr
    [run] = CheckpointStore(store).list_runs()[0]
    assert run.status.value == "succeeded" and run.condition.reason == "Succeeded"
    assert run.termination is None and run.skipped_tasks == []


@pytest.mark.parametrize(
    ("mode", "finally_runs", "status"),
    [
        ("CancelledRunFinally", True, "succeeded"),
        ("StoppedRunFinally", True, "succeeded"),
        ("Cancelled", False, "canceled"),
    ],
)
def test_a_stop_after_the_last_regular_task_changes_only_what_is_left(
    tmp_path: Path, mode: str, finally_runs: bool, status: str
) -> None:
    """The adapters' path (one task instance per step, the request in between): a request made
    once every regular task has ended tells the finally steps nothing (Job.Status is the
    regular steps' own); a mode that skips the finally steps still skips them, and the run
    ends canceled, with the finally step left to run."""
    from core import (
        begin_attempt,
        finish_attempt,
        plan_step,
        prepare_job,
        request_termination,
        run_tasks,
    )
    from core.local import enter_finally

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(DATA / "finally.yaml", {"LongSeconds": "0"})
    attempt = begin_attempt(st, job, external_key="dag/run-1")
    for step_name in ("Long", "Later"):
        [result] = run_tasks(st, job, attempt.run_id, plan_step(st, job, attempt.run_id, step_name))
        assert result.outcome.value == "succeeded"
    request_termination(st, job.job_key, attempt.run_id, mode)
    decision = enter_finally(st, job, attempt.run_id)
    assert decision.run_finally is finally_runs
    if finally_runs:
        assert decision.job_status == "Succeeded"
        [result] = run_tasks(st, job, attempt.run_id, plan_step(st, job, attempt.run_id, "Cleanup"))
        assert result.outcome.value == "succeeded"
    outcome = finish_attempt(st, job, attempt.run_id)
    assert outcome.status.value == status
    if status == "succeeded":
        assert outcome.mode is None and outcome.exit_code == 0 and outcome.skipped == []
    else:
        assert outcome.skipped == ["Cleanup"]


# A step environment whose onExit ignores SIGTERM and never ends on its own: only a forced stop
# (or a deadline) ends it. It prints its shell's pid and its child's.
HUNG_EXIT = """\
specificationVersion: 'jobtemplate-2023-09'
name: hung onExit
steps:
- name: S
  stepEnvironments:
  - name: E
    script:
      actions:
        onExit:
          command: bash
          args: [-c, "trap '' TERM; echo EXIT-START $$; sleep 600 & echo EXIT-CHILD $!; wait"]
  script:
    actions:
      onRun: {command: python3, args: [-c, "print('RAN')"]}
"""


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def hung_exit(tmp_path: Path):
    """A CLI run whose task has ended and whose step environment's onExit hangs: (the CLI, its
    store, the run id, the onExit's pids). Whatever is left of it is killed afterwards."""
    import os
    import signal

    template = tmp_path / "hung.yaml"
    template.write_text(HUNG_EXIT)
    store = tmp_path / "store"
    cli = CliProcess("run", str(template), "--store", str(store), "-q")
    pids: list[int] = []
    try:
        cli.wait_for("EXIT-CHILD")
        pids = [int(p) for p in re.findall(r"EXIT-(?:START|CHILD) (\d+)", cli.stdout)]
        assert len(pids) == 2 and all(_alive(p) for p in pids), cli.stdout
        yield cli, store, run_id_of(store), pids
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _ends_cancelled(cli: CliProcess, store: Path, run_id: str, pids: list[int]) -> None:
    """The run process ends within a bound, nothing of the onExit is left, and the run reads
    Cancelled (``runs --json``): the stop killed the onExit, it did not fail."""
    import json

    assert cli.wait(20) == 130, cli.stderr
    end = time.monotonic() + 10
    while any(_alive(p) for p in pids):
        assert time.monotonic() < end, [p for p in pids if _alive(p)]
        time.sleep(0.05)
    runs = run_cli("runs", "--json", "--store", str(store), cwd=ROOT, timeout=30)
    assert runs.returncode == 0, runs.stderr
    [row] = [r for r in json.loads(runs.stdout)["runs"] if r["run_id"] == run_id]
    assert (row["status"], row["reason"]) == ("canceled", "Cancelled"), row
    assert "onExit (environment 'E'): killed by the stop" in row["message"], row
    late = stop(store, run_id, "Cancelled")
    assert late.returncode == 4 and "has ended" in late.stderr, late.stderr


def test_a_second_stop_request_kills_a_hung_on_exit_from_another_process(hung_exit) -> None:
    """Issue 36, item 6: a first ``stop --mode Cancelled`` lets an onExit run (it is not
    stoppable: the environment's cleanup), so a hung one keeps the run alive; a second request
    from another process is forced, as a second Ctrl-C is, and kills it."""
    cli, store, run_id, pids = hung_exit
    first = stop(store, run_id, "Cancelled")
    assert first.returncode == 0, first.stderr
    assert "the run is stopping" in first.stdout and "--force" in first.stdout, first.stdout
    cli.wait_for("Cancelled requested; stopping", stream="err")  # the runner applied it
    with pytest.raises(subprocess.TimeoutExpired):
        cli.wait(2)  # ... and the onExit goes on
    assert all(_alive(p) for p in pids)
    second = stop(store, run_id, "Cancelled")
    assert second.returncode == 0, second.stderr
    assert "forced" in second.stdout and "onExit" in second.stdout, second.stdout
    _ends_cancelled(cli, store, run_id, pids)


def test_stop_force_kills_a_hung_on_exit_at_once(hung_exit) -> None:
    cli, store, run_id, pids = hung_exit
    forced = run_cli(
        "stop", run_id, "--mode", "Cancelled", "--force", "--store", str(store), timeout=30
    )
    assert forced.returncode == 0, forced.stderr
    assert "forced" in forced.stdout, forced.stdout
    _ends_cancelled(cli, store, run_id, pids)


SLOW_TASK_WITH_CLEANUP = """\
specificationVersion: 'jobtemplate-2023-09'
name: cleanup after a forced stop
steps:
- name: S
  stepEnvironments:
  - name: Cleanup
    script:
      actions:
        onExit: {command: bash, args: [-c, "echo CLEANUP-STARTS; sleep 30"]}
  script:
    actions:
      onRun: {command: bash, args: [-c, "echo TASK-RUNS; sleep 600"]}
"""


def test_a_forced_stop_skips_an_on_exit_that_has_not_started(tmp_path: Path) -> None:
    """``stop --force`` while the task runs: the task is killed at once, and the
    environment's onExit, which it would only kill part-way, is not started; the run says
    so and reads Cancelled (a new user saw 'cleanup starts', then it killed)."""
    import json

    template = tmp_path / "cleanup.yaml"
    template.write_text(SLOW_TASK_WITH_CLEANUP)
    store = tmp_path / "store"
    cli = CliProcess("run", str(template), "--store", str(store))
    try:
        cli.wait_for("TASK-RUNS")
        run_id = run_id_of(store)
        forced = run_cli(
            "stop", run_id, "--mode", "Cancelled", "--force", "--store", str(store), timeout=30
        )
        assert forced.returncode == 0, forced.stderr
        assert cli.wait(20) == 130, cli.stderr
        assert "CLEANUP-STARTS" not in cli.stdout, cli.stdout
        runs = run_cli("runs", "--json", "--store", str(store), cwd=ROOT, timeout=30)
        [row] = [r for r in json.loads(runs.stdout)["runs"] if r["run_id"] == run_id]
        assert (row["status"], row["reason"]) == ("canceled", "Cancelled"), row
        assert "(environment 'Cleanup'): not run, the stop was forced" in row["message"], row
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()


def test_a_second_request_of_a_stopping_run_is_forced(tmp_path: Path) -> None:
    """The rule is core's (``request_termination``), for every caller: the CLI's ``stop``,
    Airflow's endpoint, Prefect's ``end_flow_run``. A runner's own requests (its signals, a
    notice) are not escalated; a mode that may not replace the one in force is still refused;
    a forced mode that runs the finally steps does not reach them."""
    from core import (
        RunError,
        Termination,
        TerminationMode,
        begin_attempt,
        prepare_job,
        request_termination,
    )
    from core.task import force_reaches

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(DATA / "finally.yaml", {"LongSeconds": "0"})
    run_id = begin_attempt(st, job, external_key="dag/run-1").run_id
    first, _ = request_termination(st, job.job_key, run_id, "StoppedRunFinally")
    assert first.mode == TerminationMode.STOPPED_RUN_FINALLY and not first.force
    own, _ = request_termination(st, job.job_key, run_id, "StoppedRunFinally", escalate=False)
    assert not own.force
    second, _ = request_termination(st, job.job_key, run_id, "StoppedRunFinally")
    assert second.mode == TerminationMode.STOPPED_RUN_FINALLY and second.force
    with pytest.raises(RunError, match="already stopping"):
        request_termination(st, job.job_key, run_id, "Suspended")
    stored = st.read_stop_requests(job.job_key, run_id)
    assert [r.force for r in stored] == [False, False, True]
    assert force_reaches(second, "regular") and not force_reaches(second, "finally")
    # A mode that replaces the one in force is a new request (its cancelation runs), not a
    # second one; asked again, it is forced.
    run2 = begin_attempt(st, job, external_key="dag/run-2").run_id
    request_termination(st, job.job_key, run2, "StoppedRunFinally")
    upgraded, _ = request_termination(st, job.job_key, run2, "Cancelled")
    assert upgraded.mode == TerminationMode.CANCELLED and not upgraded.force
    again, _ = request_termination(st, job.job_key, run2, "Cancelled")
    assert again.force
    cancelled = Termination(TerminationMode.CANCELLED, force=True)
    assert force_reaches(cancelled, "finally")
    assert not force_reaches(Termination(TerminationMode.CANCELLED), "regular")
