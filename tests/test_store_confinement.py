"""The store never reaches outside its root: symbolic links, FIFOs, folders and huge files where
records belong, a read-only store, and random sequences of all of these (hypothesis)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from conftest import EXAMPLES, CliProcess, cli_cmd, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import CheckpointData, CheckpointStore, RunRecord, StoreError, TaskRecord
from core._hashing import canonical_json, sha256_hex
from core.fs._local import SLOTS_FILE
from core.fs._storefs import MAX_RECORD_BYTES
from core.store import this_process
from core.store._layout import task_id_for

JK = "0123456789abcdef"
RID = "20260101-000000-abcdef"
FIB = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
FIB_JK = sha256_hex(canonical_json({"name": "Fibonacci checkpointing job (fast)"}))[:16]
FAST = ("-p", "N=3", "-p", "StepSeconds=0.01", "-q")


def record(task_key: str = "{}") -> TaskRecord:
    return TaskRecord(job_key=JK, run_id=RID, step="S", task_key=task_key, parameters={})


def run_record() -> RunRecord:
    return RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h")


def ck(gen: int) -> CheckpointData:
    return CheckpointData(generation=gen, state=f"s{gen}", saved_at=1.0, attempt=1)


def outside_folder(base: Path) -> Path:
    out = base / "outside"
    (out / "sub").mkdir(parents=True)
    (out / "foreign.txt").write_text("not the store's")
    (out / "sub" / "x.json").write_text("{}")
    return out


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below ``folder`` with its kind and content (links are not followed)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_text(errors="replace")
    return out


# --- symbolic links ----------------------------------------------------------------------------
@pytest.mark.parametrize("linked", ["jobs", "job", "runs", "run", "tasks"])
def test_folder_linked_outside_is_refused_and_nothing_outside_is_touched(
    tmp_path: Path, linked: str
) -> None:
    outside = outside_folder(tmp_path)
    root = tmp_path / "store"
    store = CheckpointStore(root)
    folders = {
        "jobs": root / "jobs",
        "job": root / "jobs" / JK,
        "runs": root / "jobs" / JK / "runs",
        "run": root / "jobs" / JK / "runs" / RID,
        "tasks": root / "jobs" / JK / "runs" / RID / "tasks",
    }
    if linked == "tasks":
        store.write_run(run_record())
    folders[linked].parent.mkdir(parents=True, exist_ok=True)
    folders[linked].symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)

    with pytest.raises(StoreError, match="symbolic link") as info:
        store.commit_checkpoint(record(), ck(1))
    assert str(folders[linked]) in str(info.value)
    with pytest.raises(StoreError, match="symbolic link"):
        store.read_tasks(JK, RID)
    with pytest.raises(StoreError, match="symbolic link"):
        store.delete_checkpoints(run_record())
    with pytest.raises(StoreError, match="symbolic link"):
        store.acquire_task_lease(JK, RID, "S", "{}")
    if linked != "tasks":
        with pytest.raises(StoreError, match="symbolic link"):
            store.write_run(run_record())
        with pytest.raises(StoreError, match="symbolic link"):
            store.acquire_lease(run_record())
        with pytest.raises(StoreError, match="symbolic link"):
            store.removal.delete(JK, RID, this_process())
    else:
        # removes the link itself, never what it points at
        store.removal.delete(JK, RID, this_process())
        assert not folders["run"].exists()
    assert snapshot(outside) == before


@pytest.mark.parametrize("version", [1, 2])
def test_lock_file_linked_outside_is_refused(tmp_path: Path, version: int) -> None:
    """Run version 1: a task's lease is a lock file of its own; version 2: a slot of the
    tasks folder's one lock file (``SLOTS_FILE``). Either linked outside is refused."""
    outside = outside_folder(tmp_path)
    store = CheckpointStore(tmp_path / "store")
    store.write_run(run_record().model_copy(update={"schema_version": version}))
    run_dir = tmp_path / "store" / "jobs" / JK / "runs" / RID
    (run_dir / "lease.lock").symlink_to(outside / "made-by-the-store")  # dangling
    (run_dir / "run.lock").symlink_to(outside / "foreign.txt")
    tasks = run_dir / "tasks"
    tasks.mkdir()
    lock = f"{task_id_for('S', '{}')}.lock" if version == 1 else SLOTS_FILE
    (tasks / lock).symlink_to(outside / "task-lock")
    before = snapshot(outside)
    with pytest.raises(StoreError, match="symbolic link"):
        store.acquire_lease(run_record())
    with pytest.raises(StoreError, match="symbolic link"):
        store.update_run(JK, RID, message="x")
    with pytest.raises(StoreError, match="symbolic link"):
        store.acquire_task_lease(JK, RID, "S", "{}")
    assert snapshot(outside) == before


