"""Interruptions do not use retries (issue 39), under ``dag.test()``: a task instance that
interruption notices stop three times with ``retries=1`` is rescheduled each time (Airflow keeps
its try number) and finishes by resuming; past ``interruption_retries`` a notice uses a retry; a
task that exits with an error still fails after its retries. And the checkpoint metrics through
Airflow's own ``Stats``: StatsD to a UDP listener of the test, checked against the run's
records.

The notices come from a file (``file:PATH``), written by a thread of the test once the task's
process catches SIGUSR1 (its checkpoint signal; ``/proc/PID/status``), so the notice reaches a
task that can checkpoint. ``openjd_finish`` is marked success (``mark_success_pattern``) so that
the run's task records, which a finished run deletes, are left to compare with."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import airflow_helpers as ah
import psutil
import pytest

import core

ROOT = Path(__file__).resolve().parents[2]
FIBONACCI = ROOT / "examples" / "fibonacci" / "fibonacci-fast.yaml"
TASK = "ResumableFibonacci"
POLL = 0.2  # notice_poll_seconds

pytestmark = pytest.mark.timeout(240)

DAG_FILE = """
from airflow_plugin import dag_from_template

dag = dag_from_template(
    {template!r}, dag_id={dag_id!r}, store={store!r}, default_args={{"retries": 1}},
    interruption_notices={notices!r}, notice_poll_seconds={poll},
    interruption_delay_seconds=0.2, {extra}
)
"""

FAILING = """\
specificationVersion: 'jobtemplate-2023-09'
name: failing task
steps:
- name: Fails
  script:
    actions:
      onRun: {command: python3, args: [-c, "import sys; print('FAILING-RAN'); sys.exit(3)"]}
"""


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def the_task(store: core.CheckpointStore) -> core.TaskRecord | None:
    runs, _ = store.list_runs()
    if len(runs) != 1:
        return None
    tasks, _ = store.read_tasks(runs[0].job_key, runs[0].run_id)
    return next((t for t in tasks if t.step == TASK), None)


def catches_sigusr1(pid: int) -> bool:
    """The process ``pid`` (or one of its children) has a SIGUSR1 handler installed."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.M)
        if found and (int(found.group(1), 16) >> (signal.SIGUSR1 - 1)) & 1:
            return True
    return False


class Notices:
    """Writes the notice file ``count`` times from a thread: each time once the task's attempt
    number ``k`` runs a process that catches SIGUSR1. ``written``: when each was written."""

    def __init__(self, store: Path, notice: Path, count: int) -> None:
        self.store = core.CheckpointStore(str(store))
        self.notice = notice
        self.count = count
        self.written: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notices", daemon=True)

    def __enter__(self) -> Notices:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        assert len(self.written) == self.count, f"{len(self.written)} notice(s) written"

    def _ready(self, k: int) -> bool:
        rec = the_task(self.store)
        if rec is None or len(rec.history) != k or rec.history[-1].ended_at is not None:
            return False
        pid = (rec.process.pid if rec.process else 0) or 0
        return pid > 0 and catches_sigusr1(pid)

    def _run(self) -> None:
        try:
            for k in range(1, self.count + 1):
                end = time.monotonic() + 120
                while not self._ready(k):
                    if self._stop.is_set() or time.monotonic() > end:
                        raise TimeoutError(f"attempt {k} of the task never ran")
                    time.sleep(0.02)
                self.written.append(time.time())
                self.notice.write_text(f"notice {k}\n")
        except BaseException as exc:
            self.error = exc


