"""Facts about the host this process runs on, decided in one place: its identity (which
processes it may kill as its own), the file data flow of checkpoint files and the folders whose
files a managed store may capture and restore. Every one comes from an argument or the
environment; none needs the store (so the store and the files layer both stand on this module).

Implements seed 000's "Shared file systems vs managed file data flow".
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from core._errors import StoreError

__all__ = (
    "FILE_ROOTS_VARIABLE",
    "FILES_MODE_VARIABLE",
    "HOST_ID_VARIABLE",
    "Configured",
    "FileDataFlow",
    "FileSettings",
    "file_flow_from_env",
    "file_roots_from_env",
    "first_setting",
    "host_id",
)

HOST_ID_VARIABLE = "OPENJD_CHECKPOINT_HOST_ID"
"""Environment variable that names this process's host (default: the host name)."""


def host_id() -> str:
    """This process's host identity: ``$OPENJD_CHECKPOINT_HOST_ID``, else the host name.

    Recorded with every process a task starts. Leftover processes are killed only on the host
    that recorded them, so two workers on one machine with distinct host ids stand in for two
    hosts (tests do this)."""
    return os.environ.get(HOST_ID_VARIABLE) or _host_name()


@functools.lru_cache(maxsize=1)
def _host_name() -> str:
    """The host name, read once a process: ``gethostname`` is a system call, and a task asks
    three times (150 microseconds on a Firecracker VM); a host renamed while a process runs
    keeps the name it started with, as every record that process wrote does."""
    return socket.gethostname()


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


Configured = Callable[[str], tuple[Any, str] | None]
"""A framework's configuration of a runner (Airflow's ``[openjd_checkpoint]`` section, a
Prefect block): a setting's key (``files``, ``file_roots``, ``interruption_notices``,
``notice_poll_seconds``) -> its value and where it came from, for messages
(``[openjd_checkpoint] files``); None when the configuration does not set it."""


def first_setting(
    given: Any,
    where: str,
    configured: Configured | None,
    key: str,
    environ: Mapping[str, str] | None = None,
    variable: str | None = None,
) -> tuple[Any, str]:
    """A runner's setting, with where it came from: the argument ``given`` (named ``where``),
    else ``configured(key)`` (a value that is None or blank is not set), else ``variable`` of
    ``environ`` (named ``$VARIABLE``; None when unset), else ``(None, where)``."""
    if given is not None:
        return given, where
    found = configured(key) if configured is not None else None
    if found is not None and found[0] is not None and str(found[0]).strip():
        return found
    if environ is not None and variable is not None:
        return environ.get(variable), f"${variable}"
    return None, where


@dataclass(frozen=True)
class FileSettings:
    """A store's file data flow and file roots as a runner (a DAG, a flow, an operator) was
    given them, checked where they are given: what every runner passes to ``CheckpointStore``
    (``files=settings.mode, file_roots=settings.roots``).

    Attributes:
        files: the file data flow, or None: the process that opens the store decides
            (``$OPENJD_CHECKPOINT_FILES``, else ``shared``: ``file_flow_from_env``).
        roots: absolute folders, besides the session working directory, whose files a managed
            store may capture and restore (``$OPENJD_CHECKPOINT_FILE_ROOTS`` of the process
            that opens the store is added to them: ``file_roots_from_env``).
    """

    files: FileDataFlow | None = None
    roots: tuple[str, ...] = ()

    @property
    def mode(self) -> str | None:
        """``files`` as its value (``shared``, ``managed``), or None."""
        return self.files.value if self.files is not None else None

    @classmethod
    def resolve(
        cls,
        files: str | None = None,
        file_roots: Sequence[str] | str | None = None,
        *,
        where: str = "files=",
        roots_where: str = "file_roots",
        configured: Configured | None = None,
    ) -> FileSettings:
        """The settings of a runner: for each, the argument, else ``configured`` (``files``,
        ``file_roots``: see ``Configured``), else none. ``file_roots`` is a list of folders or
        one string of them separated by ``os.pathsep``; blanks are dropped. ``files`` may be
        given in any case (``Managed``).

        Raises:
            ValueError: ``files`` is not ``shared`` or ``managed``, or a root is not an
                absolute path; the message names where it came from (``where``,
                ``roots_where``, the configuration's name).
        """
        text, text_where = first_setting(files, where, configured, "files")
        flow = None
        if text is not None:
            try:
                flow = FileDataFlow(str(text).strip().lower())
            except ValueError:
                named = (
                    f"{text_where}{text!r}"
                    if text_where.endswith("=")
                    else (f"{text_where} = {text!r}")
                )
                modes = ", ".join(m.value for m in FileDataFlow)
                raise ValueError(f"{named} is not one of {modes}") from None
        given, roots_from = first_setting(file_roots, roots_where, configured, "file_roots")
        items = given.split(os.pathsep) if isinstance(given, str) else list(given or ())
        roots = tuple(str(r).strip() for r in items if str(r).strip())
        for root in roots:
            if not os.path.isabs(root):
                raise ValueError(f"{roots_from}: {root!r} is not an absolute path")
        return cls(flow, roots)


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
