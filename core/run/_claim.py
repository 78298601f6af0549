"""Claiming a task: its lease, its stored record, and no earlier process of it left alive.

``claim_task`` is what every runner does before a task starts (``core.run._executor``): take the
task's lease (``core.store._lease``), wait for a held one on a store whose leases have a ttl (a
holder that died frees it only once its ttl ran out: ``$OPENJD_CHECKPOINT_LEASE_SECONDS``),
read the task's record, and kill a process of an earlier attempt still alive on this host.
Implements the resume safety of seed 001 (Trax's run-level refusal ``already-resumed``), for
one task.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from core._killpoints import kill_point
from core._records import TaskRecord, TaskStatus
from core.job import PreparedJob, TaskSpec, plan_tasks
from core.process import kill_recorded_process, recorded_name
from core.store import CheckpointStore, HeldLease, Lease, SetAsideError
from core.task import RefusalCode, ResumeRefusedError, no_run_words

__all__ = (
    "LEASE_WAIT_MARGIN_SECONDS",
    "NotStartedError",
    "claim_task",
    "lease_expired_note",
    "planned_as_stored",
)


class NotStartedError(Exception):
    """A stop request came while ``claim_task`` waited for the task's lease: the task is not
    started (``str()`` says why)."""


LEASE_WAIT_MARGIN_SECONDS = 10.0
"""How much longer than a held lease's ttl ``claim_task`` waits for it to free."""


def claim_task(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    *,
    note: Callable[[str], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
    run_held: bool = False,
    lost: Callable[[], str | None] | None = None,
) -> tuple[Lease, TaskRecord | None]:
    """Take the task's lease and make sure no earlier process of it is alive on this host.

    On a store whose leases have a ttl (S3 and other remote stores), a lease held by another
    process makes the claim wait for it, up to the lease's ttl plus
    ``LEASE_WAIT_MARGIN_SECONDS``: a holder that died (a lost host, a killed worker) cannot
    release it, and its lease frees only once its ttl has run out. The wait is told to ``note``
    when it starts and when it ends; it stops early when ``should_stop`` returns a reason. On
    a local folder or ``memory://`` a live holder is known to be alive: refused at once (after
    0.5 s, so that a process that merely probes the lease is not mistaken for a holder). A
    task that the holder waited for ran to its end meanwhile is not run again: refused.

    With the lease taken, the run must still be there: a run being deleted (``core.run._delete``,
    which looks at its tasks' leases again once it has marked the run) starts no task.
    ``run_held``: this process holds the run's lease (the CLI), so no delete can have begun:
    not looked at.

    ``lost``: why this process may no longer start the run's tasks (it lost the run's lease;
    None: it may). Asked before the claim, during a wait for the task's lease, and once it is
    taken (then released again): a process stalled past its run lease at any of those points
    (a SIGSTOP, a paused VM, a swapped-out host) starts nothing on waking.

    Returns the lease (release it when the task ends) and the task's stored record (None if it
    has none); what a person should know (a record rebuilt, an earlier process stopped) goes
    to ``note``.

    Raises:
        ResumeRefusedError: ``already-resumed``: another live process holds the task (on a ttl
            store: still, after the wait), or the holder waited for ran it to its end;
            ``unknown-run``: the run has been deleted, or is being deleted.
        NotStartedError: ``should_stop`` gave a reason during the wait, or ``lost`` one.
        StoreError: the store cannot be read or written, or the task's record is unreadable and
            was left in place (it could not be set aside, or is of a newer version): the task
            is not started, so that nothing is written over it.
    """
    tell = note or _ignore
    why_lost = lost or _never
    why = why_lost()
    if why is not None:  # a runner woken after a stall past its run lease claims nothing
        raise NotStartedError(why)
    kill_point("task.claiming")
    lease = store.acquire_task_lease(
        job.job_key, run_id, spec.step_name, spec.task_key, wait_seconds=0.5
    )  # a reap that probes the lease lets go at once; a holder does not
    held = None
    if lease is None:
        stop = should_stop or _never
        lease, held = _wait_for_task_lease(
            store, job, run_id, spec, tell, lambda: why_lost() or stop()
        )
    kill_point("task.claimed")
    why = why_lost()
    if why is not None:  # the stall came while the task's lease was taken
        lease.release()
        raise NotStartedError(why)
    if not run_held and store.removal.gone(job.job_key, run_id):
        lease.release()
        raise ResumeRefusedError(
            RefusalCode.UNKNOWN_RUN,
            f"{no_run_words(store, run_id, job.job_key)}: {spec.label} is not started",
        )
    where = (job.job_key, run_id, spec.step_name, spec.task_key)
    try:
        store.fence_task(lease, *where)  # what this holder's record writes are conditional on
    except BaseException:
        lease.release()
        raise
    try:
        rebuilt: list[str] = []
        record = store.read_task(*where, rebuilt)
        if rebuilt:  # the read wrote the record again
            store.fence_task(lease, *where)
        for warning in rebuilt:
            tell(f"warning: {warning}")
    except SetAsideError as exc:  # moved aside, none of its generations rebuilt it: its
        tell(f"warning: {exc}; the task runs from the top")  # place is free
        record = None
    except BaseException:  # a record left in place (unreadable, newer, not read): the task
        lease.release()  # does not start, so that nothing is written over it
        raise
    if held is not None and record is not None and record.status == TaskStatus.SUCCEEDED:
        lease.release()  # the holder waited for was alive after all, and finished the task
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run_id} is being run by another process "
            f"({held.describe()}, which ran it to its end while this one waited for its lease)",
        )
    if record is not None and record.process is not None:
        if kill_recorded_process(record.process):
            tell(
                f"stopped {recorded_name(record.process)} of {spec.label} left running by an "
                "earlier attempt"
            )
    return lease, record


