"""Content names of managed checkpoint files: BLAKE3 for new blobs, SHA-256 blobs and manifests of
earlier versions still restored, recognised and kept by ``gc``; the fast copy's fallbacks.

The old-format stores here are made by hand (sha256 blobs and a version 1 manifest, written
as the earlier version wrote them) or copied from the checked-in ``tests/data/store_v1``;
what they should hold is computed from their files with ``hashlib``, not by the code under
test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import blake3
import pytest

from core import CheckpointStore
from core._hashing import Digest
from core.files import Blobs, FileCapture, RestoreError, restore_checkpoint
from core.files._blobs import ManifestEntry
from core.files._copy import copy_and_hash, copy_fd
from core.run import collect_file_garbage, holds_managed_files

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "store_v1" / "store"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _old_store(root: Path, files: dict[str, tuple[bytes, bool]]) -> tuple[CheckpointStore, str]:
    """A managed store as the earlier version wrote it: each file's content at
    ``blobs/sha256/<h[:2]>/<h>``, and a version 1 manifest naming them by ``sha256``, itself at
    ``manifests/<h[:2]>/<h>.json`` named by the SHA-256 of its bytes. Returns the store and the
    manifest's name."""
    entries = []
    for path, (data, executable) in sorted(files.items()):
        digest = _sha(data)
        blob = root / "blobs" / "sha256" / digest[:2] / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        entries.append(
            {
                "root": "session",
                "path": path,
                "kind": "file",
                "sha256": digest,
                "size": len(data),
                "executable": executable,
            }  # fmt: skip
        )
    manifest = {
        "version": 1,
        "entries": entries,
        "file": {"root": "session", "path": sorted(files)[0]},
        "files": [],
        "dirs": [],
    }
    raw = (json.dumps(manifest, sort_keys=True) + "\n").encode()
    name = _sha(raw)
    target = root / "manifests" / name[:2] / f"{name}.json"
    target.parent.mkdir(parents=True)
    target.write_bytes(raw)
    return CheckpointStore(str(root), files="managed"), name


def _manifest(store_root: Path, name: str) -> dict:
    return json.loads((store_root / "manifests" / name[:2] / f"{name}.json").read_text())


def _commit(capture: FileCapture, path: str) -> str:
    """Declare ``path``, save it, wait: the new generation's manifest name."""
    got: list[str] = []
    capture.declare([path], [])
    capture.save(None, [path], [], lambda manifest, _file, _bytes: got.append(manifest))
    assert capture.drain(60)
    assert len(got) == 1, "the save was not committed"
    return got[0]


def test_content_names_and_their_keys() -> None:
    data = b"frame 1\n"
    new = Digest.of_bytes(data)
    assert new == Digest("blake3", blake3.blake3(data).hexdigest()) and new.valid
    assert new.key == f"blobs/blake3/{new.hex[:2]}/{new.hex}"
    assert Digest.parse(str(new)) == new and str(new).startswith("blake3:")
    old = Digest.parse(_sha(data))  # the bare hex an earlier version wrote is a SHA-256
    assert old == Digest.of_bytes(data, "sha256") and old.key.startswith("blobs/sha256/")
    assert not Digest("md5", "0" * 64).valid and not Digest("blake3", "ABC").valid
    # a manifest entry of an earlier version reads as sha256; one naming two hashes names none
    assert (
        ManifestEntry.model_validate({"root": "session", "path": "a", "sha256": old.hex}).digest
        == old
    )
    both = ManifestEntry(root="session", path="a", sha256=old.hex, blake3=new.hex)
    assert both.digest is None
    written = ManifestEntry.for_file("session", "a", new, len(data), False)
    assert written.blake3 == new.hex and written.sha256 is None and written.digest == new


