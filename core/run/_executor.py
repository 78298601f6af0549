"""The one executor of a run's tasks: a group of tasks in OpenJD sessions, in this process.

Every runner runs its tasks here: the CLI (``core.cli``) runs each step of an attempt through one
``TaskExecutor``, an Airflow task instance and a Prefect task run run their group of a step's
tasks through ``run_tasks`` (an executor of one session). What the executor owns, so that no
runner decides it again:

- claiming each task (its lease; a process of it left alive on this host is killed first);
- a pool of sessions (at most ``max_parallel`` tasks at once, a session per running task, kept
  for the next task; an environment entered once per session and exited when the executor
  closes; an environment exit that failed is recorded in the run, so the attempt ends Failed);
- the run's termination requests (``RunWatcher``): running tasks stop as ``task_stop_for`` says,
  tasks not started do not start (``starts_no_tasks``);
- interruption notices (``NoticeWatcher``): the running tasks checkpoint by the notice's
  deadline and no more start; the notice is noted in the run's record, and acknowledged once
  the tasks have stopped;
- an expired lease: the work it covered is canceled (another process may do it now);
- a time budget per phase (the CLI's ``--timeout`` and finally timeout): on expiry the
  running tasks of the phase are canceled and the rest do not start;
- the caller's stop (``GroupStop``, Airflow's ``on_kill``): the running tasks stop as it asks
  and the rest do not start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from core._errors import RunError, StoreError
from core._figures import interval_env
from core._records import RunPhase, RunStatus, TaskRecord
from core.job import PreparedJob, TaskFeed, TaskSpec, new_task_record
from core.run._claim import NotStartedError, claim_task, lease_expired_note, planned_as_stored
from core.run._group_stop import GroupStop
from core.run._in_flight import Flight, InFlight, on_worker_thread, since
from core.run._metrics import MetricSink, MetricsObserver, default_sinks
from core.run._notices import (
    DEFAULT_POLL_SECONDS,
    Notice,
    NoticeSource,
    NoticeWatcher,
    checkpoint_timing,
)
from core.run._pool import SessionPool
from core.run._running import RunningTasks
from core.store import CheckpointStore, Lease
from core.task import (
    ResumeRefusedError,
    RunWatcher,
    Session,
    TaskEvent,
    TaskExecution,
    TaskOutcome,
    TaskResult,
    Termination,
    TerminationMode,
    fold_request,
    request_or_fold,
)

__all__ = (
    "StepRun",
    "TaskExecutor",
    "record_notice",
    "run_task",
    "run_tasks",
)

TaskKey = tuple[str, str]


@dataclass
class StepRun:
    """What ``TaskExecutor.run`` did with a feed of tasks.

    Attributes:
        results: every task that ran, with its result, in the order they ended (with
            ``run(..., keep_succeeded=False)``, only those that did not succeed).
        succeeded: how many of the tasks that ran succeeded, kept in ``results`` or not.
        not_started: tasks taken from the feed that did not start, with why (a sentence that
            begins ``not started:``).
        refused: tasks that could not be claimed (``errors="fail"``), with why.
        rest: labels of chunks an adaptive feed never handed out.
        ok: False once a task did not succeed or could not be claimed.
    """

    results: list[tuple[TaskSpec, TaskResult]] = field(default_factory=list)
    succeeded: int = 0
    not_started: list[tuple[TaskSpec, str]] = field(default_factory=list)
    refused: list[tuple[TaskSpec, str]] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    ok: bool = True

    @property
    def skipped(self) -> list[str]:
        """Labels of every task not run: not started, then never handed out."""
        return [s.label for s, _ in self.not_started] + self.rest

    def count(self, spec: TaskSpec, result: TaskResult, keep_succeeded: bool) -> bool:
        """Count the result of a task that ran (kept in ``results`` unless it succeeded and
        ``keep_succeeded`` is False); True if it succeeded."""
        if result.outcome != TaskOutcome.SUCCEEDED:
            self.results.append((spec, result))
            self.ok = False
            return False
        self.succeeded += 1
        if keep_succeeded:
            self.results.append((spec, result))
        return True


class TaskExecutor:
    """Runs a run's tasks in sessions of this process, under the run's termination requests
    and interruption notices (the module docstring lists what it decides).

    Use it as a context manager (``start`` ... ``close``), and ``run`` one feed of tasks at a
    time (one step's, or a group of one step's tasks).

    Args:
        store / job / run_id / attempt: the run attempt whose tasks these are.
        max_parallel: tasks run at once (one session each); 1 runs them one after the other.
        run_lease: the run's lease, when this process drives the whole run (the CLI): renewed
            with the task leases; if it expires, every task here is canceled and none starts. A
            notice then suspends the whole run (``Suspended``), not only this process's tasks.
        on_output / on_event: passed to every ``TaskExecution``.
        on_note: lines a person should see (warnings, notices, mode changes).
        on_start: called with each ``TaskExecution`` just before it runs.
        working_root: parent folder of the sessions' working folders.
        poll_seconds: how often the store is read for termination requests, in seconds.
        notices: interruption notice sources (``parse_notice_sources``).
        notice_poll_seconds: at most one request per source this often (default 5 s).
        on_notice: called with each notice acted on (on a background thread), before the
            running tasks are stopped.
        stop: the caller's handle to stop the running tasks and every one still to come.
        metrics: where the checkpoint metrics go (None: ``_metrics.default_sinks``).
    """

    def __init__(
        self,
        store: CheckpointStore,
        job: PreparedJob,
        run_id: str,
        *,
        attempt: int,
        max_parallel: int = 1,
        run_lease: Lease | None = None,
        on_output: Callable[[TaskExecution, list[str]], None] | None = None,
        on_event: Callable[[TaskExecution, TaskEvent], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        on_start: Callable[[TaskExecution], None] | None = None,
        working_root: str | None = None,
        poll_seconds: float = 0.5,
        notices: Sequence[NoticeSource] = (),
        notice_poll_seconds: float | None = None,
        on_notice: Callable[[Notice], None] | None = None,
        stop: GroupStop | None = None,
        metrics: Sequence[MetricSink] | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.run_id = run_id
        self.attempt = attempt
        self.max_parallel = max(1, max_parallel)
        self._run_lease = run_lease
        self._on_output = on_output
        sinks = default_sinks() if metrics is None else metrics
        self._on_event = MetricsObserver(job.job.name, sinks, on_note).wrap(on_event)
        self._on_note = on_note
        self._on_start = on_start
        self._working_root = working_root
        self._on_notice = on_notice
        self.sessions = SessionPool(
            store, job, run_id, attempt=attempt, working_root=working_root, on_note=on_note
        )
        self.running = RunningTasks(self.sessions, drives_run=run_lease is not None)
        """What runs here now, and what stops it."""
        if stop is not None:
            stop.bind(self.running)
        self.phase = RunPhase.REGULAR
        self._said_lost = False
        self._watcher = RunWatcher(
            store,
            job.job_key,
            run_id,
            attempt,
            self.apply,
            leases=[run_lease] if run_lease is not None else [],
            poll_seconds=poll_seconds,
            on_lease_expired=self._lease_expired,
        )
        self._notices = NoticeWatcher(
            notices,
            self._notified,
            on_note=on_note,
            poll_seconds=notice_poll_seconds or DEFAULT_POLL_SECONDS,
        )

    # --- life ----------------------------------------------------------------------------------
    def __enter__(self) -> TaskExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> TaskExecutor:
        """Read the run's termination requests once, then watch them and the notice sources.

        Raises:
            StoreError: the store cannot be read.
        """
        self._watcher.check()
        self._watcher.start()
        self._notices.start()
        return self

    def close(self) -> None:
        """End every session (environments exit, ``onExit``, in reverse order; a forced stop
        skips them; what they left running is killed), record an environment exit that
        failed, then stop watching. After a notice: how long the tasks took to stop against
        its deadline goes to the log and the run's record, and the notice is acknowledged."""
        self.sessions.close()  # the run watcher still runs: a deadline reaches onExit
        self._notices.close()
        notice = self.running.notice
        if notice is not None:
            key = (self.job.job_key, self.run_id)
            lines = notice_ended(self.store, *key, self.attempt, notice)
            for line in lines + self._notices.acknowledge():
                self.note(line)
        with self.running.lock:
            self.running.closed = True
        self._watcher.close()
        for error in self._watcher.errors[:3]:
            self.note(f"warning: {error}")

    def note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    # --- stopping ------------------------------------------------------------------------------
    @property
    def termination(self) -> Termination:
        """The termination in force for this process's tasks."""
        return self.running.term

    def timed_out(self, is_finally: bool) -> bool:
        """True once the phase's time budget expired (``run(..., deadline=...)``)."""
        return self.running.timed_out[is_finally]

    def request(
        self, mode: TerminationMode, *, force: bool = False, deadline: float | None = None
    ) -> None:
        """Ask the run to end in ``mode`` (``request_termination``, as another process would)
        and apply the result here at once. When the store cannot take the request, this
        process's tasks still stop (the request is folded here only, with a warning).

        Raises:
            RunError: the run has ended, or is stopping in a mode this one may not replace.
        """
        where = (self.store, self.job.job_key, self.run_id, self.running.term, mode)
        term, note, warning = request_or_fold(
            *where, phase=self.phase, force=force, deadline=deadline
        )
        if warning is not None:
            self.note(warning)
        if note is not None:
            self.note(f"run {self.run_id}: {note}")
        self.apply(term)

    def apply(self, term: Termination) -> None:
        """The run's termination is now ``term`` (the watcher's report, or ``request``): stop
        the running tasks as it says, and forward a forced stop or a deadline to an
        environment action still running (``RunningTasks.apply``). Thread-safe."""
        previous = self.running.apply(term, self.phase)
        if (
            previous is not None
            and (term.mode, term.force) != (previous.mode, previous.force)
            and term.mode is not None
        ):
            self.note(f"run {self.run_id}: {term.describe()}")

    def _notified(self, notice: Notice) -> None:
        drives_run = self._run_lease is not None
        what = "suspending the run" if drives_run else "checkpointing and stopping"
        self.note(f"interruption notice from {notice.describe()}: {what}")
        first = self.running.noticed(notice)
        if first:
            where = (self.store, self.job.job_key, self.run_id)
            try:
                record_notice(*where, notice, attempt=self.attempt)
            except StoreError as exc:
                self.note(f"warning: the notice is not recorded in the run: {exc}")
        if self._on_notice is not None:
            self._on_notice(notice)
        if drives_run:
            try:
                self.request(TerminationMode.SUSPENDED, deadline=notice.deadline)
            except RunError as exc:
                self.note(str(exc))
        else:
            self.apply(self.running.term)

    def _store_failed(self, spec: TaskSpec, execution: TaskExecution, result: TaskResult) -> None:
        """A task's end could not be stored: no more task starts in this process (their ends
        could not be stored either), and the running ones are suspended (what they reported
        is kept where the store takes it). A lost lease has said so already."""
        if execution.lost_lease is not None:
            self._say_lost(
                f"{spec.label}: this process lost the task's lease ({execution.lost_lease})"
            )
        elif self.running.term.mode != TerminationMode.SUSPENDED:
            self.note(
                f"warning: the store does not take the end of {spec.label}: the tasks of this "
                "process are suspended, and no more start"
            )
        term = self.running.term
        self.running.apply(
            fold_request(term, TerminationMode.SUSPENDED, phase=self.phase)[0], self.phase
        )

    def _lease_expired(self, lease: Lease) -> None:
        why = lease_expired_note(lease)
        if lease is self._run_lease:
            self._say_lost(f"run {self.run_id}: this process lost the run's lease ({why})")
            # applied here only, and said above: this process may no longer write to the run
            self.running.apply(Termination(mode=TerminationMode.CANCELLED), self.phase)
            for execution in self.running.executions():
                execution.lease_lost(why)
            return
        holder = self.running.holding(lease)
        if holder is not None:  # it stops and stores nothing more (said as it ends)
            holder.lease_lost(why)

    def _say_lost(self, what: str) -> None:
        """Say once, for every lease of this process that was lost, that it stopped."""
        with self.running.lock:
            said, self._said_lost = self._said_lost, True
        if not said:
            self.note(
                f"warning: {what}: another process may run its work now, so this one stops "
                "its tasks and writes nothing more to the store"
            )

    # --- running -------------------------------------------------------------------------------
    def run(
        self,
        feed: TaskFeed | Sequence[TaskSpec],
        *,
        job_status: str | None = None,
        deadline: float | None = None,
        deadline_message: str = "the time budget expired",
        stop_on_failure: bool = False,
        errors: Literal["raise", "fail"] = "raise",
        known: Mapping[TaskKey, TaskRecord] | None = None,
        keep_succeeded: bool = True,
    ) -> StepRun:
        """Run the feed's tasks (all of one step), up to ``max_parallel`` at once; block until
        each has ended or was not started.

        Args:
            feed: the tasks (a ``TaskFeed``, for example an adaptive one, or a list).
            job_status: the ``{{Job.Status}}`` finally tasks get.
            deadline: ``time.monotonic()`` value when the phase's budget expires (None: none).
            deadline_message: the note said on expiry.
            stop_on_failure: once a task did not succeed, start no more of the feed.
            errors: ``raise``: a task that cannot be claimed, or whose run raised, raises here
                (tasks before it have run, none after it started); ``fail``: it fails, noted.
            known: task records to fall back on where the store has none.
            keep_succeeded: False: a task that succeeded is counted (``StepRun.succeeded``),
                not kept in ``StepRun.results``, so that a step of any size is run in memory
                that does not grow with its task count.

        Raises:
            ResumeRefusedError: ``already-resumed`` (with ``errors="raise"``): another process
                runs one of the tasks now.
            StoreError: the store cannot be read or written when a task starts.
        """
        if not isinstance(feed, TaskFeed):
            feed = TaskFeed(feed)
        # the end of a task that succeeded is stored while the next starts (``InFlight``)
        here = deadline is None and on_worker_thread()
        out = StepRun()
        with InFlight(
            self.sessions,
            self.max_parallel,
            here=here,
            pipelined=not feed.sized_by_ends,
            prepare_lease=partial(self.store.prepare_task_lease, self.job.job_key, self.run_id),
        ) as flight:
            while True:
                while flight.room():
                    spec = feed.take()
                    if spec is None:
                        break
                    is_finally = self.job.template.is_finally(spec.step_name)
                    self.phase = RunPhase.FINALLY if is_finally else RunPhase.REGULAR
                    why = self.running.why_not_start(is_finally)
                    if why is None and stop_on_failure and not out.ok:
                        why = "not started: an earlier task of the step did not succeed"
                    if why is None:  # the claim may wait for a lease, and stop waiting
                        started = self._start(
                            spec, is_finally, job_status, errors, known, flight.on_ending
                        )
                        why = str(started) if isinstance(started, NotStartedError) else None
                    if why is not None:
                        out.not_started.append((spec, why))
                        out.not_started.extend((s, why) for s in feed.drain())
                        out.rest.extend(feed.rest())
                        break
                    if not isinstance(started, tuple):  # refused (a string)
                        out.refused.append((spec, str(started)))
                        out.ok = False
                        continue
                    execution, lease, session = started
                    flight.start(
                        Flight(spec, execution, lease, session, time.monotonic()), feed.peek
                    )
                if not flight:
                    break
                ended = flight.wait(timeout=0.1)
                if deadline is not None and time.monotonic() > deadline:
                    if self.running.expire(self.phase == RunPhase.FINALLY):
                        self.note(deadline_message + "; canceling running tasks")
                for one in ended:
                    self._ended(one.execution, one.lease)
                    assert one.future is not None
                    try:
                        result = one.future.result()
                    except Exception as exc:
                        if errors == "raise":
                            raise
                        result = TaskResult(TaskOutcome.FAILED, None, str(exc), one.record)
                    if result.outcome == TaskOutcome.NOT_STORED:
                        self._store_failed(one.spec, one.execution, result)
                    if out.count(one.spec, result, keep_succeeded):
                        note = feed.ended(one.spec, since(one))
                        if note is not None:
                            self.note(note)
        return out

    def _run_lease_lost(self) -> str | None:
        """Why no task may start: this process lost the run's lease (``claim_task``'s
        ``lost``). None: it holds it, or drives no run."""
        if self._run_lease is not None and not self._watcher.still_held(self._run_lease):
            return "not started: this process lost the run's lease"
        return None

    def _start(
        self,
        spec: TaskSpec,
        is_finally: bool,
        job_status: str | None,
        errors: str,
        known: Mapping[TaskKey, TaskRecord] | None,
        on_ending: Callable[[TaskExecution, TaskOutcome], None] | None = None,
    ) -> tuple[TaskExecution, Lease, Session] | NotStartedError | str:
        try:
            lease, record = claim_task(
                self.store,
                self.job,
                self.run_id,
                spec,
                note=self.note,
                should_stop=lambda: self.running.why_not_start(is_finally),
                run_held=self._run_lease is not None,
                lost=self._run_lease_lost,
            )
            spec = planned_as_stored(
                self.job, self.run_id, spec, record, lease, attempt=self.attempt, note=self.note
            )
        except NotStartedError as exc:
            return exc
        except (ResumeRefusedError, StoreError) as exc:
            if errors == "raise":
                raise
            self.note(f"{spec.label}: {exc}")
            return str(exc)
        try:
            session = self.sessions.take(job_status if is_finally else None)
            record = record or (known or {}).get((spec.step_name, spec.task_key))
            execution = TaskExecution(
                self.job,
                spec,
                run_id=self.run_id,
                store=self.store,
                record=record,
                attempt=self.attempt,
                on_output=self._on_output,
                on_event=self._on_event,
                working_root=self._working_root,
                job_status=session.job_status,
                session=session,
                lease=lease,
                task_env=interval_env(record),
                on_ending=on_ending,
            )
        except BaseException:
            lease.release()
            raise
        self._watcher.leases.append(lease)
        self.running.add(execution, lease, is_finally)
        self.apply(self.running.term)  # a request that came while it was being claimed
        if self._on_start is not None:
            self._on_start(execution)
        return execution, lease, session

    def _ended(self, execution: TaskExecution, lease: Lease) -> None:
        """``execution`` ended (its end stored, or not storable): its lease goes."""
        self.running.remove(execution, lease)
        if lease in self._watcher.leases:
            self._watcher.leases.remove(lease)
        lease.release()


