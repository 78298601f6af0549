"""Where the adapter's checkpoints live, and the few names shared by its modules."""

from __future__ import annotations

import re

CONFIG_SECTION = "openjd_checkpoint"
"""The Airflow configuration section: ``[openjd_checkpoint] store = <path or fsspec URL>``
(or ``AIRFLOW__OPENJD_CHECKPOINT__STORE``)."""

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


def task_id_for(name: str, taken: set[str]) -> str:
    """A valid, unique Airflow task id for an OpenJD step name (unsafe characters become
    ``_``; a clash gets a numeric suffix). Adds the id to ``taken``."""
    base = _UNSAFE.sub("_", name).strip("_") or "step"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate
