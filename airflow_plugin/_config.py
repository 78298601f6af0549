"""Where the adapter's checkpoints live, how the store treats checkpoint files, and the few
names shared by its modules."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

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

FILE_MODES = tuple(flow.value for flow in core.FileDataFlow)
"""The file data flows of a store (``core.FileDataFlow``): ``shared`` keeps paths only,
``managed`` keeps the checkpoint files themselves and restores them on resume, on any worker."""

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
    return str(core.default_store_location())


def files_mode(explicit: str | None = None) -> str | None:
    """The store's file data flow: ``explicit`` (a ``dag_from_template``/operator argument),
    else ``[openjd_checkpoint] files`` from the Airflow configuration of the process that asks
    (a worker), else None: the core's default (``$OPENJD_CHECKPOINT_FILES``, else ``shared``).

    Raises:
        ValueError: the value is not ``shared`` or ``managed`` (naming where it came from).
    """
    return core.FileSettings.resolve(explicit, configured=_configured_only("files")).mode


def check_files_mode(value: str, origin: str) -> str:
    """``value`` normalized (``shared`` or ``managed``).

    Raises:
        ValueError: anything else; the message starts with ``origin`` (``files=``).
    """
    mode = core.FileSettings.resolve(value, where=origin).mode
    assert mode is not None
    return mode


def file_roots(explicit: Sequence[str] | str | None = None) -> list[str]:
    """Absolute folders (besides the session working directory) whose files a managed store
    may capture and restore: ``explicit`` (a list, or one string of folders separated by
    ``os.pathsep``), else ``[openjd_checkpoint] file_roots`` (separated by ``os.pathsep``), else
    none. The core adds ``$OPENJD_CHECKPOINT_FILE_ROOTS`` to them.

    Raises:
        ValueError: a root is not an absolute path (naming where it came from).
    """
    settings = core.FileSettings.resolve(
        file_roots=explicit, configured=_configured_only("file_roots")
    )
    return list(settings.roots)


def check_file_roots(roots: Sequence[str] | str, origin: str) -> list[str]:
    """``roots`` as a list (a string is split on ``os.pathsep``; blanks are dropped).

    Raises:
        ValueError: a root that is not an absolute path; the message names ``origin``.
    """
    return list(core.FileSettings.resolve(file_roots=roots, roots_where=origin).roots)


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
    settings = core.NoticeSettings.from_env(explicit, explicit_poll, configured=_configured)
    return list(settings.sources), settings.poll_seconds


def _configured(key: str) -> tuple[str, str] | None:
    """``[openjd_checkpoint] key`` from the Airflow configuration of the process that asks, and
    where it came from; None when it is not set (or blank)."""
    from airflow.sdk import conf

    value = conf.get(CONFIG_SECTION, key, fallback=None)
    if value is None or not str(value).strip():
        return None
    return str(value), f"[{CONFIG_SECTION}] {key}"


def _configured_only(key: str) -> Callable[[str], tuple[str, str] | None]:
    """``_configured`` for ``key`` alone (the others read as not set)."""
    return lambda asked: _configured(asked) if asked == key else None


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
