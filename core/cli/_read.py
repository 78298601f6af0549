"""The CLI's reading commands: ``runs``, ``checkpoints list``, ``checkpoints show``, each as a
table for a person or, with ``--json``, as one JSON document for scripts.

The JSON field names are stable and documented in the README ("Reading the store"). Times are
seconds since the epoch (``*_at``) and ISO 8601 UTC strings (``*_time``); sizes are bytes.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from datetime import datetime, timezone
from typing import Any

from core import CheckpointStore, RunRecord, StoreError, TaskRecord, TemplateError, report
from core.local import (
    no_run_words,
    read_figures,
    run_figures,
    run_files_mode,
    runner_lost,
    set_aside_runs,
)

__all__ = (
    "JSON_SCHEMA_VERSION",
    "add_json_option",
    "reading",
    "cmd_checkpoints_list",
    "cmd_runs",
    "cmd_show",
)

JSON_SCHEMA_VERSION = 1
"""The ``schema`` field of every ``--json`` document; raised when a field changes meaning."""


def add_json_option(p: argparse.ArgumentParser) -> None:
    """Add ``--json`` (one JSON document on stdout) to a reading command's parser."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (field names as in the README) instead of a table",
    )


def reading(fn: Any, *, raw_output: bool = False) -> Any:
    """A parser default ``func`` for a reading command ``fn(args, store)``: the store is the
    one ``--store`` names, never created or changed by reading it (an unreadable record is
    reported and left in place). What it prints is escaped (``printable``), but for
    ``raw_output``: standard output carries a task's own output, as the task wrote it."""

    def run(args: argparse.Namespace) -> int:
        # What they print comes from the store (job names, messages, file names), which a
        # template's parameters or a person may have put control characters in: escaped.
        out, err = sys.stdout, sys.stderr
        sys.stdout = out if raw_output else _Printable(out)
        sys.stderr = _Printable(err)
        try:
            code: int = fn(args, CheckpointStore(args.store, create=False, read_only=True))
        finally:
            sys.stdout, sys.stderr = out, err
        return code

    return run