def test_the_copy_falls_back_silently_and_copies_every_byte(tmp_path: Path) -> None:
    data = os.urandom((19 << 20) + 17)  # several steps of the copy and blocks of the hash
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    cases = [(src, 0, {"clone", "copy_file_range"})]  # same file system
    # A file system the store's cannot copy from in the kernel with copy_file_range (tmpfs to
    # the test's folder): sendfile, or copy_file_range where the kernel allows it.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        other = shm / f"openjd-test-{os.getpid()}.bin"
        other.write_bytes(data)
        cases.append((other, 0, {"copy_file_range", "sendfile"}))
    # A destination opened for appending takes neither in-kernel copy (EBADF, EINVAL): read.
    cases.append((src, os.O_APPEND, {"read"}))
    try:
        for n, (source, flags, ways) in enumerate(cases):
            dst = tmp_path / f"dst{n}"
            sfd = os.open(source, os.O_RDONLY)
            os.lseek(sfd, 12345, os.SEEK_SET)  # the copy is of the whole file, from its start
            dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o600)
            try:
                how, copied = copy_fd(sfd, dfd)
            finally:
                os.close(sfd)
                os.close(dfd)
            assert how in ways, (source, flags, how)
            assert copied == len(data) and dst.read_bytes() == data, how
            # the same copy with its hash made behind it, on the copy's bytes
            dst = tmp_path / f"hashed{n}"
            sfd = os.open(source, os.O_RDONLY)
            dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o600)
            try:
                how, copied, digest = copy_and_hash(sfd, dfd, "blake3")
            finally:
                os.close(sfd)
                os.close(dfd)
            assert how in ways and copied == len(data) and dst.read_bytes() == data, how
            assert digest == blake3.blake3(data).hexdigest(), how
    finally:
        for source, _flags, _ways in cases:
            if source != src:
                source.unlink()


def test_an_upload_that_does_not_hash_to_its_name_is_not_stored(
    tmp_path: Path, s3_store: str
) -> None:
    """Object stores stream a large file and hash it again on the way (``Blobs.upload``);
    content that no longer hashes to the name it was given is not stored under it."""
    store = CheckpointStore(s3_store, files="managed")
    blobs = Blobs(store.fs)
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(5 << 20))  # over SMALL_UPLOAD_BYTES: streamed
    fd = os.open(src, os.O_RDONLY)
    try:
        wrong = Digest("blake3", blake3.blake3(b"what the file held before").hexdigest())
        with pytest.raises(RestoreError, match="changed while it was being stored"):
            blobs.upload(fd, wrong)
        right = Digest("blake3", blake3.blake3(src.read_bytes()).hexdigest())
        assert blobs.upload(fd, right) == 5 << 20
    finally:
        os.close(fd)
    root = s3_store.removeprefix("s3://")
    stored = sorted(p.removeprefix(root + "/") for p in store.fs.fsspec.find(root))
    # nothing under the wrong name, no temporary object left
    assert stored == [right.key]
    with blobs.open_read(right.key) as fh:
        assert fh.read() == src.read_bytes()


def test_staged_files_are_named_only_once_all_are_synced(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "store"), files="managed")
    blobs = Blobs(store.fs)
    data = os.urandom(1 << 20)
    right = Digest("blake3", blake3.blake3(data).hexdigest())
    tmp = blobs.stage_bytes(data)
    assert not (tmp_path / "store" / right.key).exists()  # not named yet
    manifest = blobs.stage_bytes(b"{}")
    blobs.settle([(tmp, right.key), (manifest, "manifests/00/00.json")])
    stored = sorted(p.relative_to(tmp_path / "store") for p in (tmp_path / "store").rglob("*")
                    if p.is_file())  # fmt: skip
    # no temporary file left
    assert stored == [Path(right.key), Path("manifests/00/00.json")]
    assert (tmp_path / "store" / right.key).read_bytes() == data


def test_an_old_format_store_made_by_hand_restores(tmp_path: Path) -> None:
    files = {"model.txt": (b"weights 7\n", False), "bin/run.sh": (b"#!/bin/sh\necho hi\n", True)}
    store, name = _old_store(tmp_path / "store", files)
    session = tmp_path / "session"
    session.mkdir()
    result = restore_checkpoint(store.fs, name, str(session), [])
    assert result.file == str(session / "bin" / "run.sh")  # the first path, sorted
    for path, (data, executable) in files.items():
        assert (session / path).read_bytes() == data
        assert os.access(session / path, os.X_OK) == executable
    assert result.restored_bytes == sum(len(d) for d, _x in files.values())
    # an old blob is verified by the hash that names it: damaged, it is refused
    digest = _sha(files["model.txt"][0])
    (tmp_path / "store" / "blobs" / "sha256" / digest[:2] / digest).write_bytes(b"weights 8\n")
    with pytest.raises(RestoreError, match="does not match its hash"):
        restore_checkpoint(store.fs, name, str(tmp_path / "elsewhere"), [])


