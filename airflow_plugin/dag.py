"""``dag_from_template``: an Airflow DAG from an OpenJD job template with CHECKPOINT.

The DAG's shape (task ids are the step names with unsafe characters replaced by ``_``)::

    openjd_begin (setup) -> plan_<Step> -> <Step> (mapped) -> ... -> <Finally> (teardown)
                                                                  -> openjd_finish (teardown)

- ``openjd_begin``: checks the job parameters and begins the core attempt
  (``OpenJDBeginOperator``).
- ``plan_<Step>``: the step's original tasks, grouped into at most ``[core] max_map_length``
  items (``OpenJDPlanOperator``).
- ``<Step>``: ``OpenJDTaskOperator`` mapped over those groups; ``map_index`` names show the
  task parameters (``Render[Frame=1-4]``); step ``dependencies`` are edges.
- finally steps: mapped ``OpenJDTaskOperator`` teardowns of ``openjd_begin`` that wait for
  every regular step task, get ``{{Job.Status}}`` from the core, and run whether the regular
  steps succeeded or not.
- ``openjd_finish``: teardown that ends the core attempt and fails the DAG run when the core's
  outcome is not success (``on_failure_fail_dagrun``).

Parsing reads and validates the template (``core.load_template``) and nothing else: no job
creation, no task expansion, no database or network call.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

import core

from ._config import (
    BEGIN_TASK_ID,
    FINISH_TASK_ID,
    RESUME_PARAM,
    check_file_roots,
    check_files_mode,
    task_id_for,
)
from ._task_operator import INTERRUPTION_DELAY_SECONDS, check_interruption_args
from .operators import (
    OpenJDBeginOperator,
    OpenJDFinishOperator,
    OpenJDPlanOperator,
    OpenJDTaskOperator,
)

log = logging.getLogger(__name__)

HostRequirementsMapping = (
    Mapping[str, Mapping[str, Any]] | Callable[[str, dict[str, Any]], Mapping[str, Any] | None]
)
"""Step name -> operator keyword arguments (``queue``, ``pool``, ``pool_slots``...), or a function
``(step name, the step's hostRequirements as a plain dict) -> those arguments or None``."""

_OPERATOR_ARGS = frozenset({"queue", "pool", "pool_slots", "priority_weight", "executor"})


_LIST_ITEMS: dict[str, dict[str, Any]] = {
    "LIST[INT]": {"type": "integer"},
    "LIST[FLOAT]": {"type": "number"},
    "LIST[STRING]": {"type": "string"},
    "LIST[PATH]": {"type": "string"},
    "LIST[BOOL]": {"type": "boolean"},
    "LIST[LIST[INT]]": {"type": "array", "items": {"type": "integer"}},
}
"""JSON schema of a list parameter's items, by OpenJD type."""


def job_params(template: core.CheckpointJobTemplate) -> dict[str, Param]:
    """The template's job parameters as Airflow ``Param``s (types, bounds, allowed values,
    defaults, descriptions), plus ``resume``. The core's hidden parameters are left out.

    Raises:
        ValueError: a job parameter is named ``resume``.
    """
    from core import JOB_STATUS_PARAMETER

    params: dict[str, Param] = {}
    for definition in template.template.parameterDefinitions or []:
        name = definition.name
        if name == JOB_STATUS_PARAMETER:
            continue
        if name == RESUME_PARAM:
            raise ValueError(f"job parameter {name!r} clashes with the DAG's own {name!r} param")
        kind = str(getattr(definition.type, "value", definition.type))
        schema: dict[str, Any] = {}
        if kind == "INT":
            schema["type"] = "integer"
        elif kind == "FLOAT":
            schema["type"] = "number"
        elif kind in ("STRING", "PATH"):
            schema["type"] = "string"
        elif kind == "BOOL":
            schema["type"] = "boolean"
        elif kind.startswith("LIST["):  # EXPR's list types: JSON arrays in the trigger form
            schema["type"] = "array"
            item = _LIST_ITEMS.get(kind)
            if item is not None:
                schema["items"] = item
        for ours, theirs in (
            ("minValue", "minimum"),
            ("maxValue", "maximum"),
            ("minLength", "minLength"),
            ("maxLength", "maxLength"),
        ):
            value = getattr(definition, ours, None)
            if value is not None:
                schema[theirs] = core.plain_value(value)
        allowed = getattr(definition, "allowedValues", None)
        if allowed:
            schema["enum"] = [core.plain_value(v) for v in allowed]
        ui = getattr(definition, "userInterface", None)
        title = getattr(ui, "label", None) if ui is not None else None
        if title:
            schema["title"] = title
        description = getattr(definition, "description", None)
        if description:
            schema["description"] = description
        default = getattr(definition, "default", None)
        if default is None:
            schema["type"] = [schema["type"], "null"] if "type" in schema else None
            params[name] = Param(None, **{k: v for k, v in schema.items() if v is not None})
        else:
            params[name] = Param(core.plain_value(default), **schema)
    params[RESUME_PARAM] = Param(
        None,
        type=["null", "string"],
        title="Resume run",
        description=(
            "Leave empty to start a new run. A core run id (or 'latest') resumes that earlier "
            "run of this job from its checkpoints, or fails the setup task with the refusal."
        ),
    )
    return params


def _host_kwargs(
    template: core.CheckpointJobTemplate,
    step: str,
    mapping: HostRequirementsMapping | None,
    dag_id: str,
) -> dict[str, Any]:
    """The operator arguments a step's hostRequirements map to; unmapped ones are logged."""
    document_steps = list(template.document.get("steps", [])) + list(
        template.document.get("finally", []) or []
    )
    raw = next((s.get("hostRequirements") for s in document_steps if s.get("name") == step), None)
    if not raw:
        return {}
    mapped: Mapping[str, Any] | None = None
    if callable(mapping):
        mapped = mapping(step, dict(raw))
    elif mapping is not None:
        mapped = mapping.get(step)
    if not mapped:
        log.warning(
            "DAG %s: step %r has hostRequirements %s with no mapping to an Airflow queue or "
            "pool (pass host_requirements= to dag_from_template); it runs on any worker",
            dag_id,
            step,
            raw,
        )
        return {}
    unknown = set(mapped) - _OPERATOR_ARGS
    if unknown:
        raise ValueError(
            f"host_requirements for step {step!r}: unsupported operator arguments "
            f"{sorted(unknown)} (allowed: {sorted(_OPERATOR_ARGS)})"
        )
    return dict(mapped)


def dag_from_template(
    template_path: str | Path,
    *,
    dag_id: str,
    store: str | None = None,
    files: str | None = None,
    file_roots: Sequence[str] | str | None = None,
    host_requirements: HostRequirementsMapping | None = None,
    max_map_length: int | None = None,
    interruption_notices: str | None = None,
    notice_poll_seconds: float | None = None,
    interruption_retries: int = core.DEFAULT_INTERRUPTION_RETRIES,
    interruption_delay_seconds: float = INTERRUPTION_DELAY_SECONDS,
    **dag_kwargs: Any,
) -> DAG:
    """Make an Airflow DAG that runs an OpenJD job template with checkpoints and resume.

    Args:
        template_path: the template file; a relative path is taken from the folder of the DAG
            file that calls this (else the current directory).
        dag_id: the DAG id.
        store: the checkpoint store (path or fsspec URL) shared by all workers; None: the
            workers' ``[openjd_checkpoint] store`` setting, else the core's default.
        files: how the store treats checkpoint files: ``shared`` (paths only, on a file system
            every worker sees) or ``managed`` (the store keeps the files the tasks name and
            restores them into the session working directory of the task that resumes, on any
            worker); None: the workers' ``[openjd_checkpoint] files`` setting, else
            ``$OPENJD_CHECKPOINT_FILES``, else ``shared``.
        file_roots: absolute folders, besides the session working directory, whose files a
            managed store may capture and restore (a list, or one string separated by
            ``os.pathsep``); None: the workers' ``[openjd_checkpoint] file_roots`` setting.
            ``$OPENJD_CHECKPOINT_FILE_ROOTS`` is added either way.
        host_requirements: how steps' ``hostRequirements`` map to operator arguments (``queue``,
            ``pool``, ``pool_slots``...): a mapping step name -> arguments, or a function
            ``(step name, requirements dict) -> arguments or None``.
        max_map_length: the most mapped instances per step (None: the worker's ``[core]
            max_map_length`` when the step is planned).
        interruption_notices: interruption notice sources for every OpenJD task instance, as
            the CLI's ``--interruption-notices`` takes them (``aws,gcp,azure,file:PATH,
            signal:NAME``); None: the workers' ``[openjd_checkpoint] interruption_notices``,
            else ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES``. Checked here.
        notice_poll_seconds: at most one request per source this often (None: the workers'
            ``[openjd_checkpoint] notice_poll_seconds``, else 5 s).
        interruption_retries: how many times the host going away (an interruption notice, a
            worker shutting down) may stop an OpenJD task instance in a run attempt and have it
            rescheduled, resuming without using one of its ``retries``; the next time uses a
            retry, as an error does (default ``core.DEFAULT_INTERRUPTION_RETRIES``, 10; 0:
            every interruption uses a retry).
        interruption_delay_seconds: how long after such an interruption the task instance is
            rescheduled (default 5 s).
        **dag_kwargs: passed to ``airflow.sdk.DAG`` (``schedule`` defaults to None;
            ``default_args["retries"]`` defaults to 1, because a retry is how a killed task
            resumes; ``params`` are merged after the job parameters).

    Returns:
        The DAG (assign it to a module-level name of the DAG file).

    Raises:
        core.TemplateError: the template is invalid (the core's message, naming the field).
        ValueError: a job parameter is named ``resume``, a host requirements mapping gives
            an unsupported argument, ``files`` is not ``shared`` or ``managed``, a file root
            is not an absolute path, or ``interruption_notices``, ``notice_poll_seconds``,
            ``interruption_retries`` or ``interruption_delay_seconds`` is bad (naming it).
    """
    core.NoticeSettings.given(interruption_notices, notice_poll_seconds)  # checked now
    check_interruption_args(interruption_retries, interruption_delay_seconds)
    notice_args = {
        "interruption_notices": interruption_notices,
        "notice_poll_seconds": notice_poll_seconds,
        "interruption_retries": interruption_retries,
        "interruption_delay_seconds": interruption_delay_seconds,
    }
    if files is not None:
        files = check_files_mode(files, "files=")
    roots = check_file_roots(file_roots, "file_roots") if file_roots is not None else None
    store_args: dict[str, Any] = {"store": store, "files": files, "file_roots": roots}
    path = Path(template_path)
    if not path.is_absolute():
        path = _caller_folder() / path
    template = core.load_template(path)
    params = job_params(template)
    params.update(dag_kwargs.pop("params", None) or {})
    default_args = {"retries": 1, **(dag_kwargs.pop("default_args", None) or {})}
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("description", f"OpenJD job {template.name!r} ({path.name})")
    tags = list(dag_kwargs.pop("tags", None) or []) + ["openjd"]
    parameter_names = [n for n in params if n != RESUME_PARAM]
    template_file = str(path.resolve())

    with DAG(dag_id, params=params, default_args=default_args, tags=tags, **dag_kwargs) as dag:
        begin = OpenJDBeginOperator(
            task_id=BEGIN_TASK_ID,
            template_path=template_file,
            parameter_names=parameter_names,
            **store_args,
        )
        taken = {BEGIN_TASK_ID, FINISH_TASK_ID}
        step_ids = {s: task_id_for(s, taken) for s in template.regular_steps}
        step_ids.update({s: task_id_for(s, taken) for s in template.finally_steps})
        tasks: dict[str, Any] = {}
        for step in template.regular_steps + template.finally_steps:
            tid = step_ids[step]
            plan = OpenJDPlanOperator(
                task_id=task_id_for(f"plan_{tid}", taken),
                step=step,
                max_map_length=max_map_length,
                **store_args,
            )
            begin >> plan
            mapped = OpenJDTaskOperator.partial(
                task_id=tid,
                step=step,
                **store_args,
                **notice_args,
                map_index_template="{{ task.group['label'] }}",
                **_host_kwargs(template, step, host_requirements, dag_id),
            ).expand(group=plan.output)
            begin >> mapped
            tasks[step] = mapped
        regular = [tasks[s] for s in template.regular_steps]
        for step in template.regular_steps + template.finally_steps:
            for dep in template.dependencies(step):
                tasks[dep] >> tasks[step]
        for step in template.finally_steps:
            tasks[step].as_teardown(setups=begin)
            for r in regular:
                r >> tasks[step]
        finish = OpenJDFinishOperator(task_id=FINISH_TASK_ID, retries=0, **store_args)
        for t in tasks.values():
            t >> finish
        finish.as_teardown(setups=begin, on_failure_fail_dagrun=True)
    return dag


def _caller_folder() -> Path:
    """The folder of the file that called ``dag_from_template`` (the DAG file)."""
    frame = sys._getframe(2)
    filename = frame.f_code.co_filename
    if filename.startswith("<"):
        return Path.cwd()
    return Path(filename).resolve().parent
