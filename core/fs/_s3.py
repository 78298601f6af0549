"""S3 conditional writes, for the store's leases and locks on ``s3://`` (s3fs).

``S3Objects`` creates an object only if none is there (``If-None-Match: *``), rewrites or
deletes one only if its ETag is still the one read (``If-Match``), and reads an object with its
age by the server's clock, so that of two takers of a lease exactly one wins. What a server
honours is probed once per process, endpoint and bucket (``S3Objects.probe``, cached in
``S3_SUPPORT``; ``core.fs._storefs.StoreFS.conditional_writes`` asks). ``os_errors`` and
``OSErrorsOnly`` make every failure of S3's client libraries an ``OSError`` with no secret in
its message, so that the store's ``except OSError`` turns each into a ``StoreError``.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import logging
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import fsspec

__all__ = (
    "S3_PROTOCOLS",
    "S3_SUPPORT",
    "OSErrorsOnly",
    "S3Objects",
    "S3Support",
    "WriteFence",
    "os_errors",
    "protocols",
)

_LOG = logging.getLogger("core.store._store")
"""The store's warnings keep the logger they have always had."""


class WriteFence(Protocol):
    """What a lease holder's writes are checked against (fencing; ``core.store._lease.Lease`` is
    one): a write made with a fence is refused once the fence's holder no longer holds its
    lease, and on S3 it is a conditional write that fails if anyone else wrote the file since
    this holder last wrote or read it (``S3Objects.put_fenced``, ``StoreFS.replace_file``)."""

    versions: dict[str, str | None]
    """path -> the ETag this holder last wrote or read there (None: there was no file)."""

    def confirm(self) -> None:
        """Raise ``LeaseLostError`` unless the lease may still be counted on (renewing it first
        if its ttl ran out)."""

    def confirm_held(self) -> None:
        """Raise ``LeaseLostError`` unless the store says the lease is still this holder's
        (one conditional renewal)."""


S3_PROTOCOLS = frozenset({"s3", "s3a"})
"""The fsspec protocols of S3 (s3fs)."""


def protocols(fs: Any) -> tuple[str, ...]:
    """The protocols an fsspec file system answers to."""
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class S3Support:
    """What an S3 server honours (``StoreFS.conditional_writes``)."""

    def __init__(self, *, writes: bool, deletes: bool) -> None:
        self.writes = writes
        """``If-None-Match: *`` and ``If-Match`` on PutObject."""
        self.deletes = deletes
        """``If-Match`` on DeleteObject."""


S3_SUPPORT: dict[tuple[str, str], S3Support] = {}
"""(endpoint, bucket) -> what its server honours, probed once per process."""

_UNREAD: Any = object()
"""``WriteFence.versions`` has no entry: the ETag is read before a conditional write."""

_PRECONDITION_FAILED = frozenset({"PreconditionFailed", "412"})
_CONFLICT = frozenset({"ConditionalRequestConflict", "409"})
"""AWS: another conditional request on the key is under way; this one lost."""
_MISSING = frozenset({"NoSuchKey", "404"})
_NOT_SUPPORTED = frozenset({"NotImplemented", "501", "InvalidArgument", "InvalidRequest"})