def test_the_checked_in_old_store_restores_its_latest_files(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "store")
    store = CheckpointStore(str(tmp_path / "store"), files="managed")
    names = set()
    for task in (tmp_path / "store").glob("jobs/*/runs/*/tasks/*.json"):
        if task.name.count(".") == 1:  # a task record, not a generation
            checkpoint = json.loads(task.read_text()).get("checkpoint") or {}
            if checkpoint.get("manifest"):
                names.add(checkpoint["manifest"])
    assert names, "the fixture has a managed checkpoint"
    for n, name in enumerate(sorted(names)):
        entries = [e for e in _manifest(tmp_path / "store", name)["entries"]
                   if e["kind"] == "file"]  # fmt: skip
        assert entries and all(set(e) >= {"sha256"} and "blake3" not in e for e in entries)
        session = tmp_path / f"session{n}"
        session.mkdir()
        restore_checkpoint(store.fs, name, str(session), [])
        for entry in entries:
            assert _sha((session / entry["path"]).read_bytes()) == entry["sha256"], entry


def test_an_unchanged_file_restored_from_a_sha256_entry_is_not_stored_again(
    tmp_path: Path,
) -> None:
    store, name = _old_store(tmp_path / "store", {"model.txt": (b"weights 7\n", False)})
    session = tmp_path / "session"
    session.mkdir()
    result = restore_checkpoint(store.fs, name, str(session), [])
    capture = FileCapture(store.fs, str(session), [], warn=pytest.fail)
    try:
        for target, entry in result.entries:
            capture.adopt(target, entry, output=True)
        path = str(session / "model.txt")
        again = _manifest(tmp_path / "store", _commit(capture, path))
        [entry] = again["entries"]
        assert entry["sha256"] == _sha(b"weights 7\n") and not entry.get("blake3")
        assert capture.stats.uploaded_files == 0 and capture.stats.hashed_bytes == 0
        assert not (tmp_path / "store" / "blobs" / "blake3").exists()
        # changed, it is named by its BLAKE3 and stored anew
        (session / "model.txt").write_bytes(b"weights 8\n")
        changed = _manifest(tmp_path / "store", _commit(capture, path))
        [entry] = changed["entries"]
        assert entry["blake3"] == blake3.blake3(b"weights 8\n").hexdigest() and not entry["sha256"]
        assert capture.stats.uploaded_files == 1
        blob = tmp_path / "store" / "blobs" / "blake3" / entry["blake3"][:2] / entry["blake3"]
        assert blob.read_bytes() == b"weights 8\n"
    finally:
        capture.close()


