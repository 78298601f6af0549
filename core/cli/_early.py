"""Signals that arrive while the CLI starts, before it handles them itself (see
``core/cli/__init__.py``)."""

EARLY_SIGNALS: list[int] = []
"""Numbers of the signals received before the run's own handling was installed."""
