"""Interruption notices (issue 15): a test metadata server on 127.0.0.1 plays AWS (IMDSv2),
Google Cloud and Azure; a notice file and a signal do the same. A notice suspends the run with
checkpoints (exit 75) and the next run resumes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DATA, EXAMPLES, ROOT, CliProcess, run_cli
from metadata_server import MetadataServer, closed_port_url

from core import CheckpointStore
from core._records import TaskStatus
from core.run import Notice, SignalSource, parse_notice_sources, parse_poll_seconds
from core.run._notices import (
    MIN_NOTICE_SECONDS,
    AwsSource,
    AzureSource,
    FileSource,
    GcpSource,
    NoticeWatcher,
    _file_deadline,
)

pytestmark = pytest.mark.slow
FIB = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
COUNTER = DATA / "counter.yaml"
N = 25


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.close()


def fib_args(store: Path, *extra: str) -> tuple[str, ...]:
    return (
        "run", str(FIB), "--store", str(store), "-q",
        "-p", f"N={N}", "-p", "StepSeconds=0.1", "-p", "CheckpointSeconds=60",
        *extra,
    )  # fmt: skip


def wait_for(proc: CliProcess, text: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while text not in proc.stdout and time.monotonic() < end:
        if proc.proc.poll() is not None:
            break
        time.sleep(0.02)
    assert text in proc.stdout, proc.stderr


def until(ready, *, what: str, timeout: float = 30.0, interval: float = 0.01) -> None:
    """Wait until ``ready()`` is true, for at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(interval)


def only_run(store: Path):
    st = CheckpointStore(store)
    (run,), _ = st.list_runs()
    tasks, _ = st.read_tasks(run.job_key, run.run_id)
    return run, tasks


