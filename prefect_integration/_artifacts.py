"""What a flow run shows of its tasks as Prefect artifacts (translation only).

- ``GroupProgress``: the progress artifact of one task run, fed by its tasks'
  ``openjd_progress`` messages (``core.TaskEvent`` ``progress``), sent at most every
  ``PROGRESS_EVERY_SECONDS`` and once at the end; over a group of tasks, the group's share done.
- ``RunView``: the flow run's table artifact rows (a task each: status, checkpoint history,
  resume status) and its markdown artifact (each task's timeline, ``core.report.timeline_text``),
  both
  from core's one summary of a task (``core.report.summarize_task``,
  ``core.report.task_timeline``). Read
  before ``core.finish_attempt``, which deletes a succeeded run's records.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

import core
from core import CheckpointStore, PreparedJob, TaskEventKind, TaskOutcome, TaskRecord

__all__ = (
    "PROGRESS_EVERY_SECONDS",
    "GroupProgress",
    "RunView",
    "flush_progress",
    "read_run_view",
)

PROGRESS_EVERY_SECONDS = 5.0
"""A task run's progress artifact is updated at most this often (seconds), and once at its end:
one API call per interval whatever the tasks report, so a task run's cost stays low."""


class GroupProgress:
    """The progress artifact of one task run that runs ``len(task_keys)`` OpenJD tasks (after
    ``done_before`` tasks of its group finished in an earlier try): the percentage is the mean
    of its tasks' last ``openjd_progress`` (0..100; a task that succeeded counts 100, one
    finished earlier too).

    ``start`` (in the task run's thread: the artifact belongs to the task run in its context)
    has, every ``every`` seconds, a thread create the artifact (the first time) or send the
    percentage when it changed (the process's one ``_Ticker`` starts it: a task run starts no
    thread to wait with); ``on_event`` is given the core's task events (from any thread);
    ``close`` has a thread send the last percentage and a description of how the task run
    ended, and returns at once (the task run's time does not include that call; ``wait`` or
    ``flush_progress`` waits for it). A task run that ends within ``every`` seconds
    without a progress value (``set``: its tasks' ``openjd_progress``) makes no API call and
    has no progress artifact (its state says how it ended; a trivial task run costs no call),
    a task run shorter than ``every`` that reported progress makes one (the artifact, created
    at its end), a longer one one more per ``every`` seconds at most. An API error is reported
    once through ``warn`` and never fails the task run.

    Args:
        label: the task run's name (``Render[Frame=1-6] (3 tasks)``).
        task_keys: the task keys (``TaskSpec.task_key``) of what the task run runs now.
        done_before: tasks of the group that had finished before (0 or more).
        every: seconds between updates (> 0).
        warn: where an API error goes (a run logger's ``warning``).
    """

    def __init__(
        self,
        label: str,
        task_keys: Sequence[str],
        done_before: int = 0,
        *,
        every: float = PROGRESS_EVERY_SECONDS,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.label = label
        self.every = every
        self._warn = warn
        self._shares = {key: 0.0 for key in task_keys}
        self._done_before = max(0, done_before)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        """Held by a send: the last one comes after a periodic one under way."""
        self._context = contextvars.copy_context()
        self._closed = False
        self._sending = False
        """A periodic send was handed to a thread and has not ended."""
        self._thread: threading.Thread | None = None
        """The thread that sends the last update (``close``), if one was needed."""
        self._ending: str | None = None
        self._artifact_id: Any = None
        self._sent: float | None = None
        self._warned = False
        self._progressed = False
        """A progress value came (``set``), not only tasks that ended."""
        self.updates = 0
        """API calls made (creation included)."""

    @property
    def artifact_id(self) -> Any:
        """The artifact's id (None before ``start``, or when it could not be created)."""
        return self._artifact_id

    @property
    def total(self) -> int:
        return len(self._shares) + self._done_before

    def percent(self) -> float:
        """The task run's share done, 0..100 (100 for a task run with nothing to run)."""
        with self._lock:
            if not self.total:
                return 100.0
            return (100.0 * self._done_before + sum(self._shares.values())) / self.total

    def done(self) -> int:
        """Tasks finished: before this task run, and in it (succeeded)."""
        with self._lock:
            return self._done_before + sum(1 for share in self._shares.values() if share >= 100)

    def on_event(self, execution: core.TaskExecution, event: core.TaskEvent) -> None:
        """A core task event (``on_event`` of ``core.run_tasks``): ``progress`` sets the task's
        share, ``ended`` with a success makes it 100."""
        key = execution.spec.task_key
        if event.kind == TaskEventKind.PROGRESS and isinstance(event.value, (int, float)):
            self.set(key, float(event.value))
        elif event.kind == TaskEventKind.ENDED and getattr(event.value, "outcome", None) == (
            TaskOutcome.SUCCEEDED
        ):
            self._share(key, 100.0)

    def set(self, task_key: str, share: float) -> None:
        """Task ``task_key`` is ``share`` percent done (0..100; another key is ignored)."""
        self._progressed = True
        self._share(task_key, share)

    def _share(self, task_key: str, share: float) -> None:
        with self._lock:
            if task_key in self._shares:
                self._shares[task_key] = min(100.0, max(0.0, share))

    def start(self) -> GroupProgress:
        """Start sending, in a copy of this thread's context (the task run's, and Prefect's
        settings and API client). No thread is started for it: the process's one ticker
        (``_Ticker``) hands a send to a thread of its own once ``every`` seconds have passed,
        and ``close`` starts one only when there is something to send."""
        self._context = contextvars.copy_context()
        _TICKER.add(self, time.monotonic() + self.every)
        return self

    def close(self, ending: str | None = None) -> None:
        """Have a thread send the last percentage, with ``ending`` (how the task run ended,
        for the description) if given; returns at once. A task run that ended within its
        first interval without a progress value sends nothing (no thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ending = ending
            needed = self._artifact_id is not None or self._progressed or self._sending
        if needed:
            self._thread = _send_thread(self._context, self._last, "openjd-prefect-progress")

    def wait(self, timeout: float = 30.0) -> None:
        """Wait (up to ``timeout`` seconds) until the last update has been sent."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _describe(self) -> str:
        return f"{self.done()} of {self.total} task(s) finished"

    def _due(self) -> bool:
        """The ticker: ``every`` seconds have passed since the start or the last send. Starts
        a thread that sends the percentage (unless closed: ``close`` sends the last one);
        False when closed (the ticker forgets it)."""
        with self._lock:
            if self._closed:
                return False
            self._sending = True
        _send_thread(self._context, self._periodic, "openjd-prefect-progress")
        return True

    def _periodic(self) -> None:
        with self._send_lock:
            if not self._closed and (self._artifact_id is None or self.percent() != self._sent):
                self._send(None)
        with self._lock:
            self._sending = False
            closed = self._closed
        if not closed:
            _TICKER.add(self, time.monotonic() + self.every)

    def _last(self) -> None:
        with self._send_lock:  # after a periodic send still under way
            if self._artifact_id is None and not self._progressed:
                return  # ended within its first interval, with nothing to show but its state
            ending = f"; {self._ending}" if self._ending else ""
            self._send(f"{self.label}: {self._describe()}{ending}")

    def _send(self, description: str | None) -> None:
        """Create the artifact (the first time), else update it."""
        if self._warned:
            return  # the API failed once: no more calls
        percent = self.percent()
        try:
            if self._artifact_id is None:
                self._artifact_id = create_progress_artifact(
                    percent, description=description or f"{self.label}: {self._describe()}"
                )
            else:
                update_progress_artifact(self._artifact_id, percent, description=description)
            self._sent = percent
            self.updates += 1
        except Exception as exc:  # a view: the task run goes on without it
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            if self._warn is not None:
                self._warn(f"progress artifact of {self.label}: {exc}")


_PENDING: set[threading.Thread] = set()
"""Threads sending a closed task run's last progress update (``flush_progress`` waits)."""
_PENDING_LOCK = threading.Lock()


def _send_thread(
    context: contextvars.Context, fn: Callable[[], None], name: str
) -> threading.Thread:
    """Run ``fn`` on a new daemon thread, in a copy of ``context`` (two sends of one task run
    may overlap: a context is entered by one thread at a time), listed in ``_PENDING`` until
    it returns."""

    def run() -> None:
        try:
            context.copy().run(fn)
        finally:
            with _PENDING_LOCK:
                _PENDING.discard(thread)

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _PENDING_LOCK:
        _PENDING.add(thread)
    thread.start()
    return thread


class _Ticker:
    """One daemon thread per process that wakes when a task run's progress interval has
    passed (``GroupProgress._due``), so that a task run starts no thread of its own for its
    progress: most end within their first interval, with nothing to send."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, GroupProgress]] = []
        self._count = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, progress: GroupProgress, when: float) -> None:
        """Call ``progress._due()`` at ``time.monotonic()`` ``when`` (or soon after)."""
        with self._cond:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._due, self._thread = os.getpid(), [], None
            first = not self._due or when < self._due[0][0]
            heapq.heappush(self._due, (when, next(self._count), progress))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="openjd-prefect-progress-ticker", daemon=True
                )
                self._thread.start()
            elif first:
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        progress = heapq.heappop(self._due)[2]
                        break
                    self._cond.wait(self._due[0][0] - now if self._due else None)
            try:
                progress._due()
            except Exception:  # a thread that cannot start: that update is lost, not the rest
                pass


_TICKER = _Ticker()
_FLOW_BODIES = 0
"""Flow bodies running in this process. A task run in a process with none (a Dask worker's,
say) has no ``flush_progress`` coming after it: it waits for its own last update."""


def flow_body_started() -> None:
    """The flow body runs in this process (it calls ``flush_progress`` before it ends)."""
    global _FLOW_BODIES
    with _PENDING_LOCK:
        _FLOW_BODIES += 1


def flow_body_ended() -> None:
    global _FLOW_BODIES
    with _PENDING_LOCK:
        _FLOW_BODIES = max(0, _FLOW_BODIES - 1)


def flushed_here() -> bool:
    """True if a flow body in this process will wait for this process's progress updates."""
    with _PENDING_LOCK:
        return _FLOW_BODIES > 0


def flush_progress(timeout: float = 30.0) -> None:
    """Wait (up to ``timeout`` seconds in all) until the progress artifacts of this process's
    closed task runs are sent (the flow body calls it before it ends, so that a process that
    exits after its flow run loses none)."""
    deadline = time.monotonic() + timeout
    with _PENDING_LOCK:
        pending = list(_PENDING)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))


