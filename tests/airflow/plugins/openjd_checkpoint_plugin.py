"""Loads airflow_plugin's plugin into the live stack from its plugins folder, until the
``airflow.plugins`` entry point is registered in pyproject.toml (then this file does nothing,
so the plugin is not registered twice)."""

from __future__ import annotations

import importlib.metadata

_registered = any(
    ep.value.startswith("airflow_plugin")
    for ep in importlib.metadata.entry_points(group="airflow.plugins")
)
if not _registered:
    from airflow_plugin.plugin import OpenJDCheckpointPlugin  # noqa: F401
