"""What a run keeps beside its records: its tasks' output logs and the early-outputs index.

- ``logs/<name>.log.gz``: a task's output, rewritten about once a second while it runs
  (``core.cli._logs`` writes and reads them); not synced to disk, so a crash may lose its last
  second, never a record.
- ``outputs/<task_id>.json`` (managed file data flow): the files a task declared so far, with
  the key of each one's content in the store; kept with the run, after its checkpoints.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from core._errors import StoreError
from core._hashing import Digest
from core._records import TaskRecord
from core.fs import MAX_RECORD_BYTES, NotARecordError, StoreFS
from core.store._layout import LOG_NAME, Layout, task_id_for

__all__ = ("OutputsIndex", "RunLogs")


class RunLogs:
    """The task output logs of a store's runs (``CheckpointStore.write_log`` and the others
    hand on to this)."""

    def __init__(self, fs: StoreFS, layout: Layout) -> None:
        self.fs = fs
        self.layout = layout

    def write_log(self, job_key: str, run_id: str, name: str, body: bytes) -> None:
        """Write (or replace) the log file ``name`` in the run's ``logs`` folder. Not synced
        to disk: a log is rewritten about once a second while its task runs, and a crash may
        lose its last second, never a record.

        Raises:
            StoreError: ``name`` is not a plain file name, ``body`` is over
                ``MAX_RECORD_BYTES``, or the file cannot be written.
        """
        if not LOG_NAME.fullmatch(name) or len(body) > MAX_RECORD_BYTES:
            raise StoreError(f"checkpoint store {self.fs.location!r}: not writing log {name!r}")
        path = posixpath.join(self.layout.in_run(job_key, run_id, "logs"), name)
        self.fs.confined(path)
        self.fs.replace_file(path, body, durable=False)

    def list_logs(self, job_key: str, run_id: str) -> list[str]:
        """The names of the run's log files (none if it has no ``logs`` folder).

        Raises:
            StoreError: the folder cannot be listed."""
        directory = self.layout.in_run(job_key, run_id, "logs")
        return sorted(n for n in self.fs.list_names(directory) if LOG_NAME.fullmatch(n))

    def read_log(self, job_key: str, run_id: str, name: str) -> bytes | None:
        """The bytes of the run's log file ``name``; None if it is not there, not a regular
        file, or over ``MAX_RECORD_BYTES``.

        Raises:
            StoreError: it cannot be read."""
        if not LOG_NAME.fullmatch(name):
            return None
        path = posixpath.join(self.layout.in_run(job_key, run_id, "logs"), name)
        try:
            return self.fs.read_bytes(path)
        except NotARecordError:
            return None


class OutputsIndex:
    """The early-outputs indexes of a store's runs (``CheckpointStore.write_outputs`` and
    ``read_outputs`` hand on to this)."""

    def __init__(self, fs: StoreFS, layout: Layout) -> None:
        self.fs = fs
        self.layout = layout

    def write_outputs(self, record: TaskRecord, outputs: dict[str, tuple[str, int]]) -> None:
        """Write the index of the files a task declared so far (``outputs/<task_id>.json`` in
        the run's folder). ``outputs``: declared path -> (content name as ``Digest`` text,
        ``blake3:<hex>``, or a bare SHA-256 hex; size in bytes). Each file's item has its hash
        under the algorithm's name (``blake3``, or ``sha256`` as earlier versions wrote), its
        size and the content's key in the store (``blobs/<algo>/<h[:2]>/<h>``). Kept with the
        run, after its checkpoints."""
        tid = task_id_for(record.step, record.task_key)
        directory = self.layout.in_run(record.job_key, record.run_id, "outputs")
        path = posixpath.join(directory, f"{tid}.json")
        files: dict[str, dict[str, Any]] = {}
        for name, (text, size) in outputs.items():
            digest = Digest.parse(text)
            files[name] = {digest.algo: digest.hex, "size": size, "blob": digest.key}
        self.fs.write_json(
            path,
            {"step": record.step, "task_key": record.task_key, "files": files},
        )

    def read_outputs(
        self, job_key: str, run_id: str, warnings: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """The early-outputs indexes of a run. One that cannot be read (not a regular file,
        too large, not a JSON object) is left out and, with ``warnings``, named there."""
        directory = self.layout.in_run(job_key, run_id, "outputs")
        out: list[dict[str, Any]] = []
        for name in self.fs.list_names(directory):
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            path = posixpath.join(directory, name)
            try:
                raw = self.fs.read_bytes(path)
            except (NotARecordError, StoreError) as exc:
                problem = str(exc) or type(exc).__name__
            else:
                if raw is None:
                    continue  # removed meanwhile
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = None
                if isinstance(data, dict):
                    out.append(data)
                    continue
                problem = "not a JSON object"
            if warnings is not None:
                warnings.append(
                    f"{self.fs.where(path)}: unreadable early-outputs index ({problem})"
                )
        return out
