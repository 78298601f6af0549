"""Records on the store's file system: JSON documents read whole, checked against their schema
and their place, written whole and atomically (``StoreFS.write_json``).

A record that cannot be read (not JSON, a key named twice in one object, not of the schema,
not a regular file, too large, a run or task record naming folders other than its own) is moved
aside to ``<name>.unreadable-<time>`` and reported (``SetAsideError``); it is never overwritten.
On a ``read_only`` store (the CLI's reading commands) it is reported and left in place.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pydantic import ValidationError

from core._errors import StoreError
from core._records import RUN_SCHEMA_VERSIONS, SCHEMA_VERSION, RunRecord, TaskRecord
from core.fs import NotARecordError, StoreFS, WriteFence
from core.store._layout import task_id_for

__all__ = (
    "RecordFiles",
    "RunSetAside",
    "SetAsideError",
    "TaskLeftInPlace",
    "TaskRebuilt",
    "task_warning_outcome",
)


class SetAsideError(StoreError):
    """A record was unreadable and has been moved aside (kept): its place is free again."""


class RunSetAside(str):
    """A warning of ``list_runs``: a run's record (``run.json``) was unreadable and has been
    set aside (kept). The run is not resumed: only that record holds the template hash and the
    job parameter values a resume must match, so its task records and checkpoint generations
    (kept in the run's folder) cannot be verified (docs/decisions.md, "A damaged run
    record")."""

    @classmethod
    def of(cls, exc: SetAsideError, run_id: str, folder: str) -> RunSetAside:
        """The warning for run ``run_id``, whose record ``exc`` set aside, in ``folder``."""
        return cls(
            f"{exc}; run {run_id} is not resumed: the template and job parameter values it ran "
            "with were recorded there only, and cannot be verified from its task records and "
            f"checkpoint generations (kept in {folder}); a retry runs from the top, and "
            "'checkpoints delete' deletes the run"
        )


class TaskLeftInPlace(str):
    """A warning of ``read_tasks``/``iter_tasks``: a task's record could not be read and is
    left in place (of a newer schema version, not movable aside, or not read at all): the
    task is not started, since its record would be written over it (``core.run._claim``)."""


def task_warning_outcome(warning: str) -> str:
    """What becomes of the task a warning of ``read_tasks`` is about, to end the warning with:
    nothing to add for a rebuilt record (``TaskRebuilt``: it resumes from a generation);
    ``"; that task is not started"`` for one left in place; else (set aside, nothing rebuilt
    it) ``"; that task runs from the top"``."""
    if isinstance(warning, TaskRebuilt):
        return ""
    if isinstance(warning, TaskLeftInPlace):
        return "; that task is not started"
    return "; that task runs from the top"


class TaskRebuilt(str):
    """A warning of ``read_tasks``/``read_task``: a task's record was unreadable (kept aside)
    and the record was rebuilt from its newest readable checkpoint generation, which the task
    resumes from (where a plain warning's task runs from the top)."""


class RecordFiles:
    """The records kept on ``fs``: read with their checks, written atomically.

    Args:
        fs: the store's confined file system.
        read_only: report an unreadable record and leave it in place (never set it aside).
    """

    def __init__(self, fs: StoreFS, *, read_only: bool = False) -> None:
        self.fs = fs
        self.read_only = read_only

    def write(
        self,
        path: str,
        data: dict[str, Any],
        *,
        durable: bool = True,
        fence: WriteFence | None = None,
        new: bool = False,
        reuse: str | None = None,
        checked: bool = False,
    ) -> None:
        """Write the record ``data`` to ``path`` (``StoreFS.write_json``; ``fence``: the lease
        the write is made under, ``new``: no record is expected there, ``reuse``: a file beside
        it that is deleted anyway: see ``StoreFS.replace_file``; ``checked``: ``path`` was just
        checked, ``StoreFS.confined``)."""
        self.fs.write_json(
            path, data, durable=durable, fence=fence, new=new, reuse=reuse, checked=checked
        )

    def read(self, path: str, model: type[Any], *, checked: bool = False) -> Any:
        """The record of type ``model`` at ``path``, None if there is none. A run or task record
        must name the folders it is in. ``checked``: see ``StoreFS.read_bytes``.

        Raises:
            SetAsideError: it is unreadable and has been moved aside (kept).
            StoreError: it is unreadable on a ``read_only`` store (left in place), or the
                store cannot be read.
        """
        raw: bytes | None = None
        try:
            raw = self.fs.read_bytes(path, checked=checked)
            if raw is None:
                return None
            return self._parse(raw, path, model)
        except (NotARecordError, ValueError, RecursionError, ValidationError) as exc:
            # ValueError covers UnicodeDecodeError, JSONDecodeError and over-long integers
            first: Exception = exc
        # Read again before calling it unreadable: a record rewritten while it was read is
        # whole the second time (``core.fs._local._read_local`` already checks a local read).
        if raw is not None:
            try:
                again = self.fs.read_bytes(path, checked=checked)
                if again is None:
                    return None
                if again != raw:
                    return self._parse(again, path, model)
            except (NotARecordError, ValueError, RecursionError, ValidationError) as exc:
                first = exc
        if self.read_only:
            raise StoreError(
                f"{self.fs.where(path)} is unreadable ({_short(first)}); left as it is (the "
                "next run, resume, gc or checkpoints delete sets it aside)"
            ) from None
        raise self._set_aside(path, f"is unreadable ({_short(first)})")

    def _set_aside(self, path: str, why: str) -> StoreError:
        """Move the record at ``path`` aside, for ``why`` (``... is unreadable (...)``); the
        error to raise: ``SetAsideError`` (its place is free), or a ``StoreError`` when it
        could not be moved (left in place, where nothing may be written over it)."""
        aside = self.fs.move_aside(path)
        if aside == path:
            return StoreError(
                f"{self.fs.where(path)} {why}; it could not be set aside (moved to "
                f"{posixpath.basename(path)}.unreadable-<time>), so it is left in place and "
                "nothing is written over it"
            )
        return SetAsideError(f"{self.fs.where(path)} {why}; kept as {aside}")

    def _parse(self, raw: bytes, path: str, model: type[Any]) -> Any:
        """``read``'s record of type ``model`` from the bytes ``raw`` of ``path``.

        Raises:
            StoreError: another schema version.
            NotARecordError, ValueError, RecursionError, ValidationError: not such a record.
        """
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
        versions = RUN_SCHEMA_VERSIONS if model is RunRecord else (SCHEMA_VERSION,)
        if model is RunRecord and isinstance(obj, dict) and "schema_version" not in obj:
            obj["schema_version"] = SCHEMA_VERSION  # a run record without one is version 1
        version = (
            obj.get("schema_version", SCHEMA_VERSION) if isinstance(obj, dict) else SCHEMA_VERSION
        )
        if type(version) is not int or version not in versions:  # not true, 2.0 or "2"
            raise StoreError(
                f"{self.fs.where(path)} has schema version {obj.get('schema_version')!r}, "
                f"this openjd-checkpoint reads version "
                f"{' or '.join(str(v) for v in versions)}"
            )
        rec = model.model_validate(obj)
        parts = path.split("/")
        folders: tuple[int, int] | None = None
        if model is RunRecord:
            folders = (-2, -4)
        elif model is TaskRecord:
            folders = (-3, -5)
        if folders is not None:
            for attr, index in zip(("run_id", "job_key"), folders, strict=True):
                if getattr(rec, attr) != parts[index]:
                    raise ValueError(
                        f"{attr} {getattr(rec, attr)!r} does not match its folder {parts[index]!r}"
                    )
        return rec

    def read_own_task(self, path: str, tid: str, *, checked: bool = False) -> TaskRecord | None:
        """The task record at ``path``, which must be task ``tid``'s own: one that names another
        task (an edited ``step`` or ``task_key``, a file copied over another) is set aside like
        an unreadable one (``SetAsideError``; on a read-only store a ``StoreError``), so that
        no task is planned twice or under a name it does not have."""
        rec: TaskRecord | None = self.read(path, TaskRecord, checked=checked)
        if rec is not None and task_id_for(rec.step, rec.task_key) != tid:
            if self.read_only:
                raise StoreError(f"{self.fs.where(path)} names another task")
            raise self._set_aside(path, "names another task")
        return rec


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of a record, refused when it names a key twice: ``json`` would keep the
    last one without a word, and which of two statuses or checkpoints a record meant cannot be
    known (this project never writes one; an edit by hand or two writes run together can).

    Raises:
        ValueError: ``duplicate key 'status'``.
    """
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _short(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__
