"""Replacing a local record file (``core.fs._replace.replace_local``): spares swapped in with
``renameat2(RENAME_EXCHANGE)``, the fallback where the exchange is refused, and whole reads
while a record is rewritten (``core.fs._local._read_local``)."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.fs import _replace
from core.fs._local import _read_local
from core.fs._replace import replace_local
from core.fs._storefs import StoreFS
from core.process._reaper import _any_zombie

ROOT = Path(__file__).resolve().parent.parent


def tmp_names(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".tmp-"))


def test_the_first_write_renames_and_later_writes_swap_in_a_spare(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    replace_local(str(path), b"one", durable=True)
    assert path.read_bytes() == b"one"
    assert tmp_names(tmp_path) == []  # nothing to swap with: renamed into place
    first = path.stat().st_ino

    replace_local(str(path), b"two, longer", durable=True)
    assert path.read_bytes() == b"two, longer"
    spares = tmp_names(tmp_path)
    assert len(spares) == 1  # the replaced version, kept as the next write's spare
    assert (tmp_path / spares[0]).stat().st_ino == first

    replace_local(str(path), b"3", durable=False)
    assert path.read_bytes() == b"3"  # written over the spare, then cut to its size
    assert path.stat().st_ino == first  # no new file: the spare came back
    for name in [path.name, *tmp_names(tmp_path)]:
        assert (tmp_path / name).stat().st_nlink == 1  # one name per file, no hard link


def test_a_spare_made_ahead_becomes_the_first_version_of_a_new_file(tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    _replace.prepare_spare(str(folder))  # no folder yet: nothing made, nothing raised
    folder.mkdir()
    _replace.prepare_spare(str(folder))
    [spare] = tmp_names(folder)
    made = (folder / spare).stat().st_ino
    _replace.prepare_spare(str(folder))  # it has one: no second
    assert tmp_names(folder) == [spare]
    replace_local(str(folder / "new.json"), b"first", durable=False)
    assert (folder / "new.json").read_bytes() == b"first"
    assert (folder / "new.json").stat().st_ino == made  # renamed into place, no file made
    assert tmp_names(folder) == []


def test_spares_are_bounded_per_folder(tmp_path: Path) -> None:
    paths = [tmp_path / f"r{i}.json" for i in range(10)]
    for p in paths:
        replace_local(str(p), b"a", durable=False)
    for p in paths:  # ten exchanges with no write taking a spare in between would keep ten
        replace_local(str(p), b"b", durable=False)
    assert len(tmp_names(tmp_path)) <= _replace._MAX_SPARES
    assert all(p.read_bytes() == b"b" for p in paths)


def test_a_folder_at_the_path_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    replace_local(str(tmp_path / "a.json"), b"x", durable=True)
    replace_local(str(tmp_path / "a.json"), b"y", durable=True)  # a spare to swap with
    folder = tmp_path / "rec.json"
    folder.mkdir()
    (folder / "inside").write_text("kept")
    before = set(os.listdir(tmp_path))
    with pytest.raises(IsADirectoryError):
        replace_local(str(folder), b"new", durable=True)
    assert folder.is_dir() and (folder / "inside").read_text() == "kept"
    assert set(os.listdir(tmp_path)) <= before  # no temporary file of this write left


def test_a_link_at_the_path_is_replaced_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"not yours")
    path = tmp_path / "rec.json"
    replace_local(str(path), b"v1", durable=False)
    replace_local(str(path), b"v2", durable=False)  # a spare to swap with
    path.unlink()
    path.symlink_to(target)
    replace_local(str(path), b"v3", durable=True)
    assert not path.is_symlink() and path.read_bytes() == b"v3"
    assert target.read_bytes() == b"not yours"
    assert not any((tmp_path / n).is_symlink() for n in tmp_names(tmp_path))  # not a spare


def test_a_file_with_another_name_is_never_written_through(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    replace_local(str(path), b"v1", durable=False)
    other = tmp_path / "other-name"
    os.link(path, other)
    replace_local(str(path), b"v2", durable=False)  # swaps out the linked file
    replace_local(str(path), b"v3", durable=False)  # must not take it as a spare
    replace_local(str(path), b"v4", durable=False)
    assert path.read_bytes() == b"v4"
    assert other.read_bytes() == b"v1"


def test_spares_are_deleted_when_the_process_exits(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        from core.fs._replace import replace_local
        for body in (b"1", b"2", b"3"):
            replace_local({str(tmp_path / "rec.json")!r}, body, durable=True)
        import os
        print(sum(n.startswith(".tmp-") for n in os.listdir({str(tmp_path)!r})))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"  # a spare while it ran
    assert tmp_names(tmp_path) == []
    assert (tmp_path / "rec.json").read_bytes() == b"3"


def test_a_forked_child_never_writes_into_its_parents_spare(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    replace_local(str(path), b"parent 1", durable=False)
    replace_local(str(path), b"parent 2", durable=False)
    (spare,) = tmp_names(tmp_path)
    spare_ino = (tmp_path / spare).stat().st_ino
    pid = os.fork()
    if pid == 0:  # the child: its own writes make new files; its exit deletes none of ours
        try:
            replace_local(str(tmp_path / "child.json"), b"c1", durable=False)
            replace_local(str(tmp_path / "child.json"), b"c2", durable=False)
            replace_local(str(tmp_path / "child.json"), b"c3", durable=False)
            code = 0 if (tmp_path / spare).read_bytes() == b"parent 1" else 3
        except BaseException:
            code = 4
        os._exit(code)  # (no atexit: os._exit; the test below covers a normal exit)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / spare).read_bytes() == b"parent 1"
    assert (tmp_path / "child.json").read_bytes() == b"c3"
    replace_local(str(path), b"parent 3", durable=False)
    assert path.stat().st_ino == spare_ino  # the parent's spare is still its own


def test_where_the_exchange_is_refused_the_folder_falls_back_to_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rec.json"
    replace_local(str(path), b"v1", durable=True)
    calls = []

    def refused(*args: object) -> int:  # a file system without RENAME_EXCHANGE
        calls.append(args)
        ctypes.set_errno(errno.EINVAL)
        return -1

    spares = _replace._Spares()
    spares._exchange = refused
    monkeypatch.setattr(_replace, "_SPARES", spares)
    old = [open(path, "rb")]  # each version held open: a rename over it leaves it whole
    try:
        for body in (b"v2", b"v3", b"v4"):
            replace_local(str(path), body, durable=True)
            assert path.read_bytes() == body
            old.append(open(path, "rb"))
        assert [f.read() for f in old] == [b"v1", b"v2", b"v3", b"v4"]
        assert len({os.fstat(f.fileno()).st_ino for f in old}) == 4  # a new file each time
    finally:
        for f in old:
            f.close()
    assert len(calls) == 1  # asked once; then the folder is known to refuse
    assert tmp_names(tmp_path) == []


def test_a_read_while_the_record_is_rewritten_gets_one_version_whole(tmp_path: Path) -> None:
    """A reader in another process while the writer swaps spares in and writes over the
    versions it swapped out: every read is one version whole, never a mix."""
    path = tmp_path / "rec.json"
    bodies = [b"a" * 6000, b"b" * 50, b"c" * 9000, b"d" * 3]
    replace_local(str(path), bodies[0], durable=False)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from core.fs._replace import replace_local
                bodies = {bodies!r}
                end = time.monotonic() + 3
                i = 0
                while time.monotonic() < end:
                    i += 1
                    replace_local({str(path)!r}, bodies[i % 4], durable=False)
                """
            ),
        ],
        cwd=ROOT,
    )
    reads = 0
    try:
        while writer.poll() is None:
            body = _read_local(str(path))
            reads += 1
            assert body in bodies, f"read {reads}: a mix of versions ({len(body)} bytes)"
    finally:
        writer.wait(10)
    assert writer.returncode == 0 and reads > 100


