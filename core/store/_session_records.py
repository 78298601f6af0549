"""The records of a run's open OpenJD sessions and their leases, on the store's record files.

A process that runs a session (its environments entered, a daemon of an ``onEnter`` alive)
keeps ``sessions/<session_id>.json`` and holds the session's lease while it does; the next
attempt reaps sessions whose holder is gone (``core.run._attempt``): their environments' processes
on this host are stopped and their records deleted (``core.task._session``).
"""

from __future__ import annotations

import posixpath
import time

from core._errors import StoreError
from core._records import SessionRecord
from core.fs import os_reason
from core.store._layout import Layout
from core.store._lease import Lease, take_lease, take_lease_once
from core.store._record_io import RecordFiles

__all__ = ("SessionRecords",)


class SessionRecords:
    """The session records of a store's runs (``CheckpointStore.sessions``).

    Args:
        records: the store's record files.
        layout: the store's paths.
        lease_seconds: the ttl of a session's lease on stores other than a local folder.
    """

    def __init__(self, records: RecordFiles, layout: Layout, *, lease_seconds: float) -> None:
        self.records = records
        self.fs = records.fs
        self.layout = layout
        self.lease_seconds = lease_seconds

    def acquire_lease(self, job_key: str, run_id: str, session_id: str) -> Lease | None:
        """Take an open session's lease (held by the process that runs the session), or None
        if a live holder has it; waits up to 0.5 s for a probe to let go.

        Raises:
            StoreError: the lease's file cannot be made, read or written."""
        base = self.layout.session_base(job_key, run_id, session_id)
        return take_lease(self.fs, base, self.lease_seconds, wait_seconds=0.5)

    def write(self, record: SessionRecord) -> None:
        """Write a session's record (atomically replacing the previous one).

        Raises:
            StoreError: it cannot be written."""
        record.updated_at = time.time()
        base = self.layout.session_base(record.job_key, record.run_id, record.session_id)
        self.records.write(base + ".json", record.model_dump(mode="json"))

    def delete(self, job_key: str, run_id: str, session_id: str) -> None:
        """Delete a session's record, lock and lease files.

        Raises:
            StoreError: they cannot be deleted."""
        base = self.layout.session_base(job_key, run_id, session_id)
        try:
            for suffix in (".json", ".lock", ".lease.json"):
                self.fs.remove_file(base + suffix)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.fs.where(base)}: {os_reason(exc)}") from None

    def list(self, job_key: str, run_id: str) -> list[SessionRecord]:
        """The open (or abandoned) sessions of a run; unreadable records are set aside.

        Raises:
            StoreError: the run's sessions folder cannot be listed."""
        directory = self.layout.in_run(job_key, run_id, "sessions")
        out: list[SessionRecord] = []
        for name in self.fs.list_names(directory):
            if not name.endswith(".json") or name.endswith(".lease.json") or name[0] == ".":
                continue
            try:
                rec = self.records.read(posixpath.join(directory, name), SessionRecord)
            except StoreError:
                continue
            if rec is not None and rec.session_id == name[: -len(".json")]:
                out.append(rec)
        return out

    def lease_held(self, job_key: str, run_id: str, session_id: str) -> bool:
        """True if a live process holds the session's lease (probes without keeping it).

        Raises:
            StoreError: the lease's file cannot be read or written."""
        base = self.layout.session_base(job_key, run_id, session_id)
        lease = take_lease_once(self.fs, base, self.lease_seconds)
        if lease is None:
            return True
        lease.release()
        return False
