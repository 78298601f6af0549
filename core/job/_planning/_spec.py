"""A task to run, and how it is named: ``TaskSpec`` (the framework-neutral unit an adapter maps
onto its own task), its identity in the store (``task_key_of``), its parameters as a record
holds them, and the label a task or its record is shown by (``Render[Frame=1-4]``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openjd.model import IntRangeExpr, ParameterValue, ParameterValueType

from core._records import CheckpointData, TaskRecord

if TYPE_CHECKING:
    from core.job._job import PreparedJob

__all__ = (
    "TaskSpec",
    "fresh_spec",
    "json_string",
    "labelled",
    "params_from_record",
    "params_to_record",
    "task_key_of",
    "task_label",
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
        given = values or {}
        return labelled(
            self.step_name, ((k, given.get(k, v.value)) for k, v in self.parameters.items())
        )

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
                parameters=params_from_record(data["parameters"]),
                record_parameters=params_from_record(data["record_parameters"]),
                resume=CheckpointData.model_validate(resume) if resume else None,
                chunk_parameter=data.get("chunk_parameter"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a task description: {type(exc).__name__}: {exc}") from None


json_string: Callable[[str], str] = json.encoder.encode_basestring
"""A string as JSON, as ``canonical_json`` writes it (``ensure_ascii=False``)."""


def fresh_spec(
    step_name: str,
    task_key: str,
    parameters: dict[str, ParameterValue],
    record_parameters: dict[str, ParameterValue],
    chunk_parameter: str | None = None,
) -> TaskSpec:
    """``TaskSpec(step_name, task_key, parameters, record_parameters, None, chunk_parameter)``,
    made in half the time of the frozen dataclass's ``__init__`` (planning makes one a task:
    ``iter_plan``). The same object in every way (equal, frozen)."""
    spec = _new_object(TaskSpec)
    spec.__dict__.update(
        step_name=step_name,
        task_key=task_key,
        parameters=parameters,
        record_parameters=record_parameters,
        resume=None,
        chunk_parameter=chunk_parameter,
    )
    return spec


_new_object = object.__new__


def task_key_of(params: Mapping[str, ParameterValue]) -> str:
    """A task's identity: canonical JSON of its parameter values (``{}`` for a lone task)."""
    pairs = sorted(params.items())
    return "{" + ",".join(f"{json_string(k)}:{json_string(str(v.value))}" for k, v in pairs) + "}"


def params_to_record(params: Mapping[str, ParameterValue]) -> dict[str, dict[str, str]]:
    return {k: {"type": v.type.value, "value": str(v.value)} for k, v in params.items()}


def params_from_record(params: Mapping[str, Mapping[str, str]]) -> dict[str, ParameterValue]:
    return {
        k: ParameterValue(type=ParameterValueType(v["type"]), value=v["value"])
        for k, v in params.items()
    }


def labelled(step_name: str, values: Iterable[tuple[str, Any]]) -> str:
    """``Step[Name=value, ...]`` from (name, value) pairs in order; the step name alone when
    there are none (a step's lone task). Every task label is written by this function."""
    inner = ", ".join(f"{k}={v}" for k, v in values)
    return f"{step_name}[{inner}]" if inner else step_name


def task_label(rec: TaskRecord) -> str:
    """A task's readable name, as the run printed it: ``Render[Frame=1-4]``, or the step name
    for a step's lone task."""
    return labelled(rec.step, ((k, v.get("value", "")) for k, v in rec.parameters.items()))


def new_task_record(job: PreparedJob, spec: TaskSpec, run_id: str, **fields: Any) -> TaskRecord:
    """A fresh record of task ``spec`` in run ``run_id``: its identity (job key, step, task
    key, parameters, chunk parameter, the step's hash) from the job, the rest from
    ``fields`` (any ``TaskRecord`` field: status, attempts, frames, message)."""
    return TaskRecord(
        job_key=job.job_key,
        run_id=run_id,
        step=spec.step_name,
        task_key=spec.task_key,
        parameters=params_to_record(spec.record_parameters),
        chunk_parameter=spec.chunk_parameter,
        step_hash=job.template.step_hashes.get(spec.step_name, ""),
        **fields,
    )
