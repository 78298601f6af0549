"""Checkpoint figures as Prefect events, for automations (docs/prefect.md, "Events for
automations").

``PrefectEvents`` is a ``core.MetricSink`` given to ``core.run_tasks(..., metrics=...)`` by a
group's task run. The core computes every figure (``core/run/_metrics.py``: one definition);
this sink only groups the figures of one task event into one Prefect event and names the task
they belong to:

==========================  ==============================  ===================================
event                       when                            payload
==========================  ==============================  ===================================
``openjd.checkpoint.stored``  a checkpoint generation stored  ``generation``, ``bytes``,
                                                              ``commit_seconds``, ``attempt``
``openjd.task.interrupted``   an attempt stopped before its   ``cause``, ``work_lost_seconds``,
                              task's end (notice, stop,       ``stop_to_stored_seconds``,
                              timeout, worker_lost)           ``generation``, ``attempt``
``openjd.task.resumed``       a resumed attempt ended         ``status``, ``from_generation``,
                                                              ``attempt``
==========================  ==============================  ===================================

The resource is the task in its core run: ``openjd.run.<run id>.task.<task label>`` (labelled
with the job, step and task key); the related resources are the core run (``openjd.run.<run
id>``, role ``openjd-run``), the job (``openjd.job.<job key>``, role ``openjd-job``), and, from
the task run's context, Prefect's own: the flow run, the task run, the flow, the deployment and
the tags. The checkpoint age (a gauge sent with progress) is left to OpenTelemetry: an
automation that wants "no checkpoint for 30 minutes" expects ``openjd.checkpoint.stored``.

How the figures of one task event are told apart: the core's ``MetricsObserver`` gives a task
event's figures to its sinks and then calls the caller's ``on_event`` with the same event, on
the same thread (``MetricsObserver.wrap``). ``record`` keeps the figures this sink turns into
events per thread; ``on_event`` (called by the task run's ``on_event``) takes them and emits
their events with the task's identity. A failure to emit is logged once and never fails a task.
"""

from __future__ import annotations

import contextvars
import datetime
import threading
from collections.abc import Callable
from typing import Any

from prefect.events import emit_event

import core

__all__ = (
    "EVENT_INTERRUPTED",
    "EVENT_RESUMED",
    "EVENT_STORED",
    "PrefectEvents",
    "task_resource_id",
)

EVENT_STORED = "openjd.checkpoint.stored"
EVENT_INTERRUPTED = "openjd.task.interrupted"
EVENT_RESUMED = "openjd.task.resumed"

# the core's metric names (core/run/_metrics.py, METRICS) this sink turns into events
_COMMIT = "openjd_checkpoint.commit.duration"
_STORED = "openjd_checkpoint.stored"
_INTERRUPTIONS = "openjd_checkpoint.interruptions"
_WORK_LOST = "openjd_checkpoint.work_lost"
_STOP_TO_STORED = "openjd_checkpoint.stop_to_stored"
_RESUMES = "openjd_checkpoint.resumes"
_WANTED = frozenset({_COMMIT, _STORED, _INTERRUPTIONS, _WORK_LOST, _STOP_TO_STORED, _RESUMES})


def task_resource_id(run_id: str, label: str) -> str:
    """The ``prefect.resource.id`` of a task of a core run: ``openjd.run.<run id>.task.<label>``
    (``Render[Frame=1-4]``, or the step's name for a step's lone task)."""
    return f"openjd.run.{run_id}.task.{label}"