def planned_as_stored(
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    record: TaskRecord | None,
    lease: Lease,
    *,
    attempt: int,
    note: Callable[[str], None] | None = None,
) -> TaskSpec:
    """What to run of ``spec`` now, as its task's record, read under its ``lease``
    (``claim_task``), says. A task is planned before its lease is claimed, and another process
    may run it in between (another try of the same task, the holder the claim waited for, a
    runner woken after its lease expired): the task is planned again from that record alone
    (``PreparedJob.plan_step``, the plan's own rules), so that it resumes from the newest
    checkpoint stored (said to ``note``), runs none of the frames reported finished, and is
    not run again if it ran to its end. A finally task that succeeded in an earlier attempt
    than ``attempt`` runs again, as planned; a remaining piece of a chunk (``KEY#FRAMES``),
    or a chunk whose plan now splits it into pieces, runs as planned.

    Raises:
        ResumeRefusedError: ``already-resumed``: nothing of the task is left to run (another
            process ran it to its end since it was planned); ``lease`` is released.
    """
    if record is None or "#" in spec.task_key:
        return spec
    if job.template.is_finally(spec.step_name) and record.run_attempt < attempt:
        return spec  # finally steps run again on every attempt
    now = plan_tasks(job, spec.step_name, [record], tasks=[spec.record_parameters])
    if not now:
        lease.release()
        by = f" on host {record.host}" if record.host else ""
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run_id} was run to its end by another process{by} "
            "since it was planned; it is not run again",
        )
    if len(now) != 1 or now[0].task_key != spec.task_key:
        return spec
    planned, stored = spec.resume, now[0].resume
    changed = planned is None or (planned.generation, planned.saved_at) != (
        stored.generation if stored else None,
        stored.saved_at if stored else None,
    )
    if note is not None and stored is not None and changed:
        was = f"generation {planned.generation}" if planned is not None else "the top"
        note(
            f"{now[0].label}: resumes from checkpoint generation {stored.generation}, stored "
            f"since it was planned (to run from {was})"
        )
    return now[0]


def _wait_for_task_lease(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    note: Callable[[str], None],
    should_stop: Callable[[], str | None] | None,
) -> tuple[Lease, HeldLease | None]:
    """``claim_task``'s wait for a held lease on a ttl store (see there): the lease and the
    holder waited for (None: it was not waited for)."""
    where = (job.job_key, run_id, spec.step_name, spec.task_key)
    refused = f"task {spec.label} of run {run_id} is being run by another process"
    held = store.task_lease_holder(*where)
    if held is None:  # a local folder, memory://, or freed in between: one more try
        lease = store.acquire_task_lease(*where)
        if lease is None:
            raise ResumeRefusedError(RefusalCode.ALREADY_RESUMED, refused)
        return lease, None
    why = should_stop() if should_stop is not None else None
    if why is not None:  # asked before a wait is announced (a holder woken after a stall)
        raise NotStartedError(why)
    bound = held.ttl + LEASE_WAIT_MARGIN_SECONDS
    note(
        f"{spec.label}: its lease is held by {held.describe()}; waiting up to {bound:g} s "
        f"for it to free (a holder that died loses it {held.ttl:g} s after its last "
        "renewal)"
    )
    began = time.monotonic()
    while True:
        waited = time.monotonic() - began
        why = should_stop() if should_stop is not None else None
        if why is not None:
            raise NotStartedError(why)
        lease = store.acquire_task_lease(*where)
        if lease is not None:
            note(f"{spec.label}: its lease freed after {waited:.0f} s of waiting")
            return lease, held
        if waited >= bound:
            raise ResumeRefusedError(
                RefusalCode.ALREADY_RESUMED,
                f"{refused} ({held.describe()}, whose lease was still renewed after "
                f"{waited:.0f} s of waiting)",
            )
        time.sleep(min(1.0, max(0.05, bound - waited)))


def _ignore(_line: str) -> None:
    pass


def _never() -> str | None:
    return None


def lease_expired_note(lease: Lease) -> str:
    """Why a held lease no longer holds (``Lease.expired``), for a note."""
    if lease.lost:
        return "the lease was taken by another process (it expired here)"
    return (
        "the lease could not be renewed for its whole ttl (the store cannot be written), so "
        "another process may take over the work"
    )
