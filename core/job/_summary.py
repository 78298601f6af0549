"""What a person is shown of a task and its checkpoints, the same on every runner: the CLI's
``checkpoints show`` and ``checkpoints list``, the Airflow plugin's page and task state store
summary, and the Prefect flow run's table artifact all read these.

A summary never holds a checkpoint's state itself (it may hold anything) nor environment
values: only its size in bytes. Pure functions of stored records (``core.store._store``), no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from core._figures import RunFigures
from core._records import (
    AttemptSpan,
    CheckpointData,
    CheckpointsKept,
    KeptCheckpoint,
    KeptTask,
    TaskRecord,
)
from core.job._planning import task_label

if TYPE_CHECKING:
    from core.job._planning import TaskSpec

__all__ = (
    "AttemptBar",
    "CheckpointMark",
    "CheckpointSummary",
    "KeptCollector",
    "TaskSummary",
    "TaskTimeline",
    "checkpoint_mark_text",
    "describe_plan",
    "kept_timeline",
    "summarize_checkpoint",
    "summarize_task",
    "task_timeline",
    "timeline_text",
    "utc_moment",
)


@dataclass(frozen=True)
class CheckpointSummary:
    """One committed checkpoint generation, as shown."""

    generation: int
    saved_at: float
    """Seconds since the epoch."""
    attempt: int
    state_bytes: int
    """Size of the saved state in bytes (UTF-8); 0 when the save had none."""
    files: tuple[str, ...]
    """The named files: the file dataset's files, then the saved checkpoint file if any."""
    dirs: tuple[str, ...]
    files_mode: str
    """``managed`` when the store keeps the files, ``shared`` when only their paths."""
    file_bytes: int | None = None
    """Managed: bytes of the files the store keeps for it (None: shared, or not recorded)."""

    @property
    def named(self) -> int:
        """How many paths the checkpoint names: files, folders and the checkpoint file."""
        return len(self.files) + len(self.dirs)


@dataclass(frozen=True)
class TaskSummary:
    """One task's record, as shown."""

    step: str
    label: str
    status: str
    """The stored status (``TaskStatus`` value: ``interrupted`` for a suspended task)."""
    attempts: int
    frames_done: tuple[int, ...]
    """Finished frames of the chunk (``openjd_task_complete``), as recorded."""
    resume_status: str | None
    message: str | None
    updated_at: float
    checkpoint: CheckpointSummary | None
    """The latest committed checkpoint, or None."""
    host: str | None = None
    """The host id of the process that last ran the task (None: it never started one)."""
    files_mode: str | None = None
    """How the task's checkpoint files are kept, ``shared`` or ``managed``: its latest
    checkpoint's mode (a checkpoint is resumed the way it was made), else, for a task that
    saved none, its run's (given to ``summarize_task``); None when it saved none and the run's
    was not given."""

    @property
    def resumable(self) -> bool:
        """It holds something a resume uses: a checkpoint, or finished frames of an unfinished
        chunk (what ``checkpoints list`` lists, and ``runs`` counts as resumable)."""
        return self.checkpoint is not None or (
            bool(self.frames_done) and self.status != "succeeded"
        )


def summarize_checkpoint(ck: CheckpointData) -> CheckpointSummary:
    """The summary of one checkpoint generation (a record's latest or a stored one)."""
    return CheckpointSummary(
        generation=ck.generation,
        saved_at=ck.saved_at,
        attempt=ck.attempt,
        state_bytes=len((ck.state or "").encode()),
        files=(*ck.files, *([ck.file] if ck.file else [])),
        dirs=tuple(ck.dirs),
        files_mode="managed" if ck.manifest else "shared",
        file_bytes=ck.file_bytes if ck.manifest else None,
    )


