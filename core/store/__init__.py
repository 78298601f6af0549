"""The checkpoint store's records: ``CheckpointStore`` (``_store``) and the parts it hands out
(``store.tasks``, ``store.logs``, ``store.outputs``, ``store.sessions``, ``store.removal``),
records read with their checks (``_record_io``), leases and locks (``_lease``), and the
store's layout of ids and paths (``_layout``). Stands on ``fs``.
"""

from core.store._layout import is_job_key, is_run_id, new_run_id
from core.store._lease import HeldLease, Lease, read_holder, take_lease_once, this_process
from core.store._record_io import RunSetAside, SetAsideError, TaskRebuilt, task_warning_outcome
from core.store._run_removal import RunBeingDeleted, being_deleted_words
from core.store._store import (
    CheckpointStore,
    default_store_location,
    describe_holder,
    run_file_flow,
    run_files_mode,
)

__all__ = (
    "being_deleted_words",
    "CheckpointStore",
    "default_store_location",
    "describe_holder",
    "HeldLease",
    "is_job_key",
    "is_run_id",
    "Lease",
    "new_run_id",
    "read_holder",
    "run_file_flow",
    "run_files_mode",
    "RunBeingDeleted",
    "RunSetAside",
    "SetAsideError",
    "take_lease_once",
    "TaskRebuilt",
    "task_warning_outcome",
    "this_process",
)