def test_record_linked_outside_is_set_aside_unread(tmp_path: Path) -> None:
    outside = outside_folder(tmp_path)
    store = CheckpointStore(tmp_path / "store")
    rec = record()
    store.commit_checkpoint(rec, ck(1))
    tasks = tmp_path / "store" / "jobs" / JK / "runs" / RID / "tasks"
    path = tasks / f"{task_id_for('S', '{}')}.json"
    path.unlink()
    path.symlink_to(outside / "sub" / "x.json")
    before = snapshot(outside)
    found, warnings = store.read_tasks(JK, RID)
    assert len(warnings) == 1 and "not a regular file" in warnings[0]
    # the record is rebuilt from generation 1, which is inside the store
    assert [t.checkpoint.generation for t in found] == [1]
    assert "rebuilt from its checkpoint generation 1" in warnings[0]
    assert not path.is_symlink() and path.is_file()
    aside = [p for p in tasks.iterdir() if ".unreadable-" in p.name]
    assert len(aside) == 1 and aside[0].is_symlink()  # the link moved, not its target
    store.commit_checkpoint(rec, ck(2))
    store.delete_checkpoints(run_record())
    assert snapshot(outside) == before


def _suspend_fibonacci(store: Path) -> None:
    cli = CliProcess(
        "run",
        str(FIB),
        "--store",
        str(store),
        "-p",
        "N=60",
        "-p",
        "StepSeconds=0.05",
        "-p",
        "CheckpointSeconds=0.1",
    )
    cli.wait_for("checkpoint generation 1 stored")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 75, cli.stderr


@pytest.mark.parametrize("linked", ["jobs", "job", "runs", "tasks"])
def test_cli_run_with_a_store_folder_linked_outside(tmp_path: Path, linked: str) -> None:
    """A full ``run`` (and its completion clean-up) never touches a foreign folder a store
    folder links to. A link on the way to the job's runs: the run is refused, exit 3, the link
    named. A run's ``tasks`` linked out: that run cannot be resumed (the link named) and is left
    as it is; the job runs from the top in a new run folder, which completes and cleans up."""
    outside = outside_folder(tmp_path)
    store = tmp_path / "store"
    if linked == "tasks":
        _suspend_fibonacci(store)
        (run_dir,) = (store / "jobs" / FIB_JK / "runs").iterdir()
        shutil.rmtree(run_dir / "tasks")
        (run_dir / "tasks").symlink_to(outside)
        folder = run_dir / "tasks"
        params = ("-p", "N=60", "-p", "StepSeconds=0.05", "-p", "CheckpointSeconds=0.1", "-q")
    else:
        folder = {
            "jobs": store / "jobs",
            "job": store / "jobs" / FIB_JK,
            "runs": store / "jobs" / FIB_JK / "runs",
        }[linked]
        folder.parent.mkdir(parents=True)
        folder.symlink_to(outside)
        params = FAST
    before = snapshot(outside)
    res = run_cli("run", str(FIB), "--store", str(store), *params, timeout=120)
    assert res.returncode == (0 if linked == "tasks" else 3), res.stderr
    assert "symbolic link" in res.stderr and str(folder) in res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(outside) == before
    assert folder.is_symlink()


