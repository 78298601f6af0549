"""Where the adapter's checkpoints live, how the store treats checkpoint files, and the few
names shared by its modules."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import core

CONFIG_SECTION = "openjd_checkpoint"
"""The Airflow configuration section::

    [openjd_checkpoint]
    store = <path or fsspec URL>        # AIRFLOW__OPENJD_CHECKPOINT__STORE
    files = shared | managed            # AIRFLOW__OPENJD_CHECKPOINT__FILES
    file_roots = /a:/b                  # AIRFLOW__OPENJD_CHECKPOINT__FILE_ROOTS (os.pathsep)
    interruption_notices = aws,gcp,azure,file:/path,signal:USR2
                                        # AIRFLOW__OPENJD_CHECKPOINT__INTERRUPTION_NOTICES
    notice_poll_seconds = 5             # AIRFLOW__OPENJD_CHECKPOINT__NOTICE_POLL_SECONDS
"""

FILE_MODES = ("shared", "managed")
"""The file data flows of a store (``core.files._blobs``): ``shared`` keeps paths only, ``managed``
keeps the checkpoint files themselves and restores them on resume, on any worker."""

BEGIN_TASK_ID = "openjd_begin"
FINISH_TASK_ID = "openjd_finish"
RESUME_PARAM = "resume"
STATE_STORE_KEY = "openjd_checkpoint"
"""The task state store key under which each task instance keeps its checkpoint summary."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def store_location(explicit: str | None = None) -> str:
    """The checkpoint store's location: ``explicit``, else ``[openjd_checkpoint] store`` from the
    Airflow configuration of the process that asks (a worker), else the core's default
    (``$OPENJD_CHECKPOINT_STORE`` or the per-user state directory).

    Every worker must see the same store for a retry on another worker to resume.
    """
    if explicit:
        return explicit
    from airflow.sdk import conf

    configured = conf.get(CONFIG_SECTION, "store", fallback=None)
    if configured:
        return str(configured)
    import core

    return str(core.default_store_location())


def files_mode(explicit: str | None = None) -> str | None:
    """The store's file data flow: ``explicit`` (a ``dag_from_template``/operator argument),
    else ``[openjd_checkpoint] files`` from the Airflow configuration of the process that asks
    (a worker), else None: the core's default (``$OPENJD_CHECKPOINT_FILES``, else ``shared``).

    Raises:
        ValueError: the value is not ``shared`` or ``managed`` (naming where it came from).
    """
    if explicit is not None:
        return check_files_mode(explicit, "files=")
    from airflow.sdk import conf

    configured = conf.get(CONFIG_SECTION, "files", fallback=None)
    if configured is None or not str(configured).strip():
        return None
    return check_files_mode(str(configured), f"[{CONFIG_SECTION}] files = ")


def check_files_mode(value: str, origin: str) -> str:
    """``value`` normalized (``shared`` or ``managed``).

    Raises:
        ValueError: anything else; the message starts with ``origin`` (``files=``).
    """
    mode = value.strip().lower()
    if mode not in FILE_MODES:
        raise ValueError(f"{origin}{value!r} is not one of {', '.join(FILE_MODES)}")
    return mode


def file_roots(explicit: Sequence[str] | str | None = None) -> list[str]:
    """Absolute folders (besides the session working directory) whose files a managed store
    may capture and restore: ``explicit`` (a list, or one string of folders separated by
    ``os.pathsep``), else ``[openjd_checkpoint] file_roots`` (separated by ``os.pathsep``), else
    none. The core adds ``$OPENJD_CHECKPOINT_FILE_ROOTS`` to them.

    Raises:
        ValueError: a root is not an absolute path (naming where it came from).
    """
    if explicit is not None:
        return check_file_roots(explicit, "file_roots")
    from airflow.sdk import conf

    configured = conf.get(CONFIG_SECTION, "file_roots", fallback=None)
    if not configured:
        return []
    return check_file_roots(str(configured), f"[{CONFIG_SECTION}] file_roots")


def check_file_roots(roots: Sequence[str] | str, origin: str) -> list[str]:
    """``roots`` as a list (a string is split on ``os.pathsep``; blanks are dropped).

    Raises:
        ValueError: a root that is not an absolute path; the message names ``origin``.
    """
    items = roots.split(os.pathsep) if isinstance(roots, str) else list(roots)
    found = [str(r).strip() for r in items if str(r).strip()]
    for root in found:
        if not os.path.isabs(root):
            raise ValueError(f"{origin}: {root!r} is not an absolute path")
    return found


def notice_settings(
    explicit: str | None = None, explicit_poll: float | str | None = None
) -> tuple[list[core.NoticeSource], float]:
    """The interruption notice sources and poll interval of an OpenJD task instance (the CLI's
    ``--interruption-notices`` and ``--notice-poll-seconds``): ``explicit`` (an operator or
    ``dag_from_template`` argument), else ``[openjd_checkpoint] interruption_notices`` (and
    ``notice_poll_seconds``) from the Airflow configuration of the worker, else
    ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES`` (``$OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS``),
    else no source (5 s).

    Raises:
        ValueError: a bad setting, naming where it came from.
    """
    from airflow.sdk import conf

    import core
    from core import NOTICE_POLL_ENV, NOTICES_ENV

    if explicit is not None:
        text, where = explicit, "interruption_notices="
    else:
        configured = conf.get(CONFIG_SECTION, "interruption_notices", fallback=None)
        if configured is not None and str(configured).strip():
            text, where = str(configured), f"[{CONFIG_SECTION}] interruption_notices"
        else:
            text, where = os.environ.get(NOTICES_ENV, ""), f"${NOTICES_ENV}"
    sources = core.parse_notice_sources(text, where=where)
    if explicit_poll is not None:
        poll = core.parse_poll_seconds(explicit_poll, where="notice_poll_seconds=")
    else:
        configured = conf.get(CONFIG_SECTION, "notice_poll_seconds", fallback=None)
        if configured is not None and str(configured).strip():
            poll = core.parse_poll_seconds(
                str(configured), where=f"[{CONFIG_SECTION}] notice_poll_seconds"
            )
        else:
            poll = core.parse_poll_seconds(
                os.environ.get(NOTICE_POLL_ENV), where=f"${NOTICE_POLL_ENV}"
            )
    return sources, poll


def open_store(
    store: str | None = None,
    files: str | None = None,
    roots: Sequence[str] | str | None = None,
) -> core.CheckpointStore:
    """The checkpoint store a worker uses: ``store_location(store)`` with the file data flow
    ``files_mode(files)`` and the roots ``file_roots(roots)``.

    Raises:
        ValueError: a bad ``files`` or ``file_roots`` setting.
        core.StoreError: the store cannot be used.
    """
    import core

    return core.CheckpointStore(
        store_location(store), files=files_mode(files), file_roots=file_roots(roots)
    )


def task_id_for(name: str, taken: set[str]) -> str:
    """A valid, unique Airflow task id for an OpenJD step name (unsafe characters become
    ``_``; a clash gets a numeric suffix). Adds the id to ``taken``."""
    base = _UNSAFE.sub("_", name).strip("_") or "step"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate
