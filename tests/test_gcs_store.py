"""The backend seam shown with a kind of store added through it: ``gs://`` (``core.fs._gcs``, one
module and a registry line) on the session's GCS emulator (fake-gcs-server, ``tests/gcsserver``).
Leases, locks and listings on it are also tested beside S3 in ``test_leases.py``; here: the
backend chosen, its conditional writes on generations, fencing of a record, and what a location
may not be."""

from __future__ import annotations

import time

import pytest

import core.store._lease as lease_module
from core import CheckpointStore, RunRecord, StoreError, TaskRecord
from core._errors import LeaseLostError
from core.fs import StoreFS
from core.fs._gcs import GCSBackend

JK = "0123456789abcdef"
RID = "20260101-000000-abcdef"
GCS = pytest.mark.parametrize("store_url", ["gcs"], indirect=True)


def _record(value: str) -> TaskRecord:
    return TaskRecord(job_key=JK, run_id=RID, step="S", task_key="{}", parameters={}, host=value)


@GCS
def test_a_gs_store_is_served_by_its_backend_whose_writes_are_conditional(store_url: str) -> None:
    fs = StoreFS(store_url)
    assert isinstance(fs.backend, GCSBackend)
    objects = fs.conditional()
    assert objects is not None, "the emulator honours ifGenerationMatch on uploads"
    path = fs.confined(f"{fs.root}/probe-me.json")
    first = objects.create(path, b"1")
    assert first is not None
    assert objects.create(path, b"2") is None  # there is one already
    assert objects.replace(path, b"3", "1") is None  # not that generation
    second = objects.replace(path, b"4", first)
    assert second is not None and second != first
    got = objects.get(path)
    assert got is not None and got[0] == b"4" and got[1] == second and -1 <= got[2] < 30
    objects.delete(path, first)  # not the generation there: kept
    assert objects.version(path) == second
    objects.delete(path, second)
    assert objects.version(path) is None


@GCS
def test_a_holder_that_lost_its_lease_writes_no_record_over_the_new_holders(
    store_url: str,
) -> None:
    """A task's holder stalls past its lease's ttl; another process takes the lease and writes
    the task's record. Woken, the first holder's fenced write is refused (its renewal, a write
    on the condition of its own last generation, finds the new holder), and the record stays
    the new holder's."""
    st = CheckpointStore(store_url)
    st.write_run(RunRecord(job_key=JK, run_id=RID, job_name="n", template_hash="h"))
    stalled = st.acquire_task_lease(JK, RID, "S", "{}", ttl_seconds=1.0)
    assert stalled is not None
    st.fence_task(stalled, JK, RID, "S", "{}")
    st.write_task(_record("first"), fence=stalled)
    lease_module._KEEPER.discard(stalled)  # its process stalls: nothing renews it
    other = CheckpointStore(store_url)
    end = time.monotonic() + 10
    while (taker := other.acquire_task_lease(JK, RID, "S", "{}")) is None:
        assert time.monotonic() < end, "the stalled holder's lease never expired"
        time.sleep(0.05)
    try:
        other.fence_task(taker, JK, RID, "S", "{}")
        other.write_task(_record("second"), fence=taker)
        with pytest.raises(LeaseLostError, match="was lost"):
            st.write_task(_record("stale"), fence=stalled)
        rec = st.read_task(JK, RID, "S", "{}")
        assert rec is not None and rec.host == "second"
    finally:
        taker.release()
        stalled.release()


@GCS
def test_a_run_lock_on_gcs_is_exclusive(store_url: str) -> None:
    with CheckpointStore(store_url).run_lock(JK, RID):
        with pytest.raises(StoreError, match="stayed locked for 0.3 s"):
            with CheckpointStore(store_url).run_lock(JK, RID, timeout=0.3):
                pass
    with CheckpointStore(store_url).run_lock(JK, RID, timeout=5):
        pass  # let go on exit


def test_a_gs_location_names_an_existing_bucket_and_no_credentials(gcs_server) -> None:
    with pytest.raises(StoreError, match="does not exist") as missing:
        StoreFS("gs://no-such-bucket-openjd/prefix")
    assert "create it first" in str(missing.value)
    with pytest.raises(StoreError, match="takes no credentials") as secret:
        StoreFS("gs://user:s3cr3t@openjd-test/prefix")
    assert "s3cr3t" not in str(secret.value)
