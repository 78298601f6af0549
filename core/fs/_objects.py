"""What the stores with conditional writes (S3, GCS) share: ``ObjectStoreBackend``, whose server
is probed once per process for what it honours; leases as objects (``ObjectLeases``); fenced
writes (``put_fenced``, ``delete_own``).

A lease object is created only if none is there and rewritten only if it is still the version
read (``ConditionalObjects``), so of two takers exactly one wins; one whose age by the server's
clock is over its ttl (its holder died, or stalled) is taken over. A server that does not honour
conditional writes gets the best-effort files of other stores (``core.fs._fsspec.FileLeases``)
and no run or job lock, and this process logs a warning, once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from core._errors import StoreError
from core.fs._backend import (
    ConditionalObjects,
    LeaseClaim,
    LeaseFiles,
    WriteFence,
    lease_alive,
)
from core.fs._fsspec import FsspecBackend

__all__ = (
    "SUPPORT",
    "OSErrorsOnly",
    "ObjectLeases",
    "ObjectStoreBackend",
    "ProbedObjects",
    "Support",
    "delete_own",
    "put_fenced",
)

_LOG = logging.getLogger("core.store._store")
"""The store's warnings keep the logger they have always had."""


class Support:
    """What an object store's server honours (``ObjectStoreBackend.conditional``)."""

    def __init__(self, *, writes: bool, deletes: bool) -> None:
        self.writes = writes
        """Create only if absent, and rewrite only if still a version."""
        self.deletes = deletes
        """Delete only if still a version."""


SUPPORT: dict[tuple[str, str], Support] = {}
"""(server, bucket) -> what that server honours, probed once per process."""


class ProbedObjects(ConditionalObjects, Protocol):
    """``ConditionalObjects`` whose server's support is probed (``ObjectStoreBackend``)."""

    support: Support | None
    """What the server honours, once probed (``delete`` reads ``deletes``)."""

    def server(self) -> str:
        """Names the server (its protocol and endpoint), for ``SUPPORT``."""

    def bucket_exists(self, bucket: str) -> bool:
        """False if the server says ``bucket`` does not exist. OSError: it cannot be asked."""

    def probe(self, path: str) -> Support:
        """What the server honours, found with a probe object of its own at ``path``: created
        only if absent twice (the second must fail), then rewritten with a version it does not
        have (must fail), then deleted with one (must fail). OSError if it cannot be written."""


class ObjectStoreBackend(FsspecBackend):
    """An fsspec store with conditional writes (``objects``): leases are objects, its locks
    are leases that expire (``core.store._lease.hold_lock``), fenced writes are conditional."""

    objects: ProbedObjects

    def __init__(self, fs: Any, root: str, location: str, objects: ProbedObjects) -> None:
        super().__init__(fs, root, location)
        self.objects = objects
        self._object_leases = ObjectLeases(self, objects)

    def make_root(self) -> None:
        return None  # a bucket is never made; a prefix needs no making

    def bucket(self) -> str:
        return self.root.strip("/").split("/", 1)[0]

    def require_bucket(self, kind: str) -> None:
        """Check that the location names a bucket and that it exists: a store never makes a
        bucket (a typo in its name would make a new, empty one).

        Args:
            kind: the store's kind with its article, as a message says it (``an s3://``).

        Raises:
            StoreError: no bucket named, it does not exist, or it cannot be asked.
        """
        bucket = self.bucket()
        scheme = kind.split()[-1]
        if not bucket:
            raise StoreError(
                f"checkpoint store {self.location!r}: {kind} store names its bucket "
                f"({scheme}BUCKET or {scheme}BUCKET/PREFIX)"
            )
        try:
            exists = self.objects.bucket_exists(bucket)
        except OSError as exc:
            raise StoreError(f"checkpoint store {self.location!r}: {exc}") from None
        if not exists:
            raise StoreError(
                f"checkpoint store {self.location!r}: the bucket {bucket!r} does not exist; "
                "create it first: the store makes only its prefix"
            )

    def conditional(self) -> ConditionalObjects | None:
        """The store's conditional writes if its server honours them. Probed once per process,
        server and bucket with an object of its own below the root (``ProbedObjects.probe``);
        a server that does not gets the best-effort leases of other stores and no run or job
        locks, and this process logs a warning (once). OSError: the probe could not be made."""
        key = (self.objects.server(), self.bucket())
        support = SUPPORT.get(key)
        if support is None:
            probe = posixpath.join(self.root, f".conditional-write-probe-{uuid.uuid4().hex}")
            support = SUPPORT[key] = self.objects.probe(probe)
            if not support.writes:
                _LOG.warning(
                    "checkpoint store %s: the server does not honour conditional writes "
                    "(create only if absent, rewrite only if unchanged); leases are best "
                    "effort (read, then written) and run and job locks do nothing",
                    self.location,
                )
        self.objects.support = support
        return self.objects if support.writes else None

    def leases(self) -> LeaseFiles:
        return self._object_leases if self.conditional() is not None else self._leases