def summarize_task(rec: TaskRecord, files_mode: str | None = None) -> TaskSummary:
    """The summary of one task record. ``files_mode``: how its run keeps checkpoint files
    (``RunRecord.files_mode``, else the store's ``file_flow``), which a task that saved no
    checkpoint shows as its own (``TaskSummary.files_mode``)."""
    checkpoint = summarize_checkpoint(rec.checkpoint) if rec.checkpoint is not None else None
    return TaskSummary(
        step=rec.step,
        label=task_label(rec),
        status=rec.status.value,
        attempts=rec.attempt,
        frames_done=tuple(rec.completed_frames),
        resume_status=rec.resume_status,
        message=rec.message,
        updated_at=rec.updated_at,
        checkpoint=checkpoint,
        host=rec.host,
        files_mode=checkpoint.files_mode if checkpoint is not None else files_mode,
    )


def describe_plan(
    originals: Sequence[TaskSpec], specs: Sequence[TaskSpec], *, again: bool = False
) -> list[str]:
    """What an attempt does with a group of a step's original tasks, one line per task for the
    log (every runner says the same): finished in an earlier try and not run again, resumed
    from which checkpoint generation (state size, files, the attempt that saved it, frames
    skipped), frames finished earlier skipped, or (``again``: a later try or attempt) run from
    the top for want of a checkpoint.

    Args:
        originals: the group's tasks as first planned (``PreparedJob.plan_step`` with no
            records). specs: what runs now (``plan_group``).
    """
    lines: list[str] = []
    base_keys = {s.task_key.split("#", 1)[0] for s in specs}
    for orig in originals:
        if orig.task_key not in base_keys:
            lines.append(f"{orig.label}: finished in an earlier try; not run again")
    by_key = {o.task_key: o for o in originals}
    for spec in specs:
        first = by_key.get(spec.task_key.split("#")[0])
        skipped = len(first.chunk_frames - spec.chunk_frames) if first else 0
        if spec.resume is not None:
            ck = spec.resume
            files = len(ck.files) + (1 if ck.file else 0)
            lines.append(
                f"{spec.label}: resuming from checkpoint generation {ck.generation} "
                f"({len((ck.state or '').encode())} bytes of state, {files} file(s)"
                f"{' kept by the store' if ck.manifest else ''}, saved by attempt {ck.attempt})"
                + (f"; {skipped} frame(s) skipped" if skipped else "")
            )
        elif skipped:
            lines.append(f"{spec.label}: {skipped} frame(s) finished earlier are skipped")
        elif again:
            lines.append(f"{spec.label}: no checkpoint stored; running from the top")
    return lines


# --- a task's timeline ----------------------------------------------------------------------------
LATEST_MOMENT = 253402300799.0
"""9999-12-31 23:59:59 UTC, the latest moment a view can print (``datetime``'s last year)."""

MAX_TIMELINE_ATTEMPTS = 20
"""Attempts a timeline shows (the latest; ``core.task._history.MAX_SPANS``, which a record written
by
this release never exceeds): a record edited to hold thousands draws no more."""

MAX_TIMELINE_CHECKPOINTS = 100
"""Checkpoint marks a timeline shows (the latest generations): a store that kept thousands (a
large ``keep_generations``) draws no more."""


def utc_moment(value: float | None) -> datetime | None:
    """A stored time (seconds since the epoch) as a UTC ``datetime``; None when it is not one a
    view can place or print (None, NaN, infinite, before 1970 or after the year 9999: a record
    edited or damaged by hand)."""
    if value is None or not _usable(value):
        return None
    return datetime.fromtimestamp(value, tz=timezone.utc)


def _usable(value: float | None) -> bool:
    return (
        isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= LATEST_MOMENT
    )


@dataclass(frozen=True)
class AttemptBar:
    """One attempt of a task on its timeline."""

    attempt: int
    start: float
    """Seconds since the epoch."""
    end: float
    """Seconds since the epoch: its end, else (cut off, or running) the next attempt's start, or
    the timeline's end."""
    ended: bool
    """False: still running, or cut off (its process died before it could record its end)."""
    host: str | None
    outcome: str | None
    """The task's status as the attempt ended (``TaskStatus`` value); None if not ``ended``."""
    resumed_from: int | None
    """The checkpoint generation it resumed from; None: it ran from the top."""
    saved_seconds: float
    """Seconds of earlier attempts' work it did not do again (up to the checkpoint it resumed
    from); 0 when it ran from the top."""


