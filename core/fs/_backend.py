"""The seam between a store and where its files are: ``ObjectBackend``, what each kind of store
(a local folder, ``memory://``, ``s3://``, ``gs://``, any other fsspec URL) does in its own way,
and ``LeaseFiles``, how its leases and locks are held.

``core.fs._storefs.StoreFS`` does what every store does alike (the names it may touch, the size
of a record, the writes refused under a lock its holder lost, the messages) and hands the rest
to its backend, chosen by the location's protocol in ``core.fs._registry.BACKENDS``. A backend
works on paths ``StoreFS`` has checked (a name strictly below the root) and raises ``OSError``
(``FileNotFoundError`` where it says so), which ``StoreFS`` turns into a ``StoreError`` naming
the path; what it refuses outright (a link on the way, a bucket that does not exist) it raises
as ``StoreError`` itself.

Stores with conditional writes (S3, GCS) also have ``ConditionalObjects``: create an object only
if none is there, rewrite one only if it is still the version read, read one with its age by
the server's clock. Fenced writes and object leases (``core.fs._objects``) stand on them.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

__all__ = (
    "DEFAULT_LEASE_SECONDS",
    "MAX_LEASE_SECONDS",
    "MAX_RECORD_BYTES",
    "ConditionalObjects",
    "LeaseClaim",
    "LeaseFiles",
    "NotARecordError",
    "ObjectBackend",
    "WriteFence",
    "lease_alive",
    "lease_token",
    "lease_ttl",
    "no_lock",
    "os_reason",
    "too_large",
    "where",
)

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest file the store reads as a record. A record holds at most a few checkpoint states
of ``DEFAULT_MAX_STATE_BYTES`` (128 KiB) and file lists; anything larger is not a record: it is
set aside unread, like any unreadable record."""


class NotARecordError(Exception):
    """A record path holds something the store does not read (a link, a FIFO, a folder, a file
    over ``MAX_RECORD_BYTES``): it is set aside like an unreadable record."""


def os_reason(exc: OSError) -> str:
    """The operating system's reason, without repeating the path the message names already."""
    if exc.strerror:
        return exc.strerror if exc.errno is None else f"{exc.strerror} (errno {exc.errno})"
    return str(exc) or type(exc).__name__


def where(location: str, path: str) -> str:
    """``path`` named for a message, with the store's ``location`` (credentials hidden)."""
    return f"checkpoint store {location!r}, record {path}"


def too_large(size: int) -> str:
    """Why a file of ``size`` bytes is not read as a record."""
    return f"{size} bytes, more than the {MAX_RECORD_BYTES} bytes a record may have; not read"


class WriteFence(Protocol):
    """What a lease holder's writes are checked against (fencing; ``core.store._lease.Lease`` is
    one): a write made with a fence is refused once the fence's holder no longer holds its
    lease, and on a store with conditional writes it is conditional on the version of the file
    this holder last wrote or read (``core.fs._objects.put_fenced``)."""

    versions: dict[str, str | None]
    """path -> the version (S3: ETag, GCS: generation) this holder last wrote or read there
    (None: there was no file)."""

    def confirm(self) -> None:
        """Raise ``LeaseLostError`` unless the lease may still be counted on (renewing it first
        if its ttl ran out)."""

    def confirm_held(self) -> None:
        """Raise ``LeaseLostError`` unless the store says the lease is still this holder's
        (one conditional renewal)."""


class ConditionalObjects(Protocol):
    """Conditional writes of small objects (S3: ``If-None-Match``/``If-Match`` of ETags; GCS:
    ``ifGenerationMatch``). A version is the server's opaque string for one write of an
    object. Every method raises OSError for what it does not handle."""

    def create(self, path: str, body: bytes) -> str | None:
        """Write ``path`` if nothing is there: its version, else None."""

    def replace(self, path: str, body: bytes, version: str) -> str | None:
        """Rewrite ``path`` if it is still ``version``: the new version, else None."""

    def version(self, path: str) -> str | None:
        """The object's current version, None if there is none."""

    def get(self, path: str) -> tuple[bytes, str, float] | None:
        """The object's bytes, version and age in seconds by the server's clock (to the second,
        up to 1 s more than it is), None if there is none; the bytes and the version belong
        together."""

    def delete(self, path: str, version: str) -> None:
        """Delete ``path`` if it is still ``version`` (where the server ignores the condition on
        deletes, a read of the version just before stands in for it)."""