def assert_suspended_then_resumed(store: Path, first: CliProcess, source: str) -> None:
    assert first.wait(60) == 75, first.stderr
    run, tasks = only_run(store)
    assert run.status.value == "interrupted" and run.condition.reason == "Suspended"
    assert run.condition.message == f"suspended by an interruption notice ({source}); resumable"
    (task,) = tasks
    assert task.status == TaskStatus.INTERRUPTED and task.checkpoint is not None
    (notice,) = run.notices
    assert notice["source"] == source and notice["attempt"] == 1
    assert notice["stopped_after"] is not None
    assert f"interruption notice from {source}" in first.stderr
    assert re.search(
        rf"interruption notice \({source}\): tasks asked to checkpoint and stopped in", first.stderr
    )
    second = run_cli(*fib_args(store), cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert '"RESUMED"' in second.stdout
    assert f"Final answer: Fibonacci number {N} is {fib(N)}" in second.stdout


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_a_provider_notice_suspends_the_run_and_the_next_run_resumes(
    provider: str, metadata: MetadataServer, store: Path
) -> None:
    first = CliProcess(
        *fib_args(
            store, "--interruption-notices", f"{provider}:{metadata.url}",
            "--notice-poll-seconds", "0.2",
        )
    )  # fmt: skip
    wait_for(first, "Fibonacci number 5 is")
    deadline = metadata.trigger(provider, 60)
    assert_suspended_then_resumed(store, first, provider)
    run, _ = only_run(store)
    if provider != "gcp":  # Google Cloud announces no time: 30 s from the notice
        assert run.notices[0]["deadline"] == deadline
    assert not metadata.rejected, metadata.rejected  # every request had its header or token
    if provider == "aws":
        assert metadata.tokens and metadata.requests[0] == ("PUT", "/latest/api/token")
    if provider == "azure":
        assert metadata.acks == ["event-1"]  # (the note that says so is not shown with -q)


def test_a_deadline_shorter_than_the_notify_period_shortens_it(
    metadata: MetadataServer, store: Path
) -> None:
    """The task ignores its notify signal and has a 30 s notify period; the notice gives 3 s:
    it is killed before the deadline, with a warning, and its periodic checkpoint is kept."""
    args = (
        "run", str(COUNTER), "--store", str(store), "-q",
        "-p", "N=1000", "-p", "StepSeconds=0.1", "-p", "IgnoreSignal=1",
        "-p", "NotifySeconds=30",
        "--interruption-notices", f"aws:{metadata.url}", "--notice-poll-seconds", "0.1",
    )  # fmt: skip
    first = CliProcess(*args)
    wait_for(first, "COUNTER-STEP")
    deadline = metadata.trigger("aws", 3.5)
    code = first.wait(60)
    ended = time.time()
    assert code == 75, first.stderr
    assert ended < deadline + 1.0, f"ended {ended - deadline:.2f} s after the deadline"
    assert "would outlast the stop deadline" in first.stderr
    assert "notifyPeriodInSeconds 30 s" in first.stderr
    run, (task,) = only_run(store)
    assert run.notices[0]["deadline"] == deadline
    # The tasks were gone before the deadline: the runner measured it.
    assert run.notices[0]["received_at"] + run.notices[0]["stopped_after"] < deadline
    assert task.checkpoint is not None


def test_a_notice_file_suspends_the_run(store: Path, tmp_path: Path) -> None:
    notice = tmp_path / "notice"
    first = CliProcess(
        *fib_args(store, "--interruption-notices", f"file:{notice}", "--notice-poll-seconds", "0.1")
    )
    wait_for(first, "Fibonacci number 5 is")
    deadline = time.time() + 50
    notice.write_text(f"{deadline}\n")
    assert_suspended_then_resumed(store, first, "file")
    run, _ = only_run(store)
    assert run.notices[0]["deadline"] == pytest.approx(deadline)


@pytest.mark.parametrize(
    "text",
    ["{ms}", "1e20", "nan", "inf", '{{"deadline": 1e300}}', '{{"deadline": -1e300}}', "9" * 4000],
)
def test_a_deadline_that_is_no_time_is_dropped_and_the_notice_stands(
    text: str, tmp_path: Path
) -> None:
    """A notice file written in milliseconds, or with a garbled time: the notice still counts
    (a notice without deadline), and nothing raises in the watcher's thread."""
    now = time.time()
    path = tmp_path / "notice"
    path.write_text(text.format(ms=int((now + 120) * 1000)))
    notice = Notice("file", "interruption", "notice file", _file_deadline(path.read_text()))
    assert notice.deadline is None
    assert "ignored" in notice.describe() or "no deadline" in notice.describe()


def test_a_deadline_already_past_leaves_the_tasks_time_to_checkpoint() -> None:
    now = time.time()
    late = Notice("file", "interruption", "notice file", now - 5, received_at=now)
    assert late.deadline == pytest.approx(now + MIN_NOTICE_SECONDS)
    assert "ago or too near" in late.describe()
    fine = Notice("file", "interruption", "notice file", now + 60, received_at=now)
    assert fine.deadline == pytest.approx(now + 60) and "ago" not in fine.describe()


def test_a_configured_signal_suspends_the_run(store: Path) -> None:
    env_before = os.environ.get("OPENJD_CHECKPOINT_INTERRUPTION_NOTICES")
    os.environ["OPENJD_CHECKPOINT_INTERRUPTION_NOTICES"] = "signal:USR2"  # via the environment
    try:
        first = CliProcess(*fib_args(store, "--notice-poll-seconds", "0.1"))
    finally:
        if env_before is None:
            del os.environ["OPENJD_CHECKPOINT_INTERRUPTION_NOTICES"]
        else:
            os.environ["OPENJD_CHECKPOINT_INTERRUPTION_NOTICES"] = env_before
    wait_for(first, "Fibonacci number 5 is")
    first.proc.send_signal(signal.SIGUSR2)
    assert_suspended_then_resumed(store, first, "signal")


def test_no_metadata_service_logs_nothing_per_poll(store: Path) -> None:
    """Every source points at a closed port: the run succeeds, each source says once that its
    service is absent, and polls back off (a handful of requests, not one per interval)."""
    closed = closed_port_url()
    notes: list[str] = []
    sources = parse_notice_sources(f"aws:{closed},gcp:{closed},azure:{closed}", where="test")
    watcher = NoticeWatcher(sources, lambda n: notes.append(f"NOTICE {n}"), on_note=notes.append,
                            poll_seconds=0.05).start()  # fmt: skip
    window_ends = time.monotonic() + 2.0
    until(lambda: len(notes) >= 3, what="each source to say it is not reachable")
    # The polls are counted over 2 s: a measuring window (a slow machine makes fewer polls,
    # never more), not a wait for something to have happened.
    time.sleep(max(0.0, window_ends - time.monotonic()))
    watcher.close()
    assert not any(n.startswith("NOTICE") for n in notes)
    assert len(notes) == 3 and all("not reachable" in n for n in notes), notes
    # Without back-off, 2 s at 0.05 s would be ~40 polls per source; with it, about 5.
    assert watcher.polls <= 3 * 7, watcher.polls

    proc = run_cli(
        "run",
        str(FIB),
        "--store",
        str(store),
        "-q",
        "-p",
        "N=5",
        "-p",
        "StepSeconds=0.1",
        "--interruption-notices",
        f"aws:{closed},gcp:{closed},azure:{closed}",
        "--notice-poll-seconds",
        "0.05",
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("not reachable") == 3, proc.stderr


def test_a_rebalance_recommendation_is_noted_not_acted_on(metadata: MetadataServer) -> None:
    metadata.aws_rebalance = True
    notes: list[str] = []
    notices: list[object] = []
    watcher = NoticeWatcher([AwsSource(metadata.url)], notices.append, on_note=notes.append,
                            poll_seconds=0.05).start()  # fmt: skip
    # The recommendation is asked for on the 1st poll and (were it not remembered) the 7th:
    # once the 8th poll began, the 7th was answered and handled.
    until(lambda: watcher.polls >= 8, what="eight polls")
    watcher.close()
    assert notices == []
    assert len(notes) == 1 and "rebalance recommendation" in notes[0], notes
    # aws-rebalance makes it a notice (no deadline: the notify periods apply).
    watcher = NoticeWatcher([AwsSource(metadata.url, rebalance=True)], notices.append,
                            poll_seconds=0.05).start()  # fmt: skip
    until(lambda: notices, what="the rebalance notice")
    watcher.close()
    assert len(notices) == 1 and notices[0].kind == "rebalance" and notices[0].deadline is None


def test_bad_settings_are_refused_naming_where() -> None:
    with pytest.raises(ValueError, match=r"--x: unknown interruption notice source 'ec2'"):
        parse_notice_sources("aws,ec2", where="--x")
    with pytest.raises(ValueError, match=r"--x: 'aws:ftp://h'.*http://"):
        parse_notice_sources("aws:ftp://h", where="--x")
    with pytest.raises(ValueError, match=r"--x: .*file needs a path"):
        parse_notice_sources("file:", where="--x")
    with pytest.raises(ValueError, match=r"--x: signal:TERM: SIGTERM may not be used"):
        parse_notice_sources("signal:TERM", where="--x")
    with pytest.raises(ValueError, match=r"--x: signal:NOPE: not a signal name"):
        parse_notice_sources("signal:NOPE", where="--x")
    with pytest.raises(ValueError, match=r"--x: 'gcp' is named twice"):
        parse_notice_sources("gcp,gcp", where="--x")
    for bad in ("aws:http://", "azure:https:///latest", "gcp:http//h", "aws:http://h:port"):
        with pytest.raises(ValueError, match=rf"--x: '{bad}': the base URL"):
            parse_notice_sources(bad, where="--x")
    with pytest.raises(ValueError, match=r"--x: 'file:/tmp/n/../x' is named twice"):
        parse_notice_sources("file:/tmp/x,file:/tmp/n/../x", where="--x")
    with pytest.raises(ValueError, match=r"--x: 'signal:SIGUSR2' is named twice"):
        parse_notice_sources("signal:usr2,signal:SIGUSR2", where="--x")
    with pytest.raises(ValueError, match=r"--p: 'nan' must be from"):
        parse_poll_seconds("nan", where="--p")
    kinds = [
        type(s) for s in parse_notice_sources(" aws , gcp,azure,file:/tmp/x,signal:USR1", where="x")
    ]
    assert kinds == [AwsSource, GcpSource, AzureSource, FileSource, SignalSource]
    assert parse_notice_sources("", where="x") == [] and parse_notice_sources(None, where="x") == []
    assert AwsSource().base_url == "http://169.254.169.254"  # the real address is the default
    proc = run_cli("run", str(FIB), "--interruption-notices", "aws,bogus", cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "--interruption-notices: unknown" in proc.stderr, proc.stderr


def test_run_tasks_stops_this_process_tasks_on_a_notice(
    metadata: MetadataServer, tmp_path: Path
) -> None:
    """The adapters' path (``run_tasks``): an Azure notice checkpoints the running task with
    the notice's deadline, records the notice, is acknowledged once the task stopped; the run
    itself is not stopped (other hosts go on), and the next ``run_tasks`` resumes."""
    import threading

    from core import TaskOutcome, begin_attempt, plan_step, prepare_job, run_tasks

    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(FIB, {"N": N, "StepSeconds": 0.1, "CheckpointSeconds": 60})
    attempt = begin_attempt(st, job, external_key="notice-run-tasks")
    specs = plan_step(st, job, attempt.run_id, "ResumableFibonacci")
    lines: list[str] = []
    notes: list[str] = []
    seen: list[object] = []
    sources = parse_notice_sources(f"azure:{metadata.url}", where="test")

    def trigger() -> None:
        end = time.monotonic() + 30
        while not any("Fibonacci number 5 is" in line for line in lines):
            assert time.monotonic() < end
            time.sleep(0.02)
        metadata.trigger("azure", 30)

    threading.Thread(target=trigger, daemon=True).start()
    [result] = run_tasks(
        st, job, attempt.run_id, specs,
        on_output=lambda _e, ls: lines.extend(ls), on_note=notes.append,
        notices=sources, notice_poll_seconds=0.1, on_notice=seen.append,
    )  # fmt: skip
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, result
    assert len(seen) == 1 and metadata.acks == ["event-1"]
    run = st.read_run(attempt.job_key, attempt.run_id)
    assert run is not None and run.termination is None  # the run goes on elsewhere
    assert run.notices[0]["source"] == "azure" and "stopped_after" in run.notices[0]
    assert any("tasks asked to checkpoint and stopped in" in n for n in notes), notes
    lines.clear()
    [again] = run_tasks(
        st, job, attempt.run_id, plan_step(st, job, attempt.run_id, specs[0].step_name)
    )
    assert again.outcome == TaskOutcome.SUCCEEDED, again


def test_the_benchmark_prints_overhead_on_and_off_side_by_side() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "interruption_notices.py"), "3", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^off\s+[\d.]+\s+1\.000\s+0$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^closed port \(5 s\)\s+[\d.]+\s+[\d.]+\s+3$", proc.stdout, re.M)
    assert re.search(r"^off \(again: the noise\)\s+[\d.]+\s+[\d.]+\s+0$", proc.stdout, re.M)


def test_a_leftover_notice_file_counts_only_once_written_again(tmp_path: Path) -> None:
    path = tmp_path / "notice"
    path.write_text("")
    os.utime(path, (1_000_000_000, 1_000_000_000))  # left over from an earlier notice
    notes: list[str] = []
    notices: list = []
    watcher = NoticeWatcher([FileSource(str(path))], notices.append, on_note=notes.append,
                            poll_seconds=0.05).start()  # fmt: skip
    until(lambda: watcher.polls >= 3, what="two polls of the leftover file answered")
    assert notices == [] and len(notes) == 1 and "before these tasks started" in notes[0]
    path.write_text('{"deadline": "2030-01-01T00:00:00Z"}')
    until(lambda: notices, what="the notice of the file written again")
    watcher.close()
    assert len(notices) == 1 and notices[0].deadline == 1893456000.0


def test_a_signal_source_needs_the_main_thread() -> None:
    import threading

    source = parse_notice_sources("signal:USR2", where="--interruption-notices")[0]
    errors: list[Exception] = []

    def install() -> None:
        try:
            source.install()
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert errors and "--interruption-notices: signal:SIGUSR2" in str(errors[0])
    assert "main thread" in str(errors[0])