# --- things that are not records -----------------------------------------------------------------
def _read_tasks_in_time(store: CheckpointStore) -> tuple[list[TaskRecord], list[str]]:
    result: list[tuple[list[TaskRecord], list[str]]] = []
    worker = threading.Thread(target=lambda: result.append(store.read_tasks(JK, RID)), daemon=True)
    worker.start()
    worker.join(10)
    assert result, "reading the store blocked"
    return result[0]


@pytest.mark.parametrize("kind", ["fifo", "folder", "huge"])
def test_non_record_in_place_of_a_record_is_set_aside_unread(tmp_path: Path, kind: str) -> None:
    store = CheckpointStore(tmp_path / "store")
    store.commit_checkpoint(record(), ck(1))
    tasks = tmp_path / "store" / "jobs" / JK / "runs" / RID / "tasks"
    path = tasks / f"{task_id_for('S', 'other')}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "inner").write_text("x")
    else:
        with open(path, "wb") as fh:
            fh.truncate(MAX_RECORD_BYTES + 1)  # sparse: cheap to make, costly to read whole
    try:
        found, warnings = _read_tasks_in_time(store)
    finally:
        if kind == "fifo" and path.exists():  # unblock a reader stuck in open()
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    assert [t.task_key for t in found] == ["{}"]
    assert len(warnings) == 1 and str(path) in warnings[0]
    reason = "more than" if kind == "huge" else "not a regular file"
    assert reason in warnings[0]
    assert not os.path.lexists(path)
    assert [p.name for p in tasks.iterdir() if ".unreadable-" in p.name]
    # the completed run's clean-up leaves what it set aside, and does not fail on it
    store.delete_checkpoints(run_record())


# --- a read-only store ---------------------------------------------------------------------------
def _can_mount_read_only() -> bool:
    if not shutil.which("unshare"):
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount --bind {d} {d} && mount -o remount,bind,ro {d}"],
            capture_output=True,
        )
        return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_read_only(), reason="no unshare -rm with a read-only bind mount")
