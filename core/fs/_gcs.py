"""A ``gs://`` store (``GCSBackend``, gcsfs: ``pip install openjd-checkpoint[gcs]``) and Google
Cloud Storage's conditional writes (``GCSObjects``).

A version is an object's generation: ``GCSObjects`` creates an object only if none is there
(``ifGenerationMatch=0``), rewrites or deletes one only if its generation is still the one read
(``ifGenerationMatch=<generation>``), and reads an object with its generation and its age by the
server's clock (``Date`` less ``Last-Modified``), so that of two takers of a lease exactly one
wins (``core.fs._objects``). Uploads are multipart (metadata and body in one request: GCS
commits them whole). ``gcs_errors`` makes every failure of gcsfs, aiohttp and Google's auth
libraries an ``OSError``, so that the store's ``except OSError`` turns each into a
``StoreError``. A location names its bucket (``gs://BUCKET/PREFIX``), which must exist;
credentials come as usual for Google Cloud (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud``'s,
the metadata server); ``STORAGE_EMULATOR_HOST`` points gcsfs at an emulator.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

from core._errors import StoreError
from core.fs._fsspec import open_fs
from core.fs._objects import ObjectStoreBackend, OSErrorsOnly, Support

__all__ = ("GCSBackend", "GCSObjects", "gcs_errors")

_BOGUS_GENERATION = "1"
"""A generation no object of the probe has (generations are microseconds since the epoch)."""


class GCSBackend(ObjectStoreBackend):
    """A ``gs://`` store (see the module docstring)."""

    name: ClassVar[str] = "gcs"

    @classmethod
    def open(cls, url: str, location: str) -> GCSBackend:
        """The store at ``url``.

        Raises:
            StoreError: gcsfs is not installed, the URL has credentials or no bucket, or the
                bucket does not exist.
        """
        if "@" in urllib.parse.urlsplit(url).netloc:
            raise StoreError(
                f"checkpoint store {location!r}: a gs:// URL takes no credentials; give them "
                "as usual for Google Cloud (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth)"
            )
        fs, root = open_fs(url, location)
        backend = cls(OSErrorsOnly(fs, gcs_errors), root, location, GCSObjects(fs))
        backend.require_bucket("a gs://")
        return backend


