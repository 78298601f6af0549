"""Removing a run's files so that every reader finds the run whole or gone, never half deleted
(``checkpoints delete``, ``gc``; docs/decisions.md, "Deleting a run").

A delete first *marks* the run as being deleted, in one step that every reader sees at once,
and only then removes its files:

- on a local store the run's folder is renamed to ``runs/.deleting-<run_id>-<ns>`` (beside it:
  one rename), a name no reader lists; its files then go one at a time;
- on any other store (S3, whose folders cannot be renamed) ``run.json`` is rewritten with
  ``RunRecord.deleting`` (the deleting process) under the run's lock, and every reader takes a
  run so marked as gone (``CheckpointStore.read_run``); its other objects then go, the run's
  lease is let go, and ``run.json`` goes last.

So a delete killed midway leaves a run that is whole (not marked yet) or marked; ``gc``
(``core.run._delete``) finishes a marked one whose leases no live process holds. Who may mark a
run (the job's lock, the run's lease, no task running) is ``core.run._delete``'s.

Kill points (``core._killpoints``): ``delete.removing``, after each file removed (a batch of up
to 50 objects on a store other than a local folder).
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Callable

from core._errors import StoreError
from core._killpoints import kill_point
from core._records import ProcessInfo, RunRecord
from core.fs import LeaseFiles, NotARecordError, StoreFS, list_files, os_reason
from core.store._layout import Layout, is_run_id
from core.store._lease import Lease, hold_lock
from core.store._record_io import RecordFiles

__all__ = ("RunBeingDeleted", "RunRemoval", "being_deleted_words", "deleting_run_id")

DELETING_PREFIX = ".deleting-"
"""A run folder being deleted on a local store: ``.deleting-<run_id>-<ns>`` beside the runs."""
_BATCH = 50
"""Objects removed per request on a store other than a local folder."""


def deleting_run_id(name: str) -> str | None:
    """The run id of a local run folder being deleted (``.deleting-<run_id>-<ns>``), None if
    ``name`` is not one."""
    if not name.startswith(DELETING_PREFIX):
        return None
    run_id, _, stamp = name[len(DELETING_PREFIX) :].rpartition("-")
    return run_id if is_run_id(run_id) and stamp.isdigit() else None


class RunBeingDeleted(str):
    """A note of ``list_runs``: a run of the store is being deleted (or its delete was
    interrupted): no reader lists it any more (``being_deleted_words``)."""


def being_deleted_words(run_id: str) -> str:
    """What a person is told of a run marked as being deleted."""
    return (
        f"run {run_id} is being deleted ('checkpoints delete' or 'gc'; if that was "
        f"interrupted, 'checkpoints delete {run_id}' again or 'gc' removes what is left)"
    )


class RunRemoval:
    """Marking a run as being deleted, removing its files, and finding runs whose delete was
    interrupted, on one store (``CheckpointStore.removal``).

    Raises (every method):
        StoreError: the store cannot be read or written, or a path is not the store's.
    """

    def __init__(self, fs: StoreFS, layout: Layout, records: RecordFiles) -> None:
        self.fs = fs
        self.layout = layout
        self.records = records

    # --- marking ---------------------------------------------------------------------------------
    def delete(self, job_key: str, run_id: str, by: ProcessInfo) -> None:
        """Mark the run, then remove its files, taking no lock or lease: for a store nothing
        else uses (a test's). A delete that must not race a resume is ``core.delete_run``."""
        where = self.mark(job_key, run_id, by)
        if where is not None:
            self.remove(where, None)

    def mark(self, job_key: str, run_id: str, by: ProcessInfo) -> str | None:
        """Mark the run as being deleted by ``by``: from now on no reader finds it. Returns the
        folder its files are in now (``remove`` them; ``unmark`` to undo), None if the run has
        no folder. On a store other than a local folder a run with no ``run.json`` is left as
        it is (no reader finds it anyway)."""
        run_dir = self.layout.run_dir(job_key, run_id)
        if self.fs.is_local:
            self.fs.confined(run_dir, whole=True)
            name = f"{DELETING_PREFIX}{run_id}-{time.time_ns()}"
            target = self.fs.confined(posixpath.join(self.layout.runs_dir(job_key), name))
            try:
                os.rename(run_dir, target)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise StoreError(
                    f"cannot delete {self.fs.where(run_dir)}: {os_reason(exc)}"
                ) from None
            return target
        self._set_mark(job_key, run_id, by)
        return run_dir

    def unmark(self, job_key: str, run_id: str, where: str) -> None:
        """Undo ``mark`` (the run was found busy after all): the run is whole again."""
        run_dir = self.layout.run_dir(job_key, run_id)
        if not self.fs.is_local:
            self._set_mark(job_key, run_id, None)
            return
        try:
            if os.path.lexists(run_dir):
                # Made meanwhile by a claim of one of its tasks, which found no run and let go
                # (``core.run._claim``): lock files only.
                self._remove_local(run_dir)
            os.rename(where, run_dir)
        except OSError as exc:
            raise StoreError(
                f"cannot put back {self.fs.where(where)} as {run_dir}: {os_reason(exc)}"
            ) from None

    def _set_mark(self, job_key: str, run_id: str, by: ProcessInfo | None) -> None:
        path = self.layout.run_path(job_key, run_id)
        with hold_lock(self.fs, self.layout.run_lock(job_key, run_id), 30.0):
            record: RunRecord | None = self.records.read(path, RunRecord)
            if record is None:
                return
            record.deleting = by
            record.updated_at = time.time()
            self.records.write(path, record.model_dump(mode="json"))

    # --- removing --------------------------------------------------------------------------------
    def remove(self, where: str, lease: Lease | None) -> None:
        """Remove the files of a marked run (``mark``: ``where``), then let ``lease`` (the run's,
        held by the caller) go; on a store other than a local folder ``run.json``, which holds
        the mark, goes last, so that a delete killed midway leaves a marked run for ``gc``."""
        record = posixpath.join(where, "run.json")
        try:
            # the caller's lease file is kept to the end: while the run's files go, a second
            # delete sees the lease held (a live delete), not a delete killed midway to finish
            own = (
                None if lease is None else posixpath.join(where, "lease" + self.fs.leases().suffix)
            )
            if self.fs.is_local:
                self._remove_local(where, last=own)
            else:
                prefix = where[len(self.fs.root) :].strip("/")
                files = [p for p, _ in list_files(self.fs, prefix) if p not in (record, own)]
                for start in range(0, len(files), _BATCH):
                    self.fs.fsspec.rm([self.fs.confined(p) for p in files[start : start + _BATCH]])
                    kill_point("delete.removing")
        except OSError as exc:
            raise StoreError(f"cannot delete {self.fs.where(where)}: {os_reason(exc)}") from None
        finally:  # the run stays marked: once its lease is free, gc finishes the delete
            if lease is not None:
                lease.release()
        if not self.fs.is_local:
            try:
                self.fs.remove_file(record)
            except OSError as exc:
                raise StoreError(
                    f"cannot delete {self.fs.where(record)}: {os_reason(exc)}"
                ) from None

    def _remove_local(self, where: str, *, last: str | None = None) -> None:
        """Remove the folder ``where`` one file at a time (a link inside is removed, never
        followed), the file ``last`` after every other; what another remover took meanwhile
        is no error. OSError is the caller's."""
        self.fs.confined(where, whole=True)

        def raise_it(exc: OSError) -> None:
            if not isinstance(exc, FileNotFoundError):
                raise exc

        for current, folders, names in os.walk(where, topdown=False, onerror=raise_it):
            for name in names:
                path = os.path.join(current, name)
                if path != last:
                    _gone_ok(os.unlink, path)
                    kill_point("delete.removing")
            for name in folders:
                path = os.path.join(current, name)
                _gone_ok(os.unlink if os.path.islink(path) else os.rmdir, path)
        if last is not None:
            _gone_ok(os.unlink, last)
        _gone_ok(os.rmdir, where)

    # --- leases under a run's folder -----------------------------------------------------------
    def held_leases(self, where: str, *, but: str | None = None) -> list[str]:
        """The leases under the run folder ``where`` (the run's, its tasks' and its sessions')
        that a live process holds, as their paths without suffix; probed without taking them
        (``LeaseFiles.held``). ``but``: a lease not to probe (the caller's own)."""
        try:
            leases = self.fs.leases()
        except OSError as exc:
            raise StoreError(f"cannot probe {self.fs.where(where)}: {os_reason(exc)}") from None
        held: list[str] = []
        suffix = leases.suffix
        for folder in (where, posixpath.join(where, "tasks"), posixpath.join(where, "sessions")):
            for name in self.fs.list_names(folder):
                if not name.endswith(suffix) or name == "run.lock" or name.startswith("."):
                    continue
                base = posixpath.join(folder, name[: -len(suffix)])
                if base == but:
                    continue
                path = self.fs.confined(base + suffix)
                try:
                    if not leases.held(path):
                        continue
                    if name == leases.members_file:  # which tasks, by their records
                        held.extend(self._held_members(leases, folder) or [base])
                    else:
                        held.append(base)
                except OSError as exc:
                    raise StoreError(
                        f"cannot probe {self.fs.where(path)}: {os_reason(exc)}"
                    ) from None
        return held

    def _held_members(self, leases: LeaseFiles, folder: str) -> list[str]:
        """The tasks of the tasks folder ``folder`` with a record whose member lease a live
        process holds, as paths without suffix (a task claimed but with no record yet is not
        named: the caller names the members file then). OSError is the caller's."""
        held: list[str] = []
        for name in self.fs.list_names(folder):
            if name.endswith(".json") and not name.startswith("."):
                base = posixpath.join(folder, name[: -len(".json")])
                if leases.held(self.fs.confined(leases.member(base))):
                    held.append(base)
        return held

    # --- finding runs being deleted ------------------------------------------------------------
    def gone(self, job_key: str, run_id: str) -> bool:
        """True if the run has no record or is marked as being deleted (an unreadable record
        is not gone: its readers say so). Reads ``run.json`` without its checks: a task's
        claim asks this, and must set nothing aside."""
        path = self.layout.run_path(job_key, run_id)
        if self.fs.is_local:
            return not os.path.lexists(self.fs.confined(path))
        return self._marked(path) is not False

    def _marked(self, path: str) -> bool | None:
        """None: no record at ``path``; True: marked as being deleted; False otherwise."""
        try:
            raw = self.fs.read_bytes(path)
        except NotARecordError:
            return False
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return False
        return isinstance(data, dict) and bool(data.get("deleting"))

    def being_deleted(self, job_key: str, run_id: str) -> bool:
        """True if the run is marked as being deleted (its delete may have been interrupted)."""
        if not self.fs.is_local:
            return self._marked(self.layout.run_path(job_key, run_id)) is True
        names = self.fs.list_names(self.layout.runs_dir(job_key))
        return any(deleting_run_id(n) == run_id for n in names)

    def marked(self, job_key: str, *, only: str | None = None) -> list[tuple[str, str]]:
        """(run id, folder) of every run of the job marked as being deleted (``only``: of the
        run of that id alone). On a local store: its folder renamed ``.deleting-*``, or its
        ``run.json`` marked as on S3 (a store copied from S3 while a delete ran there)."""
        runs_dir = self.layout.runs_dir(job_key)
        out: list[tuple[str, str]] = []
        for name in self.fs.list_names(runs_dir):
            run_id = deleting_run_id(name) if self.fs.is_local else None
            if run_id is not None:
                if only is None or run_id == only:
                    out.append((run_id, posixpath.join(runs_dir, name)))
            elif is_run_id(name) and (only is None or name == only):
                if self._marked_record(self.layout.run_path(job_key, name)):
                    out.append((name, self.layout.run_dir(job_key, name)))
        return out

    def _marked_record(self, path: str) -> bool:
        """True if the run record at ``path`` is readable and marked as being deleted
        (``RunRecord.deleting``): a record that only looks marked (``"deleting": "yes"``) is
        an unreadable one, kept for a person, and one that cannot be read now (a link, a
        store error) is not taken for marked: it keeps no other run from being looked at."""
        try:
            if not self._marked(path):
                return False
            rec = self.records.read(path, RunRecord, checked=False)
        except StoreError:
            return False
        return rec is not None and rec.deleting is not None

    def without_record(self, job_key: str) -> list[str]:
        """The ids of the job's run folders with no ``run.json`` and no record set aside
        (``run.json.unreadable-*``, kept for a person): left by a delete of an earlier
        version killed midway, or by a task that wrote into a run being deleted."""
        names = self.fs.list_names(self.layout.runs_dir(job_key))
        return [n for n in names if is_run_id(n) and self._has_record(job_key, n) is False]

    def _has_record(self, job_key: str, run_id: str) -> bool | None:
        """``has_record``, None when the run's folder cannot be listed (a link: the readers
        name it; it hides no other run)."""
        try:
            return self.has_record(job_key, run_id)
        except StoreError:
            return None

    def set_aside(
        self, job_key: str, *, known: set[str] | frozenset[str] = frozenset()
    ) -> list[tuple[str, str]]:
        """The job's runs whose ``run.json`` was set aside as unreadable and that have had no
        record since (no reader finds them; ``gc`` keeps them for a person): ``(run id, the name
        the newest unreadable record is kept as)`` each. Run ids in ``known`` (runs read
        already) are not looked at; a folder that cannot be listed is left out (``list_runs``
        warns of it)."""
        out: list[tuple[str, str]] = []
        try:
            names = self.fs.list_names(self.layout.runs_dir(job_key))
        except StoreError:  # a link or a file put there: list_runs says so
            return out
        for name in names:
            if is_run_id(name) and name not in known:
                try:
                    kept = self.kept_records(job_key, name)
                except StoreError:  # a link put there, or unlistable: read_run said so
                    continue
                if kept:
                    out.append((name, kept[-1]))
        return out

    def kept_records(self, job_key: str, run_id: str) -> list[str]:
        """The names of the run's ``run.json`` versions set aside as unreadable
        (``run.json.unreadable-<time>``), oldest first, when it has no ``run.json``; else (or
        with no folder) none."""
        names = self.fs.list_names(self.layout.run_dir(job_key, run_id))
        if "run.json" in names:
            return []
        return sorted((n for n in names if n.startswith(_KEPT)), key=_kept_order)

    def has_record(self, job_key: str, run_id: str) -> bool:
        """True if the run's folder holds a ``run.json`` (or one set aside as unreadable)."""
        names = self.fs.list_names(self.layout.run_dir(job_key, run_id))
        return any(n == "run.json" or n.startswith("run.json.") for n in names)


_KEPT = "run.json.unreadable-"
"""A run record set aside as unreadable: ``run.json.unreadable-<time>[-<n>]``
(``StoreFS.move_aside``)."""


def _kept_order(name: str) -> tuple[int, int, str]:
    """Oldest first: by the time in the name, then its number (a name not of that form
    first)."""
    stamp, _, n = name[len(_KEPT) :].partition("-")
    if stamp.isdigit() and (n == "" or n.isdigit()):
        return int(stamp), int(n or 0), name
    return -1, 0, name


def _gone_ok(remove: Callable[[str], None], path: str) -> None:
    try:
        remove(path)
    except FileNotFoundError:
        pass
