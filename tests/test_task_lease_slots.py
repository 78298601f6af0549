"""Task leases as slots of one lock file (issue 38): on a local store a run of record version 2
holds each task's lease as an open file description lock on one byte of ``tasks/leases.lock``
(``core.fs._local.FlockLeases.member``), instead of a lock file made per task; a version 1 run
keeps a lock file per task. Holders are real processes, killed with SIGKILL."""

from __future__ import annotations

import os
import posixpath
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core import CheckpointStore, RunRecord, StoreError
from core._records import RUN_SCHEMA_VERSION
from core.fs._local import SLOTS_FILE, slot_of
from core.store._layout import task_id_for

REPO = Path(__file__).resolve().parent.parent
JK, RID = "0123456789abcdef", "20260101-000000-abcdef"

HOLDER = textwrap.dedent(
    """
    import sys, time
    from core import CheckpointStore
    store = CheckpointStore(sys.argv[1])
    lease = store.acquire_task_lease(sys.argv[2], sys.argv[3], "S", sys.argv[4])
    print("held" if lease is not None else "refused", flush=True)
    time.sleep(600)
    """
)


def _store(tmp_path: Path, version: int = RUN_SCHEMA_VERSION) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "store")
    run = RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h")
    store.write_run(run.model_copy(update={"schema_version": version}))
    return store


def _tasks(tmp_path: Path) -> Path:
    return tmp_path / "store" / "jobs" / JK / "runs" / RID / "tasks"


def _holder(tmp_path: Path, task_key: str) -> tuple[subprocess.Popen[str], str]:
    """A process that takes the task's lease and keeps it; and what it said."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "store"), JK, RID, task_key],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_a_new_run_holds_its_task_leases_as_slots_of_one_file(tmp_path: Path) -> None:
    """No lock file per task: one ``leases.lock``. A slot held (in this process or another)
    is refused to a second taker, another task's slot is not; a killed holder's slot is free."""
    store = _store(tmp_path)
    first = store.acquire_task_lease(JK, RID, "S", '{"F":"1"}')
    assert first is not None
    assert sorted(p.name for p in _tasks(tmp_path).iterdir()) == [SLOTS_FILE]
    assert store.acquire_task_lease(JK, RID, "S", '{"F":"1"}') is None  # same process, held
    assert store.task_lease_held(JK, RID, "S", '{"F":"1"}')
    other = store.acquire_task_lease(JK, RID, "S", '{"F":"2"}')
    assert other is not None  # another slot
    proc, said = _holder(tmp_path, '{"F":"1"}')
    try:
        assert said == "refused"  # held here: refused there
    finally:
        _stop(proc)
    first.release()
    proc, said = _holder(tmp_path, '{"F":"1"}')
    try:
        assert said == "held"
        assert store.acquire_task_lease(JK, RID, "S", '{"F":"1"}') is None
        assert store.task_lease_held(JK, RID, "S", '{"F":"1"}')
    finally:
        _stop(proc)
    assert not store.task_lease_held(JK, RID, "S", '{"F":"1"}')  # its holder died
    again = store.acquire_task_lease(JK, RID, "S", '{"F":"1"}')
    assert again is not None
    again.release()
    other.release()
    assert sorted(p.name for p in _tasks(tmp_path).iterdir()) == [SLOTS_FILE]


def test_a_delete_sees_a_slot_held_by_another_process(tmp_path: Path) -> None:
    """``RunRemoval.held_leases`` (what ``checkpoints delete`` and ``gc`` ask) finds a held slot,
    which a whole-file flock probe would not see, and nothing once its holder is gone."""
    store = _store(tmp_path)
    where = posixpath.dirname(str(_tasks(tmp_path)))
    proc, said = _holder(tmp_path, '{"F":"7"}')
    try:
        assert said == "held"
        held = store.removal.held_leases(where)
        assert held == [posixpath.join(where, "tasks", SLOTS_FILE.removesuffix(".lock"))]
    finally:
        _stop(proc)
    assert store.removal.held_leases(where) == []


def test_a_version_1_run_keeps_a_lock_file_per_task(tmp_path: Path) -> None:
    """A run recorded before issue 38 (an older openjd-checkpoint may still run its tasks)
    takes each task's lease as its own lock file, and stays version 1 when rewritten."""
    store = _store(tmp_path, version=1)
    lease = store.acquire_task_lease(JK, RID, "S", "{}")
    assert lease is not None
    assert [p.name for p in _tasks(tmp_path).iterdir()] == [f"{task_id_for('S', '{}')}.lock"]
    proc, said = _holder(tmp_path, "{}")
    try:
        assert said == "refused"
    finally:
        _stop(proc)
    lease.release()
    store.update_run(JK, RID, message="x")
    run = store.read_run(JK, RID)
    assert run is not None and run.schema_version == 1


