"""Task records and their checkpoint generations, on the store's record files.

A task's latest record (``tasks/<task_id>.json``) is written after the checkpoint generation it
points at (``tasks/<task_id>.gen-<N>.json``), each replaced atomically, so a crash leaves either
the previous checkpoint or the new one. Only the record is written durably (the one durable write
of a commit): it holds the whole checkpoint, and the generation files are history (older
generations to fall back on, a record to rebuild from) that the page cache writes back in its
own time (docs/decisions.md, "Which writes are durable"). The last ``keep_generations``
generations are kept. A
record that is unreadable (or names another task) is set aside, and rebuilt from the newest of
the task's readable generations when there is one (``TaskRebuilt``): a damaged record never
costs the task its stored checkpoint.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from core._errors import LeaseLostError, StoreError
from core._killpoints import kill_point
from core._records import (
    CheckpointData,
    GenerationFile,
    TaskIdentity,
    TaskRecord,
    TaskStatus,
)
from core.fs import WriteFence, os_reason
from core.store._layout import Layout, task_id_for
from core.store._record_io import RecordFiles, SetAsideError, TaskLeftInPlace, TaskRebuilt

__all__ = ("TaskRecords",)


class TaskRecords:
    """The task records and checkpoint generations of a store's runs (``CheckpointStore``
    hands its task methods on to this).

    Args:
        records: the store's record files.
        layout: the store's paths.
        keep_generations: checkpoint generations kept per task.
    """

    def __init__(self, records: RecordFiles, layout: Layout, *, keep_generations: int) -> None:
        self.records = records
        self.fs = records.fs
        self.layout = layout
        self.keep_generations = keep_generations

    def write_task(
        self, record: TaskRecord, *, durable: bool = True, fence: WriteFence | None = None
    ) -> None:
        """Write a task's latest record (atomically replacing the previous one).

        ``durable=False`` (a local store: no fsync; elsewhere ignored) is for a write whose loss
        in a machine crash costs nothing stored: the record of a task starting (its process,
        for the reaping after a runner's death, which the machine's crash makes moot) when the
        record it replaces holds no checkpoint. A record that holds one is only ever replaced
        durably, so that no crash can leave it torn.

        ``fence``: the task's lease, held by the process running the task: the write is
        refused once it is lost, and on S3 is conditional on this holder's last write
        (``StoreFS.replace_file``).

        Raises:
            StoreError: it cannot be written.
            LeaseLostError: ``fence`` was lost; nothing was written."""
        record.updated_at = time.time()
        self.records.write(
            self.task_path(record),
            record.model_dump(mode="json"),
            durable=durable,
            fence=fence,
        )

    def task_path(self, record: TaskRecord) -> str:
        """Where the record of ``record``'s task is kept."""
        tid = task_id_for(record.step, record.task_key)
        return self.layout.task_path(record.job_key, record.run_id, tid)

    def read_task(
        self,
        job_key: str,
        run_id: str,
        step: str,
        task_key: str,
        warnings: list[str] | None = None,
    ) -> TaskRecord | None:
        """One task's latest record, None if it has none.

        A record that is unreadable (or names another task) is moved aside and kept; when one
        of the task's checkpoint generation files is readable, the record is rebuilt from the
        newest (``TaskRebuilt`` appended to ``warnings``), so a damaged record never costs the
        task its stored checkpoint.

        Raises:
            StoreError: the record is unreadable and no generation rebuilds it (the record is
                moved aside and kept), or the store cannot be read.
        """
        tid = task_id_for(step, task_key)
        path = self.layout.task_path(job_key, run_id, tid)
        try:
            rec = self.records.read_own_task(path, tid)
        except SetAsideError as exc:
            tdir = self.layout.in_run(job_key, run_id, "tasks")
            rebuilt = self._rebuild_task(job_key, run_id, tid, self.fs.list_names(tdir), str(exc))
            if rebuilt is None:
                raise
            record, warning = rebuilt
            if warnings is not None:
                warnings.append(warning)
            return record
        return rec

    def _rebuild_task(
        self, job_key: str, run_id: str, tid: str, names: list[str], problem: str
    ) -> tuple[TaskRecord, TaskRebuilt] | None:
        """Rebuild the record of task ``tid`` (whose record file was set aside for
        ``problem``) from its newest readable generation file among ``names`` that says which
        task it belongs to, write it, and return it with its warning; None when there is none.
        The rebuilt record is ``interrupted`` with that checkpoint, the frames finished by that
        commit and the attempt that made it."""
        tdir = self.layout.in_run(job_key, run_id, "tasks")
        gens: list[tuple[int, str]] = []
        prefix = f"{tid}.gen-"
        for name in names:
            number = name[len(prefix) : -len(".json")]
            if name.startswith(prefix) and name.endswith(".json") and number.isdigit():
                gens.append((int(number), name))
        for _number, name in sorted(gens, reverse=True):
            try:
                gen: GenerationFile | None = self.records.read(
                    posixpath.join(tdir, name), GenerationFile
                )
            except StoreError:
                continue
            if gen is None or gen.task is None:
                continue
            ident = gen.task
            if task_id_for(ident.step, ident.task_key) != tid:
                continue
            record = TaskRecord(
                job_key=job_key,
                run_id=run_id,
                step=ident.step,
                task_key=ident.task_key,
                parameters=ident.parameters,
                status=TaskStatus.INTERRUPTED,
                attempt=gen.attempt,
                chunk_parameter=ident.chunk_parameter,
                completed_frames=ident.completed_frames,
                checkpoint=CheckpointData.model_validate(gen.model_dump(exclude={"task"})),
                step_hash=ident.step_hash,
                message=f"record rebuilt from checkpoint generation {gen.generation}",
            )
            self.write_task(record)
            return record, TaskRebuilt(
                f"{problem}; the task's record was rebuilt from its checkpoint generation "
                f"{gen.generation}, which it resumes from"
            )
        return None

    def delete_task(self, record: TaskRecord) -> None:
        """Delete a task's record and its checkpoint generations."""
        tid = task_id_for(record.step, record.task_key)
        tdir = self.layout.in_run(record.job_key, record.run_id, "tasks")
        try:
            for name in self.fs.list_names(tdir):
                if name == f"{tid}.json" or name.startswith(f"{tid}.gen-"):
                    self.fs.remove_file(posixpath.join(tdir, name))
        except OSError as exc:
            raise StoreError(f"cannot delete {self.fs.where(tdir)}: {os_reason(exc)}") from None

    def commit_checkpoint(
        self, record: TaskRecord, checkpoint: CheckpointData, *, fence: WriteFence | None = None
    ) -> None:
        """Store a new checkpoint generation, then the task record that points at it; drop
        generations older than the last ``keep_generations``.

        One durable write: the generation file is written to the page cache (history), the
        record, which holds the same checkpoint, durably; when this returns the checkpoint
        survives a crash of the machine. On a local store the generation file is the file of
        the generation this commit drops (renamed away, then rewritten: ``StoreFS.replace_file``
        ``reuse``), so that a commit makes one new file, the record's; if the commit then
        fails, that older generation is gone already. ``fence``: as for ``write_task``; both
        files are written under it (on S3 the generation file only if none of its number is
        there, or the lease is confirmed still this holder's), and a generation file written
        by a holder that then finds its lease lost is deleted again where the store can tell
        it is still that holder's (S3).

        Raises:
            StoreError: either file cannot be written; the previous checkpoint stays.
            LeaseLostError: ``fence`` was lost; the record was not written."""
        tid = task_id_for(record.step, record.task_key)
        tdir = self.layout.in_run(record.job_key, record.run_id, "tasks")
        gen_path = f"{tdir}/{tid}.gen-{checkpoint.generation:06d}.json"  # (Layout.gen_path)
        self.fs.confined(gen_path)  # the folders of both files (the record's is beside it)
        identity = TaskIdentity(
            step=record.step,
            task_key=record.task_key,
            parameters=record.parameters,
            chunk_parameter=record.chunk_parameter,
            completed_frames=record.completed_frames,
            step_hash=record.step_hash,
        )
        old = checkpoint.generation - self.keep_generations
        # the generation dropped by this commit gives its file to the new one (a local store:
        # no file made); never the record's own (keep_generations 1), which must stay until
        # the record is replaced
        reuse = None
        if 1 <= old < checkpoint.generation - 1:
            reuse = f"{tdir}/{tid}.gen-{old:06d}.json"

        def gen_data() -> dict[str, Any]:
            return {**checkpoint.model_dump(mode="json"), "task": identity.model_dump()}

        local = self.fs.is_local
        if not local:
            self.records.write(
                gen_path,
                gen_data(),
                durable=False,
                fence=fence,
                new=True,
                reuse=reuse,
                checked=True,
            )
            _generation_written()
        previous, record.checkpoint = record.checkpoint, checkpoint
        try:
            record.updated_at = time.time()  # (write_task, its path known)
            if local:
                # one wait: the generation file is written on another thread while the record
                # is fsynced, and is in place before the record is (StoreFS.write_json_pair)
                placed: list[bool] = []

                def generation_placed() -> None:
                    placed.append(True)
                    _generation_written()

                try:
                    self.fs.write_json_pair(
                        gen_path,
                        gen_data,
                        f"{tdir}/{tid}.json",
                        record.model_dump(mode="json"),
                        reuse=reuse,
                        fence=fence,
                        first_placed=generation_placed,
                    )
                except StoreError:
                    if not placed:  # as when the generation is written first and fails
                        record.checkpoint = previous
                    raise
            else:
                self.records.write(
                    f"{tdir}/{tid}.json", record.model_dump(mode="json"), fence=fence, checked=True
                )
        except LeaseLostError:
            record.checkpoint = previous
            if fence is not None and not local:
                self.fs.delete_own(gen_path, fence)
            raise
        if fence is not None:  # noted only for delete_own above: no longer needed
            fence.versions.pop(gen_path, None)
        kill_point("commit.stored")
        if old >= 1 and (reuse is None or not self.fs.is_local):
            try:
                for gen in range(max(1, old - 2), old + 1):
                    self.fs.remove_file(
                        self.layout.gen_path(record.job_key, record.run_id, tid, gen)
                    )
            except (OSError, StoreError):
                pass  # history clean-up is best effort; the record is already committed

    def read_tasks(self, job_key: str, run_id: str) -> tuple[list[TaskRecord], list[str]]:
        """Every readable task record of a run, and a warning for each unreadable one."""

        return self._read_task_files(job_key, run_id, _is_record)

    def read_task_family(
        self, job_key: str, run_id: str, step: str, task_keys: Iterable[str]
    ) -> tuple[list[TaskRecord], list[str]]:
        """The readable records of the given original tasks of a step and of their chunk
        remainder pieces (``ORIGINAL#FRAMES``), and a warning for each unreadable one: what
        ``read_tasks`` gives for those tasks, found by file name, so that planning a few tasks
        of a step of thousands reads a few records, not thousands.

        Raises:
            StoreError: the run's folder cannot be listed.
        """
        stems = {task_id_for(step, key) for key in task_keys}

        def is_family(name: str) -> bool:
            stem, _dot, suffix = name.partition(".")
            return suffix == "json" and stem.partition("-")[0] in stems

        records, warnings = self._read_task_files(job_key, run_id, is_family)
        return [r for r in records if r.step == step], warnings

    def iter_tasks(
        self, job_key: str, run_id: str, warnings: list[str] | None = None
    ) -> Iterator[TaskRecord]:
        """``read_tasks``, one record at a time as they are read (a run of any size is read in
        memory that does not grow with its task count); a warning for each unreadable record
        is appended to ``warnings``.

        Raises:
            StoreError: the run's folder cannot be listed (when the first record is asked for).
        """
        names = self.fs.list_names(self.layout.in_run(job_key, run_id, "tasks"))
        yield from self._iter_task_files(job_key, run_id, _is_record, names, warnings)

    def _read_task_files(
        self, job_key: str, run_id: str, wanted: Callable[[str], bool]
    ) -> tuple[list[TaskRecord], list[str]]:
        warnings: list[str] = []
        names = self.fs.list_names(self.layout.in_run(job_key, run_id, "tasks"))
        tasks = list(self._iter_task_files(job_key, run_id, wanted, names, warnings))
        return tasks, warnings

    def _iter_task_files(
        self,
        job_key: str,
        run_id: str,
        wanted: Callable[[str], bool],
        names: list[str],
        warnings: list[str] | None,
    ) -> Iterator[TaskRecord]:
        warn = warnings.append if warnings is not None else (lambda _w: None)
        tdir = self.layout.in_run(job_key, run_id, "tasks")
        for name in names:
            if not wanted(name):
                continue
            try:
                rec = self.records.read_own_task(  # the folder: checked by list_names
                    posixpath.join(tdir, name), name[: -len(".json")], checked=True
                )
            except SetAsideError as exc:
                rebuilt = self._rebuild_task(
                    job_key, run_id, name[: -len(".json")], names, str(exc)
                )
                if rebuilt is None:
                    warn(str(exc))
                else:
                    yield rebuilt[0]
                    warn(rebuilt[1])
                continue
            except StoreError as exc:  # left in place: its task is not started
                warn(TaskLeftInPlace(exc))
                continue
            if rec is not None:
                yield rec

    def list_generations(
        self, record: TaskRecord, latest: int | None = None
    ) -> list[CheckpointData]:
        """The stored checkpoint generations of a task, oldest first; ``latest``: only the
        files of that many of the newest (a view of a store keeping thousands reads no more).

        Raises:
            StoreError: the run's tasks folder cannot be listed."""
        return self.list_generations_of([record], latest)[0]

    def list_generations_of(
        self, records: Sequence[TaskRecord], latest: int | None = None
    ) -> list[list[CheckpointData]]:
        """``list_generations`` of each of ``records``, in their order, listing each run's tasks
        folder once: a view of a run of n tasks lists n names once, not n times (a run of
        16,000 tasks took minutes the other way).

        Raises:
            StoreError: a run's tasks folder cannot be listed."""
        listings: dict[tuple[str, str], dict[str, list[str]]] = {}
        out: list[list[CheckpointData]] = []
        for record in records:
            run = (record.job_key, record.run_id)
            tdir = self.layout.in_run(record.job_key, record.run_id, "tasks")
            if run not in listings:
                by_task: dict[str, list[str]] = {}
                for name in self.fs.list_names(tdir):
                    stem, gen, _rest = name.partition(".gen-")
                    if gen and name.endswith(".json"):
                        by_task.setdefault(stem, []).append(name)
                listings[run] = by_task
            tid = task_id_for(record.step, record.task_key)
            names = listings[run].get(tid, [])
            out.append(self._read_generations(tdir, f"{tid}.gen-", names, latest))
        return out

    def _read_generations(
        self, tdir: str, prefix: str, names: list[str], latest: int | None
    ) -> list[CheckpointData]:
        """The generations in the files ``names`` of ``tdir`` (each ``prefix`` + number), oldest
        first; ``latest``: only that many of the newest are read; an unreadable one is left
        out."""
        if latest is not None:
            number = _name_number(prefix)
            names = sorted(names, key=number)[-latest:] if latest > 0 else []
        gens: list[CheckpointData] = []
        for name in names:
            try:
                data = self.records.read(posixpath.join(tdir, name), GenerationFile)
            except StoreError:
                continue
            if data is not None:
                gens.append(CheckpointData.model_validate(data.model_dump(exclude={"task"})))
        gens.sort(key=lambda g: g.generation)
        return gens


def _generation_written() -> None:
    kill_point("commit.generation-written")


def _name_number(prefix: str) -> Callable[[str], tuple[int, str]]:
    """The sort key of a generation file's name after ``prefix``: its number (a name that
    holds none first)."""

    def key(name: str) -> tuple[int, str]:
        digits = name[len(prefix) : -len(".json")]
        return (int(digits) if digits.isdigit() else -1, name)

    return key


def _is_record(name: str) -> bool:
    """True for the name of a task's latest record in a run's ``tasks`` folder."""
    return (
        name.endswith(".json")
        and ".gen-" not in name
        and not name.endswith(".lease.json")
        and not name.startswith(".tmp-")
    )