@dataclass(frozen=True)
class CheckpointMark:
    """A stored checkpoint generation on a task's timeline (the fields of
    ``KeptCheckpoint``, which a succeeded run's record keeps of it)."""

    generation: int
    saved_at: float
    """Seconds since the epoch."""
    attempt: int
    """The run's attempt that saved it (``CheckpointData.attempt``)."""
    state_bytes: int
    files: int
    """Paths it names: files, folders and the checkpoint file."""
    task_attempt: int | None = None
    """The task's attempt that saved it (``#2`` on the timeline): the attempt of the task's
    history running when it was saved. A framework's retry inside one attempt of the run (a
    Prefect task retry, a second Dask try) is a new task attempt in the same run attempt. None
    when the history does not reach back to it."""


@dataclass(frozen=True)
class TaskTimeline:
    """A task's attempts as bars and its stored checkpoints as marks, on one time axis from
    ``start`` to ``end`` (seconds since the epoch). ``fraction(t)`` places a moment on it."""

    label: str
    start: float
    end: float
    attempts: tuple[AttemptBar, ...]
    checkpoints: tuple[CheckpointMark, ...]
    problems: tuple[str, ...] = ()
    """What of the record could not be drawn and was left out (an attempt or checkpoint whose
    time is not a time, attempts or checkpoints beyond what a timeline shows), one sentence
    each naming the field, for the view to show."""

    @property
    def saved_seconds(self) -> float:
        """Seconds of work the resumes did not do again, over every attempt."""
        return sum(a.saved_seconds for a in self.attempts)

    def fraction(self, moment: float) -> float:
        """Where ``moment`` lies on the axis: 0.0 at ``start``, 1.0 at ``end``."""
        span = self.end - self.start
        return 0.0 if span <= 0 else min(1.0, max(0.0, (moment - self.start) / span))


def task_timeline(
    rec: TaskRecord, generations: Sequence[CheckpointData] = (), *, now: float | None = None
) -> TaskTimeline:
    """The timeline of one task record and its stored checkpoint generations
    (``CheckpointStore.list_generations``; the record's latest checkpoint is added if missing).
    ``now`` (default the record's ``updated_at``) ends a running attempt's bar."""
    marks = {g.generation: g for g in generations}
    if rec.checkpoint is not None:
        marks.setdefault(rec.checkpoint.generation, rec.checkpoint)
    checkpoints = [
        CheckpointMark(
            generation=g.generation,
            saved_at=g.saved_at,
            attempt=g.attempt,
            state_bytes=len((g.state or "").encode()),
            files=len(g.files) + len(g.dirs) + (1 if g.file else 0),
        )
        for g in sorted(marks.values(), key=lambda g: g.generation)
    ]
    return _timeline(task_label(rec), rec.history, checkpoints, now or rec.updated_at)


def kept_timeline(task: KeptTask) -> TaskTimeline:
    """The timeline of a task of a succeeded run, from what its run record kept
    (``RunRecord.kept``: ``CheckpointsKept.tasks``), its records being gone."""
    checkpoints = [
        CheckpointMark(**c.model_dump())
        for c in sorted(task.checkpoints, key=lambda c: c.generation)
    ]
    last = max(
        [0.0, *(t for s in task.history for t in (s.ended_at or s.started_at,) if _usable(t))]
    )
    return _timeline(task.label, task.history, checkpoints, last)