def test_gc_keeps_the_sha256_blobs_of_kept_checkpoints_and_removes_unreferenced_ones(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    # What the kept records reference, read from the files: the manifests of every task
    # record and generation, the blobs they list, the blobs of every early-outputs index.
    live: set[str] = set()
    for task in root.glob("jobs/*/runs/*/tasks/*.json"):
        doc = json.loads(task.read_text())
        name = (doc.get("checkpoint") or doc).get("manifest")
        if name:
            live |= {f"blobs/sha256/{e['sha256'][:2]}/{e['sha256']}"
                     for e in _manifest(root, name)["entries"] if e["kind"] == "file"}  # fmt: skip
    for index in root.glob("jobs/*/runs/*/outputs/*.json"):
        live |= {item["blob"] for item in json.loads(index.read_text())["files"].values()}
    assert len(live) >= 6 and all(key.startswith("blobs/sha256/") for key in live)
    # content no record names, under both algorithms' names
    stray = {}
    for algo, data in (("sha256", b"stray old"), ("blake3", b"stray new")):
        digest = Digest.of_bytes(data, algo)
        (root / digest.key).parent.mkdir(parents=True, exist_ok=True)
        (root / digest.key).write_bytes(data)
        stray[algo] = digest.key
    report = collect_file_garbage(CheckpointStore(str(root)), grace_seconds=0)
    assert not report.warnings, report.warnings
    left = {str(p.relative_to(root)) for p in root.glob("blobs/*/*/*")}
    assert live <= left, live - left
    assert not set(stray.values()) & left
    assert report.kept_blobs == len(left) and report.blobs_removed >= 2


def test_a_generation_after_the_upgrade_mixes_both_names_and_restores(tmp_path: Path) -> None:
    """A generation saved after the upgrade names unchanged restored files by ``sha256`` and
    new content by ``blake3``, and restores. (gc of such a store after a real resume:
    ``test_store_upgrade``.)"""
    store, name = _old_store(tmp_path / "store", {"model.txt": (b"weights 7\n", False)})
    session = tmp_path / "session"
    session.mkdir()
    result = restore_checkpoint(store.fs, name, str(session), [])
    capture = FileCapture(store.fs, str(session), [], warn=pytest.fail)
    try:
        for target, entry in result.entries:
            capture.adopt(target, entry)
        (session / "samples.txt").write_bytes(b"epoch 5\n")
        paths = [str(session / "model.txt"), str(session / "samples.txt")]
        got: list[str] = []
        capture.declare(paths, [])
        capture.save(None, paths, [], lambda manifest, _file, _bytes: got.append(manifest))
        assert capture.drain(60) and len(got) == 1
    finally:
        capture.close()
    entries = {e["path"]: e for e in _manifest(tmp_path / "store", got[0])["entries"]}
    old, new = entries["model.txt"], entries["samples.txt"]
    assert old["sha256"] == _sha(b"weights 7\n") and not old["blake3"]
    assert new["blake3"] == blake3.blake3(b"epoch 5\n").hexdigest() and not new["sha256"]
    out = tmp_path / "restored"
    out.mkdir()
    restore_checkpoint(store.fs, got[0], str(out), [])
    assert (out / "model.txt").read_bytes() == b"weights 7\n"
    assert (out / "samples.txt").read_bytes() == b"epoch 5\n"


@pytest.mark.parametrize("mib", [1, 9])  # read and hashed in memory; copied while hashed
def test_content_the_store_has_is_not_stored_again_by_another_task(
    tmp_path: Path, mib: int
) -> None:
    store = CheckpointStore(str(tmp_path / "store"), files="managed")
    data = os.urandom(mib << 20)
    for n in (1, 2):  # two tasks, each with its own file of the same content
        session = tmp_path / f"session{n}"
        session.mkdir()
        (session / "weights.bin").write_bytes(data)
        capture = FileCapture(store.fs, str(session), [], warn=pytest.fail)
        try:
            name = _commit(capture, str(session / "weights.bin"))
        finally:
            capture.close()
        assert capture.stats.uploaded_files == (1 if n == 1 else 0), n
        assert capture.stats.reused_files == (0 if n == 1 else 1), n
        assert capture.stats.hashed_bytes == len(data)
    [entry] = _manifest(tmp_path / "store", name)["entries"]
    assert entry["blake3"] == blake3.blake3(data).hexdigest()
    stored = [p for p in (tmp_path / "store" / "blobs").rglob("*") if p.is_file()]
    assert stored == [tmp_path / "store" / Digest("blake3", entry["blake3"]).key]  # no tmp left
    assert stored[0].read_bytes() == data


def test_a_file_declared_without_a_save_is_in_the_store_once_the_capture_is_idle(
    tmp_path: Path,
) -> None:
    """Kept content waits to be synced with the manifest of the save behind it; with no save
    it is synced and named before ``drain`` returns, and the outputs report names it then."""
    store = CheckpointStore(str(tmp_path / "store"), files="managed")
    session = tmp_path / "session"
    session.mkdir()
    reports: list[dict] = []

    def on_uploaded(outputs: dict) -> None:  # what it names must be in the store already
        for text, _size in outputs.values():
            assert (tmp_path / "store" / Digest.parse(text).key).is_file(), text
        reports.append(outputs)

    capture = FileCapture(store.fs, str(session), [], warn=pytest.fail, on_uploaded=on_uploaded)
    try:
        for n, size in enumerate((100, 9 << 20)):  # a small and a large (staged) file
            path = session / f"out{n}.bin"
            path.write_bytes(os.urandom(size))
            capture.declare([str(path)], [])
            assert capture.drain(60)
            digest = Digest("blake3", blake3.blake3(path.read_bytes()).hexdigest())
            assert (tmp_path / "store" / digest.key).read_bytes() == path.read_bytes()
            assert reports and reports[-1][str(path)] == (str(digest), size)
    finally:
        capture.close()
    assert not list((tmp_path / "store" / "blobs" / "tmp").iterdir())


def test_a_store_holds_managed_files_once_a_capture_stored_one_until_gc_frees_it(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(str(tmp_path / "store"), files="managed")
    assert not holds_managed_files(store)  # nothing stored yet (no blobs folder)
    session = tmp_path / "session"
    session.mkdir()
    (session / "w.bin").write_bytes(b"weights")
    capture = FileCapture(store.fs, str(session), [], warn=pytest.fail)
    try:
        _commit(capture, str(session / "w.bin"))
    finally:
        capture.close()
    assert holds_managed_files(store)
    collect_file_garbage(store, grace_seconds=0)  # no record references it
    assert not holds_managed_files(store)
