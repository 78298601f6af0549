"""openjd-checkpoint core: framework-neutral operations for OpenJD jobs with CHECKPOINT.

Imports neither Airflow nor Prefect. The adapters (``airflow_plugin``, ``prefect_integration``)
and the local CLI (``core.cli``) map these operations onto their frameworks:

- ``load_template`` / ``parse_template``: validate a template (CHECKPOINT RFC idea, seed 000).
- ``prepare_job``: job parameters and job creation (openjd-model).
- ``PreparedJob.plan_step``: the tasks still to run on a resume.
- ``TaskExecution``: run one task; ``stop(StopIntent.CHECKPOINT | CANCEL)`` from any thread.
- ``CheckpointStore``: atomic, versioned records and checkpoint generations (fsspec).
- ``JobRunner``: the local scheduler that the CLI uses.
"""

# Imports are lazy (PEP 562): the CLI starts, and installs its Ctrl-C handling, before the
# heavier modules (openjd-model, pydantic, fsspec) load.
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._errors import OpenJDCheckpointError, RunError, StoreError, TemplateError
    from ._job import PreparedJob, TaskSpec, load_path_mapping_rules, prepare_job
    from ._messages import (
        DEFAULT_MAX_LINE_BYTES,
        DEFAULT_MAX_STATE_BYTES,
        MessageContext,
        MessageWarning,
        parse_line,
    )
    from ._resume import RefusalCode, ResumeHow, ResumeRefusedError
    from ._runner import EXIT_CODES, JobRunner, RunResult, TerminationMode
    from ._store import (
        CheckpointData,
        CheckpointStore,
        RunCondition,
        RunRecord,
        RunStatus,
        TaskRecord,
        TaskStatus,
        default_store_location,
    )
    from ._task import StopIntent, TaskEvent, TaskExecution, TaskOutcome, TaskResult
    from ._template import CancelMethod, CheckpointJobTemplate, load_template, parse_template

_EXPORTS = {
    "CancelMethod": "._template",
    "CheckpointData": "._store",
    "CheckpointJobTemplate": "._template",
    "CheckpointStore": "._store",
    "DEFAULT_MAX_LINE_BYTES": "._messages",
    "DEFAULT_MAX_STATE_BYTES": "._messages",
    "EXIT_CODES": "._runner",
    "JobRunner": "._runner",
    "MessageContext": "._messages",
    "MessageWarning": "._messages",
    "OpenJDCheckpointError": "._errors",
    "PreparedJob": "._job",
    "RefusalCode": "._resume",
    "ResumeHow": "._resume",
    "ResumeRefusedError": "._resume",
    "RunCondition": "._store",
    "RunError": "._errors",
    "RunRecord": "._store",
    "RunResult": "._runner",
    "RunStatus": "._store",
    "StopIntent": "._task",
    "StoreError": "._errors",
    "TaskEvent": "._task",
    "TaskExecution": "._task",
    "TaskOutcome": "._task",
    "TaskRecord": "._store",
    "TaskResult": "._task",
    "TaskSpec": "._job",
    "TaskStatus": "._store",
    "TemplateError": "._errors",
    "TerminationMode": "._runner",
    "default_store_location": "._store",
    "load_path_mapping_rules": "._job",
    "load_template": "._template",
    "parse_line": "._messages",
    "parse_template": "._template",
    "prepare_job": "._job",
}

__all__ = (
    "CancelMethod",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_STATE_BYTES",
    "EXIT_CODES",
    "JobRunner",
    "MessageContext",
    "MessageWarning",
    "OpenJDCheckpointError",
    "PreparedJob",
    "RefusalCode",
    "ResumeHow",
    "ResumeRefusedError",
    "RunCondition",
    "RunError",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "StopIntent",
    "StoreError",
    "TaskEvent",
    "TaskExecution",
    "TaskOutcome",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskStatus",
    "TemplateError",
    "TerminationMode",
    "default_store_location",
    "load_path_mapping_rules",
    "load_template",
    "parse_line",
    "parse_template",
    "prepare_job",
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