class _Printable(io.TextIOBase):
    """A text stream that writes to ``inner`` with control characters escaped (``printable``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()


# Times come from stored records, which a person or a bug may have damaged: a time that is no
# time (NaN, 1e300) shows as unknown instead of ending the command with a traceback.
def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError, TypeError):
        return None


def _local(ts: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    try:
        return time.strftime(fmt, time.localtime(ts))
    except (OverflowError, ValueError, OSError, TypeError):
        return "?"


def _duration(seconds: float) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (a damaged record's) made None: JSON has
    neither."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if chr(c) not in "\n\t"}
"""Control characters (but newline and tab) as ``\\xNN``, for ``str.translate``."""


def printable(text: str) -> str:
    """``text`` with its control characters (but newline and tab) escaped as ``\\xNN``: a
    message may quote what the user gave (``-p``, a file's text) or a name found in the store
    (a kept record's file name), and an escape sequence in it must not reach the terminal
    (``-p $'N=\\e]0;title\\a'`` set the window's title)."""
    return text.translate(_CONTROLS)


def print_warning(text: str) -> None:
    """A warning on standard error, as every command prints one:
    ``openjd-checkpoint: warning: <text>``, control characters escaped (``printable``)."""
    print(f"openjd-checkpoint: warning: {printable(text)}", file=sys.stderr)


def _dump(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(_finite(doc), indent=2, sort_keys=True) + "\n")


def _warn(warnings: list[str], text: str, as_json: bool) -> None:
    warnings.append(text)
    if not as_json:
        print_warning(text)


def _run_status(store: CheckpointStore, run: RunRecord) -> str:
    alive = not runner_lost(store, run)
    return report.run_status_words(run.status.value, runner_alive=alive)


def run_summary(store: CheckpointStore, run: RunRecord, tasks: list[TaskRecord]) -> dict[str, Any]:
    """One run as ``runs --json`` gives it (see the README for each field)."""
    status = _run_status(store, run)
    return {
        "run_id": run.run_id,
        "job": run.job_name,
        "parameters": dict(run.parameters),
        "status": status,
        "stored_status": run.status.value,
        "reason": run.condition.reason,
        "message": run.condition.message or run.message,
        "attempts": run.attempt,
        "started_at": run.created_at,
        "started_time": _iso(run.created_at),
        "updated_at": run.updated_at,
        # to the run's last change: its record's, or a task's (a run whose process was
        # killed wrote its record last when it started)
        "duration_seconds": round(
            max(0.0, max([run.updated_at, *(t.updated_at for t in tasks)]) - run.created_at), 3
        ),
        "tasks": len(tasks),
        "tasks_with_checkpoints": sum(1 for t in tasks if t.checkpoint is not None),
        "tasks_resumable": sum(1 for t in tasks if report.summarize_task(t).resumable),
        "template": run.template_path,
        "metrics": _figures(run, tasks, status),
    }


def _figures(run: RunRecord, tasks: list[TaskRecord], status: str) -> dict[str, Any] | None:
    """The run's checkpoint metrics: from its task records, or, once a succeeded run deleted
    them, what it kept (None for a run kept by an earlier version). Checkpoint ages only while
    the run runs (``status``, its words: an attempt whose runner died is not running, though
    its span is still open)."""
    if not tasks and run.kept is not None:
        if run.kept.figures is None:
            return None
        kept = read_figures(run.kept.figures)
        if kept is None:
            print_warning(
                f"run {run.run_id}: the checkpoint metrics it kept (kept.figures in its "
                "run.json) are not readable; left out"
            )
        return kept
    doc = run_figures(tasks).as_json()
    if status != "running":
        doc["checkpoint_age_seconds"] = {}
    return doc


def _runs_and_tasks(
    store: CheckpointStore, as_json: bool
) -> tuple[list[tuple[RunRecord, list[TaskRecord]]], list[str]]:
    """Every stored run with its task records, and the warnings about records that could not be
    read (printed on stderr unless ``as_json``: a JSON document carries them itself)."""
    runs, warnings = store.list_runs()
    if not as_json:
        for w in warnings:
            print_warning(w)
    out = []
    for r in runs:
        try:
            tasks, task_warnings = store.read_tasks(r.job_key, r.run_id)
        except StoreError as exc:  # one run's folder (a link put there) hides no other run
            tasks, task_warnings = [], [f"run {r.run_id}: its task records are not read: {exc}"]
        for w in task_warnings:
            _warn(warnings, w, as_json)
        out.append((r, tasks))
    for line in set_aside_runs(store, known={r.run_id for r in runs}):
        _warn(warnings, line, as_json)
    return out, warnings


def cmd_runs(args: argparse.Namespace, store: CheckpointStore) -> int:
    """``runs``: every stored run (id, job, parameters, status, attempts, started, duration)."""
    as_json = bool(getattr(args, "json", False))
    runs, warnings = _runs_and_tasks(store, as_json)
    rows = []
    for r, tasks in runs:
        rows.append(run_summary(store, r, tasks))
    if as_json:
        _dump({"schema": JSON_SCHEMA_VERSION, "store": store.location, "runs": rows,
               "warnings": warnings})  # fmt: skip
        return 0
    if not rows:
        print(f"no stored runs in {store.location}")
        return 0
    print(
        f"{'RUN':<24} {'STATUS':<11} {'ATTEMPTS':>8}  {'STARTED':<19} {'DURATION':>9}  "
        f"{'INTERRUPTED':>11} {'WORK LOST':>9}  JOB"
    )
    for row in rows:
        params = " ".join(f"{k}={v}" for k, v in row["parameters"].items())
        figures = row["metrics"] or {}
        stopped = sum((figures.get("interruptions") or {}).values()) if figures else None
        lost = (figures.get("work_lost_seconds") or {}).get("total") if figures else None
        print(
            f"{row['run_id']:<24} {row['status']:<11} {row['attempts']:>8}  "
            f"{_local(row['started_at']):<19} {_duration(row['duration_seconds']):>9}  "
            f"{'-' if stopped is None else stopped:>11} "
            f"{'-' if lost is None else report.seconds_words(lost):>9}  "
            f"{row['job']}" + (f" ({params})" if params else "")
        )
    return 0


def checkpoint_row(store: CheckpointStore, run: RunRecord, rec: TaskRecord) -> dict[str, Any]:
    """One task that holds a checkpoint (or finished frames), as ``checkpoints list --json``
    gives it (see the README for each field)."""
    task = report.summarize_task(rec, run_files_mode(store, run))
    ck = task.checkpoint
    return {
        "run_id": run.run_id,
        "job": run.job_name,
        "step": task.step,
        "task": task.label,
        "task_status": task.status,
        "generation": ck.generation if ck is not None else None,
        "saved_at": ck.saved_at if ck is not None else None,
        "saved_time": _iso(ck.saved_at) if ck is not None else None,
        "state_bytes": ck.state_bytes if ck is not None else 0,
        "files": ck.named if ck is not None else 0,
        "files_mode": task.files_mode,
        "file_bytes": ck.file_bytes if ck is not None else None,
        "frames_done": len(task.frames_done),
    }


def cmd_checkpoints_list(args: argparse.Namespace, store: CheckpointStore) -> int:
    """``checkpoints list``: the tasks that hold checkpoints or finished frames of a chunk."""
    as_json = bool(getattr(args, "json", False))
    runs, warnings = _runs_and_tasks(store, as_json)
    rows = []
    for r, tasks in runs:
        for t in tasks:
            if report.summarize_task(t).resumable:
                rows.append(checkpoint_row(store, r, t))
    if as_json:
        _dump({"schema": JSON_SCHEMA_VERSION, "store": store.location, "checkpoints": rows,
               "warnings": warnings})  # fmt: skip
        return 0
    if not rows:
        print(f"no stored checkpoints in {store.location}")
        return 0
    print(
        f"{'RUN':<24} {'TASK':<28} {'GEN':>4}  {'SAVED':<19} {'STATE':>9} {'FILES':>5} "
        f"{'FRAMES':>6}"
    )
    for row in rows:
        gen = "-" if row["generation"] is None else str(row["generation"])
        saved = _local(row["saved_at"]) if row["saved_at"] is not None else "-"
        print(
            f"{row['run_id']:<24} {row['task']:<28} {gen:>4}  {saved:<19} "
            f"{row['state_bytes']:>8}B {row['files']:>5} {row['frames_done']:>6}"
        )
    return 0


def show_document(
    store: CheckpointStore, run: RunRecord
) -> tuple[dict[str, Any], list[report.TaskSummary], list[report.TaskTimeline]]:
    """``checkpoints show RUN --json``: the run's raw records (the run, each task with its
    stored generations, the run's outputs, warnings), and each task's summary and timeline
    (its stored generations as marks), in the same order, for the table."""
    tasks, warnings = store.read_tasks(run.job_key, run.run_id)
    data: dict[str, Any] = run.model_dump(mode="json")
    data["schema"] = JSON_SCHEMA_VERSION
    data["status_words"] = _run_status(store, run)
    data["tasks"] = []
    files_mode = run_files_mode(store, run)
    summaries = [report.summarize_task(t, files_mode) for t in tasks]
    timelines = []
    continued = report.continuations(tasks)
    every = store.list_generations_of(tasks)
    for t, summary, generations in zip(tasks, summaries, every, strict=True):
        timelines.append(report.task_timeline(t, generations))
        td = t.model_dump(mode="json")
        td["label"] = summary.label
        td["generations"] = [g.generation for g in generations]
        td["files_mode"] = summary.files_mode
        td["continued"] = continued.get((t.step, t.task_key))
        data["tasks"].append(td)
    data["metrics"] = _figures(run, tasks, data["status_words"])
    data["file_data_flow"] = files_mode
    data["outputs"] = store.outputs.read_outputs(run.job_key, run.run_id, warnings)
    data["warnings"] = warnings
    return data, summaries, timelines


def cmd_show(args: argparse.Namespace, store: CheckpointStore) -> int:
    """``checkpoints show RUN``: a table of the run's tasks; ``--json``: the raw records.
    Exit 2 when the store holds no such run."""
    run = store.find_run(args.run_id)
    if run is None:
        print(f"openjd-checkpoint: {no_run_words(store, args.run_id)}", file=sys.stderr)
        return 2
    data, summaries, timelines = show_document(store, run)
    if getattr(args, "json", False):
        _dump(data)
        return 0
    for w in data["warnings"]:
        print_warning(w)
    params = " ".join(f"{k}={v}" for k, v in run.parameters.items())
    print(f"run {run.run_id}: {data['status_words']} after {run.attempt} attempt(s)")
    print(f"  job: {run.job_name}" + (f" ({params})" if params else ""))
    if run.template_path:
        print(f"  template: {run.template_path}")
    print(f"  started: {_local(run.created_at)}; last change: {_local(run.updated_at)}")
    if run.condition.message:
        print(f"  {run.condition.message}")
    print(f"  checkpoint files: {data['file_data_flow']}")
    for line in report.figures_words(data["metrics"] or {}) if data["metrics"] else ():
        print(f"  {line}")
    if not data["tasks"]:
        if run.kept is None:
            print("  no task records kept (a finished run deletes them)")
            return 0
        print(f"  checkpoints deleted at its end ({_local(run.kept.at)}), as a run that succeeds")
        print(f"  does; until then it {report.kept_sentence(run.kept)}")
        for kept_task in run.kept.tasks:
            print(f"  {kept_task.label}:")
            timeline = report.kept_timeline(kept_task)
            for line in report.timeline_text(timeline):
                print(f"    {line}")
            for mark in timeline.checkpoints:
                print(f"    ▲ {report.checkpoint_mark_text(mark)}")
        if run.kept.left_out:
            print(f"  ({run.kept.left_out} more task(s) without checkpoints or resumes)")
        return 0
    print(f"  {'TASK':<28} {'STATUS':<12} {'CHECKPOINT':<22} {'FRAMES':>6}  MESSAGE")
    for task, td, timeline in zip(summaries, data["tasks"], timelines, strict=True):
        message = "; ".join(m for m in (task.message, td["continued"]) if m)
        ck = task.checkpoint
        ckt = f"gen {ck.generation}, {ck.state_bytes}B" if ck else "-"
        status = report.task_status_words(task.status)
        print(f"  {task.label:<28} {status:<12} {ckt:<22} {len(task.frames_done):>6}  {message}")
        if ck:
            kept = f", {ck.file_bytes:,} bytes kept" if ck.file_bytes is not None else ""
            print(f"  {'':<28} checkpoint files: {ck.files_mode}, {ck.named} named{kept}")
        for mark in timeline.checkpoints:  # the Prefect table's checkpoint history, in order
            print(f"  {'':<28} ▲ {report.checkpoint_mark_text(mark)}")
    for out in data["outputs"]:  # the files a task declared so far, in the store
        files = out.get("files") if isinstance(out.get("files"), dict) else {}
        who = f"{out.get('step', '?')} {out.get('task_key', '')}".strip()
        print(f"  files declared by {who} (in the store): {len(files)}")
        for path, entry in sorted(files.items()):
            size = entry.get("size") if isinstance(entry, dict) else None
            print(f"    {path}" + (f"  {size:,} bytes" if isinstance(size, int) else ""))
    for w in data["warnings"]:
        print_warning(w)
    return 0


def add_logs_parser(sub: Any) -> None:
    """Add ``logs RUN_ID [--step S] [--task LABEL] [--attempt N] [--follow] [--json]``."""
    p = sub.add_parser(
        "logs",
        help="show the output of a run's tasks, kept in the store (also while it runs)",
        description="Show the output of a run's tasks in the order written, each line with its "
        "time and task. Every attempt of every task is kept with the run until 'gc' or "
        "'checkpoints delete' removes it.",
    )
    p.add_argument("run_id")
    p.add_argument("--step", metavar="STEP", help="only this step's tasks")
    p.add_argument("--task", metavar="LABEL", help="only this task (as shown: Render[Frame=1-4])")
    p.add_argument("--attempt", type=int, metavar="N", help="only the run's attempt N (1, 2, ...)")
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new output until the run ends"
    )
    add_json_option(p)
    p.add_argument("--store", help="checkpoint store", default=argparse.SUPPRESS)
    p.set_defaults(func=reading(cmd_logs, raw_output=True))


def _wanted(args: argparse.Namespace, log: Any) -> bool:
    return (
        (args.step is None or log.step == args.step)
        and (args.task is None or args.task in (log.task, log.of))
        and (args.attempt is None or log.attempt == args.attempt)
    )


def _line(e: Any) -> str:
    stamp = _local(e.at, "%H:%M:%S")
    if stamp != "?":
        stamp += f".{int(e.at * 1000) % 1000:03d}"
    return f"{stamp} [{e.task}] #{e.attempt} {e.text}"


def cmd_logs(args: argparse.Namespace, store: CheckpointStore) -> int:
    """``logs RUN_ID``: the run's kept task output, merged in the order written. Exit 2 when
    there is no such run or ``--json`` and ``--follow`` are both given."""
    from core.cli._logs import read_run_logs

    if args.json and args.follow:
        print("openjd-checkpoint: logs: --json and --follow: choose one", file=sys.stderr)
        return 2
    run = store.find_run(args.run_id)
    if run is None:
        print(f"openjd-checkpoint: {no_run_words(store, args.run_id)}", file=sys.stderr)
        return 2
    warnings: list[str] = []
    logs = [
        lg for lg in read_run_logs(store, run.job_key, run.run_id, warnings) if _wanted(args, lg)
    ]
    if not args.json:
        for w in warnings:
            print_warning(w)
    if args.json:
        _dump(
            {
                "schema": JSON_SCHEMA_VERSION,
                "run_id": run.run_id,
                "warnings": warnings,
                "logs": [
                    {
                        "step": lg.step,
                        "task": lg.task,
                        "attempt": lg.attempt,
                        "started_at": lg.started_at,
                        "lines": len(lg.entries),
                        "cut_bytes": lg.cut_bytes,
                        "cut_lines": lg.cut_lines,
                    }  # fmt: skip
                    for lg in logs
                ],
                "lines": [
                    {
                        "at": e.at,
                        "time": _iso(e.at),
                        "step": e.step,
                        "task": e.task,
                        "attempt": e.attempt,
                        "text": e.text,
                    }  # fmt: skip
                    for e in sorted((e for lg in logs for e in lg.entries), key=lambda e: e.at)
                ],
            }
        )
        return 0
    shown: dict[str, int] = {}
    cut_told: set[str] = set()
    last_pass = False
    while True:
        new = []
        for lg in logs:
            start = shown.get(lg.name, 0)
            new.extend(lg.entries[start:])
            shown[lg.name] = len(lg.entries)
        for e in sorted(new, key=lambda e: e.at):  # stable: a task's own lines keep their order
            sys.stdout.write(_line(e) + "\n")
        for lg in logs:
            if lg.cut_lines and lg.name not in cut_told:
                cut_told.add(lg.name)
                sys.stdout.write(
                    f"openjd-checkpoint: [{lg.task}] #{lg.attempt}: output cut: {lg.cut_lines:,} "
                    f"more line(s), {lg.cut_bytes:,} bytes, over the size kept per task\n"
                )
        if not args.follow:
            break
        sys.stdout.flush()
        rec = store.find_run(run.run_id)
        ended = rec is None or rec.status.value != "running" or runner_lost(store, rec)
        if ended and last_pass:
            break
        last_pass = ended  # one more read after the end: the last flush
        time.sleep(0.5)
        logs = [lg for lg in read_run_logs(store, run.job_key, run.run_id) if _wanted(args, lg)]
    if not any(lg.entries for lg in logs) and not shown:
        filters = [
            f"{flag} {value}"
            for flag, value in (
                ("--step", getattr(args, "step", None)),
                ("--task", getattr(args, "task", None)),
                ("--attempt", getattr(args, "attempt", None)),
            )
            if value is not None
        ]
        if filters and read_run_logs(store, run.job_key, run.run_id):
            print(
                f"openjd-checkpoint: run {run.run_id} has output, but none matches "
                f"{' '.join(filters)} (without them: every task's output)",
                file=sys.stderr,
            )
        else:
            print(f"openjd-checkpoint: no output kept for run {run.run_id}", file=sys.stderr)
    return 0


def _step_docs(tmpl: Any) -> dict[str, dict[str, Any]]:
    doc = tmpl.document
    steps = [
        s for s in (doc.get("steps") or []) + (doc.get("finally") or []) if isinstance(s, dict)
    ]
    return {str(s.get("name")): s for s in steps}


def _chunked(step: dict[str, Any]) -> bool:
    space = step.get("parameterSpace") or {}
    defs = space.get("taskParameterDefinitions") or [] if isinstance(space, dict) else []
    return any(isinstance(d, dict) and str(d.get("type")) == "CHUNK[INT]" for d in defs)


def _suspend_words(spec: Any) -> str:
    ck = spec.checkpoint_cancelation if spec is not None else None
    how = ck if ck is not None else (spec.cancelation if spec is not None else None)
    which = "checkpointCancelation" if ck is not None else "cancelation; no checkpointCancelation"
    if how is not None and how.mode == "NOTIFY_THEN_TERMINATE":
        period = how.notify_period_text or f"{how.notify_period_seconds:g}"
        return (
            f"suspending sends {how.signal_to_notify.name} ({which}), then terminates it "
            f"after {period} s"
        )
    return f"suspending terminates it at once ({which})"


def check_document(tmpl: Any, path: str) -> dict[str, Any]:
    """``check --json``: the template's name, extensions and, per step, how it resumes:
    ``checkpoint`` (``onCheckpointResume`` from its last checkpoint), ``frames`` (a chunk runs
    only its unfinished frames), ``checkpoint+frames``, or ``none`` (an unfinished task runs
    again from its start; finished tasks are skipped in every case)."""
    docs = _step_docs(tmpl)
    steps = []
    for name in list(tmpl.regular_steps) + list(tmpl.finally_steps):
        step = docs.get(name, {})
        where = tmpl.step_path(name)
        by_ck = name in tmpl.resume_actions
        by_frames = _chunked(step)
        resumes = "+".join(k for k, on in (("checkpoint", by_ck), ("frames", by_frames)) if on)
        steps.append(
            {
                "step": name,
                "path": where,
                "finally": tmpl.is_finally(name),
                "resumes": resumes or "none",
                "on_suspend": _suspend_words(
                    tmpl.actions.get(f"steps[{tmpl.step_index(name)}].script.actions.onRun")
                ),
            }  # fmt: skip
        )
    return {
        "schema": JSON_SCHEMA_VERSION,
        "template": path,
        "name": tmpl.name,
        "extensions": sorted(tmpl.extensions),
        "steps": steps,
    }


_RESUME_WORDS = {
    "checkpoint": "from its last checkpoint, through onCheckpointResume",
    "frames": "by finished frames: a chunk runs only its unfinished frames",
    "checkpoint+frames": "from its last checkpoint through onCheckpointResume, and a chunk runs "
    "only its unfinished frames",
    "none": "not resumable: an unfinished task runs again from its start",
}


ENV_VERSION = "environment-2023-09"
"""The ``specificationVersion`` that makes ``check`` validate an environment template."""


def cmd_check(args: argparse.Namespace) -> int:
    """``check TEMPLATE``: validate a job template and say how each step resumes, or validate an
    environment template (``specificationVersion: environment-2023-09``), as ``openjd check``
    does (``--json``: one document). Raises ``TemplateError`` for an invalid template
    (exit 2); with ``--json`` it prints ``{schema, template, valid: false, problems}`` instead,
    on stdout only (each problem once), and returns 2."""
    try:
        return _check(args)
    except TemplateError as exc:
        if not getattr(args, "json", False):
            raise
        _dump(
            {
                "schema": JSON_SCHEMA_VERSION,
                "template": str(args.template),
                "valid": False,
                "problems": list(exc.problems),
            }
        )
        return 2


def _too_large_by_default(template: Any) -> list[str]:
    """Why ``run`` would refuse ``template`` with its parameters' defaults for its size (a
    step of more than ``MAX_TASKS_PER_STEP`` tasks): ``check`` accepts it, as ``openjd check``
    does, since other values may make it smaller, and warns. Empty when a parameter has no
    default, or the job is created."""
    from core import prepare_job

    try:
        prepare_job(template)
    except TemplateError as exc:
        return [
            f"with its parameters' defaults {p} (run refuses that; give smaller values with -p)"
            for p in exc.too_large
        ]
    return []


def _check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from core import load_template
    from core.local import load_document, load_environment_template, read_input_file

    path = Path(args.template)
    document = load_document(
        read_input_file(path, "template file"),
        json_format=path.suffix.lower() == ".json",
        source=path,
    )
    if isinstance(document, dict) and document.get("specificationVersion") == ENV_VERSION:
        env = load_environment_template(path)
        name = getattr(getattr(env, "environment", None), "name", "")
        env_extensions = sorted(str(e) for e in (getattr(env, "extensions", None) or []))
        if getattr(args, "json", False):
            _dump(
                {
                    "schema": JSON_SCHEMA_VERSION,
                    "template": str(args.template),
                    "kind": "environment",
                    "name": name,
                    "extensions": env_extensions,
                }
            )
            return 0
        print(f"{args.template}: valid environment template {name!r}")
        if env_extensions:
            print(f"  extensions: {', '.join(env_extensions)}")
        return 0
    tmpl = load_template(args.template)
    doc = check_document(tmpl, str(args.template))
    doc["warnings"] = _too_large_by_default(tmpl)
    if getattr(args, "json", False):
        _dump(doc)
        return 0
    for text in doc["warnings"]:
        print_warning(text)
    print(f"{args.template}: valid job template {tmpl.name!r}")
    if tmpl.extensions:
        print(f"  extensions: {', '.join(sorted(tmpl.extensions))}")
    resumable = [s["step"] for s in doc["steps"] if s["resumes"] != "none"]
    print(f"  resumable steps: {', '.join(resumable) if resumable else 'none'}")
    print("  how each step resumes after a suspend or failure (finished tasks are always skipped):")
    for s in doc["steps"]:
        kind = " (finally)" if s["finally"] else ""
        print(f"    {s['step']}{kind}: {_RESUME_WORDS[s['resumes']]}; {s['on_suspend']}")
    return 0