class LeaseClaim:
    """A lease or lock file this process holds, as its backend's ``LeaseFiles`` handed it out:
    ``path``; ``token`` (in the file's content: whose it is); ``version`` (an object lease:
    the version this holder wrote last); ``handle`` (a lock held in this process: an flock's
    descriptor, a threading lock)."""

    __slots__ = ("handle", "path", "token", "version")

    def __init__(
        self, path: str, token: str, *, version: str | None = None, handle: Any = None
    ) -> None:
        self.path = path
        self.token = token
        self.version = version
        self.handle = handle


class LeaseFiles(Protocol):
    """How a store holds leases (the right to run a run, a task or a session) and locks (a
    run's or job's record lock). Paths are ``StoreFS.confined``. A lease file's content is the
    JSON of ``core.store._lease.Lease`` (``token``, ``ttl``, ``expires_at``, ``owner``)."""

    suffix: str
    """What a lease's base name is given for its file: ``.lock`` (an flock) or ``.lease.json``."""
    expire: bool
    """Leases have a ttl and are renewed by their holder's process (False: held as long as the
    holder's process lives, an flock)."""

    members_file: str | None
    """The name of the one file that holds a folder's member leases (``member``), None where
    each lease is a file of its own: probing it (``held``) says whether any member is held."""

    def member(self, base: str) -> str:
        """The lease path of ``base``, one of many leases of its folder (a run's tasks): a
        file of its own (``base`` + ``suffix``), or where one file serves them all, a slot of
        it (a local store: ``core.fs._local.FlockLeases``)."""

    def take(self, path: str, body: bytes, token: str) -> LeaseClaim | None:
        """One try at the lease ``path``, with ``body`` as its content where it has one (its
        ``token`` says it is this holder's): the claim, or None if a live holder has it.
        OSError is the caller's."""

    def renew(self, claim: LeaseClaim, body: bytes) -> bool:
        """Rewrite the held lease with ``body``: False if another holder took it meanwhile.
        OSError (and ``NotARecordError``) is the caller's."""

    def release(self, claim: LeaseClaim) -> None:
        """Let the lease go if it is still this holder's. Best effort: never raises."""

    def prepare(self, path: str) -> None:
        """Make what a later ``take`` of ``path`` needs where making it costs (a local lock
        file: creating a file on ext4 took 0.05-0.5 ms here, opening one a few microseconds),
        without taking the lease; nothing elsewhere. Best effort: never raises."""

    def held(self, path: str) -> bool:
        """True if a live holder has the lease ``path``; never makes its file. StoreError if it
        cannot be told."""

    def holder(self, path: str) -> bytes | None:
        """The content of the lease ``path``, to say who holds it where a holder may have died
        with it held (None where a holder is known to be alive, or there is none). OSError and
        ``NotARecordError`` are the caller's."""

    def lock(self, path: str, timeout: float) -> contextlib.AbstractContextManager[None] | None:
        """A context that holds the lock ``path`` as long as this process lives (waiting up to
        ``timeout`` seconds; StoreError if it stays locked), or None where a lock is a lease
        object that expires (``core.store._lease.hold_lock`` takes it with ``take``)."""


