"""The operators of a run's life in a DAG made by ``dag_from_template``: the setup task
(``OpenJDBeginOperator``: ``core.begin_attempt``), each step's plan (``OpenJDPlanOperator``: the
groups its mapped task expands over) and the last teardown (``OpenJDFinishOperator``:
``core.finish_attempt``). Translation only: the core decides, these map its answers onto Airflow
task states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

import core
from core import plan_tasks

from ._config import RESUME_PARAM
from ._inputs import (
    BEGIN_MEMO,
    BeginMemo,
    group_tasks,
    open_op_store,
    read_attempt,
    run_job,
    say_still_running,
)

__all__ = ("OpenJDBeginOperator", "OpenJDFinishOperator", "OpenJDPlanOperator")


# ------------------------------------------------------------------------------------ begin
class OpenJDBeginOperator(BaseOperator):
    """The DAG's setup task: check the job parameters and begin the core attempt.

    A new DAG run begins a new core run; the framework's retry or clear of this DAG run
    continues the same core run (external key ``<dag_id>/<run_id>``). With the ``resume`` param
    set to a run id (or ``latest``), it resumes that run instead, or fails with the core's
    refusal code and reason in its log.

    Args:
        template_path: the job template file (absolute).
        parameter_names: the job parameters, read from the DAG run's params.
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).

    Returns (XCom): ``core.Attempt.to_dict()`` plus ``store`` (the store's location) and
    ``files`` (its file data flow).
    """

    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        template_path: str,
        parameter_names: Sequence[str],
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.template_path = template_path
        self.parameter_names = list(parameter_names)
        self.store = store
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> dict[str, Any]:
        # What this process kept of an earlier run of this task is gone before anything else
        # (a failure leaves nothing kept); what it returns is kept at the end (``BeginMemo``).
        memo_key = BeginMemo.key(context["ti"], self.task_id)
        BEGIN_MEMO.drop(memo_key)
        params = context["params"]
        store = open_op_store(self)
        location = store.location  # to show: any credentials in the URL are masked
        try:
            template = core.load_template(self.template_path)
            values = core.framework_parameter_values(
                template, {n: params.get(n) for n in self.parameter_names}
            )
            job = core.prepare_job(template, values)
        except core.TemplateError as exc:
            raise AirflowFailException(f"the job cannot be made: {exc}") from None
        ti = context["ti"]
        key = f"{ti.dag_id}/{ti.run_id}"
        resume = params.get(RESUME_PARAM)
        try:
            if resume:
                self.log.info("operator resume of run %s (the %r param)", resume, RESUME_PARAM)
                attempt = core.begin_attempt(
                    store,
                    job,
                    how=core.ResumeHow.OPERATOR,
                    run_id=str(resume),
                    external_key=key,
                )
            else:
                attempt = core.begin_attempt(store, job, external_key=key)
        except core.ResumeRefusedError as exc:
            self.log.error("%s (refusal code %s)", exc, exc.code.value)
            advice = ""
            if not resume and exc.code in (
                core.RefusalCode.CHAIN_CHANGED,
                core.RefusalCode.DIFFERENT_INPUT,
            ):
                # This DAG run's mapped task instances map the tasks it was planned with.
                advice = (
                    "; this DAG run keeps the template and job parameters it began with: to run "
                    "the changed job, trigger a new DAG run (once the DAG file has been parsed "
                    "again)"
                )
                self.log.error("%s", advice[2:])
            raise AirflowFailException(f"{exc.code.value}: {exc}{advice}") from None
        for note in attempt.notes:
            self.log.info("%s", note)
        self.log.info(
            "core run %s, attempt %d, job key %s, store %s%s%s",
            attempt.run_id,
            attempt.attempt,
            attempt.job_key,
            location,
            ", checkpoint files: managed" if store.file_flow.value == "managed" else "",
            " (resumed)" if attempt.resumed else "",
        )
        # The store travels with the attempt so that the plugin's endpoints find the run.
        result = {**attempt.to_dict(), "store": store.url, "files": store.file_flow.value}
        BEGIN_MEMO.put(memo_key, result)
        return result


# ------------------------------------------------------------------------------------ plan
class OpenJDPlanOperator(BaseOperator):
    """The list a step's mapped task expands over: the step's original tasks, grouped.

    The list depends only on the template and the job parameters (not on what is stored), so a
    ``map_index`` names the same OpenJD task(s) on every try and after every clear.

    Args:
        step: the OpenJD step name.
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
        max_map_length: the most groups (None: ``[core] max_map_length``).

    Returns (XCom): ``group_tasks(...)``.
    """

    ui_color = "#eeeeee"

    def __init__(
        self,
        *,
        step: str,
        store: str | None = None,
        max_map_length: int | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.store = store
        self.max_map_length = max_map_length
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from airflow.sdk import conf

        attempt = read_attempt(context)
        store = open_op_store(self)
        job = run_job(store, attempt)
        originals = plan_tasks(job, self.step)
        limit = self.max_map_length or conf.getint("core", "max_map_length", fallback=1024)
        groups = group_tasks(originals, limit)
        self.log.info(
            "step %s: %d task(s) in %d mapped instance(s) (at most %d)",
            self.step,
            len(originals),
            len(groups),
            limit,
        )
        return groups


# ------------------------------------------------------------------------------------ finish
class OpenJDFinishOperator(BaseOperator):
    """The last teardown: end the core attempt (``core.finish_attempt``) and fail the DAG run
    when the core's outcome is not success. A run's checkpoints are deleted by the core only
    when the whole run, finally steps included, succeeded.

    Args:
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
    """

    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> dict[str, Any]:
        attempt = read_attempt(context)
        store = open_op_store(self)
        job = run_job(store, attempt)
        outcome = core.finish_attempt(
            store, job, attempt.run_id, wait_seconds=core.RELEASE_WAIT_SECONDS
        )
        say_still_running(self.log, outcome.still_running)
        cond = outcome.condition
        self.log.info(
            "core run %s ended %s (%s%s)",
            attempt.run_id,
            outcome.status.value,
            cond.reason,
            f": {cond.message}" if cond.message else "",
        )
        if outcome.skipped:
            self.log.info(
                "not finished (clearing the DAG run's failed tasks, or a new DAG run with "
                "resume=latest, resumes them): %s",
                ", ".join(outcome.skipped),
            )
        if outcome.status != core.RunStatus.SUCCEEDED:
            raise AirflowFailException(
                f"core run {attempt.run_id} ended {outcome.status.value} "
                f"({cond.reason}: {cond.message})"
            )
        return {
            "run_id": attempt.run_id,
            "status": outcome.status.value,
            "reason": cond.reason,
            "exit_code": outcome.exit_code,
        }
