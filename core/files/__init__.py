"""Managed file data flow: content-addressed blobs and manifests (``_blobs``), files captured
while a task runs (``_capture``) and restored on resume (``_restore``), and fast copies
(``_copy``). Stands on ``fs`` (a store's file system), never on the record store.
"""

from core.files._blobs import Blobs, RestoreError
from core.files._capture import CaptureStats, FileCapture
from core.files._restore import RestoreResult, restore_checkpoint

__all__ = (
    "Blobs",
    "CaptureStats",
    "FileCapture",
    "restore_checkpoint",
    "RestoreError",
    "RestoreResult",
)
