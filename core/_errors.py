"""The small error hierarchy of openjd-checkpoint's core, and ``seconds_in_range``, the one
check of a setting given in seconds (a lease's ttl, a poll interval) that raises them."""

from __future__ import annotations

__all__ = (
    "OpenJDCheckpointError",
    "TemplateError",
    "StoreError",
    "LeaseLostError",
    "SettingError",
    "RunError",
    "seconds_in_range",
)


class OpenJDCheckpointError(Exception):
    """Base class of every error this package raises on purpose."""


class TemplateError(OpenJDCheckpointError, ValueError):
    """A job template (or its job parameter values) was refused.

    Each entry of ``problems`` is one finding, written ``<field path>: <message>``, where the
    field path is dotted from the template's root, as in
    ``steps[0].script.actions.onRun.checkpointCancelation.signalToNotify``. ``too_large``:
    those of ``problems`` that refuse a step for its size (more than ``MAX_TASKS_PER_STEP``
    tasks, or a range too large to count), which other job parameter values may cure.
    """

    def __init__(
        self,
        problems: list[str],
        *,
        source: str | None = None,
        too_large: list[str] | None = None,
    ) -> None:
        self.problems = list(problems)
        self.source = source
        self.too_large = list(too_large or [])
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


class LeaseLostError(StoreError):
    """This process no longer holds the lease a write needs (fencing): the lease expired (its
    holder was stalled, or the store could not be written, for its whole ttl) and another
    process may have taken it over. Nothing was written; the holder must stop the work the
    lease covered, since another process may be doing it now. The message says which lease,
    and who holds it now when that is known.

    Attributes:
        taken: True when the store says another process holds the lease now; False when it
            could only not be renewed (the store cannot be reached or written).
    """

    def __init__(self, message: str, *, taken: bool = True) -> None:
        super().__init__(message)
        self.taken = taken


class SettingError(StoreError, ValueError):
    """A store's setting (an argument, or the environment variable standing for it) has a
    value it cannot take; the message names the setting. A ``ValueError`` too."""


class RunError(OpenJDCheckpointError):
    """A run could not be started or continued (for example: it is in progress elsewhere)."""


def seconds_in_range(
    value: object,
    *,
    where: str,
    low: float,
    high: float,
    error: type[ValueError] = ValueError,
) -> float:
    """``value`` (a number, or its text) as seconds from ``low`` to ``high``.

    Raises:
        ValueError (or ``error``, a subclass): not a number, or out of the range (nan is); the
            message names ``where``, the argument or variable it came from, and shows at most
            40 characters of the value.
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int too large for a float
        seconds = float("inf")
    except (TypeError, ValueError):
        raise error(f"{where}: {_shown(value)} is not a number of seconds") from None
    if not low <= seconds <= high:  # also refuses nan
        raise error(f"{where}: {_shown(value)} must be from {low:g} to {high:g} seconds")
    return seconds


def _shown(value: object) -> str:
    """``value`` for a message: the repr of its first 40 characters."""
    try:
        return repr(str(value)[:40])
    except ValueError:  # an int of more digits than str() converts
        return "an int of too many digits"
