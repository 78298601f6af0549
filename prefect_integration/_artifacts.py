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
    starts a thread that, every ``every`` seconds, creates the artifact (the first time) or
    sends the percentage when it changed; ``on_event`` is given the core's task events (from
    any thread); ``close`` has the thread send the last percentage and a description of how
    the task run ended, and returns at once (the task run's time does not include that call;
    ``wait`` or ``flush_progress`` waits for it). A task run that ends within ``every`` seconds
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
        """Start the update thread, in a copy of this thread's context (the task run's, and
        Prefect's settings and API client)."""
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._loop,), name="openjd-prefect-progress", daemon=True
        )
        with _PENDING_LOCK:
            _PENDING.add(self._thread)
        self._thread.start()
        return self

    def close(self, ending: str | None = None) -> None:
        """Have the thread send the last percentage, with ``ending`` (how the task run ended,
        for the description) if given, and end; returns at once."""
        self._ending = ending
        self._stop.set()

    def wait(self, timeout: float = 30.0) -> None:
        """Wait (up to ``timeout`` seconds) until the thread has sent its last update."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _describe(self) -> str:
        return f"{self.done()} of {self.total} task(s) finished"

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every):
                if self._artifact_id is None or self.percent() != self._sent:
                    self._send(None)
            if self._artifact_id is None and not self._progressed:
                return  # ended within its first interval, with nothing to show but its state
            ending = f"; {self._ending}" if self._ending else ""
            self._send(f"{self.label}: {self._describe()}{ending}")
        finally:
            with _PENDING_LOCK:
                _PENDING.discard(threading.current_thread())

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
_PENDING_LOCK = threading.Lock()
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