def _timeline(
    label: str, spans: Sequence[AttemptSpan], checkpoints: Sequence[CheckpointMark], now: float
) -> TaskTimeline:
    """The bars and marks of ``spans`` and ``checkpoints``; what cannot be drawn (a time that
    is not one, more than the ``MAX_TIMELINE_*`` shown) is left out and said in ``problems``."""
    problems: list[str] = []
    spans = _drawable_spans(spans, problems)
    checkpoints = _drawable_marks(checkpoints, problems)
    saved_at = {c.generation: c.saved_at for c in checkpoints}
    moments = [s.ended_at or s.started_at for s in spans] + [c.saved_at for c in checkpoints]
    if not _usable(now):
        now = max(moments, default=0.0)
    last = max([now, *(s.ended_at or s.started_at for s in spans)])
    bars: list[AttemptBar] = []
    for i, span in enumerate(spans):
        following = spans[i + 1].started_at if i + 1 < len(spans) else last
        end = span.ended_at if span.ended_at is not None else following
        saved = 0.0
        kept = span.resumed_saved_at if _usable(span.resumed_saved_at) else None
        if kept is None and span.resumed_from is not None:  # a span written without it
            kept = saved_at.get(span.resumed_from)
        if kept is not None:
            saved = sum(max(0.0, min(b.end, kept) - b.start) for b in bars if b.start < kept)
        bars.append(
            AttemptBar(
                attempt=span.attempt,
                start=span.started_at,
                end=max(end, span.started_at),
                ended=span.ended_at is not None,
                host=span.host,
                outcome=span.outcome,
                resumed_from=span.resumed_from,
                saved_seconds=saved,
            )
        )
    checkpoints = [_with_task_attempt(c, spans, bars) for c in checkpoints]
    starts = [b.start for b in bars] + [c.saved_at for c in checkpoints]
    start = min(starts) if starts else now
    end = max([last, *(b.end for b in bars), *(c.saved_at for c in checkpoints)])
    return TaskTimeline(
        label=label,
        start=start,
        end=end,
        attempts=tuple(bars),
        checkpoints=tuple(checkpoints),
        problems=tuple(problems),
    )


def _with_task_attempt(
    mark: CheckpointMark, spans: Sequence[AttemptSpan], bars: Sequence[AttemptBar]
) -> CheckpointMark:
    """``mark`` with the task attempt that saved it: the latest attempt (bar) running at its
    ``saved_at``, of the run's attempt that saved it (a span written before ``run_attempt``
    was recorded, 0, matches any); as it was when none did."""
    for span, bar in reversed(list(zip(spans, bars, strict=True))):
        if span.run_attempt not in (0, mark.attempt):
            continue
        if bar.start <= mark.saved_at <= bar.end:
            return dataclasses.replace(mark, task_attempt=bar.attempt)
    return mark


def _drawable_spans(spans: Sequence[AttemptSpan], problems: list[str]) -> list[AttemptSpan]:
    """The latest ``MAX_TIMELINE_ATTEMPTS`` spans whose times are times (``history[i]`` named in
    ``problems`` for each one left out)."""
    out: list[AttemptSpan] = []
    first = max(0, len(spans) - MAX_TIMELINE_ATTEMPTS)
    if first:
        problems.append(
            f"its history holds {len(spans)} attempts: the timeline shows the latest "
            f"{MAX_TIMELINE_ATTEMPTS}"
        )
    for i in range(first, len(spans)):
        span = spans[i]
        bad = [
            f"{name} {value!r}"
            for name, value in (("started_at", span.started_at), ("ended_at", span.ended_at))
            if value is not None and not _usable(value)
        ]
        if bad:
            problems.append(
                f"the record's history[{i}] (attempt {span.attempt}): {' and '.join(bad)} is "
                "not a time (seconds since the epoch, 1970 to 9999); the attempt is left out "
                "of the timeline"
            )
        else:
            out.append(span)
    return out


def _drawable_marks(marks: Sequence[CheckpointMark], problems: list[str]) -> list[CheckpointMark]:
    """The latest ``MAX_TIMELINE_CHECKPOINTS`` marks (by generation) whose time is a time."""
    out: list[CheckpointMark] = []
    for mark in marks:
        if _usable(mark.saved_at):
            out.append(mark)
        else:
            problems.append(
                f"checkpoint generation {mark.generation}: saved_at {mark.saved_at!r} is not a "
                "time (seconds since the epoch, 1970 to 9999); it is left out of the timeline"
            )
    if len(out) > MAX_TIMELINE_CHECKPOINTS:
        problems.append(
            f"{len(out)} checkpoint generations are stored: the timeline shows the latest "
            f"{MAX_TIMELINE_CHECKPOINTS}"
        )
        out = out[-MAX_TIMELINE_CHECKPOINTS:]
    return out


# --- what a succeeded run kept until its end ----------------------------------------------------
MAX_KEPT_TASKS = 50
"""How many tasks ``CheckpointsKept`` details (the run record stays small for any task count)."""


