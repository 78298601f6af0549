"""Managed file data flow, garbage collection: content and manifests that no kept checkpoint
generation or early-outputs index references, and abandoned uploads, removed once older than a
grace period (``collect_file_garbage``). The layout is in ``core.files._blobs``; content is listed
under every algorithm's folder (``blobs/blake3``, and ``blobs/sha256`` of stores written by
earlier versions, whose manifests and indexes name it by ``sha256``: ``core._hashing``).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core._hashing import ALGORITHMS, Digest
from core.files import Blobs, RestoreError
from core.fs import file_mtime, list_files

if TYPE_CHECKING:
    from core.store import CheckpointStore


__all__ = (
    "DEFAULT_GC_GRACE_SECONDS",
    "GcReport",
    "collect_file_garbage",
    "holds_managed_files",
    "referenced_manifests",
)

DEFAULT_GC_GRACE_SECONDS = 3600.0
"""Content younger than this (seconds) is never collected: a live run may still commit it."""


def holds_managed_files(store: CheckpointStore) -> bool:
    """True if the store holds files of managed checkpoints (a blob under ``blobs/<algo>/``),
    which only ``collect_file_garbage`` frees; False if it holds none, or cannot tell (a
    caller says so after a delete that is done: no error for this). Lists at most the 256
    prefix folders of each content name's algorithm, stopping at the first that has one."""
    from core._errors import StoreError

    try:
        for algo in ALGORITHMS:
            top = posixpath.join(store.fs.root, "blobs", algo)
            for prefix in store.fs.list_names(top):
                if store.fs.list_names(posixpath.join(top, prefix)):
                    return True
    except StoreError:
        return False
    return False


# --- garbage collection ------------------------------------------------------------------------
@dataclass
class GcReport:
    """What ``collect_file_garbage`` removed (counts and bytes)."""

    blobs_removed: int = 0
    manifests_removed: int = 0
    uploads_removed: int = 0
    bytes_freed: int = 0
    kept_blobs: int = 0
    young: int = 0
    """Unreferenced files and manifests kept because they are younger than the grace period."""
    warnings: list[str] = field(default_factory=list)


def referenced_manifests(store: CheckpointStore, runs: list[Any]) -> tuple[set[str], list[str]]:
    """The manifest hashes of every stored generation and task record of ``runs``."""
    names: set[str] = set()
    warnings: list[str] = []
    for run in runs:
        tasks, task_warnings = store.read_tasks(run.job_key, run.run_id)
        warnings.extend(task_warnings)
        for rec, generations in zip(tasks, store.list_generations_of(tasks), strict=True):
            if rec.checkpoint is not None and rec.checkpoint.manifest:
                names.add(rec.checkpoint.manifest)
            for gen in generations:
                if gen.manifest:
                    names.add(gen.manifest)
    return names, warnings


def _output_blobs(store: CheckpointStore, runs: list[Any], warnings: list[str]) -> set[Digest]:
    """The content named by the early-outputs indexes of ``runs`` (an item names it by
    ``blake3`` or, written by earlier versions, ``sha256``); an index that cannot be read is
    named in ``warnings``."""
    out: set[Digest] = set()
    for run in runs:
        for index in store.outputs.read_outputs(run.job_key, run.run_id, warnings):
            for item in index.get("files", {}).values():
                digest = Digest.from_fields(item) if isinstance(item, dict) else None
                if digest is not None:
                    out.add(digest)
    return out


def collect_file_garbage(
    store: CheckpointStore,
    *,
    grace_seconds: float = DEFAULT_GC_GRACE_SECONDS,
    dry_run: bool = False,
) -> GcReport:
    """Remove content and manifests no kept generation references, and abandoned uploads.

    Anything younger than ``grace_seconds`` stays: a live run may be about to commit it (a save
    uploads its files before it writes the generation that references them). A manifest that
    cannot be read keeps nothing alive and is reported.

    Raises:
        StoreError: the store cannot be listed or written.
    """
    report = GcReport()
    now = time.time()
    runs, run_warnings = store.list_runs()
    report.warnings.extend(run_warnings)
    kept_manifests, warnings = referenced_manifests(store, runs)
    report.warnings.extend(warnings)
    blobs = Blobs(store.fs)
    live_blobs: set[Digest] = set()
    for digest in sorted(kept_manifests):
        try:
            manifest = blobs.read_manifest(digest)
        except RestoreError as exc:
            report.warnings.append(str(exc))
            continue
        live_blobs.update(d for d in (e.digest for e in manifest.entries) if d is not None)
    unreadable: list[str] = []
    live_blobs.update(_output_blobs(store, runs, unreadable))
    if unreadable:
        # What it named is unknown, and after a run has ended it is the only record of its
        # outputs: no content is removed until it is mended or deleted.
        report.warnings.extend(unreadable)
        report.warnings.append(
            "no stored file content was removed: an early-outputs index cannot be read "
            "(mend or delete it, then run gc again)"
        )

    def remove(path: str) -> None:
        if dry_run:
            return
        try:
            store.fs.remove_file(store.fs.confined(path))
        except OSError as exc:
            report.warnings.append(f"cannot remove {path}: {exc}")

    for path, info in list_files(store.fs, "manifests"):
        name = posixpath.basename(path)
        digest = name[: -len(".json")] if name.endswith(".json") else name
        if digest in kept_manifests:
            continue
        if now - file_mtime(info) < grace_seconds:
            report.young += 1
            continue
        remove(path)
        report.manifests_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    listed = [
        (Digest(algo, posixpath.basename(path)), path, info)
        for algo in ALGORITHMS
        for path, info in list_files(store.fs, f"blobs/{algo}")
    ]
    for content, path, info in listed:
        if content in live_blobs or unreadable:
            report.kept_blobs += 1
            continue
        if now - file_mtime(info) < grace_seconds:
            report.young += 1
            continue
        remove(path)
        report.blobs_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    for path, info in list_files(store.fs, "blobs/tmp"):
        if now - file_mtime(info) < grace_seconds:
            continue
        remove(path)
        report.uploads_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    return report