def test_a_run_record_of_an_unknown_version_is_refused_by_name(tmp_path: Path) -> None:
    """A newer run record is not read (nor its tasks' leases taken some other way): the error
    names the file and the versions this one reads; the record is left as it is."""
    store = _store(tmp_path, version=RUN_SCHEMA_VERSION + 1)
    path = tmp_path / "store" / "jobs" / JK / "runs" / RID / "run.json"
    before = path.read_bytes()
    with pytest.raises(
        StoreError, match=r"schema version 3, this openjd-checkpoint reads version 1 or 2"
    ):
        store.acquire_task_lease(JK, RID, "S", "{}")
    assert path.read_bytes() == before and not _tasks(tmp_path).exists()


def test_slots_of_a_million_task_ids_do_not_collide() -> None:
    """Two tasks sharing a slot would wait for each other (never both run): with 63 bits of
    hash, a million tasks of one run share none."""
    names = [task_id_for("Render", f'{{"Frame":"{i}"}}') for i in range(1_000_000)]
    slots = {slot_of(name) for name in names}
    assert len(slots) == len(names)
    assert all(0 <= s < 2**63 for s in list(slots)[:1000])


def test_a_lease_that_cannot_be_taken_names_the_file_not_the_slot(tmp_path: Path) -> None:
    store = _store(tmp_path)
    (_tasks(tmp_path) / SLOTS_FILE).mkdir(parents=True)
    with pytest.raises(StoreError) as caught:
        store.acquire_task_lease(JK, RID, "S", "{}")
    assert str(caught.value).endswith(f"/tasks/{SLOTS_FILE}: Is a directory (errno 21)")


@pytest.mark.parametrize("value", ["absent", True, 2.0, "2", None, -1])
def test_a_run_record_s_version_is_an_integer_it_knows_and_absent_is_version_1(
    tmp_path: Path, value: object
) -> None:
    """A run record without ``schema_version`` is version 1 (a lock file per task, as every
    earlier openjd-checkpoint reads it); one that is not the integer 1 or 2 is refused."""
    import json

    store = _store(tmp_path)
    path = tmp_path / "store" / "jobs" / JK / "runs" / RID / "run.json"
    doc = json.loads(path.read_text())
    if value == "absent":
        del doc["schema_version"]
    else:
        doc["schema_version"] = value
    path.write_text(json.dumps(doc))
    store = CheckpointStore(tmp_path / "store")
    if value != "absent":
        with pytest.raises(StoreError, match="schema version"):
            store.read_run(JK, RID)
        return
    lease = store.acquire_task_lease(JK, RID, "S", "{}")
    assert lease is not None
    assert [p.name for p in _tasks(tmp_path).iterdir()] == [f"{task_id_for('S', '{}')}.lock"]
    lease.release()


def test_records_that_have_no_version_field_still_read(tmp_path: Path) -> None:
    """A stop request has no ``schema_version``: the run record's version rules leave it be
    (a bug of this change once made every stop request unreadable, so a suspended run ended
    failed)."""
    from core._records import StopRequest

    store = _store(tmp_path)
    run = store.read_run(JK, RID)
    assert run is not None
    store.add_stop_request(run, StopRequest(mode="Suspended", attempt=1, requested_at=1.0))
    (request,) = store.read_stop_requests(JK, RID)
    assert request.mode == "Suspended"