def task_reschedules(dag_id: str, run_id: str, task_id: str) -> int:
    """The TaskReschedule rows Airflow keeps for the task instance's current try."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        ti_id = session.scalar(
            select(TaskInstance.id).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == 0,
            )
        )
        count = session.scalar(
            select(func.count(TaskReschedule.id)).where(TaskReschedule.ti_id == ti_id)
        )
    return int(count or 0)


def run_with_notices(
    dag_tester: ah.DagTester,
    tmp_path: Path,
    dag_id: str,
    notices: int,
    *,
    n: int = 80,
    extra: str = "",
) -> tuple[ah.DagTestResult, Notices, Path]:
    store, notice = tmp_path / "store", tmp_path / "notice"
    source = DAG_FILE.format(
        template=str(FIBONACCI),
        dag_id=dag_id,
        store=str(store),
        notices=f"file:{notice}",
        poll=POLL,
        extra=extra,
    )
    with Notices(store, notice, notices) as writer:
        result = dag_tester.run(
            f"{dag_id}.py",
            source=source,
            run_conf={"N": n, "StepSeconds": 0.05, "CheckpointSeconds": 600},
            mark_success_pattern="openjd_finish",  # keeps the records (a finish deletes them)
        )
    writer.check()
    return result, writer, store


def test_three_notices_resume_without_using_a_retry(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    n = 80
    result, _writer, store = run_with_notices(dag_tester, tmp_path, "notices_three", 3, n=n)

    ti = result.ti(TASK, 0)
    assert (ti.state, ti.try_number, ti.max_tries) == ("success", 1, 1), result.states()
    assert not [h for h in result.history if h.task_id == TASK], result.history  # no retry
    assert task_reschedules("notices_three", result.run_id, TASK) == 3
    printed = capfd.readouterr().out
    assert printed.count("rescheduled for") == 3, printed[-4000:]
    assert "interruption 3 of 10 that resume without using a retry" in printed
    for generation in (1, 2, 3):
        assert f"resuming from checkpoint generation {generation}" in printed
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in printed
    rec = the_task(core.CheckpointStore(str(store)))
    assert rec is not None and rec.status.value == "succeeded"
    causes = [span.cause.value if span.cause else None for span in rec.history]
    assert causes == ["notice", "notice", "notice", None], rec.history
    assert core.interruptions_so_far([rec], rec.history[-1].run_attempt) == 3


def test_past_the_budget_a_notice_uses_a_retry(
    dag_tester: ah.DagTester, tmp_path: Path, capfd
) -> None:
    result, _writer, store = run_with_notices(
        dag_tester, tmp_path, "notices_budget", 2, extra="interruption_retries=1,"
    )

    ti = result.ti(TASK, 0)
    assert (ti.state, ti.try_number) == ("success", 2), result.states()
    [earlier] = [h for h in result.history if h.task_id == TASK]
    assert (earlier.try_number, earlier.state) == (1, "failed")  # as the history keeps it
    printed = capfd.readouterr().out
    assert printed.count("rescheduled for") == 1, printed[-4000:]
    assert (
        "the interruption budget is spent (2 interruptions of this run attempt, "
        "interruption_retries=1): this one uses a retry"
    ) in printed
    assert "resuming from checkpoint generation 2" in printed
    rec = the_task(core.CheckpointStore(str(store)))
    assert rec is not None and rec.status.value == "succeeded"


def test_an_error_still_uses_the_retries(dag_tester: ah.DagTester, tmp_path: Path, capfd) -> None:
    template = tmp_path / "failing.yaml"
    template.write_text(FAILING)
    source = DAG_FILE.format(
        template=str(template),
        dag_id="failing_retries",
        store=str(tmp_path / "store"),
        notices=None,
        poll=None,
        extra="",
    )
    result = dag_tester.run("failing_retries.py", source=source, run_conf={})

    assert result.state == "failed"
    ti = result.ti("Fails", 0)
    assert (ti.state, ti.try_number) == ("failed", 2), result.states()
    assert [(h.try_number, h.state) for h in result.history if h.task_id == "Fails"] == [
        (1, "failed")
    ]
    assert task_reschedules("failing_retries", result.run_id, "Fails") == 0
    printed = capfd.readouterr().out
    assert printed.count("FAILING-RAN") == 2
    assert "rescheduled for" not in printed


# ------------------------------------------------------------------------------ StatsD


class StatsdListener:
    """A UDP socket on 127.0.0.1 that StatsD packets are sent to; ``lines()`` reads what came."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def lines(self) -> list[str]:
        self.sock.settimeout(0.5)  # every packet was sent before dag.test() returned
        out: list[str] = []
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return out
            out.extend(data.decode().splitlines())


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    """Airflow's StatsD metrics (``[metrics]``, with InfluxDB-style tags) to a listener of the
    test. ``Stats`` is initialized from the configuration as the task runner does it as it
    starts (``task_runner.main``); ``dag.test()`` runs tasks in this process, whose ``Stats``
    was initialized before the settings were made, so the test does it again, and again after."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    listener = StatsdListener()
    for key, value in {
        "STATSD_ON": "True",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(listener.port),
        "STATSD_PREFIX": "openjdtest",
        "STATSD_INFLUXDB_ENABLED": "True",
    }.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield listener
    finally:
        monkeypatch.undo()
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        listener.sock.close()


def parse(line: str) -> tuple[str, dict[str, str], float, str]:
    """``prefix.name,tag=value,...:value|type`` -> (name, tags, value, type)."""
    head, _, rest = line.rpartition(":")
    value, _, kind = rest.partition("|")
    name, *pairs = head.split(",")
    tags = dict(pair.split("=", 1) for pair in pairs)
    return name, tags, float(value), kind


def test_checkpoint_metrics_reach_statsd(
    dag_tester: ah.DagTester, tmp_path: Path, statsd: StatsdListener
) -> None:
    _result, writer, store_path = run_with_notices(dag_tester, tmp_path, "notices_statsd", 1)
    figures = [parse(line) for line in statsd.lines() if "openjd_checkpoint." in line]

    def values(metric: str, kind: str, **tags: str) -> list[float]:
        return [
            v
            for name, t, v, k in figures
            if name == f"openjdtest.openjd_checkpoint.{metric}"
            and k == kind
            and tags.items() <= t.items()
        ]

    step = {"job": "Fibonacci_checkpointing_job__fast_", "step": TASK}  # tag characters
    store = core.CheckpointStore(str(store_path))
    rec = the_task(store)
    assert rec is not None and len(rec.history) == 2, rec
    first = rec.history[0]
    gens = store.list_generations(rec)
    assert [g.generation for g in gens] == [1]

    # interruptions, by cause: the one notice
    assert values("interruptions", "c", **step, cause="notice") == [1.0]
    assert len(values("interruptions", "c")) == 1
    # stop to stored: the notice reached the task within the poll period of its writing, and
    # the checkpoint it asked for was stored after it; the figure, in ms, is the record's
    assert first.stopped_at is not None and first.stored_after_stop_at is not None
    assert 0 <= first.stopped_at - writer.written[0] <= POLL + 1.0
    [stop_ms] = values("stop_to_stored", "ms", **step, cause="notice")
    assert stop_ms / 1000 == pytest.approx(first.stored_after_stop_at - first.stopped_at, abs=1e-3)
    # work lost: from the attempt's last stored checkpoint to its end
    [lost_ms] = values("work_lost", "ms", **step, cause="notice")
    covered = max(first.started_at, first.saved_at or first.started_at)
    assert first.ended_at is not None
    assert lost_ms / 1000 == pytest.approx(first.ended_at - covered, abs=1e-3)
    # commit duration and stored bytes: the one generation's, as the task record keeps it (its
    # generation file holds the duration up to its own write, the record's to the record's)
    ckpt = rec.checkpoint
    assert ckpt is not None and ckpt.generation == 1 and ckpt.commit_seconds is not None
    [commit_ms] = values("commit.duration", "ms", **step)
    assert commit_ms / 1000 == pytest.approx(ckpt.commit_seconds, abs=1e-3)
    assert values("stored", "c", **step) == [len((gens[0].state or "").encode())]
    # the resumed attempt said RESUMED; the checkpoint age is a gauge of seconds
    assert values("resumes", "c", **step, status="RESUMED") == [1.0]
    from airflow.sdk.observability.stats import normalize_name_for_stats

    task = normalize_name_for_stats(rec.task_key, log_warning=False)  # "{}" is tagged "__"
    ages = values("checkpoint.age", "g", **step, task=task)
    assert ages and 0.0 in ages and all(age >= 0 for age in ages), ages


def _forget_otel_flush_at_exit() -> None:
    """Airflow's OpenTelemetry logger registers ``flush_otel_metrics`` at exit, which calls
    ``force_flush`` on the process's meter provider; once a test has put back the no-op proxy
    provider, that call raises at the interpreter's exit (``'_ProxyMeterProvider' object has
    no attribute 'force_flush'``, printed under the suite's summary)."""
    import atexit
    import importlib

    for name in (
        "airflow.sdk._shared.observability.metrics.otel_logger",
        "airflow._shared.observability.metrics.otel_logger",
    ):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        atexit.unregister(module.flush_otel_metrics)


