"""Facts about the host this process runs on, decided in one place: its identity (which
processes it may kill as its own), the file data flow of checkpoint files and the folders whose
files a managed store may capture and restore. Every one comes from an argument or the
environment; none needs the store (so the store and the files layer both stand on this module).

Implements seed 000's "Shared file systems vs managed file data flow".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from enum import Enum

from core._errors import StoreError

__all__ = (
    "FILE_ROOTS_VARIABLE",
    "FILES_MODE_VARIABLE",
    "HOST_ID_VARIABLE",
    "FileDataFlow",
    "file_flow_from_env",
    "file_roots_from_env",
    "host_id",
)

HOST_ID_VARIABLE = "OPENJD_CHECKPOINT_HOST_ID"
"""Environment variable that names this process's host (default: the host name)."""


def host_id() -> str:
    """This process's host identity: ``$OPENJD_CHECKPOINT_HOST_ID``, else the host name.

    Recorded with every process a task starts. Leftover processes are killed only on the host
    that recorded them, so two workers on one machine with distinct host ids stand in for two
    hosts (tests do this)."""
    return os.environ.get(HOST_ID_VARIABLE) or socket.gethostname()


FILES_MODE_VARIABLE = "OPENJD_CHECKPOINT_FILES"
"""Environment variable choosing the file data flow: ``shared`` (default) or ``managed``."""

FILE_ROOTS_VARIABLE = "OPENJD_CHECKPOINT_FILE_ROOTS"
"""Environment variable: absolute folders (separated by ``os.pathsep``) whose files a managed
store may capture and restore, besides the session working directory."""


class FileDataFlow(str, Enum):
    """How a store treats checkpoint files (seed 000, "Shared file systems vs managed file data
    flow")."""

    SHARED = "shared"
    """Paths only: the files live on a file system every host sees."""
    MANAGED = "managed"
    """The store keeps the files and restores them on resume."""


def file_flow_from_env(value: str | None = None) -> FileDataFlow:
    """``value``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``.

    Raises:
        StoreError: not ``shared`` or ``managed``.
    """
    text = value if value is not None else os.environ.get(FILES_MODE_VARIABLE, "")
    text = text.strip().lower() or FileDataFlow.SHARED.value
    try:
        return FileDataFlow(text)
    except ValueError:
        origin = "the option" if value is not None else "$" + FILES_MODE_VARIABLE
        raise StoreError(
            f"file data flow {text!r} (from {origin}) is not 'shared' or 'managed'"
        ) from None


def file_roots_from_env(extra: Iterable[str] = ()) -> list[str]:
    """The allowed roots: ``extra`` then ``$OPENJD_CHECKPOINT_FILE_ROOTS``, normalized.

    Raises:
        StoreError: a root that is not an absolute path.
    """
    roots: list[str] = []
    env = os.environ.get(FILE_ROOTS_VARIABLE, "")
    given = [(r, "file root") for r in extra]
    given += [(r, f"${FILE_ROOTS_VARIABLE}") for r in env.split(os.pathsep) if r.strip()]
    for root, where in given:
        if not os.path.isabs(root):
            raise StoreError(f"{where} {root!r} is not an absolute path")
        norm = os.path.normpath(root)
        if norm not in roots:
            roots.append(norm)
    return roots
