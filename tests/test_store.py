"""The checkpoint store: atomic versioned records, generations, unreadable records kept; on a
local folder, ``memory://`` and ``s3://`` (a moto server) alike (the ``store_url`` fixture)."""

from __future__ import annotations

import json
import os
import posixpath
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core import CheckpointData, CheckpointStore, RunRecord, StoreError, TaskRecord
from core._records import TaskStatus
from core.store import this_process
from core.store._layout import task_id_for

JK = "0123456789abcdef"
RID = "20260101-000000-abcdef"
RUN_DIR = f"jobs/{JK}/runs/{RID}"
TASK_FILE = f"{RUN_DIR}/tasks/{task_id_for('S', '{}')}.json"
LOCAL_AND_S3 = pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)


def raw_path(store: CheckpointStore, rel: str) -> str:
    """The store's own name of ``rel`` below its root (what its messages show)."""
    return posixpath.join(store.root, rel)


def write_raw(store: CheckpointStore, rel: str, data: str | bytes) -> None:
    """Write a file below the store's root behind the store's back."""
    payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    store.fs.fsspec.pipe_file(raw_path(store, rel), payload)


def read_json(store: CheckpointStore, rel: str) -> dict:
    return json.loads(store.fs.fsspec.cat_file(raw_path(store, rel)))


def names(store: CheckpointStore, rel: str) -> list[str]:
    return sorted(
        posixpath.basename(p.rstrip("/"))
        for p in store.fs.fsspec.ls(raw_path(store, rel), detail=False)
    )


def record(**kw) -> TaskRecord:
    base = dict(job_key=JK, run_id=RID, step="S", task_key="{}", parameters={})
    base.update(kw)
    return TaskRecord(**base)


def ck(gen: int, state: str = "s") -> CheckpointData:
    return CheckpointData(generation=gen, state=f"{state}{gen}", saved_at=1.0, attempt=1)


def test_round_trip_and_generations_kept(store_url: str) -> None:
    store = CheckpointStore(store_url, keep_generations=2)
    rec = record()
    for gen in range(1, 6):
        store.commit_checkpoint(rec, ck(gen))
    tasks, warnings = store.read_tasks(JK, RID)
    assert warnings == []
    assert tasks[0].checkpoint.state == "s5"
    assert [g.generation for g in store.list_generations(tasks[0])] == [4, 5]


