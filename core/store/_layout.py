"""Where the store keeps what: the names of runs, tasks and their files under the store's root.

Layout under the root (a local directory or any fsspec URL)::

    jobs/<job_key>/job.lock                                     the job's lock
    jobs/<job_key>/runs/<run_id>/run.json                       the run's record (run.lock, lease.*)
    jobs/<job_key>/runs/<run_id>/tasks/<task_id>.json           latest task record
    jobs/<job_key>/runs/<run_id>/tasks/<task_id>.gen-<N>.json   checkpoint generation N
    jobs/<job_key>/runs/<run_id>/tasks/leases.lock              the tasks' leases (local store,
                                                                run version 2; version 1 and
                                                                other stores: <task_id>.lock
                                                                or <task_id>.lease.json)
    jobs/<job_key>/runs/<run_id>/requests/<time>-<id>.json      stop requests
    jobs/<job_key>/runs/<run_id>/sessions/<session_id>.json     open sessions (and their leases)
    jobs/<job_key>/runs/<run_id>/logs/<name>.log.gz             task output logs
    jobs/<job_key>/runs/<run_id>/outputs/<task_id>.json         early outputs (managed files)
    jobs/<job_key>/runs/.deleting-<run_id>-<ns>/                a run being deleted (local store)

Job keys, run ids and session ids are each one safe path component, checked before any path is
made of them (``Layout``); a task's file name is a hash of its step and task key
(``task_id_for``). The content-addressed files beside ``jobs/`` are ``core.files._blobs``'s.
"""

from __future__ import annotations

import functools
import posixpath
import re
import time
import uuid

from core._errors import StoreError
from core._hashing import canonical_json, sha256_hex

__all__ = (
    "LOG_NAME",
    "Layout",
    "is_job_key",
    "is_run_id",
    "new_run_id",
    "task_id_for",
)

LOG_NAME = re.compile(r"[0-9a-f]{24}\.[0-9]{1,9}\.[0-9]{1,9}\.log\.gz")
"""A task output log's file name: a hash of the task, the run's attempt, a counter."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Run ids are one safe path component: made here as ``YYYYmmdd-HHMMSS-xxxxxx``; adapters may
pass their own (letters, digits, ``.``, ``_``, ``-``; not starting with ``.``)."""
_JOB_KEY = re.compile(r"[0-9a-f]{16}")


def is_run_id(text: str) -> bool:
    """True if ``text`` can be a run id (one safe path component, at most 128 characters)."""
    return bool(_RUN_ID.fullmatch(text))


def is_job_key(text: str) -> bool:
    """True if ``text`` is a job key this store makes (16 hexadecimal digits)."""
    return bool(_JOB_KEY.fullmatch(text))


@functools.lru_cache(maxsize=256)  # the tasks in flight, each asked several times
def task_id_for(step: str, task_key: str) -> str:
    """The file name stem of a task's record: a hash of its step name and task key. A chunk's
    remainder piece (task key ``ORIGINAL#FRAMES``) gets its original's stem, a dash and a hash
    of its own, so that the records of one original task and its pieces are found by name
    (``CheckpointStore.read_task_family``) without reading the whole run."""
    base, sep, _piece = task_key.partition("#")
    stem = sha256_hex(canonical_json([step, base]))[:24]
    if not sep:
        return stem
    return stem + "-" + sha256_hex(canonical_json([step, task_key]))[:12]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class Layout:
    """The paths of one store's records below ``root``; ``location`` (credentials hidden) names
    the store in a refusal.

    Raises (every method taking a job key, run id or session id):
        StoreError: it is not one this store makes: it is never used as a path.
    """

    def __init__(self, root: str, location: str) -> None:
        self.root = root
        self.location = location

    @property
    def jobs_dir(self) -> str:
        return posixpath.join(self.root, "jobs")

    def runs_dir(self, job_key: str) -> str:
        return posixpath.join(self.root, "jobs", job_key, "runs")

    def job_lock(self, job_key: str) -> str:
        if not _JOB_KEY.fullmatch(job_key):
            raise StoreError(f"checkpoint store {self.location!r}: {job_key!r} is not a job key")
        return posixpath.join(self.root, "jobs", job_key, "job.lock")

    def run_dir(self, job_key: str, run_id: str) -> str:
        if not _JOB_KEY.fullmatch(job_key) or not _RUN_ID.fullmatch(run_id):
            raise StoreError(
                f"checkpoint store {self.location!r}: {job_key!r}/{run_id!r} is not a job key "
                "and run id this store makes; refusing to use it as a path"
            )
        return posixpath.join(self.root, "jobs", job_key, "runs", run_id)

    def run_path(self, job_key: str, run_id: str) -> str:
        return posixpath.join(self.run_dir(job_key, run_id), "run.json")

    def run_lock(self, job_key: str, run_id: str) -> str:
        """The run's record lock (``run.lock``: ``core.store._lease.hold_lock``)."""
        return posixpath.join(self.run_dir(job_key, run_id), "run.lock")

    def run_lease(self, job_key: str, run_id: str) -> str:
        """The run's lease without its suffix (``lease.lock``, ``lease.lease.json``)."""
        return posixpath.join(self.run_dir(job_key, run_id), "lease")

    def in_run(self, job_key: str, run_id: str, folder: str) -> str:
        """The run's folder ``folder`` (``tasks``, ``requests``, ``sessions``, ``logs``,
        ``outputs``)."""
        return posixpath.join(self.run_dir(job_key, run_id), folder)

    def task_path(self, job_key: str, run_id: str, task_id: str) -> str:
        return posixpath.join(self.in_run(job_key, run_id, "tasks"), f"{task_id}.json")

    def gen_path(self, job_key: str, run_id: str, task_id: str, gen: int) -> str:
        return posixpath.join(
            self.in_run(job_key, run_id, "tasks"), f"{task_id}.gen-{gen:06d}.json"
        )

    def session_base(self, job_key: str, run_id: str, session_id: str) -> str:
        """A session's files without their suffix (``.json``, ``.lock``, ``.lease.json``)."""
        if not _RUN_ID.fullmatch(session_id):
            raise StoreError(f"checkpoint store {self.location!r}: bad session id {session_id!r}")
        return posixpath.join(self.in_run(job_key, run_id, "sessions"), session_id)