def _when(at: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(at, tz=datetime.timezone.utc)


class PrefectEvents:
    """A ``core.MetricSink`` that emits Prefect events for a group's task run (module doc).

    Made in the task run's body (its context is kept: ``emit_event`` relates the flow run and
    the task run from it, whichever thread of the core emits).

    Args:
        job_name, job_key, run_id: the core run the task run's tasks belong to.
        warn: told once when emitting fails (then no more events are emitted).
    """

    def __init__(
        self, job_name: str, job_key: str, run_id: str, warn: Callable[[str], None]
    ) -> None:
        self.job_name = job_name
        self.job_key = job_key
        self.run_id = run_id
        self._warn = warn
        self._context = contextvars.copy_context()
        self._local = threading.local()
        self._broken = False

    # core.MetricSink
    def record(self, figure: core.Figure) -> None:
        if self._broken or figure.metric.name not in _WANTED:
            return
        pending = getattr(self._local, "figures", None)
        if pending is None:
            pending = self._local.figures = []
        pending.append(figure)

    def on_event(self, execution: core.TaskExecution, event: core.TaskEvent) -> None:
        """Emit the events of the figures ``record`` kept for ``event`` (this thread's)."""
        figures: list[core.Figure] = getattr(self._local, "figures", None) or []
        self._local.figures = []
        if not figures or self._broken:
            return
        try:
            for name, payload, at in self._events(execution, event, figures):
                self._emit(execution, name, payload, at)
        except Exception as exc:  # events must never fail a task
            self._broken = True
            self._warn(
                f"Prefect events: not emitted any more ({type(exc).__name__}: {exc}); the task "
                "goes on"
            )

    def _events(
        self, execution: core.TaskExecution, event: core.TaskEvent, figures: list[core.Figure]
    ) -> list[tuple[str, dict[str, Any], float]]:
        by_name: dict[str, list[core.Figure]] = {}
        for fig in figures:
            by_name.setdefault(fig.metric.name, []).append(fig)
        ended = getattr(event.value, "record", None)
        rec: core.TaskRecord = ended if isinstance(ended, core.TaskRecord) else execution.record
        out: list[tuple[str, dict[str, Any], float]] = []
        for stored in by_name.get(_STORED, []):
            commit = [f.value for f in by_name.get(_COMMIT, []) if f.at == stored.at]
            generation = event.value if isinstance(event.value, int) else None
            if generation is None and rec.checkpoint is not None:
                generation = rec.checkpoint.generation
            payload: dict[str, Any] = {
                "generation": generation,
                "bytes": int(stored.value),
                "commit_seconds": commit[0] if commit else None,
                "attempt": rec.attempt,
            }
            out.append((EVENT_STORED, payload, stored.at))
        for count in by_name.get(_INTERRUPTIONS, []):
            cause = count.labels.get("cause", "")
            same = [f for f in figures if f.labels.get("cause") == cause and f.at == count.at]
            lost = [f.value for f in same if f.metric.name == _WORK_LOST]
            wait = [f.value for f in same if f.metric.name == _STOP_TO_STORED]
            span = rec.history[-2 if cause == "worker_lost" else -1] if rec.history else None
            payload = {
                "cause": cause,
                "work_lost_seconds": lost[0] if lost else None,
                "stop_to_stored_seconds": wait[0] if wait else None,
                "generation": rec.checkpoint.generation if rec.checkpoint else None,
                "attempt": span.attempt if span is not None else None,
            }
            out.append((EVENT_INTERRUPTED, payload, count.at))
        for resumed in by_name.get(_RESUMES, []):
            span = rec.history[-1] if rec.history else None
            payload = {
                "status": resumed.labels.get("status"),
                "from_generation": span.resumed_from if span is not None else None,
                "attempt": span.attempt if span is not None else None,
            }
            out.append((EVENT_RESUMED, payload, resumed.at))
        return out

    def _emit(
        self, execution: core.TaskExecution, name: str, payload: dict[str, Any], at: float
    ) -> None:
        spec = execution.spec
        resource = {
            "prefect.resource.id": task_resource_id(self.run_id, spec.label),
            "prefect.resource.name": spec.label,
            "openjd.job.name": self.job_name,
            "openjd.job.key": self.job_key,
            "openjd.run.id": self.run_id,
            "openjd.step": spec.step_name,
            "openjd.task.key": spec.task_key,
        }
        related = [
            {
                "prefect.resource.id": f"openjd.run.{self.run_id}",
                "prefect.resource.role": "openjd-run",
                "prefect.resource.name": self.run_id,
            },
            {
                "prefect.resource.id": f"openjd.job.{self.job_key}",
                "prefect.resource.role": "openjd-job",
                "prefect.resource.name": self.job_name,
            },
        ]
        # a copy per call: a context cannot be entered by two threads at once
        self._context.copy().run(
            emit_event,
            name,
            resource=resource,
            occurred=_when(at),
            related=related,
            payload=payload,
        )
