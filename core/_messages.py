"""Parse the OpenJD stdout/stderr message protocol into typed events.

Implements the existing 2023-09 messages (``openjd_progress``, ``openjd_status``, ``openjd_fail``,
``openjd_env``, ``openjd_redacted_env``, ``openjd_unset_env``) with openjd-sessions'
``ActionMonitoringFilter`` as the behavioural reference, and the four messages of the CHECKPOINT
RFC idea (seed 000, "Messages from the task to the scheduler"):

- ``openjd_checkpoint_files: {"files": [...], "dirs": [...], "mode": "ACCUMULATE"|"RESET"}``
  (absolute paths)
- ``openjd_task_complete: {"<CHUNK[INT] parameter name>": <int>}``
- ``openjd_checkpoint_save: {"state": "...", "file": "/abs/path"}`` (both keys optional)
- ``openjd_checkpoint_resume_status: {"status": "RESUMED"|"DISCARDED"}``

openjd-sessions' filter is a closed regex over its own kinds and cannot be taught new ones, so the
whole protocol is parsed here. The parser is pure (no I/O): ``parse_line`` takes one complete
line and returns an event, ``None`` for ordinary output, or a ``MessageWarning`` naming what was
wrong. Rules that need the running context (the chunk parameter's name and frames, whether this is
the resume action) are checked by ``MessageContext.check``. ``read_line`` does the whole of one
output line as the reader hands it over (its bytes, or only its size when it was over the line
cap): decoding, parsing, the context's rules and the masking of secrets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = (
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_STATE_BYTES",
    "CheckpointFiles",
    "CheckpointSave",
    "EnvSet",
    "EnvUnset",
    "Fail",
    "REDACTED",
    "FilesMode",
    "LineReading",
    "MessageContext",
    "MessageEvent",
    "MessageWarning",
    "Progress",
    "ResumeStatus",
    "Status",
    "TaskComplete",
    "parse_line",
    "read_line",
)

DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024
"""The longest output line the reader takes whole (4 MiB, newline excluded). A longer line is
refused with a warning and never parsed, in whole or in part."""

DEFAULT_MAX_STATE_BYTES = 128 * 1024 - 1
"""The largest checkpoint ``state``: 131,071 bytes of UTF-8. Trax caps a checkpoint at 1 MiB,
but ``{{Task.Checkpoint.State}}`` reaches the task as one command-line argument of
``onCheckpointResume``, and Linux takes at most 128 KiB (MAX_ARG_STRLEN, with its NUL) for one:
a larger state could be saved but never resumed. See docs/decisions.md."""

REDACTED = "********"
"""What a secret is shown as in the task's output."""


class FilesMode(str, Enum):
    ACCUMULATE = "ACCUMULATE"
    """Add the listed files and dirs to the checkpoint's file dataset."""
    RESET = "RESET"
    """Empty the dataset first, then add the listed files and dirs."""


@dataclass(frozen=True)
class Progress:
    percent: float
    """0.0 to 100.0."""


@dataclass(frozen=True)
class Status:
    message: str


@dataclass(frozen=True)
class Fail:
    message: str


@dataclass(frozen=True)
class EnvSet:
    name: str
    value: str
    redacted: bool = False
    """True for ``openjd_redacted_env``: the value is never logged or stored."""


@dataclass(frozen=True)
class EnvUnset:
    name: str


@dataclass(frozen=True)
class CheckpointFiles:
    files: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    mode: FilesMode = FilesMode.ACCUMULATE


@dataclass(frozen=True)
class TaskComplete:
    parameter: str
    """The CHUNK[INT] task parameter's name."""
    frame: int


@dataclass(frozen=True)
class CheckpointSave:
    state: str | None = None
    file: str | None = None


class ResumeStatusValue(str, Enum):
    RESUMED = "RESUMED"
    """The resume action used the checkpoint."""
    DISCARDED = "DISCARDED"
    """The resume action threw the checkpoint away and started from scratch."""


@dataclass(frozen=True)
class ResumeStatus:
    status: ResumeStatusValue