def test_the_generations_of_many_tasks_are_listed_with_one_listing_of_their_run(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_generations_of`` gives what ``list_generations`` gives for each task, listing
    the run's tasks folder once (a view of a 16,000-task run listed it per task: minutes)."""
    store = CheckpointStore(store_url, keep_generations=2)
    recs = [record(task_key=json.dumps({"I": i})) for i in range(5)]
    for i, rec in enumerate(recs):
        for gen in range(1, 2 + i):
            store.commit_checkpoint(rec, ck(gen, f"t{i}-"))
    each = [store.list_generations(r) for r in recs]
    assert [[g.generation for g in gens] for gens in each] == [[1], [1, 2], [2, 3], [3, 4], [4, 5]]
    listed: list[str] = []
    real = store.fs.list_names

    def list_names(path: str) -> list[str]:
        listed.append(path)
        return real(path)

    monkeypatch.setattr(store.fs, "list_names", list_names)
    assert store.list_generations_of(recs) == each
    assert len(listed) == 1, listed
    assert store.list_generations_of(recs, latest=1) == [gens[-1:] for gens in each]


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_a_fenced_holder_remembers_a_bounded_number_of_versions(store_url: str) -> None:
    """On S3 a task's holder notes the ETag of each file it writes under its lease, so that its
    next write of the record is conditional on it (fencing): a commit's generation file is
    noted too, to be deleted again if the lease turns out lost before the record is written.
    Once the record is written that note is of no use: a task that saves for days must not
    keep one per generation (it did: memory grew with every save)."""
    store = CheckpointStore(store_url)
    lease = store.acquire_task_lease(JK, RID, "S", "{}")
    assert lease is not None
    try:
        store.fence_task(lease, JK, RID, "S", "{}")
        rec = record()
        for gen in range(1, 21):
            store.commit_checkpoint(rec, ck(gen), fence=lease)
        assert store.read_tasks(JK, RID)[0][0].checkpoint.state == "s20"
        assert len(lease.versions) <= 2, sorted(lease.versions)
    finally:
        lease.release()


def test_unreadable_record_is_moved_aside_and_rebuilt_from_its_newest_generation(
    store_url: str,
) -> None:
    """A damaged task record is kept aside, never overwritten, and the record is rebuilt from
    the task's newest readable generation: the stored checkpoint is not lost."""
    store = CheckpointStore(store_url)
    rec = record(parameters={"F": {"type": "INT", "value": "3"}}, chunk_parameter=None)
    rec.completed_frames = [1, 2]
    rec.step_hash = "abc"
    for gen in (1, 2, 3):
        store.commit_checkpoint(rec, ck(gen))
    write_raw(store, TASK_FILE, "{ not json")
    # the newest generation is damaged too: the one before it is used
    gen3 = f"{RUN_DIR}/tasks/{task_id_for('S', '{}')}.gen-000003.json"
    write_raw(store, gen3, "[1, 2")
    tasks, warnings = store.read_tasks(JK, RID)
    path = raw_path(store, TASK_FILE)
    assert len(warnings) == 1 and path in warnings[0] and "unreadable" in warnings[0]
    assert "rebuilt from its checkpoint generation 2" in warnings[0]
    [task] = tasks
    assert (task.step, task.task_key, task.parameters) == ("S", "{}", rec.parameters)
    assert task.status == TaskStatus.INTERRUPTED and task.checkpoint.state == "s2"
    assert task.completed_frames == [1, 2] and task.step_hash == "abc"
    aside = [n for n in names(store, f"{RUN_DIR}/tasks") if ".unreadable-" in n]
    assert len(aside) == 2  # the record and generation 3, both kept
    record_aside = next(n for n in aside if ".gen-" not in n)
    assert (
        store.fs.fsspec.cat_file(raw_path(store, f"{RUN_DIR}/tasks/{record_aside}"))
        == b"{ not json"
    )
    # the rebuilt record was written: the next read is clean, and read_task agrees
    assert store.read_tasks(JK, RID) == ([task], [])
    assert store.read_task(JK, RID, "S", "{}").checkpoint.state == "s2"


def test_a_record_edited_to_name_another_task_is_set_aside_not_planned_twice(
    store_url: str,
) -> None:
    """A task record whose ``task_key`` was edited (or a record copied over another task's
    file) is not read as that other task: it is kept aside, and the task's own record is
    rebuilt from its newest generation, so no task is listed twice."""
    store = CheckpointStore(store_url)
    for key in ("{}", '{"I": "2"}'):
        rec = record(task_key=key)
        for gen in (1, 2):
            store.commit_checkpoint(rec, ck(gen, state=key))
    data = read_json(store, TASK_FILE)
    data["task_key"] = '{"I": "2"}'  # names the other task
    write_raw(store, TASK_FILE, json.dumps(data))
    reader = CheckpointStore(store_url, create=False, read_only=True)
    tasks, warnings = reader.read_tasks(JK, RID)  # read-only: named, left in place
    assert [t.task_key for t in tasks] == ['{"I": "2"}']
    assert any("names another task" in w and raw_path(store, TASK_FILE) in w for w in warnings)
    tasks, warnings = store.read_tasks(JK, RID)
    assert sorted(t.task_key for t in tasks) == ['{"I": "2"}', "{}"], warnings
    own = next(t for t in tasks if t.task_key == "{}")
    assert own.checkpoint is not None and own.checkpoint.state == "{}2"
    assert any("names another task" in w and "rebuilt from" in w for w in warnings), warnings
    assert any(".unreadable-" in n for n in names(store, f"{RUN_DIR}/tasks"))


def test_unreadable_record_with_no_usable_generation_is_moved_aside_not_overwritten(
    store_url: str,
) -> None:
    """With no generation that names its task (files written before generations carried it,
    or a generation of another task under this name), the record is only kept aside."""
    store = CheckpointStore(store_url)
    rec = record()
    store.commit_checkpoint(rec, ck(1))
    gen1 = f"{RUN_DIR}/tasks/{task_id_for('S', '{}')}.gen-000001.json"
    old_format = read_json(store, gen1)
    del old_format["task"]
    write_raw(store, gen1, json.dumps(old_format))
    write_raw(store, TASK_FILE, "{ not json")
    tasks, warnings = store.read_tasks(JK, RID)
    assert tasks == []
    path = raw_path(store, TASK_FILE)
    assert len(warnings) == 1 and path in warnings[0] and "unreadable" in warnings[0]
    assert "rebuilt" not in warnings[0]
    aside = [n for n in names(store, f"{RUN_DIR}/tasks") if ".unreadable-" in n]
    assert len(aside) == 1
    assert store.fs.fsspec.cat_file(raw_path(store, f"{RUN_DIR}/tasks/{aside[0]}")) == b"{ not json"
    # the checkpoint generation file is still there too, and still lists as a generation
    assert any(".gen-000001" in n for n in names(store, f"{RUN_DIR}/tasks"))
    assert [g.state for g in store.list_generations(rec)] == ["s1"]
    # another task's generation under this task's name does not rebuild it
    other = read_json(store, gen1) | {"task": {"step": "T", "task_key": "{}", "parameters": {}}}
    write_raw(store, gen1, json.dumps(other))
    write_raw(store, TASK_FILE, "{ not json")
    with pytest.raises(StoreError, match="unreadable"):
        store.read_task(JK, RID, "S", "{}")


def test_other_schema_version_is_refused_by_name(store_url: str) -> None:
    store = CheckpointStore(store_url)
    run = RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h")
    store.write_run(run)
    data = read_json(store, f"{RUN_DIR}/run.json")
    data["schema_version"] = 99
    write_raw(store, f"{RUN_DIR}/run.json", json.dumps(data))
    with pytest.raises(StoreError, match="schema version 99"):
        store.read_run(JK, RID)
    # not moved: a newer openjd-checkpoint can still read it
    assert store.fs.fsspec.exists(raw_path(store, f"{RUN_DIR}/run.json"))


def test_record_with_unknown_field_is_refused(store_url: str) -> None:
    store = CheckpointStore(store_url)
    store.write_task(record())
    data = read_json(store, TASK_FILE)
    data["surprise"] = 1
    write_raw(store, TASK_FILE, json.dumps(data))
    tasks, warnings = store.read_tasks(JK, RID)
    assert tasks == [] and "surprise" in warnings[0]


def test_record_naming_a_key_twice_is_set_aside_naming_the_key(store_url: str) -> None:
    """``{"status": "running", ..., "status": "succeeded"}``: json keeps the last without a
    word; the store refuses the record (set aside, the task rebuilt from its checkpoint)."""
    store = CheckpointStore(store_url)
    rec = record(status=TaskStatus.RUNNING)
    store.commit_checkpoint(rec, ck(1))
    text = json.dumps(read_json(store, TASK_FILE))
    write_raw(store, TASK_FILE, text[:-1] + ', "status": "succeeded"}')
    tasks, warnings = store.read_tasks(JK, RID)
    assert len(warnings) == 1 and "duplicate key 'status'" in warnings[0], warnings
    assert [t.status for t in tasks] == [TaskStatus.INTERRUPTED]  # rebuilt, not "succeeded"
    assert tasks[0].checkpoint is not None and tasks[0].checkpoint.state == "s1"
    assert any(".unreadable-" in n for n in names(store, f"{RUN_DIR}/tasks"))


def test_a_record_that_cannot_be_set_aside_is_left_in_place_and_not_written_over(
    tmp_path: Path,
) -> None:
    """Every name it could be set aside under is taken (a hostile trial): the read raises a
    ``StoreError`` that says so (not ``SetAsideError``, "kept as" its own path), and the
    damaged record is not rebuilt over."""
    import time

    from core.store import SetAsideError

    store = CheckpointStore(tmp_path)
    rec = record(status=TaskStatus.RUNNING)
    store.commit_checkpoint(rec, ck(1))
    write_raw(store, TASK_FILE, "{ torn")
    now = int(time.time())
    for stamp in range(now, now + 3):
        for n in range(100):
            write_raw(store, f"{TASK_FILE}.unreadable-{stamp}" + (f"-{n}" if n else ""), "x")
    with pytest.raises(StoreError, match="could not be set aside") as caught:
        store.read_task(JK, RID, "S", "{}")  # a claim's read: the task does not start
    assert not isinstance(caught.value, SetAsideError)
    assert "left in place" in str(caught.value) and raw_path(store, TASK_FILE) in str(caught.value)
    tasks, warnings = store.read_tasks(JK, RID)  # a listing names it, and goes on
    assert tasks == [] and len(warnings) == 1 and "could not be set aside" in warnings[0]
    assert (tmp_path / TASK_FILE).read_text() == "{ torn"


def test_leftover_temporary_file_is_ignored(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write_task(record(status=TaskStatus.RUNNING))
    tdir = tmp_path / f"jobs/{JK}/runs/{RID}/tasks"
    (tdir / ".tmp-abc").write_text('{"half": ')
    tasks, warnings = store.read_tasks(JK, RID)
    assert warnings == [] and len(tasks) == 1


def test_delete_run(store_url: str) -> None:
    store = CheckpointStore(store_url)
    rec = record()
    store.commit_checkpoint(rec, ck(1))
    assert store.read_tasks(JK, RID)[0][0].checkpoint.state == "s1"
    store.removal.delete(JK, RID, this_process())
    assert store.read_tasks(JK, RID) == ([], [])


CRASHER = textwrap.dedent(
    """
    import sys
    from core import CheckpointData, CheckpointStore, TaskRecord
    store = CheckpointStore(sys.argv[1])
    rec = TaskRecord(
        job_key="0123456789abcdef", run_id="20260101-000000-abcdef", step="S", task_key="{}",
        parameters={},
    )
    gen = 0
    while True:
        gen += 1
        store.commit_checkpoint(
            rec, CheckpointData(generation=gen, state="x" * 4096 + str(gen), saved_at=0, attempt=1)
        )
        if gen == 1:  # killed in the burst that follows, whatever the machine's load
            print("ready", flush=True)
    """
)


@pytest.mark.parametrize(
    ("store_url", "delay"),
    [("local", 0.05), ("local", 0.13), ("local", 0.29), ("s3", 0.29)],
    indirect=["store_url"],
)
def test_sigkill_during_a_burst_of_saves_leaves_a_readable_latest(store_url: str, delay) -> None:
    """A writer killed at an arbitrary instant: the record is whole and not older than the
    previous generation it had committed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, store_url],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout.readline() == b"ready\n"
    import time

    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = CheckpointStore(store_url)
    tasks, warnings = store.read_tasks(JK, RID)
    assert warnings == []
    (task,) = tasks
    gens = store.list_generations(task)
    assert task.checkpoint is not None
    assert task.checkpoint.state.endswith(str(task.checkpoint.generation))
    # the record points at the newest generation written whole, or the one just before it
    assert task.checkpoint.generation >= max(g.generation for g in gens) - 1


@pytest.mark.parametrize("bad", ["../../x", "..", "a/b", "", ".hidden", "x" * 200])
def test_ids_that_are_not_one_safe_path_component_are_refused(store_url: str, bad: str) -> None:
    store = CheckpointStore(store_url)
    with pytest.raises(StoreError, match="refusing to use it as a path"):
        store.removal.delete(JK, bad, this_process())
    assert store.find_run(bad) is None


def test_record_whose_ids_do_not_match_its_folder_is_refused(store_url: str) -> None:
    """An edited run.json naming another run must not make the store touch that run."""
    store = CheckpointStore(store_url)
    store.write_run(RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h"))
    other = "20260101-000000-ffffff"
    store.write_run(RunRecord(job_key=JK, run_id=other, job_name="n", template_hash="h"))
    data = read_json(store, f"{RUN_DIR}/run.json")
    data["run_id"] = other
    write_raw(store, f"{RUN_DIR}/run.json", json.dumps(data))
    runs, warnings = store.list_runs()
    assert [r.run_id for r in runs] == [other]
    assert "does not match its folder" in warnings[0]


@pytest.mark.parametrize(
    "garbage",
    ['{"schema_version": 1, "x": ' + "9" * 5000 + "}", "[" * 100_000, "\udcff"],
    ids=["huge-int", "deep", "bad-utf8"],
)
def test_hostile_record_is_a_warning_not_a_crash(store_url: str, garbage: str) -> None:
    store = CheckpointStore(store_url)
    store.write_run(RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h"))
    write_raw(store, f"{RUN_DIR}/run.json", garbage)
    runs, warnings = store.list_runs()
    assert runs == [] and "unreadable" in warnings[0]


def test_read_only_use_does_not_create_the_store(tmp_path: Path) -> None:
    CheckpointStore(tmp_path / "nope", create=False).list_runs()
    assert not (tmp_path / "nope").exists()
    with pytest.raises(StoreError, match="empty"):
        CheckpointStore("")


def test_an_s3_store_in_a_bucket_that_does_not_exist_is_refused_not_created(
    s3_server, tmp_path: Path
) -> None:
    """s3fs would create the bucket (a typo in its name would make a new bucket): the store
    refuses, naming it; the CLI exits 3 with that message. An existing bucket's new prefix is
    made as before."""
    import s3fs

    with pytest.raises(StoreError, match="the bucket 'openjd-no-such-bucket' does not exist"):
        CheckpointStore("s3://openjd-no-such-bucket/runs")
    fs = s3fs.S3FileSystem(use_listings_cache=False)
    assert "openjd-no-such-bucket" not in [b.rstrip("/") for b in fs.ls("")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "core.cli",
            "run",
            "examples/fibonacci/fibonacci-fast.yaml",
            "-p",
            "N=1",
            "--store",
            "s3://openjd-no-such-bucket/x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode in (2, 3), done.stderr
    assert "openjd-no-such-bucket" in done.stderr and "Traceback" not in done.stderr
    # A reading command says so too, rather than that the store holds no runs.
    listed = subprocess.run(
        [sys.executable, "-m", "core.cli", "runs", "--store", "s3://openjd-no-such-bucket/x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert listed.returncode == 3 and "does not exist" in listed.stderr, listed
    with pytest.raises(StoreError, match="names its bucket"):
        CheckpointStore("s3://")
    CheckpointStore(s3_server.new_store())  # the test bucket exists: fine


def test_a_refusal_names_a_dead_holder_whose_lease_has_not_expired() -> None:
    """On a store other than a local folder a dead holder's lease frees only after its ttl:
    the refusal says the process has ended and when to try again, instead of asking to wait
    for a process that is gone. A live holder, or one of another host, is named only."""
    from core._host import host_id
    from core._records import ProcessInfo
    from core.store import describe_holder

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = CheckpointStore("memory://openjd-holder-test")
    gone = ProcessInfo(pid=dead.pid, pgid=dead.pid, start_time=0, host=host_id())
    assert "has ended" in describe_holder(store, gone) and "60 s" in describe_holder(store, gone)
    me = ProcessInfo(pid=os.getpid(), pgid=os.getpgid(0), start_time=0, host=host_id())
    assert describe_holder(store, me) == f" by process {os.getpid()}"
    other = ProcessInfo(pid=dead.pid, pgid=dead.pid, start_time=0, host="another-host")
    assert describe_holder(store, other) == f" by process {dead.pid}"
    assert describe_holder(store, None) == ""


def test_list_generations_latest_reads_only_the_newest(tmp_path: Path) -> None:
    """``list_generations(rec, latest=N)``: the N newest by number (generation 1000000's name,
    seven digits, sorts before 999999's as text), oldest first; an older file, even damaged,
    is not read (a page polling a store that keeps thousands reads a few)."""
    import core

    st = core.CheckpointStore(tmp_path / "store", keep_generations=10**7)
    rec = core.TaskRecord(job_key="0" * 16, run_id="r1", step="S", task_key="{}", parameters={})
    st.write_run(core.RunRecord(job_key="0" * 16, run_id="r1", job_name="J", template_hash="h"))
    for n in (7, 999_999, 1_000_000):
        st.commit_checkpoint(rec, core.CheckpointData(generation=n, saved_at=1.0, attempt=1))
    [old] = (tmp_path / "store").rglob("*.gen-000007.json")
    old.write_text("{damaged")
    assert [g.generation for g in st.list_generations(rec, latest=2)] == [999_999, 1_000_000]
    assert old.read_text() == "{damaged"  # not read, so not set aside
    assert st.list_generations(rec, latest=0) == []
    assert [g.generation for g in st.list_generations(rec)] == [999_999, 1_000_000]  # set aside
    assert not old.exists()


def test_a_lease_file_that_cannot_be_taken_is_named_with_its_suffix(tmp_path: Path) -> None:
    """The error names the lease's own file (``….lock``), not its base name (a hostile-input
    try replaced a task's lock file with a folder: the message named a path that did not
    exist)."""
    from core.store._lease import take_lease_once

    store = CheckpointStore(str(tmp_path / "store"))
    base = raw_path(store, f"{RUN_DIR}/tasks/{task_id_for('S', '{}')}")
    leases = store.fs.leases()
    os.makedirs(base + leases.suffix)
    with pytest.raises(StoreError) as info:
        take_lease_once(store.fs, base, 60.0)
    assert store.fs.where(base + leases.suffix) in str(info.value), str(info.value)