class ObjectBackend(Protocol):
    """What each kind of store does in its own way (see the module docstring). One instance per
    ``StoreFS``; the class is found by protocol in ``core.fs._registry.BACKENDS``."""

    name: ClassVar[str]
    """Short name for messages and tests: ``local``, ``memory``, ``s3``, ``gcs``, ``fsspec``."""
    fs: Any
    """The fsspec file system, unconfined (every path given to it must have passed
    ``StoreFS.confined``); on S3 and GCS wrapped so that their client's errors are OSErrors."""
    root: str
    location: str
    """The location to show (credentials hidden)."""
    local: bool
    """The store is a folder of this machine: ``os`` calls work on its paths (files are staged
    and renamed, a run's folder is renamed to delete it, a file's time can be touched)."""

    def make_root(self) -> None:
        """Make the store's folder if it is missing (a bucket is never made). OSError is the
        caller's."""

    def confine(self, path: str, *, whole: bool) -> None:
        """Refuse (StoreError) a ``path`` (a name below the root) that passes through what the
        store does not follow (a local store: a symbolic link, or a non-folder on the way; with
        ``whole``, ``path`` itself too). Nothing to do on stores without links."""

    def makedirs(self, directory: str) -> None:
        """Make ``directory`` and its missing parents below the root. OSError is the caller's."""

    def replace_file(
        self, path: str, body: bytes, *, durable: bool, reuse: str | None = None
    ) -> None:
        """Replace ``path`` (its folders made if missing) with ``body`` all at once: a crash at
        any instant leaves the previous version readable; durably (surviving a crash of the
        machine once this returns) when ``durable``. ``reuse``: a file in the same folder that
        the caller deletes anyway, which a local store takes (renamed away, then rewritten) for
        the new version instead of making a file; elsewhere left for the caller to delete.
        OSError is the caller's."""

    def prepare_replace(self, folder: str) -> None:
        """Make ahead what a ``replace_file`` in ``folder`` will need where making it costs (a
        local store: a spare file, ``core.fs._replace.prepare_spare``); nothing elsewhere. Best
        effort: never raises."""

    def read_record(self, path: str) -> bytes:
        """The bytes of the regular file ``path``, never following a link.

        Raises:
            NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES``.
            OSError: it cannot be read (FileNotFoundError: there is none).
        """

    def move_aside(self, path: str, aside: str) -> bool:
        """Rename ``path`` (a link is moved, never followed) to ``aside``: False if ``aside``
        is taken (try another name). OSError is the caller's."""

    def remove_file(self, path: str) -> None:
        """Delete the file (or link) at ``path`` if there is one; a folder is left alone."""

    def remove_tree(self, path: str) -> None:
        """Delete the folder ``path`` and everything in it, never following a link."""

    def list_names(self, path: str) -> list[str]:
        """The names in the folder ``path`` as they are now (never from a cache).
        FileNotFoundError if it is missing; other OSErrors are the caller's."""

    def list_files(self, base: str) -> list[tuple[str, dict[str, Any]]]:
        """(path, info with ``size`` and a modification time) of every file under ``base``
        (none if it is missing; a link is never followed). StoreError if ``base`` passes a
        link; OSError is the caller's."""

    def conditional(self) -> ConditionalObjects | None:
        """The store's conditional writes when its server honours them (probed once per
        process), else None. OSError: the probe could not be made."""

    def leases(self) -> LeaseFiles:
        """How this store holds leases and locks (may probe: OSError is the caller's)."""


# --- the content of a lease file ----------------------------------------------------------------
DEFAULT_LEASE_SECONDS = 60.0
"""A lease's ttl in seconds when ``$OPENJD_CHECKPOINT_LEASE_SECONDS`` is not set (and the ttl of
a lease file that says none)."""
MAX_LEASE_SECONDS = 86400.0
"""The longest ttl a lease may have."""


def _lease_field(raw: bytes, name: str) -> Any:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data.get(name) if isinstance(data, dict) else None


def lease_token(raw: bytes) -> str | None:
    """The token of a lease file's content, None if it has none (or is not JSON)."""
    token = _lease_field(raw, "token")
    return token if isinstance(token, str) else None


def lease_ttl(raw: bytes) -> float:
    """A lease file's ttl in seconds (what its holder renews it within); 60 if it says none
    or says something that is no ttl."""
    value = _lease_field(raw, "ttl")
    try:
        ttl = float(DEFAULT_LEASE_SECONDS if value is None else value)
    except (ValueError, TypeError, OverflowError):  # OverflowError: a huge int
        return DEFAULT_LEASE_SECONDS
    return ttl if 0 <= ttl <= MAX_LEASE_SECONDS else DEFAULT_LEASE_SECONDS


def lease_alive(raw: bytes | None, age: float | None = None) -> bool:
    """True if the lease file whose content is ``raw`` (None: there is none) is still its
    holder's: with ``age`` (seconds since it was last written, by the server's clock, to the
    second: up to 1 s more than it is) while that age is not over its ttl rounded up, so that
    it is never taken while its holder still counts on it; without, while its ``expires_at``
    (by this machine's clock) is to come. Content that is not a lease is not alive."""
    if raw is None:
        return False
    if age is not None:
        return age <= math.ceil(lease_ttl(raw))
    try:
        return float(_lease_field(raw, "expires_at") or 0) > time.time()
    except (ValueError, TypeError, OverflowError):
        return False


@contextlib.contextmanager
def no_lock() -> Iterator[None]:
    """A lock that holds nothing: the best effort of stores with no way to lock."""
    yield