MessageEvent = (
    Progress
    | Status
    | Fail
    | EnvSet
    | EnvUnset
    | CheckpointFiles
    | TaskComplete
    | CheckpointSave
    | ResumeStatus
)


@dataclass(frozen=True)
class MessageWarning:
    """A malformed protocol message. The task keeps running; nothing is stored from it.

    Attributes:
        kind: the message name (``openjd_checkpoint_save``) or ``output`` for line-level faults.
        reason: what was wrong, for a person to read.
    """

    kind: str
    reason: str

    def describe(self, line_number: int | None = None) -> str:
        where = f"output line {line_number}: " if line_number is not None else ""
        return f"{where}malformed {self.kind} message: {self.reason}"


_PREFIX = re.compile(
    r"^openjd_(progress|status|fail|env|redacted_env|unset_env|checkpoint_files|task_complete|"
    r"checkpoint_save|checkpoint_resume_status|session_runtime_loglevel):(.*)\Z",
    re.DOTALL,
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_line(
    line: str, *, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
) -> MessageEvent | MessageWarning | None:
    """Parse one complete output line (without its newline).

    Args:
        line: the decoded line. Leading and trailing white space is ignored, as openjd-sessions
            ignores it.
        max_state_bytes: the cap on a checkpoint ``state``, in bytes of UTF-8.

    Returns:
        An event for a well-formed message, a ``MessageWarning`` for a malformed one, or None
        for a line that is not a protocol message.
    """
    text = line.strip()
    if not text.startswith("openjd_"):
        return None
    m = _PREFIX.match(text)
    if m is None:
        return None
    kind, body = m.group(1), m.group(2).strip()
    name = f"openjd_{kind}"
    try:
        return _HANDLERS[kind](body, max_state_bytes)
    except _MalformedError as exc:
        return MessageWarning(kind=name, reason=str(exc))


class _MalformedError(ValueError):
    pass


def _json_object(body: str, allowed: set[str]) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long integers
        raise _MalformedError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _MalformedError(f"expected a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _MalformedError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
    return value


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _MalformedError(f"'{key}' must be a list of strings")
    for v in value:
        if not v or "\x00" in v:
            raise _MalformedError(f"'{key}' holds an empty path or one with a NUL character")
        if not _is_absolute(v):
            raise _MalformedError(f"'{key}' must hold absolute paths, got {v!r}")
    return tuple(value)


_WINDOWS_ABSOLUTE = re.compile(r"[A-Za-z]:[\\/]")


def _is_absolute(path: str) -> bool:
    """The one path rule of ``openjd_checkpoint_files`` and ``openjd_checkpoint_save``: a path
    is absolute (POSIX ``/...`` or a Windows drive ``C:\\...``), else the message is refused. A
    relative path could only mean the action's working directory, which is the session working
    directory that is deleted when the task ends (see docs/decisions.md)."""
    return path.startswith("/") or _WINDOWS_ABSOLUTE.match(path) is not None


def _progress(body: str, _cap: int) -> MessageEvent:
    try:
        pct = float(body)
    except ValueError:
        raise _MalformedError(f"progress must be a number from 0 to 100, got {body!r}") from None
    if not 0.0 <= pct <= 100.0:
        raise _MalformedError(f"progress must be a number from 0 to 100, got {body!r}")
    return Progress(pct)


def _env(body: str, _cap: int, redacted: bool = False) -> MessageEvent:
    text = body
    if text.startswith('"'):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _MalformedError(f"the JSON string form is not valid JSON ({exc})") from None
        if not isinstance(text, str):
            raise _MalformedError("the JSON form must be a string NAME=VALUE")
    name, eq, value = text.partition("=")
    if not eq or not _ENV_NAME.match(name):
        raise _MalformedError("expected NAME=VALUE with a name of letters, digits and '_'")
    return EnvSet(name=name, value=value, redacted=redacted)


def _unset(body: str, _cap: int) -> MessageEvent:
    if not _ENV_NAME.match(body):
        raise _MalformedError(f"expected a variable name, got {body!r}")
    return EnvUnset(body)


def _files(body: str, _cap: int) -> MessageEvent:
    obj = _json_object(body, {"files", "dirs", "mode"})
    mode_raw = obj.get("mode", "ACCUMULATE")
    try:
        mode = FilesMode(mode_raw)
    except (ValueError, TypeError):
        raise _MalformedError(f"'mode' must be ACCUMULATE or RESET, got {mode_raw!r}") from None
    return CheckpointFiles(
        files=_str_list(obj.get("files"), "files"),
        dirs=_str_list(obj.get("dirs"), "dirs"),
        mode=mode,
    )


def _task_complete(body: str, _cap: int) -> MessageEvent:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _MalformedError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict) or len(value) != 1:
        raise _MalformedError('expected one key, the CHUNK[INT] parameter: {"Frame": 12}')
    ((param, frame),) = value.items()
    if isinstance(frame, bool) or not isinstance(frame, int):
        raise _MalformedError(f"the frame of {param!r} must be an integer, got {frame!r}")
    return TaskComplete(parameter=param, frame=frame)


def _save(body: str, cap: int) -> MessageEvent:
    obj = _json_object(body, {"state", "file"})
    for key in ("state", "file"):
        if key in obj and obj[key] is None:
            raise _MalformedError(
                f"'{key}' is null: give a string, or leave the key out (a save keeps no {key} then)"
            )
    state = obj.get("state")
    file = obj.get("file")
    if state is not None:
        if not isinstance(state, str):
            raise _MalformedError(f"'state' must be a string, got {type(state).__name__}")
        if "\x00" in state:
            raise _MalformedError(
                "'state' holds a NUL character, which cannot be stored; encode such data "
                "(Base64, say)"
            )
        try:
            size = len(state.encode("utf-8"))
        except UnicodeEncodeError:
            raise _MalformedError(
                "'state' holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode"
            ) from None
        if size > cap:
            raise _MalformedError(f"'state' is {size} bytes, over the {cap}-byte cap")
    if file is not None:
        if not isinstance(file, str) or not file or "\x00" in file:
            raise _MalformedError("'file' must be a non-empty path string")
        try:
            file.encode("utf-8")
        except UnicodeEncodeError:
            raise _MalformedError("'file' holds a lone surrogate; not valid Unicode") from None
        if not _is_absolute(file):
            raise _MalformedError(f"'file' must be an absolute path, got {file!r}")
    return CheckpointSave(state=state, file=file)


def _resume_status(body: str, _cap: int) -> MessageEvent:
    obj = _json_object(body, {"status"})
    raw = obj.get("status")
    try:
        return ResumeStatus(ResumeStatusValue(raw))
    except (ValueError, TypeError):
        raise _MalformedError(f"'status' must be RESUMED or DISCARDED, got {raw!r}") from None


def _loglevel(body: str, _cap: int) -> MessageEvent:
    return Status(message=f"runtime log level {body}")


_HANDLERS: dict[str, Any] = {
    "progress": _progress,
    "status": lambda b, c: Status(b),
    "fail": lambda b, c: Fail(b),
    "env": _env,
    "redacted_env": lambda b, c: _env(b, c, redacted=True),
    "unset_env": _unset,
    "checkpoint_files": _files,
    "task_complete": _task_complete,
    "checkpoint_save": _save,
    "checkpoint_resume_status": _resume_status,
    "session_runtime_loglevel": _loglevel,
}


@dataclass
class MessageContext:
    """What a message is checked against while an action runs.

    Attributes:
        chunk_parameter: name of the step's CHUNK[INT] task parameter, or None.
        chunk_frames: the frames of the running chunk (empty when not chunked).
        in_resume_action: True while ``onCheckpointResume`` runs.
        in_task_action: True for onRun/onCheckpointResume; False for environment actions,
            which may not report checkpoints or finished frames.
        redaction_enabled: the template declares REDACTED_ENV_VARS.
    """

    chunk_parameter: str | None = None
    chunk_frames: frozenset[int] = field(default_factory=frozenset)
    in_resume_action: bool = False
    in_task_action: bool = True
    redaction_enabled: bool = False

    def check(self, event: MessageEvent) -> MessageWarning | None:
        """Return a warning if ``event`` is not valid here, else None."""
        if isinstance(event, TaskComplete):
            if not self.in_task_action:
                return MessageWarning("openjd_task_complete", "only a task's action may send it")
            if self.chunk_parameter is None:
                return MessageWarning(
                    "openjd_task_complete", "the step has no CHUNK[INT] task parameter"
                )
            if event.parameter != self.chunk_parameter:
                return MessageWarning(
                    "openjd_task_complete",
                    f"key {event.parameter!r} is not the step's CHUNK[INT] parameter "
                    f"{self.chunk_parameter!r}",
                )
            if event.frame not in self.chunk_frames:
                return MessageWarning(
                    "openjd_task_complete",
                    f"frame {event.frame} is not in the running chunk",
                )
        elif isinstance(event, (CheckpointSave, CheckpointFiles)):
            if not self.in_task_action:
                kind = (
                    "openjd_checkpoint_save"
                    if isinstance(event, CheckpointSave)
                    else "openjd_checkpoint_files"
                )
                return MessageWarning(kind, "only a task's action may report checkpoints")
        elif isinstance(event, ResumeStatus):
            if not self.in_resume_action:
                return MessageWarning(
                    "openjd_checkpoint_resume_status",
                    "valid only inside onCheckpointResume",
                )
        elif isinstance(event, EnvSet) and event.redacted and not self.redaction_enabled:
            return MessageWarning(
                "openjd_redacted_env",
                "the template does not declare the REDACTED_ENV_VARS extension",
            )
        return None


@dataclass(frozen=True)
class LineReading:
    """What one output line of an action is to the task.

    Attributes:
        text: the line as it may be shown (every secret masked), or None for a line that was
            dropped (over the line cap).
        event: the message the line carries, valid in its context, or None.
        warning: what was wrong with the line, naming its number, or None.
    """

    text: str | None
    event: MessageEvent | None = None
    warning: str | None = None


def read_line(
    data: bytes,
    *,
    number: int,
    context: MessageContext,
    secrets: set[str],
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    dropped_size: int | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> LineReading:
    """Read one whole output line (no I/O).

    Args:
        data: the line's bytes, without its newline.
        number: its 1-based number in the action's output, for the warning.
        context: what a message is checked against.
        secrets: the values declared secret so far; the value of a well-formed
            ``openjd_redacted_env`` is added to it (this line's text is masked with it too).
        max_state_bytes: the cap on a checkpoint ``state``.
        dropped_size: the line's size in bytes when the reader dropped it for being over
            ``max_line_bytes`` (then ``data`` is ignored); None for a line read whole.
        max_line_bytes: the line cap, named in the warning about a dropped line.
    """
    if dropped_size is not None:
        return LineReading(
            text=None,
            warning=f"output line {number}: {dropped_size} bytes is over the "
            f"{max_line_bytes}-byte line cap; the line was dropped and not parsed",
        )
    event: MessageEvent | None = None
    warning: str | None = None
    try:
        text = data.decode("utf-8")
        bad_utf8 = False
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        bad_utf8 = True
    stripped = data.lstrip()
    if stripped.startswith(b"openjd_"):
        if bad_utf8:
            if stripped.startswith(b"openjd_redacted_env"):
                text = "openjd_redacted_env: " + REDACTED
            warning = f"output line {number}: not valid UTF-8; the message was ignored"
        else:
            result = parse_line(text, max_state_bytes=max_state_bytes)
            if isinstance(result, MessageWarning):
                if result.kind == "openjd_redacted_env":
                    text = "openjd_redacted_env: " + REDACTED
                warning = result.describe(number)
            elif result is not None:
                problem = context.check(result)
                if isinstance(result, EnvSet) and result.redacted:
                    secrets.add(result.value)
                    text = f"openjd_redacted_env: {result.name}={REDACTED}"
                if problem is not None:
                    warning = problem.describe(number)
                else:
                    event = result
    if secrets:
        for secret in secrets:
            if secret:
                text = text.replace(secret, REDACTED)
    return LineReading(text=text, event=event, warning=warning)
