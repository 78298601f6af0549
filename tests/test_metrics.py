"""Checkpoint metrics (issue 39): the one definition of each figure (``core._figures``), read
back from a real OpenTelemetry exporter (the CLI's OTLP/HTTP export to a receiver this test
runs on 127.0.0.1) and checked against the run's records; the suggested save interval against
Young's formula; the per-run figures ``runs`` and ``checkpoints show`` print."""

from __future__ import annotations

import http.server
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import rest_of_output

from core import CheckpointStore, TaskRecord
from core._figures import (
    INTERRUPTIONS,
    RESUMES,
    STOP_TO_STORED,
    WORK_LOST,
    attempt_figures,
    interval_env,
    run_figures,
    suggested_interval,
)
from core._records import AttemptSpan, CheckpointData, InterruptionCause
from core.task._history import note_committed, note_stored

REPO = Path(__file__).resolve().parent.parent
FIB = REPO / "examples" / "fibonacci" / "fibonacci-fast.yaml"
CLI = [sys.executable, "-m", "core.cli"]
POLL = 0.5


def _record(*spans: AttemptSpan, checkpoint: CheckpointData | None = None) -> TaskRecord:
    rec = TaskRecord(job_key="0" * 16, run_id="r", step="S", task_key="{}", parameters={})
    rec.history = list(spans)
    rec.checkpoint = checkpoint
    return rec


# --- the definitions, on records made by hand ---------------------------------------------------
def test_a_notice_gives_an_interruption_its_lost_work_and_its_stop_to_stored_time() -> None:
    span = AttemptSpan(
        attempt=1,
        started_at=100.0,
        ended_at=160.0,
        outcome="interrupted",
        cause=InterruptionCause.NOTICE,
        stopped_at=150.0,
        stored_after_stop_at=152.5,
        saved_at=152.5,
    )
    figures = {f.metric.name: f for f in attempt_figures("J", _record(span))}
    assert figures[INTERRUPTIONS.name].labels == {"job": "J", "step": "S", "cause": "notice"}
    assert figures[WORK_LOST.name].value == pytest.approx(160.0 - 152.5)
    assert figures[STOP_TO_STORED.name].value == pytest.approx(2.5)


def test_an_attempt_that_saved_nothing_lost_all_its_time_and_a_success_is_no_interruption() -> None:
    stopped = AttemptSpan(
        attempt=1,
        started_at=10.0,
        ended_at=70.0,
        outcome="interrupted",
        cause=InterruptionCause.STOP,
        stopped_at=65.0,
    )
    figures = {f.metric.name: f for f in attempt_figures("J", _record(stopped))}
    assert figures[WORK_LOST.name].value == pytest.approx(60.0)
    assert STOP_TO_STORED.name not in figures  # nothing was stored after the stop
    done = AttemptSpan(attempt=1, started_at=10.0, ended_at=70.0, outcome="succeeded")
    names = {f.metric.name for f in attempt_figures("J", _record(done))}
    assert INTERRUPTIONS.name not in names and WORK_LOST.name not in names


def test_a_span_left_open_and_followed_by_another_is_a_lost_worker() -> None:
    lost = AttemptSpan(attempt=1, started_at=0.0, saved_at=40.0)  # its process died
    nxt = AttemptSpan(attempt=2, started_at=100.0, ended_at=130.0, outcome="succeeded",
                      resumed_from=3)  # fmt: skip
    rec = _record(lost, nxt)
    rec.resume_status = "RESUMED"
    first = {f.metric.name: f for f in attempt_figures("J", rec, 0)}
    assert first[INTERRUPTIONS.name].labels["cause"] == "worker_lost"
    assert first[WORK_LOST.name].value == pytest.approx(60.0)  # an upper bound: to the next start
    second = {f.metric.name: f for f in attempt_figures("J", rec, 1)}
    assert second[RESUMES.name].labels["status"] == "RESUMED"
    assert attempt_figures("J", _record(AttemptSpan(attempt=1, started_at=0.0))) == []  # running


