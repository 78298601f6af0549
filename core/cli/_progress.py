"""What ``openjd-checkpoint run`` shows while a run goes on.

Task output goes to stdout, each line prefixed with its task (``[Render[Frame=1-4]] text``).
Progress goes to stderr, in one of three forms:

- plain lines, when stderr is not a terminal (CI, a pipe, a log file): each step's start and
  end with counts, each task's start and outcome, each stored checkpoint, warnings;
- a live display (``rich``), when stderr is a terminal: each step with its tasks done, running
  and left, the frames of a chunked step, each running task's ``openjd_progress`` and latest
  ``openjd_status``, the checkpoints stored so far and the elapsed time; notes print above it
  and its final screen stays;
- with ``-q``, only what a person must act on: warnings, failures and the run's report.

``-v`` adds every message a task sends (each ``openjd_progress``, ``openjd_status`` and finished
frame) as plain lines.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

from core import TaskEvent, TaskEventKind, TaskExecution, plan_tasks, report

__all__ = ("Progress", "make_progress", "write")

_VERBOSE_KINDS = (TaskEventKind.FAIL, TaskEventKind.ACTION_STARTED, TaskEventKind.ACTION_ENDED)
"""Events shown only with ``-v``."""

_closed_streams: set[int] = set()


def write(stream: Any, text: str) -> None:
    """Write and flush; a closed or broken stream (``| head``, ``2>&-``, a full disk) is
    dropped quietly so that the run, and the reading of its tasks' output, goes on."""
    if stream is None or id(stream) in _closed_streams:
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        _closed_streams.add(id(stream))


class _Step:
    def __init__(self, name: str, planned: int | None) -> None:
        self.name = name
        self.planned = planned
        self.started_at = time.monotonic()
        self.running: dict[int, TaskExecution] = {}
        self.outcomes: dict[str, int] = {}
        self.frames_done = 0
        self.frames_total = 0
        self.checkpoints = 0
        self.ended = False

    @property
    def done(self) -> int:
        """Tasks that finished (succeeded or failed); a suspended or canceled one is still left."""
        return self.outcomes.get("succeeded", 0) + self.outcomes.get("failed", 0)

    def counts(self) -> str:
        return ", ".join(f"{n} {report.OUTCOME_WORDS.get(k, k)}" for k, n in self.outcomes.items())