def test_any_zombie_looks_without_reaping() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while not _any_zombie():
        assert time.monotonic() < deadline, "the child never showed as ended"
        time.sleep(0.01)
    assert proc.wait(5) == 0  # still there to be reaped by its Popen
    assert not _any_zombie()


def test_remove_files_removes_names_in_one_folder_only(tmp_path: Path) -> None:
    fs = StoreFS(str(tmp_path / "store"))
    fs.make_root()
    folder = f"{fs.root}/tasks"
    for name in ("a.json", "b.json", "keep.json"):
        fs.replace_file(f"{folder}/{name}", b"{}", durable=False)
    fs.remove_files(folder, ["a.json", "b.json"])
    assert fs.list_names(folder) == ["keep.json"]
    with pytest.raises(ValueError, match="not a file name"):
        fs.remove_files(folder, ["../keep.json"])
    assert fs.list_names(folder) == ["keep.json"]


def test_a_record_unreadable_once_is_read_again_before_it_is_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that changed between two reads is judged by the second: a mix seen once (a
    rewrite on another kernel or store) never sets a good record aside."""
    from pydantic import BaseModel

    from core.store._record_io import RecordFiles, SetAsideError

    class Rec(BaseModel):
        n: int

    fs = StoreFS(str(tmp_path / "store"))
    fs.make_root()
    files = RecordFiles(fs)
    path = f"{fs.root}/rec.json"
    files.write(path, {"n": 7})
    real = fs.read_bytes
    torn = iter([b'{"n": 7}xx'])
    monkeypatch.setattr(fs, "read_bytes", lambda p, **kw: next(torn, None) or real(p, **kw))
    assert files.read(path, Rec) == Rec(n=7)
    assert os.listdir(fs.root) == ["rec.json"]  # nothing set aside

    (tmp_path / "store" / "rec.json").write_bytes(b'{"n": 7}xx')  # unreadable both times
    with pytest.raises(SetAsideError, match="unreadable"):
        files.read(path, Rec)
    assert [n for n in os.listdir(fs.root) if ".unreadable-" in n]


def test_a_pair_puts_the_first_file_in_place_on_another_thread_before_the_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replace_local_pair`` (a checkpoint's generation file and its record): the first is
    written on another thread (reusing the file it is given) while the second is written and
    fsynced, and is in place before the second is swapped in."""
    rec, gen, old = tmp_path / "rec.json", tmp_path / "t.gen-000004.json", tmp_path / "o.json"
    replace_local(str(rec), b"record 1", durable=True)
    old.write_bytes(b"a dropped generation, longer than the new one")
    old_ino = old.stat().st_ino
    seen: list[tuple[str, bool, bytes]] = []
    real_exchange = _replace._SPARES.exchange

    def exchange(tmp: str, path: str) -> bool:
        seen.append((threading.current_thread().name, gen.exists(), gen.read_bytes()))
        return real_exchange(tmp, path)

    monkeypatch.setattr(_replace._SPARES, "exchange", exchange)
    threads: list[str] = []
    _replace.replace_local_pair(
        str(gen),
        b"generation 4",
        str(rec),
        b"record 2",
        reuse=str(old),
        first_placed=lambda: threads.append(threading.current_thread().name),
    )
    assert rec.read_bytes() == b"record 2" and gen.read_bytes() == b"generation 4"
    assert gen.stat().st_ino == old_ino and not old.exists()  # no file made for it
    assert threads == ["openjd-checkpoint-beside"]
    # the record's swap (the only exchange: the generation's new name is renamed) came after
    assert seen == [(threading.main_thread().name, True, b"generation 4")]


