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

__all__ = (
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_STATE_BYTES",
    "EXIT_CODES",
    "CancelMethod",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "RefusalCode",
    "ResumeHow",
    "ResumeRefusedError",
    "TerminationMode",
    "JobRunner",
    "MessageContext",
    "MessageWarning",
    "OpenJDCheckpointError",
    "PreparedJob",
    "RunError",
    "RunCondition",
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
    "default_store_location",
    "load_path_mapping_rules",
    "load_template",
    "parse_line",
    "parse_template",
    "prepare_job",
)