class Progress:
    """The run's progress, fed by ``JobRunner``'s ``on_output``, ``on_event`` and ``on_note``.

    Args:
        job: the prepared job (step names, and planned task counts where cheap to know).
        mode: ``plain``, ``live`` or ``quiet``.
        verbose: also show every message a task sends.
    """

    def __init__(self, job: Any, *, mode: str = "plain", verbose: bool = False) -> None:
        self._job = job
        self._mode = mode
        self._verbose = verbose
        self._lock = threading.RLock()
        self._steps: dict[str, _Step] = {}
        self._current: _Step | None = None
        self._last_progress: dict[int, float] = {}
        self._task_progress: dict[int, float] = {}
        self._task_status: dict[int, str] = {}
        self._checkpoints = 0
        self._started = time.monotonic()
        self._live: Any = None
        self.header: str | None = None
        """Printed before the run's first word: a refused resume prints nothing like a start."""

    # --- the live display -----------------------------------------------------------------
    def start(self) -> None:
        """Start the live display (in ``live`` mode; nothing otherwise)."""
        if self._mode == "live":
            from rich.console import Console
            from rich.live import Live

            console = Console(file=sys.stderr)
            self._live = Live(
                get_renderable=self._render,
                console=console,
                refresh_per_second=4,
                transient=False,
                # Task output prints above the display when it goes to the same terminal; to a
                # file or a pipe it goes there untouched.
                redirect_stdout=_is_terminal(sys.stdout),
                redirect_stderr=False,
            )
            self._live.start()

    def finish(self) -> None:
        """End the display: close the last step (its counts), leave the live display's final
        screen."""
        with self._lock:
            if self._current is not None and not self._current.ended:
                self._end_step(self._current)
        if self._live is not None:
            live, self._live = self._live, None
            try:
                live.refresh()
                live.stop()
            except (OSError, ValueError):
                pass

    def _render(self) -> Any:
        from rich.table import Table

        with self._lock:
            elapsed = time.monotonic() - self._started
            table = Table(
                title=f"{self._job.job.name}  {_clock(elapsed)}  checkpoints stored: "
                f"{self._checkpoints}",
                title_justify="left",
                expand=False,
            )
            for col in ("step", "done", "running", "left", "frames", "progress", "status"):
                table.add_column(col, no_wrap=col != "status")
            for name in self._step_names():
                st = self._steps.get(name)
                if st is None:
                    table.add_row(name, "", "", "", "", "", "waiting")
                    continue
                left = (
                    ""
                    if st.planned is None
                    else str(max(0, st.planned - st.done - len(st.running)))
                )
                frames = f"{st.frames_done}/{st.frames_total}" if st.frames_total else ""
                pct = [self._task_progress.get(k) for k in st.running]
                shown = [p for p in pct if p is not None]
                prog = f"{sum(shown) / len(shown):.0f}%" if shown else ""
                status = "; ".join(
                    f"{ex.spec.describe()}: {self._task_status[k]}"
                    for k, ex in st.running.items()
                    if k in self._task_status
                )
                if st.ended:
                    status = st.counts() or "no task ran"
                table.add_row(name, str(st.done), str(len(st.running)), left, frames, prog, status)
            return table

    # --- feeding ----------------------------------------------------------------------------
    def _step_names(self) -> list[str]:
        tmpl = self._job.template
        return list(tmpl.regular_steps) + list(tmpl.finally_steps)

    def _say(self, text: str) -> None:
        if self._live is not None:
            try:
                self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
                return
            except (OSError, ValueError):
                pass
        write(sys.stderr, text + "\n")

    def started(self) -> None:
        """Print the header (once), if not yet printed."""
        with self._lock:
            header, self.header = self.header, None
        if header is not None:
            self._say(f"openjd-checkpoint: {header}")

    def note(self, text: str) -> None:
        """A line a person should see: the runner's decisions (resuming or not, and why),
        warnings, failures, signals. In ``quiet`` mode (``-q``) only what the person must act
        on or know: not the routine notes of ``_ROUTINE``."""
        self.started()
        if self._mode == "quiet" and _ROUTINE.search(text):
            return
        self._say(f"openjd-checkpoint: {text}")

    def output(self, ex: TaskExecution, lines: list[str]) -> None:
        self.started()
        prefix = f"[{ex.spec.describe()}] "
        write(sys.stdout, "".join(prefix + line + "\n" for line in lines))

    def _plain(self, text: str) -> None:
        if self._mode == "plain":
            self._say(f"openjd-checkpoint: {text}")

    def _planned(self, step: str) -> int | None:
        if self._mode != "live":  # only the live display shows tasks left: plan nothing extra
            return None
        try:
            return len(plan_tasks(self._job, step))
        except Exception:  # adaptive or unusual plans: unknown
            return None

    def _end_step(self, st: _Step) -> None:
        st.ended = True
        self._plain(f"step {st.name} ended: {st.counts() or 'no task ran'}")

    def event(self, ex: TaskExecution, event: TaskEvent) -> None:
        self.started()
        name = ex.spec.describe()
        key = id(ex)
        with self._lock:
            step = ex.spec.step_name
            st = self._steps.get(step)
            if st is None:
                if self._current is not None and not self._current.ended:
                    self._end_step(self._current)
                st = self._steps[step] = _Step(step, self._planned(step))
                self._current = st
                self._plain(f"step {step} started")
            kind = event.kind
            if kind == TaskEventKind.STARTED:
                st.running[key] = ex
                if ex.spec.chunk_parameter:
                    st.frames_total += len(ex.spec.chunk_frames) + len(
                        ex.record.completed_frames if ex.record else []
                    )
                how = "" if event.value is None else f" (resuming from checkpoint {event.value})"
                self._plain(f"{name} started{how}")
            elif kind == TaskEventKind.ENDED:
                st.running.pop(key, None)
                res = event.value
                outcome = res.outcome.value
                key_ = report.outcome_key(res)
                st.outcomes[key_] = st.outcomes.get(key_, 0) + 1
                words = report.OUTCOME_WORDS.get(key_, outcome)
                detail = f": {res.message}" if res.message and outcome != "succeeded" else ""
                text = f"{name} {words}{detail}"
                if outcome == "failed":
                    self.note(text)  # shown even with -q
                else:
                    self._plain(text)
                self._task_progress.pop(key, None)
                self._task_status.pop(key, None)
            elif kind == TaskEventKind.FRAME_COMPLETE:
                st.frames_done += 1
                if self._verbose:
                    self._say(f"openjd-checkpoint: {name}: frame {event.value} finished")
            elif kind == TaskEventKind.PROGRESS:
                self._task_progress[key] = float(event.value)
                now = time.monotonic()
                if self._verbose:
                    self._say(f"openjd-checkpoint: {name}: {event.value:.0f}%")
                elif self._mode == "plain" and now - self._last_progress.get(key, 0.0) >= 1.0:
                    self._last_progress[key] = now
                    self._say(f"openjd-checkpoint: {name}: {event.value:.0f}%")
            elif kind == TaskEventKind.STATUS:
                self._task_status[key] = str(event.value)
                if self._verbose or (
                    self._mode == "plain" and str(event.value).startswith("resuming")
                ):
                    self._say(f"openjd-checkpoint: {name}: {event.value}")
            elif kind == TaskEventKind.WARNING:
                self.note(f"warning: {name}: {event.value}")
            elif kind == TaskEventKind.CHECKPOINT_SAVED:
                st.checkpoints += 1
                self._checkpoints += 1
                self._plain(f"{name}: checkpoint generation {event.value} stored")
            elif kind == TaskEventKind.RESUME_STATUS:
                self._plain(f"{name}: resume status {event.value}")
            elif self._verbose and kind in _VERBOSE_KINDS:
                words = kind.value.replace("_", " ")
                self._say(f"openjd-checkpoint: {name}: {words}: {event.value}")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


_ROUTINE = re.compile(
    r"^interruption notices from: |^checkpoint files: |^azure: acknowledged scheduled event "
)
"""The notes ``-q`` leaves out: routine steps of what the person asked for. Every other note
(warnings, failures, refusals, decisions about resuming, processes a dead runner left, what a
signal or a stop request does) is shown, and the "Running job" line (what other OpenJD CLIs
print first, and scripts look for)."""


def make_progress(job: Any, *, quiet: bool, verbose: bool) -> Progress:
    """The progress for ``run``/``resume``: ``quiet`` with ``-q``, a live display when stderr
    is a terminal (not ``TERM=dumb``, not ``-v``), else plain lines."""
    if quiet:
        mode = "quiet"
    elif not verbose and _is_terminal(sys.stderr) and os.environ.get("TERM", "") != "dumb":
        mode = "live"
    else:
        mode = "plain"
    return Progress(job, mode=mode, verbose=verbose)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False