def _s3_code(exc: BaseException) -> str | None:
    """The S3 error code behind ``exc`` (an s3fs OSError caused by a botocore ClientError)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status:
                return str(status)
        seen = seen.__cause__ or seen.__context__
    return None


class S3Objects:
    """Conditional writes of small objects through s3fs's client (its ``call_s3``). Every
    method raises OSError for what it does not handle, never botocore's own errors."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def endpoint(self) -> str:
        kwargs = getattr(self.fs, "client_kwargs", None) or {}
        return str(getattr(self.fs, "endpoint_url", None) or kwargs.get("endpoint_url") or "")

    def bucket_exists(self, bucket: str) -> bool:
        """False if the server says ``bucket`` does not exist (``HeadBucket``: 404). True
        otherwise, also when these credentials may not ask (403: a policy may grant objects
        under a prefix only; the store's own requests then tell).

        Raises:
            OSError: the server cannot be reached, or answers otherwise.
        """
        try:
            with os_errors(self.fs):
                self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return False
        except PermissionError:
            return True
        except OSError as exc:
            code = _s3_code(exc)
            if code in _MISSING | {"NoSuchBucket"}:
                return False
            if code in ("403", "AccessDenied"):
                return True
            raise
        return True

    def _bucket_key(self, path: str) -> tuple[str, str]:
        bucket, key, _version = self.fs.split_path(path)
        return bucket, key

    def _put(self, path: str, body: bytes, **condition: str) -> str | None:
        """Put ``body`` at ``path`` under ``condition``: the new ETag, or None if the condition
        did not hold."""
        bucket, key = self._bucket_key(path)
        try:
            with os_errors(self.fs):
                response = self.fs.call_s3(
                    "put_object", Bucket=bucket, Key=key, Body=body, **condition
                )
        except FileExistsError:  # s3fs: If-None-Match failed
            return None
        except FileNotFoundError:  # If-Match on a key that is gone
            return None
        except OSError as exc:
            if _s3_code(exc) in _PRECONDITION_FAILED | _CONFLICT | _MISSING:
                return None
            raise
        return str(response["ETag"])

    def create(self, path: str, body: bytes) -> str | None:
        """Write ``path`` if nothing is there (``If-None-Match: *``): its ETag, else None."""
        return self._put(path, body, IfNoneMatch="*")

    def replace(self, path: str, body: bytes, etag: str) -> str | None:
        """Rewrite ``path`` if its ETag is ``etag`` (``If-Match``): the new ETag, else None."""
        return self._put(path, body, IfMatch=etag)

    def put_fenced(
        self, path: str, body: bytes, fence: WriteFence, *, new: bool, where: str
    ) -> None:
        """Write ``path`` under ``fence`` (a lease holder's write; its lease was confirmed by the
        caller): ``If-Match`` of the ETag the holder last wrote or read there
        (``fence.versions``, read now if it has none), ``If-None-Match`` when ``new``. When the
        condition fails the lease is confirmed with the store (``fence.confirm_held()``, which
        raises ``LeaseLostError`` if another process holds it); if it is still the holder's,
        the file was written by a process whose lease had expired, and the holder's version
        replaces it (logged as a warning, ``where`` naming the file).

        Raises:
            OSError: the server cannot be reached, or another write came at the same moment.
            LeaseLostError: the holder's lease is another's now; nothing was written.
        """
        expected = None if new else fence.versions.get(path, _UNREAD)
        if expected is _UNREAD:
            expected = self.etag(path)
        etag = self._put_over(path, body, expected)
        if etag is None:  # written by another process since this holder's last write
            fence.confirm_held()
            _LOG.warning(
                "%s was written by another process since this one took its lease (a holder "
                "whose lease had expired); this holder's version replaces it",
                where,
            )
            etag = self._put_over(path, body, self.etag(path))
            if etag is None:
                raise OSError(errno.EAGAIN, "another process wrote it at the same moment")
        fence.versions[path] = etag

    def _put_over(self, path: str, body: bytes, etag: str | None) -> str | None:
        """``create`` if ``etag`` is None, else ``replace`` of that version."""
        return self.create(path, body) if etag is None else self.replace(path, body, etag)

    def delete_own(self, path: str, fence: WriteFence) -> None:
        """Delete ``path`` if it is still the version ``fence``'s holder wrote (``If-Match``):
        what a holder that then found its lease lost wrote before it knew. Best effort:
        never raises."""
        etag = fence.versions.pop(path, None)
        if etag is not None:
            with contextlib.suppress(OSError):
                self.delete(path, etag)

    def etag(self, path: str) -> str | None:
        """The object's ETag (``HeadObject``), None if there is none."""
        bucket, key = self._bucket_key(path)
        try:
            with os_errors(self.fs):
                response = self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _s3_code(exc) in _MISSING:
                return None
            raise
        return str(response["ETag"])

    def get(self, path: str) -> tuple[bytes, str, float] | None:
        """The object's bytes, ETag and age in seconds by the server's clock (its ``Date`` less
        the object's ``LastModified``, each to the second), None if there is none. One request,
        so the bytes and the ETag belong together."""
        bucket, key = self._bucket_key(path)

        async def fetch() -> tuple[bytes, dict[str, Any]]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            try:
                data = await response["Body"].read()
            finally:
                response["Body"].close()
            return bytes(data), response

        try:
            with os_errors(self.fs):
                data, response = fsspec.asyn.sync(self.fs.loop, fetch)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _s3_code(exc) in _MISSING:
                return None
            raise
        modified = response["LastModified"].timestamp()
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
        except (TypeError, ValueError):
            now = time.time()
        return data, str(response["ETag"]), now - modified

    def delete(self, path: str, etag: str) -> None:
        """Delete ``path`` if its ETag is still ``etag`` (``If-Match``; where the server ignores
        that on deletes, a read of the ETag just before stands in for it)."""
        bucket, key = self._bucket_key(path)
        support = S3_SUPPORT.get((self.endpoint(), bucket))
        if support is not None and not support.deletes:
            current = self.get(path)
            if current is None or current[1] != etag:
                return
            condition: dict[str, str] = {}
        else:
            condition = {"IfMatch": etag}
        try:
            with os_errors(self.fs):
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, **condition)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if _s3_code(exc) not in _PRECONDITION_FAILED | _CONFLICT | _MISSING:
                raise

    def probe(self, path: str) -> S3Support:
        """What the server honours, found with a probe object of its own at ``path`` (see
        ``StoreFS.conditional_writes``). OSError if it cannot be written at all."""
        bogus = '"00000000000000000000000000000000"'
        try:
            try:
                writes = (
                    self.create(path, b"1\n") is not None
                    and self.create(path, b"2\n") is None
                    and self.replace(path, b"3\n", bogus) is None
                )
            except OSError as exc:
                if _s3_code(exc) in _NOT_SUPPORTED:
                    return S3Support(writes=False, deletes=False)
                raise
            bucket, key = self._bucket_key(path)
            try:
                with os_errors(self.fs):
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=bogus)
                deletes = False  # deleted although the ETag did not match
            except OSError as exc:
                deletes = _s3_code(exc) in _PRECONDITION_FAILED
            return S3Support(writes=writes, deletes=deletes)
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)