@pytest.mark.parametrize("command", ["run", "resume"])
def test_read_only_store_exits_3_naming_the_path(tmp_path: Path, command: str) -> None:
    store = tmp_path / "store"
    _suspend_fibonacci(store)
    (run_dir,) = (store / "jobs" / FIB_JK / "runs").iterdir()
    args = (
        ["run", str(FIB), "-p", "N=60", "-p", "StepSeconds=0.05", "-p", "CheckpointSeconds=0.1"]
        if command == "run"
        else ["resume", run_dir.name]
    )
    inner = " ".join(cli_cmd(*args, "--store", str(store), "-q"))
    res = subprocess.run(
        ["unshare", "-rm", "sh", "-c",
         f"mount --bind {store} {store} && mount -o remount,bind,ro {store} && exec {inner}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert "Read-only file system" in res.stderr and str(store) in res.stderr
    assert "Traceback" not in res.stderr


# --- random sequences (hypothesis) ----------------------------------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("commit")),
        st.tuples(st.just("kill")),
        st.tuples(st.just("read")),
        st.tuples(st.just("lease")),
        st.tuples(st.just("corrupt"), st.binary(max_size=40)),
        st.tuples(st.just("link_record"), st.sampled_from(["mine", "other", "lock", "slots"])),
        st.tuples(st.just("special"), st.sampled_from(["fifo", "folder", "huge"])),
        st.tuples(st.just("link_folder"), st.sampled_from(["tasks", "run", "job", "requests"])),
        st.tuples(st.just("unlink_folders")),
        st.tuples(st.just("run_record")),
    ),
    max_size=25,
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops=OPS)
def test_random_abuse_never_reaches_outside_nor_loses_the_last_generation(ops: list) -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        outside = outside_folder(base)
        root = base / "store"
        store = CheckpointStore(root, keep_generations=2)
        run_dir = root / "jobs" / JK / "runs" / RID
        folders = {
            "job": root / "jobs" / JK,
            "run": run_dir,
            "tasks": run_dir / "tasks",
            "requests": run_dir / "requests",
        }
        tid = task_id_for("S", "{}")
        other = run_dir / "tasks" / f"{task_id_for('S', 'other')}.json"
        before = snapshot(outside)
        rec = record()
        next_gen, last_done = 1, 0
        saved: list[tuple[Path, Path]] = []  # (folder replaced by a link, where it was kept)

        def unlink_folders() -> None:
            for folder, kept in reversed(saved):
                folder.unlink()
                if kept.exists():
                    kept.rename(folder)
            saved.clear()

        def store_op(op: tuple) -> None:
            nonlocal next_gen, last_done
            name = op[0]
            try:
                if name == "commit":
                    gen, next_gen = next_gen, next_gen + 1
                    store.commit_checkpoint(rec, ck(gen))
                    last_done = gen
                elif name == "read":
                    store.read_tasks(JK, RID)
                    store.list_generations(rec)
                    store.read_run(JK, RID)
                    store.list_runs()
                elif name == "lease":
                    lease = store.acquire_task_lease(JK, RID, "S", "{}")
                    if lease is not None:
                        lease.release()
                    with store.run_lock(JK, RID, timeout=0.1):
                        pass
                elif name == "run_record":
                    store.write_run(run_record())
            except StoreError:
                pass  # the one documented error

        for op in ops:
            name = op[0]
            tasks = folders["tasks"]
            if name in ("commit", "read", "lease", "run_record"):
                store_op(op)
            elif name == "kill" and tasks.is_dir() and not tasks.is_symlink():
                (tasks / f".tmp-killed{next_gen}").write_bytes(b'{"half')  # abandoned write
            elif name == "corrupt" and tasks.is_dir() and not tasks.is_symlink():
                target = tasks / f"{tid}.json"
                if not target.is_dir() or target.is_symlink():
                    if target.is_symlink():
                        target.unlink()
                    target.write_bytes(op[1])
            elif name == "link_record" and tasks.is_dir() and not tasks.is_symlink():
                target = {
                    "mine": tasks / f"{tid}.json",
                    "other": other,
                    "lock": tasks / f"{tid}.lock",
                    "slots": tasks / SLOTS_FILE,
                }[op[1]]
                if os.path.lexists(target) and not target.is_dir():
                    target.unlink()
                if not os.path.lexists(target):
                    target.symlink_to(outside / ("foreign.txt" if op[1] == "mine" else "new"))
            elif name == "special" and tasks.is_dir() and not tasks.is_symlink():
                if not os.path.lexists(other):
                    if op[1] == "fifo":
                        os.mkfifo(other)
                    elif op[1] == "folder":
                        other.mkdir()
                    else:
                        with open(other, "wb") as fh:
                            fh.truncate(MAX_RECORD_BYTES + 1)
            elif name == "link_folder":
                folder = folders[op[1]]
                if folder.is_dir() and not folder.is_symlink():
                    kept = folder.with_name(folder.name + ".kept")
                    if not os.path.lexists(kept):
                        folder.rename(kept)
                        folder.symlink_to(outside, target_is_directory=True)
                        saved.append((folder, kept))
            elif name == "unlink_folders":
                unlink_folders()
            assert snapshot(outside) == before, op

        unlink_folders()
        if last_done:
            gen_file = folders["tasks"] / f"{tid}.gen-{last_done:06d}.json"
            assert gen_file.is_file(), sorted(p.name for p in folders["tasks"].iterdir())
            assert f'"s{last_done}"' in gen_file.read_text()
        # the completion clean-up, then deleting the run, touch nothing outside either
        try:
            store.delete_checkpoints(run_record())
        except StoreError:
            pass
        try:
            store.removal.delete(JK, RID, this_process())
        except StoreError:
            pass
        assert snapshot(outside) == before