def test_a_commit_measured_shorter_than_its_estimate_leaves_the_largest_as_measured() -> None:
    """``note_stored`` counts a commit at an estimate (to the write, plus the last write's time);
    ``note_committed`` puts the measured duration in its place. The span's largest commit is
    then the largest measured one, as the exported histogram's max is, never the estimate (CI
    saw 0.008007 kept against 0.008006 exported)."""
    rec = _record(AttemptSpan(attempt=1, started_at=100.0))
    measured = []
    for estimate, after in ((0.004, 0.003), (0.009, 0.006), (0.002, 0.005)):
        data = CheckpointData(generation=len(measured) + 1, state="s", saved_at=101.0,
                              attempt=1, commit_seconds=estimate)  # fmt: skip
        earlier = note_stored(rec, data, None)
        note_committed(rec, earlier, estimate, after)
        measured.append(after)
    span = rec.history[-1]
    assert span.commits == 3
    assert span.commit_seconds == pytest.approx(sum(measured))
    assert span.commit_seconds_max == max(measured) == 0.006


def test_the_suggested_interval_is_youngs_formula_over_the_recorded_figures() -> None:
    """Two tasks: 3 interruptions over 900 s of attempts, commits of 2 s and 4 s: C = 3 s,
    M = 300 s, so sqrt(2 * 3 * 300) = 42.43 s."""
    a = _record(
        AttemptSpan(
            attempt=1,
            started_at=0.0,
            ended_at=300.0,
            outcome="interrupted",
            cause=InterruptionCause.NOTICE,
            saved_at=290.0,
        ),  # fmt: skip
        AttemptSpan(
            attempt=2,
            started_at=400.0,
            ended_at=600.0,
            outcome="interrupted",
            cause=InterruptionCause.NOTICE,
            saved_at=590.0,
        ),  # fmt: skip
        checkpoint=CheckpointData(generation=4, saved_at=590.0, attempt=1, commit_seconds=2.0),
    )
    b = _record(
        AttemptSpan(
            attempt=1,
            started_at=0.0,
            ended_at=400.0,
            outcome="interrupted",
            cause=InterruptionCause.STOP,
            saved_at=380.0,
        ),  # fmt: skip
        checkpoint=CheckpointData(generation=1, saved_at=380.0, attempt=1, commit_seconds=4.0),
    )
    figures = run_figures([a, b], now=1000.0)
    assert figures.run_seconds == pytest.approx(900.0)
    assert sum(figures.interruptions.values()) == 3
    assert figures.suggested_interval == pytest.approx(math.sqrt(2 * 3.0 * 300.0))
    assert suggested_interval(3.0, 300.0) == pytest.approx(42.426, abs=1e-3)
    assert interval_env(a) == {
        "OPENJD_CHECKPOINT_SUGGESTED_INTERVAL": str(round(math.sqrt(2 * 2.0 * 250.0)))
    }
    assert interval_env(_record()) == {}  # no history: no advice
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="positive number of seconds"):
            suggested_interval(bad, 10.0)