# --- a group of tasks in one session (Airflow task instances, Prefect task runs) ---------------
def run_tasks(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    specs: list[TaskSpec],
    **options: Any,
) -> list[TaskResult]:
    """Run tasks of a run one after the other in one OpenJD session, in this process (an
    Airflow task instance or a Prefect task run that runs a group of a step's tasks): a
    ``TaskExecutor`` of one session.

    Each task's lease is held while it runs; a previous process of it left alive on this host
    is killed first. On a store whose leases have a ttl (S3), a lease still held by another
    process (one that died on another host) is waited for, up to its ttl plus 10 s, and said in
    ``on_note`` (``core.run._claim.claim_task``). Termination requests of the run reach the
    running task within ``poll_seconds`` and stop it as ``task_stop_for`` says, with the
    request's ``force`` and ``deadline``; tasks not started by then are not started
    (``TaskOutcome.SKIPPED``). Finally
    tasks get the ``{{Job.Status}}`` that ``enter_finally`` stored. The session's environments
    are entered once, before the first task, and exited after the last.

    An interruption notice from one of ``notices`` (``core.run._notices``) stops the running
    task as ``Suspended`` does (``checkpointCancelation``), with the notice's deadline, and
    the tasks after it are not started: the host is going away, so this process's tasks
    stop (the run's other processes, on other hosts, go on) and the framework's retry
    resumes them. The run's record notes the notice (``record_notice``); the log says how
    long the checkpoints took against its deadline; an Azure event is acknowledged once the
    tasks have stopped.

    Args:
        specs: the tasks, all of one step (``plan_step``, or ``TaskSpec.from_dict``).
        options: ``TaskExecutor``'s keyword arguments but ``attempt``, ``max_parallel`` and
            ``run_lease``: ``on_output``, ``on_event``, ``on_note``, ``on_start``,
            ``working_root``, ``poll_seconds``, ``notices`` (``parse_notice_sources``; none
            by default), ``notice_poll_seconds`` (default 5 s), ``on_notice`` (called with
            each notice acted on, on a background thread, before the running task is
            stopped), ``stop`` (a ``GroupStop``: an ``on_kill`` stops the running task and
            every one still to come through it, from any thread; the tasks it leaves not
            started end ``SKIPPED``).

    Returns:
        One ``TaskResult`` per spec, in order.

    Raises:
        ResumeRefusedError: ``already-resumed``: another process runs one of these tasks now
            (on S3: its lease was still renewed after the wait; tasks before it have run, none
            after it).
        RunError: the run does not exist or has ended.
        StoreError: the store cannot be read or written when a task starts.
    """
    run = store.read_run(job.job_key, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r} of job {job.job.name!r} in {store.location}")
    if run.phase == RunPhase.ENDED or run.status != RunStatus.RUNNING:
        labels = ", ".join(s.label for s in specs)
        raise RunError(f"run {run_id} has ended ({run.status.value}); {labels} not run")
    executor = TaskExecutor(store, job, run_id, attempt=run.attempt, **options)
    with executor:
        step = executor.run(specs, job_status=run.job_status)
    by_key = {spec.task_key: result for spec, result in step.results}
    for spec, why in step.not_started:
        by_key[spec.task_key] = TaskResult(
            TaskOutcome.SKIPPED, None, why, new_task_record(job, spec, run_id)
        )
    return [by_key[spec.task_key] for spec in specs]