def test_a_pair_whose_first_file_fails_leaves_the_second_as_it_was(tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    replace_local(str(rec), b"record 1", durable=True)
    replace_local(str(rec), b"record 2", durable=True)  # a spare to be taken
    gen = tmp_path / "t.gen-000002.json"
    gen.mkdir()
    (gen / "inside").write_text("kept")  # a folder in its place: its rename fails
    before = set(os.listdir(tmp_path))
    with pytest.raises(_replace.PairFirstError) as failed:
        _replace.replace_local_pair(str(gen), b"generation 2", str(rec), b"record 3")
    assert failed.value.path == str(gen)
    assert rec.read_bytes() == b"record 2"  # never swapped in
    assert (gen / "inside").read_text() == "kept"
    assert set(os.listdir(tmp_path)) <= before  # no temporary file of either write left


def test_a_local_commit_whose_generation_fails_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    from core import CheckpointData, CheckpointStore, StoreError, TaskRecord
    from core.store._layout import task_id_for

    store = CheckpointStore(str(tmp_path / "store"))
    rec = TaskRecord(
        job_key="0123456789abcdef", run_id="r1", step="S", task_key="{}", parameters={}
    )
    store.commit_checkpoint(rec, CheckpointData(generation=1, state="1", saved_at=1.0, attempt=1))
    tasks = tmp_path / "store/jobs/0123456789abcdef/runs/r1/tasks"
    (tasks / f"{task_id_for('S', '{}')}.gen-000002.json").mkdir()
    (tasks / f"{task_id_for('S', '{}')}.gen-000002.json" / "x").write_text("")
    with pytest.raises(StoreError, match="gen-000002"):
        store.commit_checkpoint(
            rec, CheckpointData(generation=2, state="2", saved_at=1.0, attempt=1)
        )
    assert rec.checkpoint is not None and rec.checkpoint.generation == 1
    (stored,), _ = store.read_tasks("0123456789abcdef", "r1")
    assert stored.checkpoint is not None and stored.checkpoint.state == "1"