# --- read back from a real OTLP receiver ----------------------------------------------------------
class _Receiver(http.server.BaseHTTPRequestHandler):
    got: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        type(self).got.append(MessageToDict(request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra (in [test]) is installed")
    got: list[dict[str, Any]] = []
    handler = type("Receiver", (_Receiver,), {"got": got})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()


def _points(got: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Metric name -> its data points, the latest of each series (of labels): the export is
    cumulative, and the CLI may export more than once (periodically, then at its end)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for request in got:
        for rm in request.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    body = m.get("histogram") or m.get("sum") or m.get("gauge") or {}
                    for point in body.get("dataPoints", []):
                        series = json.dumps(_labels(point), sort_keys=True)
                        out.setdefault(m["name"], {})[series] = point
    return {name: list(series.values()) for name, series in out.items()}


def _value(point: dict[str, Any]) -> float:
    """A sum or gauge point's value (counters of whole numbers come as ``asInt``)."""
    return float(point.get("asInt", point.get("asDouble", "nan")))


def _labels(point: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"]["stringValue"] for a in point.get("attributes", [])}


def _run(store: Path, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, PYTHONPATH=str(REPO))
    return subprocess.run(
        [*CLI, "run", str(FIB), "--store", str(store), *extra],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def test_the_cli_exports_each_figure_as_the_records_say(
    tmp_path: Path, receiver: tuple[str, list[dict[str, Any]]]
) -> None:
    """A notice written at a known time: the exported interruption, lost work, stop-to-stored,
    commit and bytes figures equal what the run's records hold, and the stop-to-stored time is
    within the notice poll period of the notice's writing."""
    endpoint, got = receiver
    store, notice = tmp_path / "store", tmp_path / "notice"
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [*CLI, "run", str(FIB), "--store", str(store), "--interruption-notices",
         f"file:{notice}", "--notice-poll-seconds", str(POLL)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    st = CheckpointStore(store)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the first stored checkpoint
        runs = st.list_runs()[0]
        tasks = st.read_tasks(runs[0].job_key, runs[0].run_id)[0] if runs else []
        if tasks and tasks[0].checkpoint is not None:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("no checkpoint was stored within 60 s")
    noticed_at = time.time()
    notice.write_text("{}")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out  # suspended: resumable
    assert "suspended by an interruption notice" in out

    run = st.list_runs()[0][0]
    (rec,) = st.read_tasks(run.job_key, run.run_id)[0]
    span = rec.history[-1]
    assert span.cause == InterruptionCause.NOTICE and span.stopped_at is not None
    assert span.stored_after_stop_at is not None and rec.checkpoint is not None
    generations = st.list_generations(rec)
    points = _points(got)

    (stopped,) = points["openjd_checkpoint.interruptions"]
    assert _labels(stopped)["cause"] == "notice" and _value(stopped) == 1
    (lost,) = points["openjd_checkpoint.work_lost"]
    assert float(lost["sum"]) == pytest.approx(span.ended_at - span.saved_at, abs=1e-6)
    (waited,) = points["openjd_checkpoint.stop_to_stored"]
    figure = float(waited["sum"])
    assert figure == pytest.approx(span.stored_after_stop_at - span.stopped_at, abs=1e-6)
    since_notice = span.stored_after_stop_at - noticed_at
    assert 0 <= figure <= since_notice <= figure + POLL + 1.0, (figure, since_notice)
    (commits,) = points["openjd_checkpoint.commit.duration"]  # every commit, as the span counts
    assert int(commits["count"]) == span.commits >= len(generations) >= 2
    assert float(commits["sum"]) == pytest.approx(span.commit_seconds, abs=1e-5)
    assert float(commits["max"]) == pytest.approx(span.commit_seconds_max, abs=1e-6)
    (stored,) = points["openjd_checkpoint.stored"]
    assert _value(stored) == span.stored_bytes
    kept = sum(len((g.state or "").encode()) for g in generations)  # the newest few, kept
    assert 0 < kept <= span.stored_bytes
    assert points["openjd_checkpoint.checkpoint.age"], "no checkpoint age was sent"

    # the same figures, read back by the CLI
    shown = subprocess.run(
        [*CLI, "checkpoints", "show", run.run_id, "--store", str(store), "--json"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    )  # fmt: skip
    doc = json.loads(shown.stdout)["metrics"]
    assert doc["interruptions"] == {"notice": 1}
    assert doc["commit_seconds"]["count"] == span.commits
    assert doc["stored_bytes"]["total"] == span.stored_bytes
    assert doc["work_lost_seconds"]["total"] == pytest.approx(float(lost["sum"]), abs=1e-5)
    assert doc["stop_to_stored_seconds"]["total"] == pytest.approx(figure, abs=1e-5)
    text = subprocess.run(
        [*CLI, "checkpoints", "show", run.run_id, "--store", str(store)],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    assert "interruptions: 1 (notice 1); work lost" in text
    assert "stop to checkpoint stored:" in text and "suggested save interval:" in text

    # the resume: a RESUMED status; the finished run keeps its figures when its records go
    got.clear()
    done = _run(store, endpoint)
    assert done.returncode == 0, done.stdout + done.stderr
    (resumed,) = _points(got)["openjd_checkpoint.resumes"]
    assert _labels(resumed)["status"] == "RESUMED"
    rows = subprocess.run(
        [*CLI, "runs", "--store", str(store), "--json"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    (row,) = json.loads(rows)["runs"]
    assert row["stored_status"] == "succeeded"
    assert row["metrics"]["interruptions"] == {"notice": 1}
    assert row["metrics"]["resumes"] == {"RESUMED": 1}


def test_without_the_sdk_or_an_endpoint_nothing_is_exported_and_the_run_is_unchanged(
    tmp_path: Path,
) -> None:
    """No endpoint: no provider is set, so the executor computes no figure (``default_sinks``
    is empty); an endpoint nobody listens on: the run still succeeds, with a warning at most."""
    from core import default_sinks

    assert default_sinks() == []
    done = _run(tmp_path / "store", "http://127.0.0.1:9", "--param", "N=3")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_table_names_every_metric_as_core_defines_it() -> None:
    """docs/metrics.md's table: one row per metric of ``core._figures.METRICS``, with its
    kind, unit and labels as defined."""
    from core._figures import METRICS

    rows = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`openjd_checkpoint."):
            rows[cells[0].strip("`")] = (
                cells[1],
                cells[2],
                tuple(c.strip() for c in cells[3].split(",")),
            )
    assert rows == {m.name: (m.kind.value, m.unit, m.labels) for m in METRICS}


PROBE = """\
specificationVersion: 'jobtemplate-2023-09'
extensions: [CHECKPOINT]
name: interval-probe
steps:
- name: Work
  script:
    actions:
      onRun:
        command: python3
        args: ['{{Task.File.Work}}', '0']
        checkpointCancelation: {mode: NOTIFY_THEN_TERMINATE, notifyPeriodInSeconds: 20,
                                signalToNotify: SIGUSR1}
      onCheckpointResume:
        command: python3
        args: ['{{Task.File.Work}}', '{{Task.Checkpoint.State}}']
    embeddedFiles:
    - name: Work
      type: TEXT
      filename: work.py
      data: |
        import os, signal, sys, time
        n = int(sys.argv[1])
        v = os.environ.get("OPENJD_CHECKPOINT_SUGGESTED_INTERVAL", "none")
        print("suggested=" + v, flush=True)
        if n:
            print('openjd_checkpoint_resume_status: {"status": "RESUMED"}', flush=True)
            sys.exit(0)
        def save_and_go(*_):
            print('openjd_checkpoint_save: {"state": "5"}', flush=True)
            sys.exit(1)
        signal.signal(signal.SIGUSR1, save_and_go)
        print('openjd_checkpoint_save: {"state": "1"}', flush=True)
        while True:
            time.sleep(0.05)
"""


def test_a_task_resumed_after_an_interruption_reads_the_suggested_interval(
    tmp_path: Path,
) -> None:
    """The first attempt has no history (no variable); interrupted by a notice once, its
    resume reads ``$OPENJD_CHECKPOINT_SUGGESTED_INTERVAL`` as ``interval_env`` computes it
    from the task's record."""
    template, store, notice = tmp_path / "probe.yaml", tmp_path / "store", tmp_path / "notice"
    template.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [*CLI, "run", str(template), "--store", str(store), "--interruption-notices",
         f"file:{notice}", "--notice-poll-seconds", str(POLL)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the task's output, as the CLI shows it
        seen.append(line)
        if "generation 1 stored" in line:
            notice.write_text("{}")
            break
    out = "".join(seen) + rest_of_output(proc, 60)
    assert proc.returncode == 75, out
    assert "suggested=none" in out
    st = CheckpointStore(store)
    run = st.list_runs()[0][0]
    (rec,) = st.read_tasks(run.job_key, run.run_id)[0]
    expected = interval_env(rec)["OPENJD_CHECKPOINT_SUGGESTED_INTERVAL"]
    again = subprocess.run(
        [*CLI, "run", str(template), "--store", str(store)],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"suggested={expected}" in again.stdout + again.stderr


@pytest.mark.parametrize(
    "damage",
    [
        {"commit_seconds": math.inf},
        {"commit_seconds": math.nan},
        {"commit_seconds": 1.7e308},
        {"commit_seconds": -5.0},
        {"ended_at": math.inf},
        {"ended_at": 1e300},
        {"started_at": -1e308},
        {"stopped_at": 5e9, "stored_after_stop_at": math.inf},
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_figures_of_a_damaged_record_are_left_out_never_absurd(damage: dict[str, float]) -> None:
    """A record edited or damaged by hand (NaN, infinite, far-future, negative values): every
    figure read back is a finite, non-negative number or left out; the suggested interval
    stays between 1 s and a week; nothing raises."""
    now = time.time()
    span = AttemptSpan(attempt=1, started_at=now - 100, ended_at=now - 10, outcome="interrupted",
                       cause=InterruptionCause.NOTICE, saved_at=now - 20, commits=2,
                       commit_seconds=0.5, commit_seconds_max=0.3, stored_bytes=40)  # fmt: skip
    cp = CheckpointData(generation=2, saved_at=now - 20, attempt=1, state="x", commit_seconds=0.3)
    for key, value in damage.items():
        if key == "commit_seconds":
            cp.commit_seconds = value
            span.commit_seconds = span.commit_seconds_max = value
        else:
            setattr(span, key, value)
    rec = _record(span, checkpoint=cp)
    doc = run_figures([rec], now=now).as_json()
    json.dumps(doc, allow_nan=False)  # finite everywhere
    for name in ("work_lost_seconds", "stop_to_stored_seconds", "commit_seconds", "stored_bytes"):
        assert doc[name]["total"] >= 0 and doc[name]["max"] >= 0, (name, doc[name])
    assert doc["attempt_seconds"] >= 0
    interval = doc["suggested_interval_seconds"]
    assert interval is None or 0 < interval <= 7 * 86400
    env = interval_env(rec)
    if env:
        assert 1 <= int(env["OPENJD_CHECKPOINT_SUGGESTED_INTERVAL"]) <= 7 * 86400


def test_kept_figures_that_do_not_have_their_shape_are_not_read() -> None:
    from core._figures import read_figures

    good = run_figures([]).as_json()
    assert read_figures(good) == good
    for bad in (
        {**good, "interruptions": {"stop": "x"}},
        {**good, "work_lost_seconds": {"count": 1, "total": "x", "max": 1.0}},
        {**good, "checkpoint_age_seconds": {"a": "b"}},
        {**good, "commit_seconds": {"count": 1, "total": math.nan, "max": math.inf}},
        {**good, "suggested_interval_seconds": math.inf},
        "not a document",
        None,
    ):
        assert read_figures(bad) is None, bad


def test_a_bad_export_setting_warns_and_the_command_runs(tmp_path: Path) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL the SDK would refuse (0) or could not wait (huge), an
    exporter other than otlp: a warning each, the run succeeds, and nothing waits long."""
    pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra (in [test]) is installed")
    for setting, said in (
        ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, "OTEL_METRIC_EXPORT_INTERVAL='0'"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "99999999999999999999"}, "60000 is used"),
        ({"OTEL_METRICS_EXPORTER": "console"}, "only with otlp"),
    ):
        env = dict(
            os.environ, PYTHONPATH=str(REPO), OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"
        )
        env.update(setting)
        started = time.monotonic()
        done = subprocess.run(
            [*CLI, "run", str(FIB), "--store", str(tmp_path / f"s{len(said)}"), "-p", "N=2", "-q"],
            env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert time.monotonic() - started < 30
