"""The operator of a step's mapped task in a DAG made by ``dag_from_template``
(``OpenJDTaskOperator``): one group of the step's tasks through ``core.plan_group`` and
``core.run_tasks``, in one OpenJD session; how the try ends is the core's
``classify_group``, mapped onto Airflow's exceptions."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSkipException,
)

import core

from ._config import BEGIN_TASK_ID, notice_settings
from ._inputs import group_originals, open_op_store, read_attempt, run_job, say_still_running
from ._kill import DONE_MESSAGE, KILL_BUDGET_SECONDS, Kill
from ._metrics import task_sinks
from ._summary import GroupReport

__all__ = ("INTERRUPTION_DELAY_SECONDS", "OpenJDTaskOperator", "check_interruption_args")

_NEXT_TRY = "the next try of this task instance (a retry, or clearing it)"
"""What resumes a group an interruption stopped, in Airflow's words (``classify_group``)."""
_RESUMED_LATER = "the task instance, rescheduled (not a retry),"
"""What resumes a group the host's going away stopped, within its interruption budget."""
INTERRUPTION_DELAY_SECONDS = 5.0
"""How long after an interruption the task instance is rescheduled (``AirflowRescheduleException``):
long enough for a worker that is going away to stop taking work."""


def check_interruption_args(retries: Any, delay_seconds: Any) -> None:
    """Check ``interruption_retries`` (an int, 0 or more) and ``interruption_delay_seconds``
    (a number of seconds, 0 to a day).

    Raises:
        ValueError: naming the argument.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"interruption_retries must be an int, 0 or more; got {retries!r}")
    ok = isinstance(delay_seconds, (int, float)) and not isinstance(delay_seconds, bool)
    if not ok or not 0 <= delay_seconds <= 86400:
        raise ValueError(
            f"interruption_delay_seconds must be 0 to 86400 seconds; got {delay_seconds!r}"
        )


class OpenJDTaskOperator(BaseOperator):
    """Runs one group of an OpenJD step's tasks through the core, in one OpenJD session.

    Each try asks the core what to run now (``core.plan_group``: finished tasks drop out,
    checkpointed ones resume, interrupted chunks keep their unfinished frames) and runs it
    (``core.run_tasks``: per-task leases, termination requests obeyed, every checkpoint and
    finished frame stored as it arrives). Task output goes to the task log, with
    ``openjd_redacted_env`` values masked. The latest checkpoint summary is written to the
    task state store under ``openjd_checkpoint`` (by a first try only once there is something
    to show: a checkpoint, a finished frame or a resume status).

    Airflow states, as ``core.classify_group`` says (``core.GroupEnd``): all tasks succeeded
    (or nothing left to run) -> success; a task failed -> the operator raises and Airflow
    retries; stopped by an interruption notice, or by ``on_kill`` because the worker shuts
    down (the host going away: ``GroupVerdict.interruption``) -> up for reschedule
    (``AirflowRescheduleException``, ``interruption_delay_seconds`` later): the same try
    resumes, using none of ``retries``, for ``interruption_retries`` such interruptions of the
    run's attempt, after which the next one raises as below; stopped by any other ``on_kill``
    or an ``execution_timeout`` -> raises (Airflow decides the state; the checkpoint is kept
    for the next try); stopped, or some not started, because of a termination request ->
    failed without retry (``Cancelled`` and friends); none started -> skipped.

    ``on_kill`` (task marked failed or success, run marked failed, a running task cleared,
    worker shutdown: SIGTERM, with SIGKILL 5 s later) asks the running task to checkpoint
    with a deadline ``KILL_BUDGET_SECONDS`` away, and finds out from a worker thread why it
    was called (the task instance's and the DAG run's states); the stop reaches the running
    task and every task of the group still to come (``core.GroupStop``, ``_kill.Kill``).
    ``execution_timeout`` gets the action's full notify period.

    Args:
        step: the OpenJD step name.
        group: one item of ``OpenJDPlanOperator``'s list (the mapped argument).
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
        begin_task_id: the setup task whose XCom holds the attempt.
        kill_budget_seconds: the ``on_kill`` deadline, in seconds from the call.
        interruption_notices: notice sources, as the CLI's ``--interruption-notices`` takes
            them (``aws,gcp,azure,file:PATH,signal:NAME``; None: the worker's
            ``[openjd_checkpoint] interruption_notices``, else
            ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES``). A notice checkpoints the running
            task with the notice's deadline and the task instance is rescheduled (within
            ``interruption_retries``): it resumes as the same try.
        notice_poll_seconds: at most one request per notice source this often (None: the
            worker's ``[openjd_checkpoint] notice_poll_seconds``, else 5 s).
        interruption_retries: how many interruptions by the host going away (notices, worker
            shutdowns) of the run's attempt this group resumes from without using a retry
            (``core.interruptions_so_far`` counts them over the group's task records); the
            next one uses a retry, as an error does.
        interruption_delay_seconds: how long after such an interruption the task instance
            is rescheduled.
    """

    ui_color = "#cfe2f3"
    template_fields: Sequence[str] = ()

    def __init__(
        self,
        *,
        step: str,
        group: dict[str, Any],
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        begin_task_id: str = BEGIN_TASK_ID,
        kill_budget_seconds: float = KILL_BUDGET_SECONDS,
        interruption_notices: str | None = None,
        notice_poll_seconds: float | None = None,
        interruption_retries: int = core.DEFAULT_INTERRUPTION_RETRIES,
        interruption_delay_seconds: float = INTERRUPTION_DELAY_SECONDS,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("do_xcom_push", False)
        super().__init__(**kwargs)
        check_interruption_args(interruption_retries, interruption_delay_seconds)
        self.interruption_retries = interruption_retries
        self.interruption_delay_seconds = float(interruption_delay_seconds)
        self.interruption_notices = interruption_notices
        self.notice_poll_seconds = notice_poll_seconds
        self._notice: core.Notice | None = None
        self.step = step
        self.group = group
        self.store = store
        self.files = files
        self.file_roots = file_roots
        self.begin_task_id = begin_task_id
        self.kill_budget_seconds = kill_budget_seconds
        self._kill = Kill(core.GroupStop(), self.log)
        self._finished = threading.Event()
        self._context: Any = None
        self._masked: set[str] = set()

    # -- running
    def execute(self, context: Any) -> None:
        self._context = context
        attempt = read_attempt(context, self.begin_task_id)
        store = open_op_store(self)
        job = run_job(store, attempt)
        run_id = attempt.run_id
        originals = group_originals(job, self.step, self.group)
        if job.template.is_finally(self.step):
            # Airflow starts teardowns as soon as a task is marked failed, while the killed
            # task may still be checkpointing: the core starts the finally phase once none runs.
            decision = core.start_finally(store, job, run_id)
            say_still_running(self.log, decision.still_running)
            self.log.info("finally step %s: %s", self.step, decision.describe())
        # A later try of this task instance in this DAG run: Airflow runs it again only after
        # a try that did not succeed, or when it was cleared; a cleared one whose tasks
        # finished (in an earlier attempt) runs them again from their start. A first try (a
        # new DAG run, an operator resume included) leaves finished tasks out.
        rerun_notes: list[str] = []
        try:
            specs = core.plan_group(
                store, job, run_id, originals, rerun=self._try_number() > 1, notes=rerun_notes
            )
        except core.ResumeRefusedError as exc:
            raise AirflowException(str(exc)) from None  # another process still runs it
        for note in rerun_notes:
            self.log.info("%s (the task instance was cleared)", note)
        self._log_plan(store, attempt, originals, specs)
        report = GroupReport(
            store,
            attempt,
            originals,
            context.get("task_state_store"),
            self.log,
            self._try_number(),
        )
        if specs != originals:  # what an earlier try left, shown from the start
            report.write()
        if not specs:
            self.log.info("nothing left to run: every task of this group finished earlier")
            report.close()
            return
        try:
            sources, poll = notice_settings(self.interruption_notices, self.notice_poll_seconds)
            for source in sources:  # a signal handler is installed from this (main) thread
                install = getattr(source, "install", None)
                if install is not None:
                    install()
        except ValueError as exc:
            report.close()
            raise AirflowFailException(f"the interruption notice settings: {exc}") from None
        box = self._run(store, job, run_id, specs, report, sources, poll)
        self._kill.wait_reason()  # why on_kill was called, within the budget
        self._end(box, store, job, attempt, originals, specs, report)

    def _run(
        self,
        store: core.CheckpointStore,
        job: core.PreparedJob,
        run_id: str,
        specs: list[core.TaskSpec],
        report: GroupReport,
        sources: Sequence[core.NoticeSource],
        poll: float | None,
    ) -> dict[str, Any]:
        """Run the group on a thread of its own (``core.run_tasks``, stopped through the
        group's ``GroupStop``); this thread waits, so that Airflow's ``execution_timeout``,
        raised here, stops it with a checkpoint. Returns ``{"results"}`` or ``{"error"}``."""
        box: dict[str, Any] = {}

        def on_notice(notice: core.Notice) -> None:
            self._notice = notice

        def on_output(ex: core.TaskExecution, lines: list[str]) -> None:
            self._mask(ex)
            for line in lines:
                self.log.info("%s", line)

        def on_event(ex: core.TaskExecution, event: core.TaskEvent) -> None:
            said = core.report.event_log_line(ex.spec.label, event.kind, event.value)
            if said is not None:
                (self.log.warning if said[0] else self.log.info)("%s", said[1])
            if event.kind in _SUMMARY_EVENTS:
                report.write()

        def work() -> None:
            try:
                box["results"] = core.run_tasks(
                    store,
                    job,
                    run_id,
                    specs,
                    on_output=on_output,
                    on_event=on_event,
                    on_note=lambda note: self.log.info("%s", note),
                    notices=sources,
                    notice_poll_seconds=poll,
                    on_notice=on_notice,
                    stop=self._kill.stop,
                    metrics=task_sinks(),
                )
            except BaseException as exc:
                box["error"] = exc
            finally:
                self._finished.set()

        worker = threading.Thread(target=work, name=f"openjd-{self.task_id}", daemon=True)
        worker.start()
        try:
            while not self._finished.wait(0.2):
                pass
        except BaseException as exc:
            # execution_timeout (AirflowTaskTimeout, raised in this thread) or another
            # interruption: checkpoint with the action's full notify period, then go on.
            self.log.warning("interrupted (%s): asking the running task to checkpoint", exc)
            self._kill.timed_out(exc)
            worker.join()
            self._report(box, specs, report)
            raise
        worker.join()
        return box

    def _end(
        self,
        box: dict[str, Any],
        store: core.CheckpointStore,
        job: core.PreparedJob,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        specs: list[core.TaskSpec],
        report: GroupReport,
    ) -> None:
        """Report the group's end, then end the try as ``core.classify_group`` says."""
        self._report(box, specs, report)
        results = box.get("results", [])
        verdict = core.classify_group(
            specs,
            results,
            error=box.get("error"),
            stopped_by=self._kill.stopped_by(),
            notice=self._notice,
            declared_done=DONE_MESSAGE if self._kill.marked_success else None,
            next_try=_NEXT_TRY,
            stop_cause=self._kill.cause(),
        )
        kind = verdict.kind
        run_id = attempt.run_id
        if kind == core.GroupEnd.DECLARED_DONE:
            for line in core.declare_done(store, job, run_id, originals, verdict.message):
                (self.log.warning if line.startswith("warning: ") else self.log.info)("%s", line)
        elif kind == core.GroupEnd.SKIPPED:
            raise AirflowSkipException(verdict.message)
        elif verdict.interruption:
            self._interrupted(verdict, store, attempt, originals, results)
        elif kind.retry:
            raise AirflowException(verdict.message)
        elif kind != core.GroupEnd.SUCCEEDED:  # stopped by the run, or the run is gone
            raise AirflowFailException(verdict.message)

    def _interrupted(
        self,
        verdict: core.GroupVerdict,
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        results: Sequence[core.TaskResult],
    ) -> None:
        """The host's going away stopped the group (``verdict.interruption``): reschedule this
        try (``AirflowRescheduleException``: Airflow keeps its try number) while the
        interruptions of the run's attempt are within ``interruption_retries``; past it, raise
        as an error does, so that the next one uses a retry."""
        records = [r.record for r in results]
        try:  # every record of the group, those of tasks finished in an earlier try included
            family, _ = store.read_task_family(
                attempt.job_key, attempt.run_id, self.step, [s.task_key for s in originals]
            )
            records = family or records
        except core.StoreError as exc:
            self.log.warning("interruptions counted from this try's tasks only: %s", exc)
        rescheduled = int((self._context or {}).get("task_reschedule_count", 0) or 0)
        budget = self.interruption_retries
        count, resumes = core.interruption_resumes(
            core.interruptions_so_far(records, attempt.attempt), rescheduled, budget
        )
        if not resumes:
            raise AirflowException(
                f"{verdict.message}; the interruption budget is spent ({count} interruptions "
                f"of this run attempt, interruption_retries={budget}): this one uses a retry"
            )
        when = datetime.now(timezone.utc) + timedelta(seconds=self.interruption_delay_seconds)
        self.log.warning(
            "%s; interruption %d of %d that resume without using a retry: rescheduled for %s",
            verdict.message.replace(_NEXT_TRY, _RESUMED_LATER),
            count,
            budget,
            when.isoformat(timespec="seconds"),
        )
        raise AirflowRescheduleException(when)

    def _report(self, box: dict[str, Any], specs: list[core.TaskSpec], report: GroupReport) -> None:
        report.end(
            specs,
            box.get("results", []),
            killed_at=self._kill.at,
            kill_budget_seconds=self.kill_budget_seconds,
        )

    # -- logging
    def _mask(self, ex: core.TaskExecution) -> None:
        # The core already replaces openjd_redacted_env values in the output it hands over;
        # masking them in Airflow too covers anything else Airflow logs.
        values = ex.redacted_values
        new = [v for v in values if v and v not in self._masked]
        if new:
            from airflow.sdk.log import mask_secret

            for value in new:
                mask_secret(value)
                self._masked.add(value)

    def _log_plan(
        self,
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        specs: list[core.TaskSpec],
    ) -> None:
        self.log.info(
            "core run %s (attempt %d) of job %s on host %s (store %s, checkpoint files: %s)",
            attempt.run_id,
            attempt.attempt,
            attempt.job_key,
            core.host_id(),
            store.location,
            store.file_flow.value,
        )
        again = attempt.attempt > 1 or self._try_number() > 1
        for line in core.report.describe_plan(originals, specs, again=again):
            self.log.info("%s", line)

    def _try_number(self) -> int:
        ti = self._context["ti"] if self._context else None
        return int(getattr(ti, "try_number", 1) or 1)

    # -- being killed
    def on_kill(self) -> None:
        """Ask the running task to checkpoint, to be gone within ``kill_budget_seconds``, and
        start no more of the group (``_kill.Kill.killed``).

        Called by Airflow's SIGTERM handler (in the main thread, which must not wait) and after
        an ``execution_timeout`` (then ``execute`` already stopped the task with the full
        notify period). Why it was called is looked up from a worker thread first, for at most
        ``REASON_WAIT_SECONDS``: a task instance marked success is canceled and recorded done
        as it ends (``declared_done``), never left readable as stopped; any other reason, or
        none in time, checkpoints.
        """
        if self._finished.is_set():
            return
        self._kill.killed(self._context, self.kill_budget_seconds)


_SUMMARY_EVENTS = frozenset(
    {
        core.TaskEventKind.CHECKPOINT_SAVED,
        core.TaskEventKind.FRAME_COMPLETE,
        core.TaskEventKind.RESUME_STATUS,
    }
)
"""Task events after which the group's checkpoint summary is written again."""