class GCSObjects:
    """Conditional writes of small objects through gcsfs's client (its ``_call``):
    ``core.fs._objects.ProbedObjects``, a version being a generation. Every method raises
    OSError for what it does not handle."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.support: Support | None = None

    def server(self) -> str:
        return f"gcs:{getattr(self.fs, '_location', '')}"

    def _call(self, method: str, path: str, *args: str, **kwargs: Any) -> tuple[Any, bytes]:
        import fsspec.asyn

        with gcs_errors(self.fs):
            return fsspec.asyn.sync(self.fs.loop, self.fs._call, method, path, *args, **kwargs)

    def _split(self, path: str) -> tuple[str, str]:
        bucket, key, _generation = self.fs.split_path(path)
        return bucket, key

    def bucket_exists(self, bucket: str) -> bool:
        """False if the server says ``bucket`` does not exist (404); True otherwise, also when
        these credentials may not ask (403). OSError: it cannot be reached."""
        try:
            self._call("GET", "b/{}", bucket)
        except FileNotFoundError:
            return False
        except PermissionError:
            return True
        except OSError as exc:
            if "Forbidden" in str(exc):
                return True
            raise
        return True

    def _upload(self, path: str, body: bytes, generation: str) -> str | None:
        """One multipart upload of ``body`` to ``path`` if its generation is ``generation``
        (``0``: there is none): the new generation, else None."""
        bucket, key = self._split(path)
        meta = json.dumps({"name": key})
        cut = f"=={uuid.uuid4().hex}=="  # in no body
        data = (
            (
                f"--{cut}\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--{cut}\n"
                "Content-Type: application/octet-stream\n\n"
            ).encode()
            + body
            + f"\n--{cut}--".encode()
        )
        location = getattr(self.fs, "_location", "https://storage.googleapis.com")
        try:
            _headers, content = self._call(
                "POST",
                f"{location}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o",
                uploadType="multipart",
                ifGenerationMatch=generation,
                headers={"Content-Type": f'multipart/related; boundary="{cut}"'},
                data=data,
            )
        except (FileExistsError, FileNotFoundError):  # 412: the condition did not hold
            return None
        return str(json.loads(content)["generation"])

    def create(self, path: str, body: bytes) -> str | None:
        """Write ``path`` if nothing is there (``ifGenerationMatch=0``): its generation, else
        None."""
        return self._upload(path, body, "0")

    def replace(self, path: str, body: bytes, version: str) -> str | None:
        """Rewrite ``path`` if its generation is ``version``: the new one, else None."""
        return self._upload(path, body, version)

    def version(self, path: str) -> str | None:
        """The object's generation, None if there is none."""
        bucket, key = self._split(path)
        try:
            _headers, content = self._call("GET", "b/{}/o/{}", bucket, key)
        except FileNotFoundError:
            return None
        return str(json.loads(content)["generation"])

    def get(self, path: str) -> tuple[bytes, str, float] | None:
        """The object's bytes, generation and age in seconds by the server's clock (its
        ``Date`` less the object's ``Last-Modified``, each to the second), None if there is
        none. One request, so the bytes and the generation belong together."""
        bucket, key = self._split(path)
        try:
            headers, content = self._call("GET", "b/{}/o/{}", bucket, key, alt="media")
        except FileNotFoundError:
            return None
        generation = headers.get("X-Goog-Generation") or headers.get("x-goog-generation")
        if generation is None:
            raise OSError(errno.EIO, "the server told no generation of the object read")
        now = _http_time(headers.get("Date")) or time.time()
        modified = _http_time(headers.get("Last-Modified")) or now
        return bytes(content), str(generation), now - modified

    def delete(self, path: str, version: str) -> None:
        """Delete ``path`` if its generation is still ``version`` (where the server ignores that
        on deletes, a read of the generation just before stands in for it)."""
        bucket, key = self._split(path)
        condition: dict[str, str] = {"ifGenerationMatch": version}
        if self.support is not None and not self.support.deletes:
            if self.version(path) != version:
                return
            condition = {}
        try:
            self._call("DELETE", "b/{}/o/{}", bucket, key, **condition)
        except (FileNotFoundError, FileExistsError):
            pass

    def probe(self, path: str) -> Support:
        """What the server honours, found with a probe object of its own at ``path`` (see
        ``core.fs._objects.ProbedObjects.probe``). OSError if it cannot be written at all."""
        try:
            writes = (
                self.create(path, b"1\n") is not None
                and self.create(path, b"2\n") is None
                and self.replace(path, b"3\n", _BOGUS_GENERATION) is None
            )
            bucket, key = self._split(path)
            try:
                self._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=_BOGUS_GENERATION)
                deletes = False  # deleted although the generation did not match
            except FileExistsError:  # 412
                deletes = True
            return Support(writes=writes, deletes=deletes)
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)


def _http_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _client_error(exc: BaseException) -> bool:
    """True for an error of GCS's client libraries that is not an OSError (gcsfs's
    ``HttpError``, aiohttp's, google-auth's)."""
    return any(
        cls.__module__.split(".")[0] in ("gcsfs", "aiohttp", "google", "requests")
        for cls in type(exc).__mro__
    )


@contextlib.contextmanager
def gcs_errors(fs: Any) -> Iterator[None]:
    """Raise the client libraries' own errors as OSErrors (gcsfs's ``ValueError`` for a request
    it calls invalid too)."""
    try:
        yield
    except OSError:
        raise
    except ValueError as exc:
        if "Bad Request" not in str(exc):
            raise
        raise OSError(errno.EINVAL, str(exc)) from None
    except Exception as exc:
        if not _client_error(exc):
            raise
        raise OSError(errno.EIO, f"{type(exc).__name__}: {exc}") from None
