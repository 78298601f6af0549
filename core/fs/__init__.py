"""A store's file system: ``StoreFS`` (``_storefs``), one store's files confined to its root,
with atomic writes, fenced writes and locks that fence; under it the backend seam
(``_backend.ObjectBackend`` and ``LeaseFiles``), one module per kind of store (``_local``,
``_memory``, ``_s3``, ``_gcs``, and ``_fsspec`` for any other fsspec URL; ``_objects``: what
the stores with conditional writes share), chosen by protocol in ``_registry.BACKENDS``.
"""

from core.fs._backend import (
    DEFAULT_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MAX_RECORD_BYTES,
    LeaseClaim,
    LeaseFiles,
    NotARecordError,
    ObjectBackend,
    WriteFence,
    lease_ttl,
    os_reason,
)
from core.fs._registry import BACKENDS
from core.fs._storefs import (
    StoreFS,
    file_mtime,
    list_files,
    lock_fence,
    redact_location,
)

__all__ = (
    "BACKENDS",
    "DEFAULT_LEASE_SECONDS",
    "file_mtime",
    "LeaseClaim",
    "LeaseFiles",
    "lease_ttl",
    "list_files",
    "lock_fence",
    "MAX_LEASE_SECONDS",
    "MAX_RECORD_BYTES",
    "NotARecordError",
    "ObjectBackend",
    "os_reason",
    "redact_location",
    "StoreFS",
    "WriteFence",
)
