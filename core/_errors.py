"""The small error hierarchy of openjd-checkpoint's core."""

from __future__ import annotations

__all__ = (
    "OpenJDCheckpointError",
    "TemplateError",
    "StoreError",
    "SettingError",
    "RunError",
)


class OpenJDCheckpointError(Exception):
    """Base class of every error this package raises on purpose."""


class TemplateError(OpenJDCheckpointError, ValueError):
    """A job template (or its job parameter values) was refused.

    Each entry of ``problems`` is one finding, written ``<field path>: <message>``, where the
    field path is dotted from the template's root, as in
    ``steps[0].script.actions.onRun.checkpointCancelation.signalToNotify``.
    """

    def __init__(self, problems: list[str], *, source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(text)


class StoreError(OpenJDCheckpointError):
    """A checkpoint store could not be read or written.

    The message names the store location and the record. A stored record that cannot be read is
    never deleted or overwritten because of this error.
    """


class SettingError(StoreError, ValueError):
    """A store's setting (an argument, or the environment variable standing for it) has a
    value it cannot take; the message names the setting. A ``ValueError`` too."""


class RunError(OpenJDCheckpointError):
    """A run could not be started or continued (for example: it is in progress elsewhere)."""
