"""openjd-checkpoint on Prefect 3.9: flows from OpenJD job templates (extra ``[prefect]``).

- ``flow_from_template(path, ...)`` / ``@openjd_flow(path, ...)``: a Prefect ``Flow`` whose
  parameters are the job parameters plus ``resume``; each step's tasks run as grouped task runs
  that continue from checkpoints on a retry.
- ``CheckpointStoreBlock``: a Prefect block naming the checkpoint store (``store=``).
- ``end_flow_run(flow_run_id, mode)``: end a running flow run in one of the core's termination
  modes (``Cancelled``, ``CancelledRunFinally``, ``StoppedRunFinally``, ``Suspended``).

See docs/prefect.md. The core (``core``) decides; this package translates.
"""

try:
    import prefect  # noqa: F401  (the framework this adapter maps the core onto)
except ModuleNotFoundError as exc:
    if exc.name != "prefect":
        raise
    raise ImportError(
        "prefect_integration needs Prefect, which is not installed in this environment: "
        "pip install 'openjd-checkpoint[prefect]' (from a checkout: pip install -e '.[prefect]')"
    ) from exc

from ._blocks import CheckpointStoreBlock
from ._cancel import end_flow_run
from ._flow import (
    DEFAULT_MAX_TASK_RUNS_PER_STEP,
    DEFAULT_MAX_WORKERS,
    flow_from_template,
    openjd_flow,
)

__all__ = (
    "CheckpointStoreBlock",
    "DEFAULT_MAX_TASK_RUNS_PER_STEP",
    "DEFAULT_MAX_WORKERS",
    "end_flow_run",
    "flow_from_template",
    "openjd_flow",
)
