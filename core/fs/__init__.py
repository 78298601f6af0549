"""A store's file system: ``StoreFS`` (``_storefs``), the fsspec file system confined to the
store's root, with atomic writes, fenced writes and the conditional-write probe; S3's
conditional writes (``_s3``).
"""

from core.fs._s3 import WriteFence
from core.fs._storefs import (
    MAX_RECORD_BYTES,
    NotARecordError,
    StoreFS,
    file_mtime,
    list_files,
    lock_fence,
    os_reason,
    redact_location,
)

__all__ = (
    "file_mtime",
    "list_files",
    "lock_fence",
    "MAX_RECORD_BYTES",
    "NotARecordError",
    "os_reason",
    "redact_location",
    "StoreFS",
    "WriteFence",
)
