"""An ``s3://`` store (``S3Backend``, s3fs) and S3's conditional writes (``S3Objects``).

``S3Objects`` creates an object only if none is there (``If-None-Match: *``), rewrites or
deletes one only if its ETag is still the one read (``If-Match``), and reads an object with its
age by the server's clock, so that of two takers of a lease exactly one wins
(``core.fs._objects``). ``os_errors`` and ``OSErrorsOnly`` make every failure of S3's client
libraries an ``OSError`` with no secret in its message, so that the store's ``except OSError``
turns each into a ``StoreError``. A location names its bucket, which must exist (a typo would
otherwise make a new one), and takes no credentials (they come as usual for AWS).
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import os
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec

from core._errors import StoreError
from core.fs._fsspec import open_fs
from core.fs._objects import ObjectStoreBackend, OSErrorsOnly, Support

__all__ = ("S3Backend", "S3Objects", "os_errors")


class S3Backend(ObjectStoreBackend):
    """An ``s3://`` store (see the module docstring)."""

    name: ClassVar[str] = "s3"

    @classmethod
    def open(cls, url: str, location: str) -> S3Backend:
        """The store at ``url``.

        Raises:
            StoreError: the URL has credentials or no bucket, or the bucket does not exist.
        """
        if "@" in urllib.parse.urlsplit(url).netloc:
            raise StoreError(
                f"checkpoint store {location!r}: an s3:// URL takes no credentials; "
                "give them as usual for AWS (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, ~/.aws/credentials, an instance role)"
            )
        # An S3 service that cannot be reached fails a call in seconds, not minutes: s3fs's own
        # retries (5, with back-off) around botocore's (legacy mode, 5 more) made each call of
        # a run take 10 s or more while the store was away, and a run with uploads queued sat
        # for minutes. Throttling and 5xx answers are still retried (botocore's standard mode,
        # 3 attempts). Listings are never cached: other processes write here too.
        fs, root = open_fs(
            url,
            location,
            use_listings_cache=False,
            config_kwargs={
                "connect_timeout": 5,
                "read_timeout": 60,
                "retries": {"max_attempts": 3, "mode": "standard"},
            },
        )
        fs.retries = 2  # s3fs's own, around botocore's (above); a class attribute of 5
        backend = cls(OSErrorsOnly(fs, os_errors), root, location, S3Objects(fs))
        # s3fs's makedirs of a bucket path creates the bucket: a typo in its name would make a
        # new bucket (and reading commands would say the store is empty).
        backend.require_bucket("an s3://")
        return backend


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
    """Conditional writes of small objects through s3fs's client (its ``call_s3``):
    ``core.fs._objects.ProbedObjects``, a version being an ETag. Every method raises OSError
    for what it does not handle, never botocore's own errors."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.support: Support | None = None

    def server(self) -> str:
        kwargs = getattr(self.fs, "client_kwargs", None) or {}
        endpoint = getattr(self.fs, "endpoint_url", None) or kwargs.get("endpoint_url") or ""
        return f"s3:{endpoint}"

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

    def version(self, path: str) -> str | None:
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
        support = self.support
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

    def probe(self, path: str) -> Support:
        """What the server honours, found with a probe object of its own at ``path`` (see
        ``ProbedObjects.probe``). OSError if it cannot be written at all."""
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
                    return Support(writes=False, deletes=False)
                raise
            bucket, key = self._bucket_key(path)
            try:
                with os_errors(self.fs):
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=bogus)
                deletes = False  # deleted although the ETag did not match
            except OSError as exc:
                deletes = _s3_code(exc) in _PRECONDITION_FAILED
            return Support(writes=writes, deletes=deletes)
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
