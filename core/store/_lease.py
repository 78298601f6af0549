"""Leases and locks on the store's file system.

A lease is the right to run a run, a task or a session now; a lock (a run's record lock, a job's
lock) makes a read-change-write of records one step. How each is held is its store's backend's
(``StoreFS.leases()``, a ``core.fs.LeaseFiles``):

- local directory: ``flock``s, dropped by the kernel when their owner dies (``core.fs._local``);
- ``s3://``, ``gs://``: objects written with conditional writes (create only if absent; renew or
  take over an expired one only if it is still the version read), so that of two takers exactly
  one wins. A server that does not honour them (probed once per process and bucket) gets the
  best-effort files of other stores, with a warning (``logging``, once) (``core.fs._objects``);
- ``memory://`` (one process): files read then written under a threading lock, and threading
  locks, exact within the process (``core.fs._memory``);
- any other fsspec store: a ``*.lease.json`` with an expiry, read then written (best effort),
  and no run or job lock (``core.fs._fsspec``).

Everywhere but a local store, a held lease is renewed by a daemon thread of its process
(``_KEEPER``), so it expires only when its process died (or stalled for its whole ttl).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

from core._errors import LeaseLostError, SettingError, StoreError, seconds_in_range
from core._host import host_id
from core._records import ProcessInfo
from core.fs import (
    DEFAULT_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    LeaseClaim,
    LeaseFiles,
    NotARecordError,
    StoreFS,
    lease_ttl,
    lock_fence,
    os_reason,
)

__all__ = (
    "DEFAULT_LEASE_SECONDS",
    "LEASE_SECONDS_ENV",
    "LOCK_STALE_SECONDS",
    "HeldLease",
    "Lease",
    "hold_lock",
    "lease_seconds_setting",
    "read_holder",
    "take_lease",
    "take_lease_once",
    "this_process",
)

LEASE_SECONDS_ENV = "OPENJD_CHECKPOINT_LEASE_SECONDS"
"""The environment variable that sets the ttl of leases on stores other than a local folder."""
_MIN_LEASE_SECONDS = 1.0


def lease_seconds_setting(value: float | str | None = None) -> float:
    """The ttl of leases in seconds: ``value``, else ``$OPENJD_CHECKPOINT_LEASE_SECONDS``, else
    60. A holder renews its lease every third of it; a dead holder's lease frees after it.

    Raises:
        SettingError: (a ``ValueError`` and a ``StoreError``) not a number from 1 to 86400,
            naming the setting it came from.
    """
    where = "lease_seconds"
    if value is None:
        value, where = os.environ.get(LEASE_SECONDS_ENV) or None, LEASE_SECONDS_ENV
        if value is None:
            return DEFAULT_LEASE_SECONDS
    return seconds_in_range(
        value, where=where, low=_MIN_LEASE_SECONDS, high=MAX_LEASE_SECONDS, error=SettingError
    )


LOCK_STALE_SECONDS = 30.0
"""A run's or job's lock object on a store with conditional writes that its holder has not
refreshed for this long (its holder refreshes it every 10 s) belonged to a process that died:
it is taken over."""


def _leases(fs: StoreFS, what: str, path: str) -> LeaseFiles:
    """``fs.leases()``, the OSError of its probe a StoreError (``what``: ``lock``...)."""
    try:
        return fs.leases()
    except OSError as exc:
        raise StoreError(f"cannot {what} {fs.where(path)}: {os_reason(exc)}") from None


@contextlib.contextmanager
def hold_lock(fs: StoreFS, path: str, timeout: float) -> Iterator[None]:
    """Hold the lock ``path`` (waiting up to ``timeout`` seconds; not reentrant): what the
    store's backend holds as long as this process lives (``LeaseFiles.lock``: a blocking
    ``flock`` on the file ``path`` locally, a threading lock of this process on ``memory://``,
    nothing on stores with no way to lock: best effort, see docs/decisions.md), or else, on a
    store with conditional writes, the lease object ``path``, tried again until ``timeout``
    and let go on exit. Its holder refreshes it every 10 s; one not refreshed for
    ``LOCK_STALE_SECONDS`` (its holder died, or stalled) is taken over, and a holder that
    stalled that long writes nothing more under it (``core.fs.lock_fence``).

    Raises:
        StoreError: the lock was not had within ``timeout`` seconds, or cannot be taken.
    """
    leases = _leases(fs, "lock", path)
    held = leases.lock(fs.confined(path), timeout)
    if held is not None:
        with held:
            yield
        return
    end = time.monotonic() + timeout
    pause = 0.02
    while True:
        try:
            lease = _take(fs, leases, path, LOCK_STALE_SECONDS)
        except OSError as exc:
            raise StoreError(f"cannot lock {fs.where(path)}: {os_reason(exc)}") from None
        if lease is not None:
            break
        if time.monotonic() > end:
            raise StoreError(f"{fs.where(path)} stayed locked for {timeout:g} s")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
    try:
        with lock_fence(lease, f"the lock {fs.where(path)}"):
            yield
    finally:
        lease.release()


def take_lease(
    fs: StoreFS, base: str, ttl_seconds: float, wait_seconds: float = 0.0, *, member: bool = False
) -> Lease | None:
    """The lease ``base`` (its file: ``base.lock`` with an flock on a local store,
    ``base.lease.json`` elsewhere; with ``member``, one of many leases of its folder,
    ``LeaseFiles.member``: on a local store a slot of the folder's one lock file), None if a
    live holder has it.

    ``wait_seconds``: keep trying that long, so that another process that merely probes
    the lease (``*_lease_held``, which takes and drops it) is not mistaken for a holder."""
    end = time.monotonic() + wait_seconds
    while True:
        lease = take_lease_once(fs, base, ttl_seconds, member=member)
        if lease is not None or time.monotonic() >= end:
            return lease
        time.sleep(0.02)


def take_lease_once(
    fs: StoreFS, base: str, ttl_seconds: float, *, member: bool = False
) -> Lease | None:
    """One try of ``take_lease``: the lease, or None if a live holder has it.

    Raises:
        StoreError: the lease's file cannot be made, read or written.
    """
    leases = _leases(fs, "take the lease", base)
    path = leases.member(base) if member else base + leases.suffix
    try:
        return _take(fs, leases, path, ttl_seconds)
    except OSError as exc:
        slots = leases.members_file if member else None  # a slot of it: name the file
        shown = posixpath.join(posixpath.dirname(base), slots) if slots else path
        raise StoreError(f"cannot take the lease {fs.where(shown)}: {os_reason(exc)}") from None


def _take(fs: StoreFS, leases: LeaseFiles, path: str, ttl: float) -> Lease | None:
    """One try at the lease file ``path`` (``LeaseFiles.take``), renewed by ``_KEEPER`` where
    leases expire. OSError is the caller's."""
    lease = Lease(fs, fs.confined(path), ttl=ttl, leases=leases)
    claim = leases.take(lease._path, lease._content_bytes(), lease._token)
    if claim is None:
        return None
    lease._claim = claim
    if leases.expire:
        _KEEPER.add(lease)
    return lease


class Lease:
    """A held lease (of a run, a task or a session, or a run's or job's lock on a store with
    conditional writes); ``release()`` when done.

    How it is held is its store's (``core.fs.LeaseFiles``, module docstring). Where leases
    expire (every store but a local folder, whose flock lasts as long as its process), a daemon
    thread of this process (``_KEEPER``) renews every held lease every third of its ttl, so a
    lease expires only when its process died (or stalled for its whole ttl). ``lost`` says that
    a renewal found another holder in its place.
    """

    def __init__(self, fs: StoreFS, path: str, *, ttl: float, leases: LeaseFiles) -> None:
        self._fs = fs
        self._path = path
        self._leases = leases
        self._claim: LeaseClaim | None = None
        """What the store's ``LeaseFiles`` handed out when the lease was taken."""
        self._expires = leases.expire
        self._ttl = ttl
        self._token = uuid.uuid4().hex
        self._renewals = 0
        self._mutex = threading.Lock()
        self._released = False
        self._due = time.monotonic() + ttl / 3
        self._renewed = time.monotonic()
        self.owner = this_process()
        self.lost = False
        """A renewal found that the lease had expired and another process had taken it."""
        self.versions: dict[str, str | None] = {}
        """The files this holder writes with the lease as their fence (``WriteFence``): path ->
        the version it last wrote or read there, on a store with conditional writes."""

    @property
    def expired(self) -> bool:
        """True when this holder may no longer count on the lease: it was lost, or it has not
        been renewed for its whole ttl (the store could not be written), so another process
        may take it now. Never on a local store (an flock lasts while its process does)."""
        if not self._expires or self._released:
            return False
        return self.lost or time.monotonic() - self._renewed > self._ttl

    def _content(self) -> dict[str, Any]:
        return {
            "owner": self.owner.model_dump(mode="json"),
            "token": self._token,
            "ttl": self._ttl,
            "expires_at": time.time() + self._ttl,
            "renewals": self._renewals,
        }

    def _content_bytes(self) -> bytes:
        return (json.dumps(self._content(), sort_keys=True) + "\n").encode("utf-8")

    def renew(self) -> None:
        """Extend the lease by its ttl (a no-op on a local store; the holder's process does it
        on its own elsewhere, so calling it is never needed).

        Raises:
            LeaseLostError: (a ``StoreError``) the lease was lost: it expired and another
                process took it (``lost`` is then True).
            StoreError: it could not be written.
        """
        if not self._expires:
            return
        with self._mutex:
            if self._released:
                return
            if self.lost:
                raise LeaseLostError(self._lost_message())
            assert self._claim is not None
            self._renewals += 1
            # Counted from before the request: a process stalled between sending it and
            # reading the answer (a SIGSTOP, say) may have been taken over meanwhile, so the
            # renewal vouches only for the time since it was sent.
            sent = time.monotonic()
            try:
                if not self._leases.renew(self._claim, self._content_bytes()):
                    self.lost = True
            except (OSError, NotARecordError) as exc:
                raise StoreError(
                    f"cannot renew the lease {self._fs.where(self._path)}: {exc}"
                ) from None
            if self.lost:
                raise LeaseLostError(self._lost_message())
            self._due = sent + self._ttl / 3
            self._renewed = sent

    def confirm(self) -> None:
        """Make sure the lease may still be counted on before a write it fences (``WriteFence``):
        nothing to do while it is fresh (no I/O) or on a local store (an flock lasts as long as
        its process); when its ttl ran out since the last renewal (this process was stalled,
        or the store could not be written), it is renewed now, which tells whether another
        process took it meanwhile.

        Raises:
            LeaseLostError: the lease was lost, or cannot be renewed although its ttl ran out.
        """
        if not self._expires:
            return
        if self.lost:
            raise LeaseLostError(self._lost_message())
        if self._released:
            raise LeaseLostError(
                f"the lease {self._fs.where(self._path)} was released", taken=False
            )
        if time.monotonic() - self._renewed > self._ttl:
            self.confirm_held()

    def confirm_held(self) -> None:
        """Renew the lease now, which on a store with conditional writes is a write conditional
        on this holder's own last write of it: it succeeds only if no other process took it
        (``WriteFence``).

        Raises:
            LeaseLostError: another process holds it, or it cannot be renewed now.
        """
        if not self._expires:
            return
        try:
            self.renew()
        except LeaseLostError:
            raise
        except StoreError as exc:
            if self.lost:
                raise LeaseLostError(self._lost_message()) from None
            raise LeaseLostError(
                f"the lease {self._fs.where(self._path)} could not be renewed for its whole "
                f"ttl ({exc}); another process may take it over, so this one writes nothing "
                "more with it",
                taken=False,
            ) from None

    def _lost_message(self) -> str:
        holder = ""
        try:
            held = read_holder(self._fs, self._path.removesuffix(".lease.json"))
            if held is not None and held.owner is not None:
                holder = f" ({held.describe()})"
        except (StoreError, OSError):
            pass
        return (
            f"the lease {self._fs.where(self._path)} was lost: it expired (not renewed "
            f"within {self._ttl:g} s) and another process{holder} took it"
        )

    def _keep(self) -> None:
        """Renew, for the keeper thread: on an error try again in a second, until lost."""
        try:
            self.renew()
        except StoreError:
            if self.lost:
                _KEEPER.discard(self)
                return
            self._due = time.monotonic() + min(1.0, self._ttl / 10)

    def release(self) -> None:
        """Let the lease go (once; later calls do nothing). Where leases expire, the lease's
        file is deleted only if it is still this lease's (best effort)."""
        with self._mutex:
            if self._released:
                return
            self._released = True
        _KEEPER.discard(self)
        if self.lost or self._claim is None:
            return
        self._leases.release(self._claim)


_STARTED: dict[int, float] = {}
"""This process's start time (psutil's ``create_time``, seconds since the epoch), by pid: read
once (``/proc/PID/stat`` and ``/proc/stat``), not at every lease; a forked child has its own."""


def this_process(pgid: int | None = None) -> ProcessInfo:
    """This process as a lease's or a record's holder: its pid, process group (``pgid``, else
    its own), start time and host id."""
    pid = os.getpid()
    started = _STARTED.get(pid)
    if started is None:
        import psutil

        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:  # pragma: no cover
            started = time.time()
        _STARTED[pid] = started
    return ProcessInfo(
        pid=pid,
        pgid=pgid if pgid is not None else os.getpgid(pid),
        start_time=started,
        host=host_id(),
    )


class HeldLease:
    """Who holds a lease object (``owner``, None if it does not say) and its ttl in seconds."""

    __slots__ = ("owner", "ttl")

    def __init__(self, owner: ProcessInfo | None, ttl: float) -> None:
        self.owner = owner
        self.ttl = ttl

    def describe(self) -> str:
        """``process PID on host HOST``, or ``another process`` if the lease does not say."""
        if self.owner is None:
            return "another process"
        return f"process {self.owner.pid} on host {self.owner.host}"


def read_holder(fs: StoreFS, base: str) -> HeldLease | None:
    """The holder of the lease ``base`` on a store whose leases have a ttl (not a local folder,
    not ``memory://``, whose holders are known to be alive: ``LeaseFiles.holder``); None there,
    or if the lease object is gone or unreadable (then it is not held).

    Raises:
        StoreError: the object cannot be read.
    """
    leases = _leases(fs, "read the lease", base)
    path = fs.confined(base + leases.suffix)
    try:
        raw = leases.holder(path)
    except NotARecordError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {fs.where(path)}: {os_reason(exc)}") from None
    if raw is None:
        return None
    owner: ProcessInfo | None
    try:
        owner = ProcessInfo.model_validate(json.loads(raw).get("owner"))
    except (ValueError, TypeError, AttributeError):
        owner = None
    return HeldLease(owner, lease_ttl(raw))


# --- renewing leases -----------------------------------------------------------------------------
class _Keeper:
    """One daemon thread per process that renews every held lease (but local ones) when due."""

    def __init__(self) -> None:
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        """Started with the first lease; after a fork, again in the child."""

    def add(self, lease: Lease) -> None:
        with self._wake:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="openjd-lease-keeper", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def discard(self, lease: Lease) -> None:
        with self._wake:
            self._leases.discard(lease)

    def _loop(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [lease for lease in self._leases if lease._due <= now]
                if not due:
                    soonest = min((lease._due for lease in self._leases), default=now + 5.0)
                    self._wake.wait(min(max(soonest - now, 0.01), 5.0))
                    continue
            for lease in due:
                lease._keep()
            del due

    def reset(self) -> None:
        """In a forked child: the parent's leases are not this process's to renew."""
        self._leases = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread = None


_KEEPER = _Keeper()


def _after_fork_in_child() -> None:
    _KEEPER.reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