# --- the flow run's table and timeline ----------------------------------------------------------
@dataclass(frozen=True)
class RunView:
    """The run's tasks as read before ``finish_attempt``: their records, stored checkpoint
    generations (oldest first) and timelines, in step order."""

    records: tuple[TaskRecord, ...]
    timelines: tuple[core.report.TaskTimeline, ...]
    summaries: tuple[core.report.TaskSummary, ...]

    def rows(self) -> list[dict[str, Any]]:
        """The table artifact's rows: one a task, its status in the CLI's words
        (``core.report.task_status_words``: ``succeeded``, ``suspended``...), its checkpoint history
        (every kept generation, as ``core.report.checkpoint_mark_text`` says it: number, UTC time,
        the task's and the run's attempt that saved it, state bytes, files; the bytes of its
        files that a managed store keeps), resume status and what continued it
        (``core.report.continuations``); never a state's contents."""
        rows = []
        continued = core.report.continuations(self.records)
        for rec, task, line in zip(self.records, self.summaries, self.timelines, strict=True):
            ckpt = task.checkpoint
            note = continued.get((rec.step, rec.task_key))
            resumed = [a.resumed_from for a in line.attempts if a.resumed_from is not None]
            rows.append(
                {
                    "task": task.label,
                    "status": core.report.task_status_words(task.status)
                    + (f", {note}" if note else ""),
                    "attempts": task.attempts,
                    "frames done": len(task.frames_done),
                    "checkpoint generation": ckpt.generation if ckpt else "",
                    "state bytes": ckpt.state_bytes if ckpt and ckpt.state_bytes else "",
                    "files": len(ckpt.files) if ckpt else "",
                    "bytes kept by the store": (
                        ckpt.file_bytes if ckpt and ckpt.file_bytes is not None else ""
                    ),
                    "checkpoint history": "; ".join(
                        core.report.checkpoint_mark_text(m) for m in line.checkpoints
                    ),
                    "resume status": task.resume_status or "",
                    "resumed from": ", ".join(str(g) for g in resumed),
                    "work saved by resumes (s)": round(line.saved_seconds, 1) if resumed else "",
                    "host": task.host or "",
                }
            )
        return rows

    def markdown(self, heading: str) -> str:
        """The markdown artifact: under ``heading``, each task's timeline as
        ``core.report.timeline_text`` draws it, in a code block."""
        parts = [f"### {heading}", ""]
        if not self.records:
            parts.append("No task records: nothing ran, or they could not be read.")
        for task, line in zip(self.summaries, self.timelines, strict=True):
            saved = (
                f"; resumes saved {line.saved_seconds:.0f} s of work" if line.saved_seconds else ""
            )
            parts.append(
                f"**{_md(task.label)}**: {core.report.task_status_words(task.status)}, "
                f"{task.attempts} attempt(s), "
                f"{len(line.checkpoints)} checkpoint generation(s) kept{saved}"
            )
            parts.append("")
            parts.extend(f"- {problem}" for problem in line.problems)
            block = core.report.timeline_text(line) or ["(never started)"]
            block += [f"  ▲ {core.report.checkpoint_mark_text(mark)}" for mark in line.checkpoints]
            longest = max((len(r) for r in re.findall("`+", "\n".join(block))), default=0)
            fence = "`" * max(3, longest + 1)  # a host named with ``` does not end the block
            parts.extend([fence, *block, fence, ""])
        parts.append("█ running, ▲ a stored checkpoint, | end of an attempt, ? cut off.")
        return "\n".join(parts)


def _md(text: str) -> str:
    """``text`` (a task's label: parameter values, anything) as literal markdown: its
    punctuation backslash-escaped, so that it neither formats nor links nor ends a block."""
    return re.sub(r"([\\`*_{}\[\]()<>#+\-.!|~&])", r"\\\1", text)


def read_run_view(
    store: CheckpointStore, job: PreparedJob, run_id: str, now: float | None = None
) -> RunView:
    """The run's tasks, checkpoint generations and timelines, read from the store now
    (before ``finish_attempt`` deletes a succeeded run's records).

    Raises:
        StoreError: the store cannot be read.
    """
    records, _ = store.read_tasks(job.job_key, run_id)
    order = job.step_order()
    records = sorted(
        records, key=lambda r: (order.index(r.step) if r.step in order else len(order), r.task_key)
    )
    now = time.time() if now is None else now
    timelines = tuple(
        core.report.task_timeline(r, store.list_generations(r), now=now) for r in records
    )
    return RunView(
        records=tuple(records),
        timelines=timelines,
        summaries=tuple(core.report.summarize_task(r) for r in records),
    )
