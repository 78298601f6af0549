"""Managed file data flow, restore: a checkpoint generation's files written into the new
session's working directory and the allowed roots before ``onCheckpointResume`` runs, hashes
verified while writing, never outside the restore root (``restore_checkpoint``). The
content-addressed layer they come from is ``core.files._blobs``; the overview is there.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from core._errors import StoreError
from core._hashing import Digest, hash_fd, new_hasher
from core._host import FILE_ROOTS_VARIABLE, host_id
from core.files._blobs import (
    CHUNK_BYTES,
    SESSION_ROOT,
    Blobs,
    ManifestEntry,
    PathRef,
    RestoreError,
    _clean_relative,
)
from core.files._copy import copy_fd

if TYPE_CHECKING:
    from core.fs import StoreFS


__all__ = ("RestoreResult", "restore_checkpoint")


# --- restore -----------------------------------------------------------------------------------
@dataclass
class RestoreResult:
    """Where a generation's files now are."""

    file: str | None
    files: list[str]
    dirs: list[str]
    entries: list[tuple[str, ManifestEntry]]
    """(restored path, entry) of every file."""
    restored_bytes: int = 0


def _target_root(token: str, session_dir: str, roots: list[str]) -> str:
    if token == SESSION_ROOT:
        return session_dir
    norm = os.path.normpath(token) if os.path.isabs(token) else None
    if norm is None or norm not in roots:
        raise RestoreError(
            f"the manifest names root {token!r}, which is not an allowed root on this host "
            "(--file-root or $" + FILE_ROOTS_VARIABLE + ")"
        )
    return norm


def _join(root: str, rel: str) -> str:
    return root if rel == "" else os.path.join(root, *rel.split("/"))


def _safe_dirs(root: str, rel_dir: str) -> str:
    """Make the folders of ``rel_dir`` below ``root`` one at a time, refusing links."""
    current = root
    os.makedirs(root, exist_ok=True)
    if rel_dir == "":
        return current
    for part in rel_dir.split("/"):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        mode = os.lstat(current).st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise RestoreError(f"{current} is not a folder (a link or a file is there)")
    return current


def restore_checkpoint(
    fs: StoreFS, manifest_digest: str, session_dir: str, roots: list[str]
) -> RestoreResult:
    """Restore a generation's files from the store's file system ``fs``
    (``CheckpointStore.fs``) into ``session_dir`` (and allowed roots).

    Every entry is checked before anything is written: a manifest with any entry that is not a
    clean relative path below a known root is refused whole. Each file is written to a temporary
    name beside its target while its hash is checked; once every file is in, each is renamed
    over its target (a link there is replaced, never followed), so a generation that cannot be
    restored leaves the files that were there as they were. Temporary files that a restore
    killed part-way on this host left are removed. Restoring twice gives the same tree.

    Raises:
        RestoreError: the manifest is missing, edited or unsafe, a file's content is missing or
            does not match its hash, or a file cannot be written.
    """
    blobs = Blobs(fs)
    manifest = blobs.read_manifest(manifest_digest)
    refs: list[PathRef | ManifestEntry] = [*manifest.entries, *manifest.files, *manifest.dirs]
    if manifest.file is not None:
        refs.append(manifest.file)
    targets: dict[str, str] = {}
    for ref in refs:
        if not _clean_relative(ref.path):
            raise RestoreError(
                f"manifest {manifest_digest[:12]} is refused whole: entry {ref.path!r} is not a "
                "clean relative path"
            )
        targets[ref.root] = _target_root(ref.root, session_dir, roots)
    if manifest.file is not None and not any(
        e.kind == "file" and (e.root, e.path) == (manifest.file.root, manifest.file.path)
        for e in manifest.entries
    ):
        raise RestoreError(
            f"manifest {manifest_digest[:12]} is refused whole: its checkpoint file "
            f"{manifest.file.path!r} is not one of its files"
        )
    for entry in manifest.entries:
        if entry.kind not in ("file", "dir"):
            raise RestoreError(
                f"manifest {manifest_digest[:12]}: unknown entry kind {entry.kind!r}"
            )
        digest = entry.digest
        if entry.kind == "file" and (digest is None or not digest.valid or entry.path == ""):
            raise RestoreError(
                f"manifest {manifest_digest[:12]} is refused whole: entry {entry.path!r} has no "
                "valid content hash"
            )
    result = RestoreResult(
        file=_join(targets[manifest.file.root], manifest.file.path) if manifest.file else None,
        files=[_join(targets[r.root], r.path) for r in manifest.files],
        dirs=[_join(targets[r.root], r.path) for r in manifest.dirs],
        entries=[],
    )
    # Two phases, so that a generation that cannot be restored changes nothing that was there
    # (a file of a --file-root included): every file is first written beside its target under
    # a temporary name while its hash is checked; only once all are in are they renamed over
    # their targets.
    staged: list[tuple[str, str, ManifestEntry]] = []
    swept: set[str] = set()
    try:
        for entry in manifest.entries:
            root = targets[entry.root]
            try:
                if entry.kind == "dir":
                    _safe_dirs(root, entry.path)
                    continue
                parent_rel, _, name = entry.path.rpartition("/")
                parent = _safe_dirs(root, parent_rel)
                target = os.path.join(parent, name)
                if os.path.isdir(target) and not os.path.islink(target):  # found before any
                    raise RestoreError(  # file is renamed in: nothing there changes
                        f"cannot restore {entry.path!r}: a folder is in its place"
                    )
                if parent not in swept:
                    _sweep_dead_restores(parent)
                    swept.add(parent)
                tmp, size = _stage_file(blobs, entry, parent)
                staged.append((tmp, target, entry))
                result.restored_bytes += size
            except OSError as exc:
                raise RestoreError(
                    f"cannot restore {entry.path!r}: {exc.strerror or exc}"
                ) from None
        for i, (tmp, target, entry) in enumerate(staged):
            try:
                os.replace(tmp, target)  # a link at the target is replaced, never followed
            except OSError as exc:
                staged = staged[i:]
                raise RestoreError(
                    f"cannot restore {entry.path!r}: {exc.strerror or exc}"
                ) from None
            result.entries.append((target, entry))
        staged = []
    finally:
        for tmp, _target, _entry in staged:  # a generation not restored leaves nothing behind
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return result