def _client_error(exc: BaseException) -> bool:
    """True for an error of S3's client libraries (botocore, aiobotocore, aiohttp) that is not
    an OSError (``EndpointConnectionError``, ``NoCredentialsError``...)."""
    return any(
        cls.__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")
        for cls in type(exc).__mro__
    )


def _scrub(text: str, fs: Any) -> str:
    """``text`` with the secrets the file system's client knows replaced by ``***``."""
    secrets = {
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
        os.environ.get("AWS_SESSION_TOKEN"),
        getattr(fs, "secret", None),
        getattr(fs, "token", None),
    }
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def os_errors(fs: Any) -> Iterator[None]:
    """Raise the client library's own errors as OSErrors, and no secret in any message."""
    try:
        yield
    except OSError as exc:
        text = str(exc)
        clean = _scrub(text, fs)
        if clean == text:
            raise
        raise type(exc)(exc.errno or errno.EIO, clean) from None
    except Exception as exc:
        if not _client_error(exc):
            raise
        raise OSError(errno.EIO, _scrub(f"{type(exc).__name__}: {exc}", fs)) from None


class OSErrorsOnly:
    """An fsspec file system (s3fs) whose public methods raise OSErrors (``os_errors``), so
    that the store's ``except OSError`` makes ``StoreError``s of every failure."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with os_errors(self._fs):
                return attr(*args, **kwargs)

        return call


def _after_fork_in_child() -> None:
    S3_SUPPORT.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