class KeptCollector:
    """Gathers ``CheckpointsKept`` from a run's task records, one at a time (memory bounded by
    ``MAX_KEPT_TASKS`` records whatever the task count): ``add`` each record, then ``result``.
    Pure: the caller lists the detailed tasks' generations (``detailed``)."""

    def __init__(self) -> None:
        self._totals = CheckpointsKept(at=0.0)
        self._busy: list[TaskRecord] = []  # with a checkpoint or more than one attempt
        self._plain: list[TaskRecord] = []
        self._seen = 0
        self._figures = RunFigures()

    def add(self, rec: TaskRecord) -> None:
        """Count one task record (its latest checkpoint, its attempts and what resumes saved)."""
        t = self._totals
        self._seen += 1
        t.task_count += 1
        ck = rec.checkpoint
        if ck is not None:
            t.tasks_with_checkpoints += 1
            t.generations += ck.generation
            t.state_bytes += len((ck.state or "").encode())
            t.files += len(ck.files) + len(ck.dirs) + (1 if ck.file else 0)
        spans = rec.history
        t.interruptions += sum(1 for s in spans[:-1] if s.outcome in (None, "interrupted"))
        t.resumes += sum(1 for s in spans if s.resumed_from is not None)
        t.saved_seconds += task_timeline(rec).saved_seconds
        self._figures.add(rec)
        busy = ck is not None or len(spans) > 1
        keep = self._busy if busy else self._plain
        if len(keep) < MAX_KEPT_TASKS:
            keep.append(rec)

    def detailed(self) -> list[TaskRecord]:
        """The records ``result`` details: those with a checkpoint or more than one attempt
        first, at most ``MAX_KEPT_TASKS``."""
        return (self._busy + self._plain)[:MAX_KEPT_TASKS]

    def result(
        self, generations: Mapping[tuple[str, str], Sequence[CheckpointData]], *, at: float
    ) -> CheckpointsKept:
        """The summary; ``generations``: (step, task key) -> its stored generations (those of
        ``detailed()``; a task missing from it shows its latest checkpoint only)."""
        tasks = []
        for rec in self.detailed():
            stored = generations.get((rec.step, rec.task_key), ())
            marks = task_timeline(rec, stored).checkpoints
            tasks.append(
                KeptTask(
                    step=rec.step,
                    label=task_label(rec),
                    attempts=rec.attempt,
                    frames_done=len(rec.completed_frames),
                    resume_status=rec.resume_status,
                    host=rec.host,
                    history=list(rec.history),
                    checkpoints=[
                        KeptCheckpoint(**_stored_fields(dataclasses.asdict(m))) for m in marks
                    ],
                )
            )
        return self._totals.model_copy(
            update={
                "at": at,
                "tasks": tasks,
                "left_out": self._seen - len(tasks),
                "figures": self._figures.as_json(),
            }
        )


def _stored_fields(mark: dict[str, Any]) -> dict[str, Any]:
    """A mark's fields that ``KeptCheckpoint`` stores (its task attempt is read from the kept
    history again)."""
    mark.pop("task_attempt", None)
    return mark


def checkpoint_mark_text(mark: CheckpointMark) -> str:
    """One stored checkpoint generation in words, the same in the Prefect table's checkpoint
    history, its timeline artifact and ``checkpoints show``: ``generation 3 at 2026-01-05
    14:03:09Z (task attempt #2, run attempt 1, 120 B of state, 2 file(s))``. The task
    attempt is the timeline's ``#N`` (left out when not known); the run attempt is the run's
    (``checkpoints show``'s ``after N attempt(s)``)."""
    moment = utc_moment(mark.saved_at)  # a timeline's marks are times; never raise here
    at = moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else f"{mark.saved_at} (not a time)"
    task = f"task attempt #{mark.task_attempt}, " if mark.task_attempt is not None else ""
    return (
        f"generation {mark.generation} at {at} ({task}run attempt {mark.attempt}, "
        f"{mark.state_bytes} B of state, {mark.files} file(s))"
    )