def test_task_sinks_follow_airflows_metrics_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Airflow's StatsD on, the figures go through ``Stats``; with Airflow's OpenTelemetry
    on (which sets the process's meter provider as its backend is made), only through the
    core's OpenTelemetry sink, so that Airflow's exporter gets each figure once."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils
    from opentelemetry import metrics

    from airflow_plugin._metrics import StatsSink, task_sinks

    listener = StatsdListener()
    try:
        monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
        monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        assert [type(s) for s in task_sinks()] == [StatsSink]  # no meter provider set
        monkeypatch.delenv("AIRFLOW__METRICS__STATSD_ON")
        monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "True")
        monkeypatch.setenv("AIRFLOW__METRICS__OTEL_HOST", "127.0.0.1")
        monkeypatch.setenv("AIRFLOW__METRICS__OTEL_PORT", str(listener.port))  # nothing listens
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
        sinks = task_sinks()
        assert [type(s).__name__ for s in sinks] == ["OpenTelemetrySink"], sinks
        provider = metrics.get_meter_provider()
        assert type(provider).__name__ == "MeterProvider"  # the one Airflow's backend set
    finally:
        monkeypatch.undo()
        # No meter provider left for the session's later tests (its exporter would send to a
        # port nobody reads): Airflow's own way to set one again (get_otel_logger).
        provider = metrics.get_meter_provider()
        if type(provider).__name__ == "MeterProvider":
            provider.shutdown(timeout_millis=1000)
            import opentelemetry.metrics._internal as internal

            internal._METER_PROVIDER_SET_ONCE._done = False
            internal._METER_PROVIDER = None
            _forget_otel_flush_at_exit()
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        listener.sock.close()