def run_task(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    **options: Any,
) -> TaskResult:
    """Run one task of a run, in this process, to its end (any process, any host): a group of
    one (``run_tasks``), in a session of its own.

    Raises:
        ResumeRefusedError: ``already-resumed`` (another process runs this task now).
        RunError: the run does not exist or has ended.
        StoreError: the store cannot be read or written when the task starts.
    """
    [result] = run_tasks(store, job, run_id, [spec], **options)
    return result


def notice_ended(
    store: CheckpointStore, job_key: str, run_id: str, attempt: int, notice: Notice
) -> list[str]:
    """The tasks a notice stopped are gone: how long it took against the notice's deadline, as
    lines for the log, and noted in the run's record (``record_notice``'s ``stopped_after``)."""
    ended = time.time()
    lines = [checkpoint_timing(notice, ended)]
    try:
        record_notice(
            store,
            job_key,
            run_id,
            notice,
            attempt=attempt,
            stopped_after=ended - notice.received_at,
        )
    except StoreError as exc:
        lines.append(f"warning: the notice is not recorded in the run: {exc}")
    return lines


# --- what the executor notes in the run's record -----------------------------------------------
def record_notice(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    notice: Notice,
    *,
    attempt: int,
    stopped_after: float | None = None,
) -> None:
    """Note in the run's record (``RunRecord.notices``) that an interruption notice stopped
    an attempt; called again with ``stopped_after`` (seconds from the notice until its tasks
    had stopped) updates the same entry.

    Raises:
        StoreError: the store cannot be read or written.
    """
    entry = {**notice.to_record(), "attempt": attempt}
    if stopped_after is not None:
        entry["stopped_after"] = round(stopped_after, 3)
    with store.run_lock(job_key, run_id):
        run = store.read_run(job_key, run_id)
        if run is None:
            return
        for i, old in enumerate(run.notices):
            if (old.get("source"), old.get("received_at")) == (notice.source, notice.received_at):
                run.notices[i] = entry
                break
        else:
            run.notices.append(entry)
        store.write_run(run)