def timeline_text(timeline: TaskTimeline, width: int = 40) -> list[str]:
    """The timeline as text, one line per attempt (for a log, a markdown artifact, a terminal):
    ``#2 ····████████▲███|  resumed from 3, saved 12 s; succeeded on host-b``, where ``█`` is
    the attempt running, ``▲`` a stored checkpoint it saved, ``|`` its end (``?`` where it was
    cut off) and ``·`` time before it started."""
    lines = []
    for bar in timeline.attempts:
        cells = [" "] * width
        first = min(width - 1, int(timeline.fraction(bar.start) * (width - 1)))
        last = min(width - 1, int(timeline.fraction(bar.end) * (width - 1)))
        for i in range(first):
            cells[i] = "·"
        for i in range(first, last + 1):
            cells[i] = "█"
        for mark in timeline.checkpoints:
            if bar.start <= mark.saved_at <= bar.end:
                cells[min(width - 1, int(timeline.fraction(mark.saved_at) * (width - 1)))] = "▲"
        cells[last] = "|" if bar.ended else "?"
        how = (
            f"resumed from {bar.resumed_from}, saved {bar.saved_seconds:.0f} s"
            if bar.resumed_from is not None
            else "from the top"
        )
        end = (bar.outcome or "ended") if bar.ended else "running or cut off"
        where = f" on {bar.host}" if bar.host else ""
        lines.append(f"#{bar.attempt} {''.join(cells)}  {how}; {end}{where}")
    return lines


def duration_words(seconds: float) -> str:
    """A duration for people: ``"12 s"`` under 90 s, ``"4.5 min"`` under 90 minutes, else
    ``"2.1 h"``. ``seconds``: a duration in seconds (negative or NaN reads as 0)."""
    s = seconds if seconds > 0 else 0.0  # NaN > 0 is False
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _count(n: int, one: str) -> str:
    return f"{n} {one}" if n == 1 else f"{n} {one}s"


def kept_sentence(kept: CheckpointsKept) -> str:
    """What a succeeded run stored until its end, from its record's summary (``RunRecord.kept``)
    in words: ``stored 3 checkpoint generations over 1 task (the latest: 120 bytes of state and
    2 files named); 1 interruption, 1 resume, saving 12 s of work``. The Airflow page and
    ``checkpoints show`` say it after "until then it"."""
    files = f" and {_count(kept.files, 'file')} named" if kept.files else ""
    what = (
        f"stored {_count(kept.generations, 'checkpoint generation')} over "
        f"{_count(kept.tasks_with_checkpoints, 'task')} (the latest: {kept.state_bytes} bytes "
        f"of state{files})"
        if kept.tasks_with_checkpoints
        else "stored no checkpoint"
    )
    if kept.resumes or kept.interruptions:
        what += (
            f"; {_count(kept.interruptions, 'interruption')}, {_count(kept.resumes, 'resume')}, "
            f"saving {duration_words(kept.saved_seconds)} of work"
        )
    return what


def continuations(records: Iterable[TaskRecord]) -> dict[tuple[str, str], str]:
    """Which task records a later one continued, in words: the rest of an interrupted chunk
    runs as a task record of its own (task key ``<key>#<frames>``, label ``Render[Frame=9,10]``)
    while the chunk's record keeps the status it stopped with (``interrupted``: suspended), so a
    view of a run whose chunks were resumed shows both. Maps (step, task key) of each record so
    continued to ``"continued as Render[Frame=9,10]"`` (the next record of that chunk, by
    ``updated_at``); a record not continued is not in it. The Airflow page, the Prefect table
    artifact and ``checkpoints show`` say it beside the record's status."""
    chunks: dict[tuple[str, str], list[TaskRecord]] = {}
    for rec in records:
        chunks.setdefault((rec.step, rec.task_key.partition("#")[0]), []).append(rec)
    out: dict[tuple[str, str], str] = {}
    for recs in chunks.values():
        recs.sort(key=lambda r: (r.updated_at, "#" in r.task_key))
        for earlier, later in zip(recs, recs[1:], strict=False):
            if earlier.status.value != "succeeded":
                out[(earlier.step, earlier.task_key)] = f"continued as {task_label(later)}"
    return out