_RESTORE_TMP = ".openjd-restore-"
"""Prefix of a file being restored, beside its target:
``.openjd-restore-<host>-<pid>-<random>``, ``<host>`` a hash of this host's id (a file root may
be shared by several hosts)."""


def _restore_prefix() -> str:
    return f"{_RESTORE_TMP}{hashlib.sha256(host_id().encode()).hexdigest()[:12]}-"


def _sweep_dead_restores(folder: str) -> None:
    """Remove what a restore of this host killed part-way (its process gone) left in
    ``folder``; those of other hosts are theirs."""
    prefix = _restore_prefix()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or psutil.pid_exists(int(pid_text)):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _stage_file(blobs: Blobs, entry: ManifestEntry, parent: str) -> tuple[str, int]:
    """Write ``entry``'s content to a new temporary file in ``parent``, checking its hash (by
    the algorithm that names it: ``blake3``, or ``sha256`` in stores of earlier versions). From
    a local store the blob is cloned or copied in the kernel (``core.files._copy.copy_fd``) and the
    copy then hashed; from an object store it streams through the hash. Returns the temporary
    file's path and its size in bytes.

    Raises:
        RestoreError: the content is missing or does not match its hash (nothing is left).
        OSError: the file cannot be written (nothing is left).
    """
    digest = entry.digest or Digest("sha256", "")
    tmp = os.path.join(parent, f"{_restore_prefix()}{os.getpid()}-{uuid.uuid4().hex}")
    try:
        src = blobs.open_read(digest.key)
    except FileNotFoundError:
        raise RestoreError(f"the content of {entry.path!r} is missing from the store") from None
    except StoreError as exc:
        raise RestoreError(str(exc)) from None
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with src, os.fdopen(fd, "r+b") as out:
            if blobs.local:
                copy_fd(src.fileno(), out.fileno())
                got, size = hash_fd(out.fileno(), digest.algo)
            else:
                got, size = _stream(src, out, digest.algo, entry.size)
        if got != digest.hex or size != entry.size:
            raise RestoreError(
                f"the stored content of {entry.path!r} does not match its hash "
                f"({digest.hex[:12]}): the store was damaged or edited"
            )
        os.chmod(tmp, 0o755 if entry.executable else 0o644)
        done, tmp = tmp, ""
        return done, size
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _stream(src: Any, out: Any, algo: str, size_hint: int) -> tuple[str, int]:
    """Copy the file object ``src`` to ``out`` through a hash by ``algo``: (hex, bytes)."""
    h = new_hasher(algo, size_hint)
    size = 0
    while True:
        chunk = src.read(CHUNK_BYTES)
        if not chunk:
            return h.hexdigest(), size
        h.update(chunk)
        size += len(chunk)
        out.write(chunk)
