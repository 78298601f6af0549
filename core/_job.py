"""A job made from a CHECKPOINT template, and the framework-neutral plan of the tasks to run.

openjd-model does the job creation (parameter preprocessing, ``create_job``), parameter spaces
(``StepParameterSpaceIterator``, which also balances chunks) and range expressions
(``IntRangeExpr``). This module adds what CHECKPOINT needs on top: a stable identity for every
task, and the plan of a resumed step (seed 000, "Semantics"): tasks that finished are not run
again, checkpointed tasks run ``onCheckpointResume``, and the frames of a chunk that were not
reported complete run through ``onRun`` (split into contiguous pieces where the chunk parameter's
``rangeConstraint`` is CONTIGUOUS).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from openjd.model import (
    DecodeValidationError,
    EnvironmentTemplate,
    IntRangeExpr,
    Job,
    JobParameterValues,
    ParameterValue,
    ParameterValueType,
    StepParameterSpaceIterator,
    create_job,
    create_job_with_symbol_tables,
    decode_environment_template,
    preprocess_job_parameters,
)
from openjd.sessions import PathMappingRule

from ._chunks import AdaptiveChunker, group_key, is_adaptive
from ._errors import TemplateError
from ._inputs import decode_json, load_document, read_input_file
from ._records import CheckpointData, TaskRecord
from ._template import (
    JOB_STATUS_PARAMETER,
    MODEL_EXTENSIONS,
    WRAP_NEEDS_EXPR,
    CheckpointJobTemplate,
    canonical_json,
    int64_problems,
    load_template,
    sha256_hex,
)

_INT64 = (-(2**63), 2**63 - 1)
"""OpenJD INT values are 64-bit (Template Schemas 2.3); openjd-model 0.14 does not check it."""
_INT_TEXT = re.compile(r"[-+]?[0-9]+")
"""How an INT value is written (Template Schemas 2.3: a base-10 integer)."""

MAX_TASKS_PER_STEP = 1_000_000
"""The most tasks (chunks, for a chunked step) a step's parameter space may define, and the most
frames a CHUNK[INT] parameter may hold. Planning a step builds every task it runs (about 20 s and
0.7 GB for a million), so a larger space is refused when the job is prepared
(docs/decisions.md, "Inputs")."""

__all__ = (
    "MAX_TASKS_PER_STEP",
    "PreparedJob",
    "TaskSpec",
    "load_environment_template",
    "framework_parameter_values",
    "load_path_mapping_rules",
    "plain_value",
    "prepare_job",
)


@dataclass(frozen=True)
class TaskSpec:
    """One task to run: the framework-neutral operation an adapter maps onto its own task.

    Attributes:
        step_name: the step's name.
        task_key: identity of the task's record in the store (canonical JSON of its parameter
            values, with ``#<frames>`` for the remaining piece of an interrupted chunk).
        parameters: the task parameter values to run with (name -> openjd ``ParameterValue``).
        record_parameters: the values its record was created with (differ from ``parameters``
            when a checkpointed chunk resumes with fewer frames).
        resume: the checkpoint to resume from with ``onCheckpointResume``; None runs ``onRun``.
        chunk_parameter: the step's CHUNK[INT] parameter name, or None.
    """

    step_name: str
    task_key: str
    parameters: dict[str, ParameterValue]
    record_parameters: dict[str, ParameterValue]
    resume: CheckpointData | None = None
    chunk_parameter: str | None = None

    @property
    def chunk_frames(self) -> frozenset[int]:
        if self.chunk_parameter is None:
            return frozenset()
        return frozenset(IntRangeExpr.from_str(str(self.parameters[self.chunk_parameter].value)))

    def describe(self, values: Mapping[str, Any] | None = None) -> str:
        """``Step[Name=value, ...]`` with the task's parameters in order, each value from
        ``values`` where it holds one (default: the values it runs with)."""
        if not self.parameters:
            return self.step_name
        given = values or {}
        inner = ", ".join(f"{k}={given.get(k, v.value)}" for k, v in self.parameters.items())
        return f"{self.step_name}[{inner}]"

    @property
    def label(self) -> str:
        """A stable, readable name: ``Render[Frame=1-4]`` (the step name for a lone task)."""
        return self.describe()

    @property
    def whole_label(self) -> str:
        """The label of the task this spec runs all or part of: for the rest of an interrupted
        chunk (``Render[Frame=7-10]``, resumed from its checkpoint or run by its unfinished
        frames, task key ``<key>#<frames>``), the whole chunk's (``Render[Frame=1-10]``)."""
        values: dict[str, Any] = {k: v.value for k, v in self.record_parameters.items()}
        key, sep, _frames_part = self.task_key.partition("#")
        if sep:
            try:
                values = dict(json.loads(key))
            except (ValueError, TypeError):
                return self.label
        return self.describe(values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable description (an XCom value, a Prefect task parameter); the
        reverse of ``from_dict``."""
        return {
            "step": self.step_name,
            "task_key": self.task_key,
            "label": self.label,
            "parameters": params_to_record(self.parameters),
            "record_parameters": params_to_record(self.record_parameters),
            "resume": self.resume.model_dump(mode="json") if self.resume else None,
            "chunk_parameter": self.chunk_parameter,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        """Rebuild a task from ``to_dict()``'s output, in any process.

        Raises:
            ValueError: the description is malformed (names the field).
        """
        try:
            resume = data.get("resume")
            return cls(
                step_name=str(data["step"]),
                task_key=str(data["task_key"]),
                parameters=_from_record(data["parameters"]),
                record_parameters=_from_record(data["record_parameters"]),
                resume=CheckpointData.model_validate(resume) if resume else None,
                chunk_parameter=data.get("chunk_parameter"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a task description: {type(exc).__name__}: {exc}") from None


@dataclass
class PreparedJob:
    """A job ready to run: template, job parameter values, the openjd-model ``Job``.

    Attributes:
        template: the validated template.
        job: the openjd-model ``Job`` (``create_job``).
        parameter_values: the preprocessed job parameter values.
        environments: external environment templates, entered before the job's own.
        path_mapping_rules: openjd-sessions ``PathMappingRule``s applied to PATH values.
        job_key: the job's identity in the store: sha256 of the template's (raw) name.
    """

    template: CheckpointJobTemplate
    job: Job
    parameter_values: JobParameterValues
    environments: list[EnvironmentTemplate] = field(default_factory=list)
    path_mapping_rules: list[PathMappingRule] = field(default_factory=list)
    job_key: str = ""
    environment_paths: list[str] = field(default_factory=list)
    """The external environment template files, as absolute paths (kept with the run)."""
    job_scope: dict[str, Any] = field(default_factory=dict)
    """EXPR (RFC 0005): the job-scope symbols openjd-model resolved at job creation
    (``Param.*``, ``RawParam.*``, ``Job.Name``), as typed ``openjd.expr`` values; the base of
    every job and external environment's symbol table. Empty without EXPR."""
    step_scopes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """EXPR: per step name, the job scope plus ``Step.Name`` and the step's template-scope
    ``let`` bindings (``create_job_with_symbol_tables``); the base of the step's actions."""

    @property
    def uses_expr(self) -> bool:
        """The template or an external environment template declares EXPR."""
        if "EXPR" in self.template.extensions:
            return True
        return any("EXPR" in (getattr(e, "extensions", None) or []) for e in self.environments)

    @property
    def parameters(self) -> dict[str, str]:
        """Job parameter values as plain strings (name -> value), each written as
        ``prepare_job`` reads it back (``_parameter_text``): a list (EXPR's ``LIST[...]``
        types) as JSON (``["a", "b"]``; Python's ``str`` of a list is not JSON), a bool as
        ``true``/``false``, anything else as its text."""
        return {
            k: _parameter_text(v.value)
            for k, v in sorted(self.parameter_values.items())
            if k != JOB_STATUS_PARAMETER
        }

    def step(self, name: str) -> Any:
        for step in self.job.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def step_order(self) -> list[str]:
        """Step names in an order that respects ``dependencies`` (template order otherwise)."""
        names = [s.name for s in self.job.steps]
        deps = {s.name: [d.dependsOn for d in (s.dependencies or [])] for s in self.job.steps}
        done: list[str] = []
        remaining = list(names)
        while remaining:
            for name in remaining:
                if all(d in done for d in deps[name]):
                    done.append(name)
                    remaining.remove(name)
                    break
            else:  # pragma: no cover - openjd-model refuses cycles
                raise TemplateError([f"steps: dependency cycle among {remaining}"])
        return done

    def dependencies(self, step_name: str) -> list[str]:
        return [d.dependsOn for d in (self.step(step_name).dependencies or [])]

    def chunk_parameter(self, step_name: str) -> tuple[str | None, bool]:
        """The step's CHUNK[INT] parameter name and whether its chunks must be CONTIGUOUS."""
        space = self.step(step_name).parameterSpace
        if space is None:
            return None, False
        for name, definition in space.taskParameterDefinitions.items():
            if str(getattr(definition.type, "value", definition.type)) == "CHUNK[INT]":
                chunks = getattr(definition, "chunks", None)
                constraint = getattr(chunks, "rangeConstraint", None)
                contiguous = str(getattr(constraint, "value", constraint)) == "CONTIGUOUS"
                return name, contiguous
        return None, False

    def iter_tasks(self, step_name: str) -> Iterable[dict[str, ParameterValue]]:
        space = self.step(step_name).parameterSpace
        if space is None:
            yield {}
            return
        yield from StepParameterSpaceIterator(space=space)

    def new_task_record(self, spec: TaskSpec, run_id: str, **fields: Any) -> TaskRecord:
        """A fresh record of task ``spec`` in run ``run_id``: its identity (job key, step, task
        key, parameters, chunk parameter, the step's hash) from the job, the rest from
        ``fields`` (any ``TaskRecord`` field: status, attempts, frames, message)."""
        return TaskRecord(
            job_key=self.job_key,
            run_id=run_id,
            step=spec.step_name,
            task_key=spec.task_key,
            parameters=params_to_record(spec.record_parameters),
            chunk_parameter=spec.chunk_parameter,
            step_hash=self.template.step_hashes.get(spec.step_name, ""),
            **fields,
        )

    def plan_step(
        self,
        step_name: str,
        records: Iterable[TaskRecord] = (),
        *,
        tasks: Iterable[Mapping[str, ParameterValue]] | None = None,
    ) -> list[TaskSpec]:
        """The tasks of a step still to run, given the records of earlier attempts.

        ``tasks`` limits the plan to those original tasks (parameter sets of the step's
        parameter space; default: all of it) and ``records`` should then be theirs: a scheduler
        that maps over a step's tasks in groups plans one group in time proportional to its
        size, not the step's.

        Rules (seed 000, "Semantics", and docs/decisions.md):
          1. a task whose record succeeded is not run again;
          2. a record with a checkpoint, in a step with ``onCheckpointResume``, resumes: its chunk
             keeps the frames not reported complete (for CONTIGUOUS chunks, the contiguous span
             from the first to the last of them);
          3. any other task runs ``onRun``; a chunk runs only its frames not reported complete,
             as one task, or one task per contiguous run of frames where CONTIGUOUS is required.
        """
        chunk_param, contiguous = self.chunk_parameter(step_name)
        resumable = self.template.is_resumable(step_name)
        by_key = {r.task_key: r for r in records if r.step == step_name}

        def group(params: Mapping[str, Any]) -> str:
            return canonical_json({k: _value(v) for k, v in params.items() if k != chunk_param})

        done: dict[str, set[int]] = {}
        for rec in by_key.values():
            if chunk_param is None:
                continue
            frames = done.setdefault(group(rec.parameters), set())
            frames.update(rec.completed_frames)
            if rec.status.value == "succeeded":
                frames.update(_frames(rec.parameters[chunk_param]["value"]))

        specs: list[TaskSpec] = []
        claimed: dict[str, set[int]] = {}
        # 2. checkpointed tasks resume.
        for rec in sorted(by_key.values(), key=lambda r: r.task_key):
            if rec.status.value == "succeeded" or rec.checkpoint is None or not resumable:
                continue
            params = _from_record(rec.parameters)
            if chunk_param is not None:
                g = group(rec.parameters)
                remaining = _frames(rec.parameters[chunk_param]["value"]) - done.get(g, set())
                if not remaining:
                    continue
                if contiguous:
                    remaining = set(range(min(remaining), max(remaining) + 1))
                claimed.setdefault(g, set()).update(remaining)
                params = dict(params)
                params[chunk_param] = ParameterValue(
                    type=ParameterValueType.CHUNK_INT, value=_expr(remaining)
                )
            specs.append(
                TaskSpec(
                    step_name=step_name,
                    task_key=rec.task_key,
                    parameters=params,
                    record_parameters=_from_record(rec.parameters),
                    resume=rec.checkpoint,
                    chunk_parameter=chunk_param,
                )
            )
        resumed_keys = {s.task_key for s in specs}

        # 1 and 3: the parameter space, less what is done or claimed.
        space: Iterable[Mapping[str, ParameterValue]] = (
            self.iter_tasks(step_name) if tasks is None else tasks
        )
        for given in space:
            params = dict(given)
            key = task_key_of(params)
            prior = by_key.get(key)
            if key in resumed_keys or (prior is not None and prior.status.value == "succeeded"):
                continue
            if chunk_param is None:
                specs.append(TaskSpec(step_name, key, dict(params), dict(params)))
                continue
            g = group({k: _value(v) for k, v in params.items()})
            frames = _frames(str(params[chunk_param].value))
            remaining = frames - done.get(g, set()) - claimed.get(g, set())
            if not remaining:
                continue
            if remaining == frames:
                specs.append(
                    TaskSpec(step_name, key, dict(params), dict(params), None, chunk_param)
                )
                continue
            pieces = _contiguous_runs(remaining) if contiguous else [remaining]
            for piece in pieces:
                p = dict(params)
                p[chunk_param] = ParameterValue(
                    type=ParameterValueType.CHUNK_INT, value=_expr(piece)
                )
                specs.append(TaskSpec(step_name, f"{key}#{_expr(piece)}", p, p, None, chunk_param))
        return specs

    def adaptive_plan(
        self, step_name: str, records: Iterable[TaskRecord] = ()
    ) -> tuple[list[TaskSpec], Any] | None:
        """For a step whose CHUNK[INT] parameter has ``targetRuntimeSeconds`` (TASK_CHUNKING):
        the checkpointed chunks that resume (``plan_step``'s rule 2), and an
        ``AdaptiveChunker`` that hands out every other frame not yet reported, in chunks whose
        size follows the measured time per frame. None for any other step.

        Frames are counted per frame, so a resume runs exactly the frames not yet reported,
        whatever the chunk boundaries of earlier attempts were.
        """
        chunk_param, _contiguous = self.chunk_parameter(step_name)
        if chunk_param is None or not is_adaptive(self.step(step_name).parameterSpace):
            return None
        records = [r for r in records if r.step == step_name]
        resumed = [s for s in self.plan_step(step_name, records) if s.resume is not None]
        done: dict[str, set[int]] = {}
        for rec in records:
            frames = done.setdefault(group_key(rec.parameters, chunk_param), set())
            frames.update(rec.completed_frames)
            if rec.status.value == "succeeded":
                frames.update(_frames(rec.parameters[chunk_param]["value"]))
        for spec in resumed:
            done.setdefault(group_key(spec.parameters, chunk_param), set()).update(
                spec.chunk_frames
            )
        chunker = AdaptiveChunker.for_step(self, step_name, done=done)
        return resumed, chunker

    def task_count(self, step_name: str) -> int:
        """How many tasks (chunks, for a chunked step) the step's parameter space defines: the
        length of ``plan_step(step_name)`` with no records."""
        space = self.step(step_name).parameterSpace
        if space is None:
            return 1
        walker = StepParameterSpaceIterator(space=space)
        try:
            return len(walker)
        except ValueError:  # adaptive chunking: no length, count them
            return sum(1 for _ in walker)

    def original_tasks(
        self, step_name: str, start: int = 0, stop: int | None = None
    ) -> list[TaskSpec]:
        """``plan_step(step_name)[start:stop]`` (the step's fresh tasks, with no records)
        without building the others: a scheduler that maps over a step of thousands of tasks
        in groups passes each group a range of indexes, not the tasks, and each group builds
        its own in time proportional to its size (openjd-model's random access into the
        parameter space; a step with adaptive chunking, which has none, is walked instead).

        Args:
            start, stop: indexes into the step's task list (0-based, ``stop`` excluded, None:
                to the end); not negative.

        Raises:
            KeyError: no such step.
        """
        space = self.step(step_name).parameterSpace
        if space is None:
            return [self.spec_for(step_name, {})][start:stop]
        walker = StepParameterSpaceIterator(space=space)
        try:
            first, last, _ = slice(start, stop).indices(len(walker))
            chosen = [walker[i] for i in range(first, last)]
        except (ValueError, RuntimeError):  # adaptive chunking: no random access
            chosen = list(itertools.islice(walker, start, stop))
        return [self.spec_for(step_name, params) for params in chosen]

    def spec_for(self, step_name: str, params: Mapping[str, ParameterValue]) -> TaskSpec:
        """A fresh task (``onRun``) of ``step_name`` with these task parameter values."""
        chunk_param, _ = self.chunk_parameter(step_name)
        return TaskSpec(
            step_name, task_key_of(params), dict(params), dict(params), None, chunk_param
        )


def task_key_of(params: Mapping[str, ParameterValue]) -> str:
    """A task's identity: canonical JSON of its parameter values (``{}`` for a lone task)."""
    return canonical_json({k: str(v.value) for k, v in params.items()})


def params_to_record(params: Mapping[str, ParameterValue]) -> dict[str, dict[str, str]]:
    return {k: {"type": v.type.value, "value": str(v.value)} for k, v in params.items()}


def _from_record(params: Mapping[str, Mapping[str, str]]) -> dict[str, ParameterValue]:
    return {
        k: ParameterValue(type=ParameterValueType(v["type"]), value=v["value"])
        for k, v in params.items()
    }


def _value(v: Any) -> str:
    if isinstance(v, ParameterValue):
        return str(v.value)
    if isinstance(v, Mapping):
        return str(v.get("value"))
    return str(v)


def _frames(expr: str) -> set[int]:
    return set(IntRangeExpr.from_str(str(expr)))


def _expr(frames: Iterable[int]) -> str:
    return str(IntRangeExpr.from_list(sorted(frames)))


def _contiguous_runs(frames: set[int]) -> list[set[int]]:
    runs: list[set[int]] = []
    current: list[int] = []
    for f in sorted(frames):
        if current and f != current[-1] + 1:
            runs.append(set(current))
            current = []
        current.append(f)
    if current:
        runs.append(set(current))
    return runs


def load_environment_template(path: str | Path) -> EnvironmentTemplate:
    """Read and validate an OpenJD environment template file (YAML or JSON).

    Raises:
        TemplateError: unreadable or invalid, naming the file.
    """
    p = Path(path)
    text = read_input_file(p, "environment template")
    obj = load_document(text, json_format=p.suffix.lower() == ".json", source=p)
    problems = int64_problems(obj)  # openjd-model 0.14 takes INT values past int64
    if problems:
        raise TemplateError(problems, source=str(p))
    try:
        env = decode_environment_template(
            template=obj, supported_extensions=sorted(MODEL_EXTENSIONS)
        )
    except DecodeValidationError as exc:
        raise TemplateError([str(exc)], source=str(p)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise TemplateError([f"not a valid environment template: {exc}"], source=str(p)) from None
    declared = list(getattr(env, "extensions", None) or [])
    if "WRAP_ACTIONS" in declared and "EXPR" not in declared:
        raise TemplateError([f"extensions: {WRAP_NEEDS_EXPR}"], source=str(p))
    return env


def load_path_mapping_rules(
    source: str | Path | list[Any] | dict[str, Any],
) -> list[PathMappingRule]:
    """Path mapping rules from a file (JSON, or YAML when it is named ``.yaml``/``.yml``) or a
    decoded object: a list of rules, or ``{"version": "pathmapping-1.0", "path_mapping_rules":
    [...]}`` as openjd-cli takes.

    Raises:
        TemplateError: the rules are unreadable or invalid.
    """
    try:
        obj: Any = source
        if isinstance(source, (str, Path)):
            text = read_input_file(source, "path mapping rules file")
            is_yaml = Path(source).suffix.lower() in (".yaml", ".yml")
            obj = load_document(text, json_format=not is_yaml, source=source)
        if isinstance(obj, dict):
            if obj.get("version") != "pathmapping-1.0":
                raise ValueError(
                    f"'version' must be 'pathmapping-1.0' (got {obj.get('version')!r})"
                )
            obj = obj.get("path_mapping_rules")
            if not isinstance(obj, list):
                raise ValueError("'path_mapping_rules' must be a list of rules")
        if not isinstance(obj, list):
            raise ValueError(
                "expected a list of rules, or an object with 'version' and 'path_mapping_rules'"
            )
        return [PathMappingRule.from_dict(rule=r) for r in obj]
    except TemplateError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:
        where = str(source) if isinstance(source, (str, Path)) else None
        raise TemplateError([f"path mapping rules: {exc}"], source=where) from None


def _parameter_text(value: Any) -> str:
    """One job parameter value as ``prepare_job`` reads it: a list as JSON, a bool as
    ``true``/``false``, anything else as its text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return json.dumps([plain_value(v) for v in value])
    return str(value)


def plain_value(value: Any) -> Any:
    """A parameter value as plain JSON data: a ``Decimal`` (openjd-model's numbers in
    templates) as an int when it is whole, else a float; lists element by element."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def framework_parameter_values(
    template: CheckpointJobTemplate, values: Mapping[str, Any]
) -> dict[str, str]:
    """Job parameter values as a framework gives them (an Airflow DAG run's params, a Prefect
    flow run's parameters), ready for ``prepare_job``: values that are None are left out (the
    default applies); a value equal to its default is left out too, so the run keeps the
    template's default exactly as the CLI does (a framework fills every default in): a
    relative ``PATH`` default is taken from the template's folder, not the current directory,
    and a ``FLOAT`` default written ``40`` stays ``40``, not Python's ``40.0``; lists are
    written as JSON and bools as ``true``/``false``.

    Args:
        values: name -> value (str, int, float, bool, or a list of them).

    Returns:
        name -> value text. Names the template does not define are kept, for ``prepare_job``
        to refuse by name.
    """
    defaults: dict[str, Any] = {}
    kind_of: dict[str, str] = {}
    for definition in template.template.parameterDefinitions or []:
        kind = str(getattr(definition.type, "value", definition.type))
        kind_of[definition.name] = kind
        default = getattr(definition, "default", None)
        if default is not None:
            defaults[definition.name] = plain_value(default)
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in defaults:
            plain = plain_value(value)
            if plain == defaults[name] or str(plain) == str(defaults[name]):
                continue
            if kind_of.get(name) == "FLOAT" and _same_float(plain, defaults[name]):
                continue
        out[name] = _parameter_text(value)
    return out


def _same_float(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def prepare_job(
    template: CheckpointJobTemplate | str | Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    environments: Iterable[EnvironmentTemplate | str | Path] = (),
    path_mapping_rules: list[PathMappingRule] | None = None,
    current_working_dir: Path | None = None,
) -> PreparedJob:
    """Create the job: validate job parameter values and instantiate the template.

    Args:
        template: a loaded template, or a template file to load.
        parameters: job parameter values, name -> value (strings, ints, floats, bools, or
            lists of them for EXPR's list types; a list is passed on as JSON).
        environments: external environment templates (or files), entered before the job's.
        path_mapping_rules: applied to PATH parameter values at run time.
        current_working_dir: where relative PATH values are taken from (default: cwd).

    Raises:
        TemplateError: invalid template or parameter values, naming the parameter.
    """
    tmpl = template if isinstance(template, CheckpointJobTemplate) else load_template(template)
    # openjd-model 0.14 exports EnvironmentTemplate as a typing alias: test for paths instead.
    env_sources = list(environments)
    envs = [load_environment_template(e) if isinstance(e, (str, Path)) else e for e in env_sources]
    narrowing = _widening_problems(tmpl, envs, env_sources)
    if narrowing:
        raise TemplateError(narrowing, source=str(tmpl.source) if tmpl.source else None)
    template_dir = tmpl.source.parent if tmpl.source else Path.cwd()
    cwd = (current_working_dir or Path.cwd()).resolve()
    raw = {k: _parameter_text(v) for k, v in (parameters or {}).items()}
    uses_expr = "EXPR" in tmpl.extensions or any(
        "EXPR" in (getattr(e, "extensions", None) or []) for e in envs
    )
    not_lists = _list_value_problems(tmpl, raw) + _long_int_problems(tmpl, envs, raw)
    if not_lists:
        raise TemplateError(not_lists, source=str(tmpl.source) if tmpl.source else None)
    given = _normalize_given_paths(tmpl, envs, raw, cwd, keep_uris=uses_expr)
    try:
        values = preprocess_job_parameters(
            job_template=tmpl.template,
            job_parameter_values=given,
            job_template_dir=template_dir.resolve(),
            current_working_dir=cwd,
            environment_templates=envs or None,
        )
        values = _join_list_paths(tmpl, raw, values, template_dir.resolve(), cwd)
        job_scope: dict[str, Any] = {}
        step_scopes: dict[str, dict[str, Any]] = {}
        if uses_expr:
            created = create_job_with_symbol_tables(
                job_template=tmpl.template,
                job_parameter_values=values,
                environment_templates=envs or None,
            )
            job = created.job
            job_scope = _scope_entries(created.job_symbol_table)
            step_scopes = {k: _scope_entries(v) for k, v in created.step_symbol_tables.items()}
        else:  # without EXPR there are no typed scopes, and openjd.expr need not be loaded
            job = create_job(
                job_template=tmpl.template,
                job_parameter_values=values,
                environment_templates=envs or None,
            )
    except (DecodeValidationError, ValueError, KeyError) as exc:
        lines = _true_missing(tmpl, envs, given, [ln for ln in str(exc).splitlines() if ln.strip()])
        raise TemplateError(
            [f"job parameters: {line}" for line in lines] or [str(exc)],
            source=str(tmpl.source) if tmpl.source else None,
        ) from None
    problems: list[str] = []
    for name, value in sorted(values.items()):
        if value.type != ParameterValueType.INT:
            continue
        if not _INT_TEXT.fullmatch(str(value.value)):
            # Python's int() (and so openjd-model 0.14) takes '1_000', ' 12' and non-ASCII
            # digits; a task would get the text as typed, and openjd run fails on it.
            problems.append(
                f"job parameters: {name}: {str(value.value)!r} is not an integer; an INT value "
                "is written with the digits 0-9 and an optional sign, nothing else"
            )
        elif not _INT64[0] <= int(value.value) <= _INT64[1]:
            problems.append(
                f"job parameters: {name}: {value.value} is outside the 64-bit integer range"
            )
    problems += _value_problems(values, [tmpl.document, *(_dump(e) for e in envs)])
    problems += _task_count_problems(job)
    if problems:
        raise TemplateError(problems, source=str(tmpl.source) if tmpl.source else None)
    return PreparedJob(
        template=tmpl,
        job=job,
        parameter_values=values,
        environments=envs,
        environment_paths=[
            str(Path(e).resolve()) for e in env_sources if isinstance(e, (str, Path))
        ],
        path_mapping_rules=list(path_mapping_rules or []),
        job_key=sha256_hex(canonical_json({"name": tmpl.name}))[:16],
        job_scope=job_scope,
        step_scopes=step_scopes,
    )


_NARROWED: tuple[tuple[str, Any, str], ...] = (
    # (constraint, whether a later value is no looser than the earlier one, in words)
    ("minValue", lambda later, earlier: later >= earlier, "at least"),
    ("maxValue", lambda later, earlier: later <= earlier, "at most"),
    ("minLength", lambda later, earlier: later >= earlier, "at least"),
    ("maxLength", lambda later, earlier: later <= earlier, "at most"),
)


def _constraint_value(value: Any) -> Any:
    """A constraint's value, comparable across definitions (INT and FLOAT bounds as Decimal,
    so that ``10`` and ``"10"`` and ``10.0`` compare equal)."""
    if isinstance(value, bool) or value is None:
        return value
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)


def _admits(key: str, bound: Any, value: Any) -> bool:
    """Whether a bound (``minValue``, ``maxLength``, ...) admits an allowed value."""
    if key in ("minLength", "maxLength"):
        measure: Any = Decimal(len(str(value)))
    else:
        measure = _constraint_value(value)
        if not isinstance(measure, Decimal):
            return True  # not a number: openjd-model judges it
    return bool(measure >= bound if key.startswith("min") else measure <= bound)


def _shown_values(values: list[str], limit: int = 5) -> str:
    more = f" and {len(values) - limit} more" if len(values) > limit else ""
    return ", ".join(repr(v) for v in values[:limit]) + more


def _widening_problems(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    sources: list[Any],
) -> list[str]:
    """Job parameter definitions that admit a value an earlier template's definition refused.

    Template Schemas 1.2.1: the definitions of one job parameter are processed in order, the
    external environment templates in the order given and then the job template, and each
    constraint may only become more constrained. Read as sets of admissible values: what a later
    definition admits (with the constraints it leaves out taken from the earlier ones) must be
    admitted by the earlier ones too. So a later ``allowedValues`` must be a subset of the
    earlier, and each of its values must meet the earlier bounds (then a looser bound beside it
    admits nothing more); without a list of allowed values, a later ``minValue``/``minLength``
    may be no lower and ``maxValue``/``maxLength`` no higher. openjd-model 0.14 intersects the
    constraints instead, so a job template that widens an environment's range is accepted
    there; here it is refused, naming both definitions. (The type must be the same too:
    openjd-model refuses a change of type.)
    """
    chain: dict[str, list[tuple[str, Any]]] = {}
    for env, source in zip(envs, sources, strict=True):
        env_name = getattr(getattr(env, "environment", None), "name", "?")
        label = (
            f"environment template {str(source)!r} ({env_name})"
            if isinstance(source, (str, Path))
            else f"environment template {env_name!r}"
        )
        for i, definition in enumerate(getattr(env, "parameterDefinitions", None) or []):
            where = f"{label}, parameterDefinitions[{i}]"
            chain.setdefault(str(definition.name), []).append((where, definition))
    job_label = f"job template {str(tmpl.source)!r}" if tmpl.source else "the job template"
    for i, definition in enumerate(getattr(tmpl.template, "parameterDefinitions", None) or []):
        where = f"{job_label}, parameterDefinitions[{i}]"
        chain.setdefault(str(definition.name), []).append((where, definition))
    problems: list[str] = []
    rule = "a template processed later may only narrow a job parameter's constraints"
    for name, definitions in chain.items():
        if len(definitions) < 2:
            continue
        bounds: dict[str, tuple[Any, Any, str]] = {}  # key -> (value, as written, where)
        allowed: tuple[list[Any], str] | None = None  # the allowed values so far, where set
        for where, definition in definitions:
            numeric = str(getattr(definition.type, "value", definition.type)) in ("INT", "FLOAT")

            def norm(value: Any, numeric: bool = numeric) -> Any:
                return _constraint_value(value) if numeric else str(value)

            own = {
                key: (_constraint_value(raw), raw)
                for key, *_ in _NARROWED
                if (raw := getattr(definition, key, None)) is not None
            }
            own_allowed = list(getattr(definition, "allowedValues", None) or [])
            candidates = own_allowed or (allowed[0] if allowed else [])
            if bounds or allowed:
                if candidates:  # a finite set: each value its own constraints admit must have
                    # been admitted before (a value it lists must not be one an earlier bound
                    # refused, though openjd-model's merge would drop it)
                    admitted = [
                        v for v in candidates if all(_admits(k, b, v) for k, (b, _r) in own.items())
                    ]
                    if allowed and own_allowed:
                        earlier = {norm(a) for a in allowed[0]}
                        extra = [str(v) for v in admitted if norm(v) not in earlier]
                        if extra:
                            problems.append(
                                f"job parameter {name}: {where}: allowedValues "
                                f"{[str(a) for a in own_allowed]} widens the allowedValues "
                                f"{[str(a) for a in allowed[0]]} of {allowed[1]} (adds "
                                f"{_shown_values(extra)}); {rule} (allowedValues a subset; "
                                "Template Schemas 1.2.1)"
                            )
                    for key, (bound, raw_bound, bound_where) in bounds.items():
                        outside = [str(v) for v in admitted if not _admits(key, bound, v)]
                        if outside:
                            subject = (
                                f"{key} {own[key][1]}"
                                if key in own
                                else f"allowedValues {[str(a) for a in own_allowed]}"
                            )
                            problems.append(
                                f"job parameter {name}: {where}: its {subject} admits "
                                f"{_shown_values(outside)}, outside the {key} {raw_bound} of "
                                f"{bound_where}; {rule} (Template Schemas 1.2.1)"
                            )
                else:  # no list of values anywhere: compare the bounds themselves
                    for key, narrower, words in _NARROWED:
                        if key in own and key in bounds:
                            value, raw = own[key]
                            earlier, raw_earlier, earlier_where = bounds[key]
                            if not narrower(value, earlier):
                                problems.append(
                                    f"job parameter {name}: {where}: {key} {raw} widens the "
                                    f"{key} {raw_earlier} of {earlier_where}; {rule} ({key} "
                                    f"{words} {raw_earlier}; Template Schemas 1.2.1)"
                                )
            # the merged constraints so far (the tighter of each, as openjd-model merges them)
            for key, narrower, _words in _NARROWED:
                if key in own and (key not in bounds or narrower(own[key][0], bounds[key][0])):
                    bounds[key] = (own[key][0], own[key][1], where)
            if own_allowed:
                if allowed:
                    earlier = {norm(a) for a in allowed[0]}
                    allowed = ([a for a in own_allowed if norm(a) in earlier], where)
                else:
                    allowed = (own_allowed, where)
    return problems


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


_MISSING_LINE = "Values missing for required job parameters: "


def _true_missing(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    given: Mapping[str, str],
    lines: list[str],
) -> list[str]:
    """openjd-model 0.14's refusal lines, with its "Values missing for required job
    parameters" line keeping only the parameters that are missing: after one bad value it
    names every parameter, those given and those with a default included."""
    out: list[str] = []
    for line in lines:
        if line.startswith(_MISSING_LINE) and len(lines) > 1:
            with_default = {
                d.name
                for t in [tmpl.template, *envs]
                for d in (getattr(t, "parameterDefinitions", None) or [])
                if getattr(d, "default", None) is not None
            }
            names = [n.strip() for n in line[len(_MISSING_LINE) :].split(",")]
            missing = [n for n in names if n and n not in given and n not in with_default]
            if not missing:
                continue
            line = _MISSING_LINE + ", ".join(missing)
        out.append(line)
    return out


def _long_int_problems(
    tmpl: CheckpointJobTemplate, envs: list[Any], raw: Mapping[str, str]
) -> list[str]:
    """A given INT value of more digits than Python converts, named (openjd-model 0.14 says it
    "must an integer", echoing every digit)."""
    int_names = {
        str(d.name)
        for source in (tmpl.template, *envs)
        for d in (getattr(source, "parameterDefinitions", None) or [])
        if str(getattr(d.type, "value", d.type)) == "INT"
    }
    problems: list[str] = []
    for name in sorted(int_names & set(raw)):
        text = raw[name].strip()
        if _INT_TEXT.fullmatch(text) and len(text) > 19:
            try:
                int(text)
            except ValueError:
                problems.append(
                    f"job parameters: {name}: an integer of {len(text.lstrip('+-')):,} digits "
                    "is outside the 64-bit integer range"
                )
    return problems


def _list_value_problems(tmpl: CheckpointJobTemplate, raw: Mapping[str, str]) -> list[str]:
    """A given value of a list parameter (EXPR's ``LIST[...]`` types) that is not a JSON list,
    named with how to write one. openjd-model 0.14 says only that it "is not valid JSON", and
    then that every required parameter is missing, including those with defaults."""
    problems: list[str] = []
    for definition in tmpl.template.parameterDefinitions or []:
        kind = str(getattr(definition.type, "value", definition.type))
        value = raw.get(definition.name)
        if not kind.startswith("LIST[") or value is None:
            continue
        try:
            parsed = decode_json(value)
        except TemplateError as exc:  # an element too long to read, named by its index
            problems += [f"job parameters: {definition.name}{p}" for p in exc.problems]
            continue
        except ValueError:
            parsed = None
        if not isinstance(parsed, list):
            example = {
                "LIST[INT]": "[1, 2, 3]",
                "LIST[FLOAT]": "[0.5, 1.0]",
                "LIST[BOOL]": "[true, false]",
                "LIST[LIST[INT]]": "[[1, 2], [3]]",
            }.get(kind, '["a", "b"]')
            problems.append(
                f"job parameters: {definition.name}: {value!r} is not a {kind} value: write a "
                f"list as JSON, e.g. -p '{definition.name}={example}'"
            )
    return problems


def _normalize_given_paths(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    raw: Mapping[str, str],
    cwd: Path,
    *,
    keep_uris: bool,
) -> dict[str, str]:
    """The given job parameter values with each relative PATH value joined with the current
    directory and normalized lexically (Template Schemas 2.2): ``a/../b``, ``./x``, ``x/`` and
    ``x//y`` become ``<cwd>/b``, ``<cwd>/x``, ``<cwd>/x`` and ``<cwd>/x/y``, as a default is
    normalized against the template's folder. openjd-model 0.14 joins without collapsing
    ``..``; joining here first means its constraint checks see the normalized value. The empty
    value, absolute values and (under EXPR) URIs stay as they are."""
    path_names = {
        str(d.name)
        for source in (tmpl.template, *envs)
        for d in (getattr(source, "parameterDefinitions", None) or [])
        if str(getattr(d.type, "value", d.type)) == "PATH"
    }
    out = dict(raw)
    for name in path_names & set(raw):
        value = raw[name]
        if value == "" or os.path.isabs(value) or (keep_uris and _URI.match(value)):
            continue
        out[name] = os.path.normpath(os.path.join(cwd, value))
    return out


def _join_list_paths(
    tmpl: CheckpointJobTemplate,
    raw: Mapping[str, str],
    values: JobParameterValues,
    template_dir: Path,
    cwd: Path,
) -> JobParameterValues:
    """Each element of a LIST[PATH] value follows the PATH rules (EXPR, Template Schemas 2.12
    with 2.2), which openjd-model 0.14 applies to PATH only: an element of a default is joined
    with the template's folder, must be relative and stay inside it, and ``item.allowedValues``
    is checked after the join; a relative element of a given value is joined with the current
    directory. URIs (``s3://...``) and empty elements stay as they are.

    Raises:
        ValueError: an element of a default is absolute, leaves the template's folder, or is
            not allowed.
    """
    out = dict(values)
    for definition in getattr(tmpl.template, "parameterDefinitions", None) or []:
        name = str(definition.name)
        value = values.get(name)
        if value is None or value.type != ParameterValueType.LIST_PATH:
            continue
        if not isinstance(value.value, list):
            continue
        joined: list[str] = []
        for element in (str(e) for e in value.value):
            if element == "" or _URI.match(element):
                joined.append(element)
            elif name in raw:
                joined.append(
                    element if os.path.isabs(element) else os.path.normpath(cwd / element)
                )
            elif os.path.isabs(element):
                raise ValueError(
                    f"The default value of LIST[PATH] parameter {name} holds the absolute path "
                    f"{element!r}. Default paths must be relative, and are joined to the job "
                    "template's directory."
                )
            else:
                path = os.path.normpath(template_dir / element)
                if not Path(path).is_relative_to(template_dir):
                    raise ValueError(
                        f"The default value of LIST[PATH] parameter {name} holds {element!r}, "
                        "a path outside of the template directory. Walking up from the template "
                        "directory is not permitted."
                    )
                joined.append(path)
        allowed = getattr(getattr(definition, "item", None), "allowedValues", None)
        if name not in raw and allowed:
            for element in joined:
                if element not in [str(a) for a in allowed]:
                    raise ValueError(
                        f"The default value of LIST[PATH] parameter {name} holds {element!r} "
                        f"(joined with the template's directory), which is not one of its "
                        f"item.allowedValues {[str(a) for a in allowed]}"
                    )
        out[name] = ParameterValue(type=value.type, value=joined)
    return out


def _scope_entries(table: Any) -> dict[str, Any]:
    """A ``SerializedSymbolTable`` from job creation as flat ``{name: ExprValue}`` entries in
    this host's path format, ready to seed a ``SymbolTable`` (as openjd-sessions 0.14
    ``Session._resolved_base_entries`` does)."""
    from openjd.expr import PathFormat

    host_format = PathFormat.WINDOWS if os.name == "nt" else PathFormat.POSIX
    engine = table.to_symtab(path_format=host_format)
    return {name: engine[name] for name in engine.symbols}


def _max_argument_bytes() -> int:
    """The longest one command-line argument or environment entry ``exec`` takes, in bytes
    (without its NUL): Linux's MAX_ARG_STRLEN (32 pages), elsewhere the whole of ARG_MAX."""
    try:
        arg_max = int(os.sysconf("SC_ARG_MAX"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        arg_max = 131072
    if sys.platform.startswith("linux"):
        arg_max = min(arg_max, 32 * int(os.sysconf("SC_PAGE_SIZE")))
    return arg_max - 1


def _dump(env: EnvironmentTemplate) -> Any:
    try:
        return env.model_dump(exclude_none=True)
    except AttributeError:  # pragma: no cover - not a pydantic model
        return {}


def _uses(documents: Iterable[Any], name: str) -> str | None:
    """Where a command, an argument or an environment variable of these documents refers to job
    parameter ``name`` (the first such field's path), or None."""
    ref = re.compile(r"\{\{\s*(?:Raw)?Param\." + re.escape(name) + r"\s*\}\}")
    stack: list[tuple[str, Any, bool]] = [("", d, False) for d in documents]
    while stack:
        path, node, in_command = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{key}" if path else str(key)
                stack.append((sub, value, in_command or key in ("command", "args", "variables")))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v, in_command) for i, v in enumerate(node))
        elif in_command and ref.search(str(node)):
            return path
    return None


def _value_problems(values: JobParameterValues, documents: list[Any]) -> list[str]:
    """Job parameter values no task could be given: a NUL byte (no argument, environment
    variable or path holds one), a FLOAT that is not a finite number (Template Schemas 2.4: a
    base-10 number), a value longer than one argument may be, where an action's command,
    arguments or environment variables use it."""
    problems: list[str] = []
    longest = _max_argument_bytes()
    for name, value in sorted(values.items()):
        text = str(value.value)
        if "\x00" in text:
            problems.append(
                f"job parameters: {name}: the value holds a NUL byte (\\0), which no command "
                "line, environment variable or path can carry"
            )
            continue
        if value.type == ParameterValueType.FLOAT:
            try:
                number = float(text)
            except ValueError:  # openjd-model has refused it already
                number = 0.0
            if math.isnan(number) or text.strip().lower().lstrip("+-") in ("inf", "infinity"):
                problems.append(
                    f"job parameters: {name}: {text!r} is not a number; a FLOAT value is a "
                    "finite base-10 number"
                )
            elif not math.isfinite(number):
                problems.append(
                    f"job parameters: {name}: {text} is outside the range of a 64-bit float "
                    f"(at most {sys.float_info.max:g} either way)"
                )
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > longest:
            where = _uses(documents, name)
            if where is not None:
                problems.append(
                    f"job parameters: {name}: the value is {size:,} bytes; {where} uses it, and "
                    f"one command-line argument or environment variable takes at most "
                    f"{longest:,} bytes on this system"
                )
    return problems


def _task_count_problems(job: Job) -> list[str]:
    """Each step whose parameter space is larger than ``MAX_TASKS_PER_STEP``, counted without
    building it: openjd-model's ``len()`` of a parameter space is arithmetic, but it expands a
    CHUNK[INT] parameter's frames into a list first, so those are counted from the range."""
    problems: list[str] = []
    for index, step in enumerate(job.steps):
        space = step.parameterSpace
        if space is None:
            continue
        where = f"steps[{index}] ({step.name})"
        override: int | None = None
        too_many_frames = False
        for name, definition in space.taskParameterDefinitions.items():
            if str(getattr(definition.type, "value", definition.type)) != "CHUNK[INT]":
                continue
            frames = len(definition.range)
            if frames > MAX_TASKS_PER_STEP:
                problems.append(
                    f"{where}: CHUNK[INT] parameter {name} has {frames:,} frames; the limit is "
                    f"{MAX_TASKS_PER_STEP:,}"
                )
                too_many_frames = True
            chunks = getattr(definition, "chunks", None)
            if chunks is not None:  # adaptive chunking has no length: count default-size chunks
                override = int(chunks.defaultTaskCount)
        if too_many_frames:
            continue
        count = len(StepParameterSpaceIterator(space=space, chunks_task_count_override=override))
        if count > MAX_TASKS_PER_STEP:
            problems.append(
                f"{where}: the parameter space has {count:,} tasks; the limit is "
                f"{MAX_TASKS_PER_STEP:,} tasks per step"
            )
    return problems
