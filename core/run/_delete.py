"""Deleting a run (``checkpoints delete``, ``gc``) so that it never races a resume or a retry,
and finishing deletes that were interrupted (docs/decisions.md, "Deleting a run").

``delete_run`` takes the job's lock (which every ``begin_attempt`` holds while it chooses its
run) and the run's lease (which the CLI's attempts hold while they run); refuses while a live
process holds the run's lease or the lease of one of its tasks or sessions; kills on this host
what dead holders left running; and marks the run as being deleted (``core.store._run_removal``),
all under the job's lock. Only then, the lock let go, it removes the run's files. So of a delete
and a resume started at the same instant one goes first: a resume that has the run makes the
delete refuse, and a resume after the mark finds no run (``unknown-run``; a retry starts a new
run and says why). An adapter's task claimed while the run was being marked finds it gone and
does not start (``core.run._claim``); one claimed just before is found by a second look at the
leases after the mark, which is then undone and the delete refused.

``finish_interrupted_deletes`` (``gc``) removes what deletes killed midway left.

Kill points (``core._killpoints``): ``delete.marking`` (checked, not marked yet: the run is
whole), ``delete.marked`` (marked, none of its files removed yet), ``delete.removing``
(``core.store._run_removal``: after each file removed).
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable

from core._errors import RunError, StoreError
from core._killpoints import kill_point
from core._records import ProcessInfo, RunRecord
from core.fs import NotARecordError, file_mtime, list_files
from core.run._attempt import RunIds, reap_run
from core.store import (
    CheckpointStore,
    Lease,
    SetAsideError,
    describe_holder,
    is_job_key,
    is_run_id,
    read_holder,
    take_lease_once,
    this_process,
)
from core.task import no_run_words, set_aside_words

__all__ = (
    "delete_named_run",
    "delete_run",
    "delete_set_aside_run",
    "finish_interrupted_delete",
    "finish_interrupted_deletes",
    "set_aside_runs",
)


class _RunGoneError(RunError):
    """``delete_run``: the run was deleted, or marked for deletion, meanwhile."""


def delete_run(store: CheckpointStore, run: RunRecord) -> list[str]:
    """Delete a run with its task records and checkpoints (``checkpoints delete``, ``gc``),
    after killing on this host what dead holders of it left running (``reap_run``), so that
    nothing of it runs on unsupervised. A resume or retry of the run (``begin_attempt``) and
    this delete exclude each other (the module's docstring). Returns the notes of
    ``reap_run``.

    Raises:
        RunError: a live process drives the run or runs one of its tasks or sessions now
            (``run X is running (process P on host H); stop it first``), or the run is gone
            (deleted meanwhile, or being deleted).
        StoreError: the store cannot be read or written.
    """
    job_key, run_id = run.job_key, run.run_id
    with store.job_lock(job_key):
        current = store.read_run(job_key, run_id)
        if current is None:
            raise _RunGoneError(no_run_words(store, run_id, job_key))
        lease = store.acquire_lease(current)
        if lease is None:
            raise RunError(
                f"run {run_id} is running ({_run_holder(store, current)}); stop it first"
            )
        notes, where = _mark(store, current, lease)
        if where is None:
            lease.release()
            raise _RunGoneError(no_run_words(store, run_id, job_key))
    kill_point("delete.marked")
    store.removal.remove(where, lease)
    return notes


def _mark(
    store: CheckpointStore, run: RunRecord | RunIds, lease: Lease
) -> tuple[list[str], str | None]:
    """A delete's part under the job's lock and the run's ``lease``: refuse while a live process
    holds a lease of one of the run's tasks or sessions, kill what dead holders left
    (``reap_run``), mark the run, and look at the leases again. Returns ``reap_run``'s notes
    and the folder to ``remove`` (None: the run has no folder; ``lease`` is then still held).

    Raises:
        RunError: a live process holds a lease of the run (``lease`` let go, nothing marked).
    """
    try:
        _refuse_if_busy(store, run, store.layout.run_dir(run.job_key, run.run_id))
        notes = reap_run(store, run)
        kill_point("delete.marking")
        where = store.removal.mark(run.job_key, run.run_id, this_process())
        if where is None:
            return notes, None
        try:
            _refuse_if_busy(store, run, where)
        except RunError:
            store.removal.unmark(run.job_key, run.run_id, where)
            raise
    except BaseException:
        lease.release()
        raise
    return notes, where


def delete_named_run(
    store: CheckpointStore, run_id: str, *, warn: Callable[[str], None] | None = None
) -> list[str] | None:
    """``checkpoints delete RUN``: delete the run named ``run_id``, whichever state it is in: a
    run with a readable record (``delete_run``); one a delete killed midway left
    (``finish_interrupted_delete``); one whose ``run.json`` was set aside as unreadable, now or
    before (``delete_set_aside_run``).

    Args:
        warn: called with a warning as it arises (the run's record was unreadable and was set
            aside just now; it is deleted here all the same).

    Returns:
        Notes (what dead holders left running and was killed) and, last, a line saying what was
        deleted; None if the store has no run ``run_id`` (or another delete removed it, or
        marked it, meanwhile).

    Raises:
        RunError: a live process drives the run or holds a lease of one of its tasks or
            sessions (nothing deleted).
        StoreError: the store cannot be read or written; or the run's record, unreadable, was
            not set aside after all (it could not be moved, or the run was written again
            meanwhile): nothing was deleted.
    """
    set_aside = False
    try:
        run = store.find_run(run_id)
    except SetAsideError as exc:  # its record, unreadable, was set aside just now
        if warn is not None:
            warn(str(exc))
        run, set_aside = None, True
    if run is not None:
        try:
            notes = delete_run(store, run)
        except _RunGoneError:  # deleted meanwhile, by another delete: as if it were never found
            return None
        return [*notes, f"deleted run {run.run_id} and its checkpoints"]
    done = finish_interrupted_delete(store, run_id)
    if done is not None:
        return [done]
    lines = delete_set_aside_run(store, run_id)
    if lines is None and set_aside:
        raise StoreError(
            f"run {run_id}: its unreadable run record is still in place (it could not be "
            "moved aside, or the run was written again meanwhile); nothing was deleted"
        )
    return lines


def delete_set_aside_run(store: CheckpointStore, run_id: str) -> list[str] | None:
    """Delete a run whose ``run.json`` was set aside as unreadable (``run.json.unreadable-<time>``;
    docs/decisions.md, "Records that cannot be read") and that has had no record since, with
    its task records and checkpoints (``checkpoints delete``). No reader finds such a run, and
    ``gc`` keeps its folder for a person: this is how that person removes it, once they have
    looked. As ``delete_run``: under the job's lock and the run's lease, refused while a live
    process holds a lease of one of its tasks or sessions, what dead holders left running on
    this host killed first (``reap_run``), marked before its files go.

    Returns ``reap_run``'s notes and, last, a line saying what was deleted; None if the store
    has no such run (no folder ``run_id``, or one with a readable ``run.json``).

    Raises:
        RunError: a live process holds the run's lease or a lease of one of its tasks or
            sessions.
        StoreError: the store cannot be read or written.
    """
    if not is_run_id(run_id):
        return None
    for key in store.fs.list_names(store.layout.jobs_dir):
        if not is_job_key(key) or not store.removal.kept_records(key, run_id):
            continue
        with store.job_lock(key):
            kept = store.removal.kept_records(key, run_id)
            if not kept:  # deleted, or given a record again, meanwhile
                return None
            ids = RunIds(key, run_id)
            lease = store.acquire_run_lease(key, run_id)
            if lease is None:
                raise RunError(
                    f"run {run_id} is running ({_run_holder(store, ids)}); stop it first"
                )
            notes, where = _mark(store, ids, lease)
            if where is None:
                lease.release()
                return None
        kill_point("delete.marked")
        store.removal.remove(where, lease)
        return [
            *notes,
            f"deleted run {run_id}, whose run record was unreadable (it was kept as {kept[-1]}), "
            "and its checkpoints",
        ]
    return None


def set_aside_runs(
    store: CheckpointStore, known: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """A line per run of the store whose ``run.json`` was set aside as unreadable and that has
    had no record since (``delete_set_aside_run`` removes one), for ``runs`` and ``gc``: no
    reader lists such a run. ``known``: ids of runs read already, not looked at again.

    Raises:
        StoreError: the store cannot be read.
    """
    lines = []
    for key in store.fs.list_names(store.layout.jobs_dir):
        if not is_job_key(key):
            continue
        for run_id, kept in store.removal.set_aside(key, known=known):
            lines.append(set_aside_words(store, key, run_id, kept))
    return lines


def _who(store: CheckpointStore, owner: ProcessInfo | None) -> str:
    """``process P on host H`` (saying so when it has ended on this host), else ``another
    process``."""
    if owner is None:
        return "another process"
    ended = describe_holder(store, owner).partition(f" by process {owner.pid}")[2]
    return f"process {owner.pid} on host {owner.host}{ended}"


def _run_holder(store: CheckpointStore, run: RunRecord | RunIds) -> str:
    """Who holds the run's lease, as far as the store tells (its lease object on S3, else the
    runner the run's record names, when it has a readable one)."""
    held = read_holder(store.fs, store.layout.run_lease(run.job_key, run.run_id))
    if held is not None and held.owner:
        return _who(store, held.owner)
    return _who(store, run.runner if isinstance(run, RunRecord) else None)


def _refuse_if_busy(store: CheckpointStore, run: RunRecord | RunIds, where: str) -> None:
    """RunError if a live process holds a lease of a task or session of the run, whose folder
    is ``where`` (the caller's own run lease aside), naming the first."""
    held = store.removal.held_leases(where, but=posixpath.join(where, "lease"))
    if not held:
        return
    base = held[0]
    kind, name = posixpath.basename(posixpath.dirname(base)), posixpath.basename(base)
    holder = read_holder(store.fs, base)
    owner = holder.owner if holder is not None else None
    what = f"session {name}" if kind == "sessions" else "a task"
    if kind == "tasks":
        task = _task_fields(store, base + ".json")
        if task.get("step"):
            what = f"task {task['step']} {task.get('task_key', '')}".rstrip()
        if owner is None and isinstance(task.get("process"), dict):
            try:  # on a local store, the task's action process tells where it runs
                owner = ProcessInfo.model_validate(task["process"])
            except ValueError:
                owner = None
    raise RunError(f"run {run.run_id} is running ({what}: {_who(store, owner)}); stop it first")


def _task_fields(store: CheckpointStore, path: str) -> dict[str, object]:
    """A task record's fields as stored, read without its checks (it may lie in a folder
    renamed for the delete); none if it cannot be read."""
    try:
        raw = store.fs.read_bytes(path)
        data = json.loads(raw) if raw is not None else {}
    except (NotARecordError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def finish_interrupted_delete(store: CheckpointStore, run_id: str) -> str | None:
    """``finish_interrupted_deletes`` for the one run ``run_id`` of any job (``checkpoints
    delete`` named a run whose delete was killed midway: it finishes that delete rather than
    leave it to ``gc``). Returns a line for a person; None if no run ``run_id`` is marked as
    being deleted.

    Raises:
        RunError: a live process is deleting it now (or holds one of its leases).
        StoreError: the store cannot be read or written.
    """
    for key in store.fs.list_names(store.layout.jobs_dir):
        if not is_job_key(key):
            continue
        for _marked_id, where in store.removal.marked(key, only=run_id):
            if not _finish_marked(store, where, store.lease_seconds):
                raise RunError(
                    f"run {run_id} is being deleted by a live process (a lease of it is held); "
                    "nothing was removed"
                )
            return f"finished deleting run {run_id}, whose delete was interrupted"
    return None


def _finish_marked(store: CheckpointStore, where: str, ttl: float) -> bool:
    """Remove the files of the run folder ``where``, marked as being deleted, if no live
    process holds a lease of it (its deleter died); False if one does (left as it is)."""
    own = posixpath.join(where, "lease")
    if store.is_local:
        if store.removal.held_leases(where):
            return False  # its deleter is still at work
        store.removal.remove(where, None)
        return True
    lease = take_lease_once(store.fs, own, ttl)
    if lease is None:
        return False  # its deleter is still at work
    if store.removal.held_leases(where, but=own):
        lease.release()
        return False
    store.removal.remove(where, lease)
    return True


def finish_interrupted_deletes(
    store: CheckpointStore,
    *,
    grace_seconds: float,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """Finish the deletes that were interrupted (``gc``): remove every run marked as being
    deleted whose leases no live process holds (its deleter died), and every run folder with
    no run record (and none set aside as unreadable) whose files are all older than
    ``grace_seconds`` and whose leases no live process holds (left by a delete of an earlier
    version killed midway, or written into by a task of a run being deleted). Returns a line
    per run removed, for a person.

    Args:
        warn: called with a line for each run whose files the store would not let go of (a
            link where a folder should be), which is then left as it is: one such run keeps no
            other from being removed. None: raise.

    Raises:
        StoreError: the store cannot be read or written (one run's files: only when ``warn``
            is None).
    """
    lines: list[str] = []
    ttl = store.lease_seconds
    for key in store.fs.list_names(store.layout.jobs_dir):
        if not is_job_key(key):
            continue
        for run_id, where in store.removal.marked(key):
            try:
                finished = _finish_marked(store, where, ttl)
            except StoreError as exc:
                if warn is None:
                    raise
                warn(f"run {run_id}: its interrupted delete was not finished: {exc}")
                continue
            if finished:
                lines.append(f"finished deleting run {run_id}, whose delete was interrupted")
        for run_id in store.removal.without_record(key):
            try:
                removed = _remove_without_record(store, key, run_id, grace_seconds)
            except StoreError as exc:
                if warn is None:
                    raise
                warn(f"run {run_id}: its folder, which has no run record, was kept: {exc}")
                continue
            if removed:
                lines.append(
                    f"removed the folder of run {run_id}, which had no run record (what a "
                    "delete killed midway leaves)"
                )
    return lines


def _remove_without_record(
    store: CheckpointStore, key: str, run_id: str, grace_seconds: float
) -> bool:
    """``finish_interrupted_deletes`` for one run folder with no run record: removed if all its
    files are older than ``grace_seconds`` and no live process holds a lease of it."""
    run_dir = store.layout.run_dir(key, run_id)
    files = list_files(store.fs, run_dir[len(store.fs.root) :].strip("/"))
    now = time.time()
    if any(now - file_mtime(info) < grace_seconds for _, info in files):
        return False  # a run being made (its lease comes before its record), or in use
    with store.job_lock(key):  # every run is made under it
        if store.removal.has_record(key, run_id) or store.removal.held_leases(run_dir):
            return False
        folder = store.removal.mark(key, run_id, this_process())
    if folder is not None:
        store.removal.remove(folder, None)
    return True