class ObjectLeases:
    """Leases and locks as objects written with conditional writes (``LeaseFiles``): see the
    module docstring. A holder renews its lease with the version it wrote last."""

    suffix = ".lease.json"
    members_file: str | None = None
    expire = True

    def __init__(self, backend: FsspecBackend, objects: ConditionalObjects) -> None:
        self.backend = backend
        self.objects = objects

    def member(self, base: str) -> str:
        return base + self.suffix  # an object of its own per lease

    def take(self, path: str, body: bytes, token: str) -> LeaseClaim | None:
        """Create the lease object; if it is there and expired (``lease_alive`` by the server's
        clock), rewrite it on the condition of the version read. None if a live holder has it
        or another taker won."""
        version = self.objects.create(path, body)
        if version is None:
            current = self.objects.get(path)
            if current is None:  # released in between: one more try
                version = self.objects.create(path, body)
            else:
                data, held_version, age = current
                if lease_alive(data, age):
                    return None
                version = self.objects.replace(path, body, held_version)
            if version is None:
                return None
        return LeaseClaim(path, token, version=version)

    def renew(self, claim: LeaseClaim, body: bytes) -> bool:
        assert claim.version is not None
        version = self.objects.replace(claim.path, body, claim.version)
        if version is None:
            return False
        claim.version = version
        return True

    def release(self, claim: LeaseClaim) -> None:
        if claim.version is not None:
            with contextlib.suppress(OSError):
                self.objects.delete(claim.path, claim.version)

    def prepare(self, path: str) -> None:
        return None  # a lease object is made by its take

    def held(self, path: str) -> bool:
        current = self.objects.get(path)
        return current is not None and lease_alive(current[0], current[2])

    def holder(self, path: str) -> bytes | None:
        try:
            return self.backend.read_record(path)
        except FileNotFoundError:
            return None

    def lock(self, path: str, timeout: float) -> contextlib.AbstractContextManager[None] | None:
        return None  # a lock is a lease object (core.store._lease.hold_lock)


def put_fenced(
    objects: ConditionalObjects, path: str, body: bytes, fence: WriteFence, *, new: bool, where: str
) -> None:
    """Write ``path`` under ``fence`` (a lease holder's write; its lease was confirmed by the
    caller) on the condition of the version the holder last wrote or read there
    (``fence.versions``, read now if it has none), or, when ``new``, that there is none. When
    the condition fails the lease is confirmed with the store (``fence.confirm_held()``, which
    raises ``LeaseLostError`` if another process holds it); if it is still the holder's, the
    file was written by a process whose lease had expired, and the holder's version replaces
    it (logged as a warning, ``where`` naming the file).

    Raises:
        OSError: the server cannot be reached, or another write came at the same moment.
        LeaseLostError: the holder's lease is another's now; nothing was written.
    """
    if new:
        expected = None
    elif path in fence.versions:
        expected = fence.versions[path]
    else:
        expected = objects.version(path)
    version = _put_over(objects, path, body, expected)
    if version is None:  # written by another process since this holder's last write
        fence.confirm_held()
        _LOG.warning(
            "%s was written by another process since this one took its lease (a holder "
            "whose lease had expired); this holder's version replaces it",
            where,
        )
        version = _put_over(objects, path, body, objects.version(path))
        if version is None:
            raise OSError(errno.EAGAIN, "another process wrote it at the same moment")
    fence.versions[path] = version


def _put_over(
    objects: ConditionalObjects, path: str, body: bytes, version: str | None
) -> str | None:
    """``create`` if ``version`` is None, else ``replace`` of that version."""
    if version is None:
        return objects.create(path, body)
    return objects.replace(path, body, version)


def delete_own(objects: ConditionalObjects, path: str, fence: WriteFence) -> None:
    """Delete ``path`` if it is still the version ``fence``'s holder wrote: what a holder that
    then found its lease lost wrote before it knew. Best effort: never raises."""
    version = fence.versions.pop(path, None)
    if version is not None:
        with contextlib.suppress(OSError):
            objects.delete(path, version)


class OSErrorsOnly:
    """An fsspec file system (s3fs, gcsfs) whose public methods raise OSErrors, so that the
    store's ``except OSError`` makes ``StoreError``s of every failure: each call runs inside
    ``errors(fs)``, a context that raises its client library's own errors as OSErrors with no
    secret in their message."""

    def __init__(
        self, fs: Any, errors: Callable[[Any], contextlib.AbstractContextManager[Any]]
    ) -> None:
        self._fs = fs
        self._errors = errors

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._errors(self._fs):
                return attr(*args, **kwargs)

        return call


def _after_fork_in_child() -> None:
    SUPPORT.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
