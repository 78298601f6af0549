"""What every operator of a DAG made by ``dag_from_template`` reads (the attempt from the setup
task's XCom, the checkpoint store, the run's job) and the groups a step's mapped task expands
over. Failures that a retry would meet again raise ``AirflowFailException``."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

import core
from core import original_tasks

from ._config import BEGIN_TASK_ID, open_store

__all__ = (
    "group_originals",
    "group_tasks",
    "BeginMemo",
    "open_op_store",
    "read_attempt",
    "run_job",
    "say_still_running",
    "state_text",
)


class BeginMemo:
    """The attempt that each DAG run's setup task (``OpenJDBeginOperator``) returned, kept by
    the process that ran it, so that the task instances after it in the same process
    (``dag.test()`` runs every task instance of a DAG run in its own process) do not each read
    it back from XCom.

    Why a task instance never gets a stale attempt from it:

    - only the setup task keeps an attempt, and it drops its DAG run's as it starts: a DAG
      run's setup task runs again before any of its task instances runs again (Airflow clears
      a task's setups with it; ``dag.test()`` again on the same logical date clears every task
      instance of the DAG run, without counting a clear: ``DagRun.clear_number`` stays), so
      its new attempt, or none when it fails, replaces the old one first;
    - a kept attempt is used only by the process that kept it: Airflow 3 runs each task
      instance of a worker in a process forked for it (``supervisor.py``), which starts with
      a copy of whatever its parent held, and a worker forked from a process that ran
      ``dag.test()`` would hold that process's attempts, which its setup tasks no longer drop.
      A fork empties the memo (``os.register_at_fork``), and the pid is checked besides;
    - everything else reads the XCom: a task instance whose setup task ran in another process
      (on a worker, each task instance is a process of its own, so nothing is lost there).

    Keyed by (dag_id, run_id, setup task id); the ``SIZE`` newest are kept.
    """

    SIZE = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str, str], tuple[int, dict[str, Any]]] = OrderedDict()
        self.enabled = True
        """False: every read goes to XCom (a benchmark's baseline)."""

    @staticmethod
    def key(ti: Any, begin_task_id: str) -> tuple[str, str, str]:
        return (str(ti.dag_id), str(ti.run_id), begin_task_id)

    def get(self, key: tuple[str, str, str]) -> dict[str, Any] | None:
        with self._lock:
            kept = self._kept.get(key)
        if not self.enabled or kept is None or kept[0] != os.getpid():
            return None
        return dict(kept[1])

    def put(self, key: tuple[str, str, str], data: dict[str, Any]) -> None:
        with self._lock:
            self._kept[key] = (os.getpid(), dict(data))
            self._kept.move_to_end(key)
            while len(self._kept) > self.SIZE:
                self._kept.popitem(last=False)

    def drop(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._kept.pop(key, None)

    def clear(self) -> None:
        self._lock = threading.Lock()  # a fork's copy of a lock another thread held stays held
        self._kept.clear()


BEGIN_MEMO = BeginMemo()
"""This process's ``BeginMemo``."""
os.register_at_fork(after_in_child=BEGIN_MEMO.clear)


def read_attempt(context: Any, begin_task_id: str = BEGIN_TASK_ID) -> core.Attempt:
    """The attempt the DAG run's setup task returned: kept by this process when that setup
    task ran in it (``BEGIN_MEMO``), else from its XCom."""
    ti = context["ti"]
    data = BEGIN_MEMO.get(BeginMemo.key(ti, begin_task_id))
    if data is None:
        data = ti.xcom_pull(task_ids=begin_task_id)
    if not isinstance(data, dict):
        raise AirflowFailException(
            f"no attempt from {begin_task_id!r} in XCom (got {type(data).__name__}); "
            "clear the whole DAG run to begin again"
        )
    return core.Attempt.from_dict(data)


def open_op_store(op: Any) -> core.CheckpointStore:
    """The operator's checkpoint store (its ``store``, ``files`` and ``file_roots``, else the
    worker's ``[openjd_checkpoint]`` settings; ``_config.open_store``). A bad setting fails the
    task without a retry: a retry would read the same setting."""
    try:
        return open_store(op.store, op.files, op.file_roots)
    except ValueError as exc:
        raise AirflowFailException(f"the checkpoint store settings: {exc}") from None


def run_job(store: core.CheckpointStore, attempt: core.Attempt) -> core.PreparedJob:
    try:
        return core.prepare_run_job(store, attempt.job_key, attempt.run_id)
    except (core.RunError, core.TemplateError) as exc:
        raise AirflowFailException(str(exc)) from None


def state_text(state: Any) -> str:
    return str(getattr(state, "value", state))


def say_still_running(log: Any, held: Sequence[str]) -> None:
    if held:
        log.warning(
            "still running after %.0f s, going on without them: %s",
            core.RELEASE_WAIT_SECONDS,
            ", ".join(held),
        )


def group_tasks(specs: Sequence[core.TaskSpec], limit: int) -> list[dict[str, Any]]:
    """Split a step's original tasks into at most ``limit`` groups of consecutive tasks
    (``core.group_tasks``), one per mapped task instance.

    Returns one small JSON-serializable item per group: ``{"step", "label", "start",
    "stop"}``, where ``start``/``stop`` index the step's original task list
    (``PreparedJob.original_tasks``) and ``label`` (the map index name) is
    ``core.group_label``: ``Render[Frame=1-4]``, or for several tasks
    ``Render[Frame=1-3] (3 tasks)``. Every mapped task instance pulls the whole list, so it
    carries indexes, not task descriptions: 1,024 items stay a few tens of kilobytes.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    items: list[dict[str, Any]] = []
    start = 0
    for group in core.group_tasks(specs, limit):
        items.append(
            {
                "step": group[0].step_name,
                "label": core.group_label(group),
                "start": start,
                "stop": start + len(group),
            }
        )
        start += len(group)
    return items


def group_originals(job: core.PreparedJob, step: str, group: dict[str, Any]) -> list[core.TaskSpec]:
    """The original tasks of one mapped instance's group (``group_tasks``'s item)."""
    return original_tasks(job, step, int(group["start"]), int(group["stop"]))
