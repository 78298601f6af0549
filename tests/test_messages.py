"""Tests of the stdout protocol on plain strings and bytes, no process: ``core._messages``
(``parse_line``, ``MessageContext.check``, ``read_line``) and what a task makes of a well-formed
message (``core.task._protocol.TaskOutput`` over a ``core.task._recorder.TaskRecorder``).

Every malformed or refused case that a process-level test asserts has its case here too; the
comment ``# from <test file>`` names where it comes from (test_task_execution.py's NOISY script,
test_bounded_output.py, test_hostile.py, test_managed_files.py, the conformance suite's
REDACTED_ENV_VARS jobs).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core._messages import (
    REDACTED,
    CheckpointFiles,
    CheckpointSave,
    EnvSet,
    EnvUnset,
    Fail,
    FilesMode,
    MessageContext,
    MessageWarning,
    Progress,
    ResumeStatus,
    ResumeStatusValue,
    Status,
    TaskComplete,
    parse_line,
    read_line,
)
from core.job import new_task_record, plan_tasks

PREFIXES = [
    "openjd_progress",
    "openjd_status",
    "openjd_fail",
    "openjd_env",
    "openjd_redacted_env",
    "openjd_unset_env",
    "openjd_checkpoint_files",
    "openjd_task_complete",
    "openjd_checkpoint_save",
    "openjd_checkpoint_resume_status",
    "openjd_session_runtime_loglevel",
]

# --- well-formed messages ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            'openjd_checkpoint_files: {"files": ["/a/b", "C:\\\\c.txt"], "dirs": ["/d"], '
            '"mode": "RESET"}',
            CheckpointFiles(files=("/a/b", "C:\\c.txt"), dirs=("/d",), mode=FilesMode.RESET),
            id="files-reset",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": ["/a"]}',
            CheckpointFiles(files=("/a",), dirs=(), mode=FilesMode.ACCUMULATE),
            id="files-default-accumulate",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"dirs": ["/x"], "mode": "ACCUMULATE"}',
            CheckpointFiles(files=(), dirs=("/x",), mode=FilesMode.ACCUMULATE),
            id="files-accumulate",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": 12}',
            TaskComplete(parameter="Frame", frame=12),
            id="task-complete",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": -3}',
            TaskComplete(parameter="Frame", frame=-3),
            id="task-complete-negative",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": "5,3,8"}',
            CheckpointSave(state="5,3,8", file=None),
            id="save-state",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"file": "/tmp/ckpt.bin"}',
            CheckpointSave(state=None, file="/tmp/ckpt.bin"),
            id="save-file",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": "s", "file": "C:\\\\work\\\\c.bin"}',
            CheckpointSave(state="s", file="C:\\work\\c.bin"),
            id="save-both-windows-path",
        ),
        pytest.param(
            "openjd_checkpoint_save: {}",
            CheckpointSave(state=None, file=None),
            id="save-neither",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": ""}',
            CheckpointSave(state="", file=None),
            id="save-empty-state",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: {"status": "RESUMED"}',
            ResumeStatus(ResumeStatusValue.RESUMED),
            id="resume-resumed",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: {"status": "DISCARDED"}',
            ResumeStatus(ResumeStatusValue.DISCARDED),
            id="resume-discarded",
        ),
        pytest.param("openjd_progress: 42.5", Progress(42.5), id="progress"),
        pytest.param("openjd_progress:0", Progress(0.0), id="progress-0-no-space"),
        pytest.param("openjd_progress: 100", Progress(100.0), id="progress-100"),
        pytest.param("  openjd_progress: 7  \r", Progress(7.0), id="progress-whitespace"),
        pytest.param("openjd_status: Rendering frame 3", Status("Rendering frame 3"), id="status"),
        pytest.param("openjd_fail: out of memory", Fail("out of memory"), id="fail"),
        pytest.param("openjd_env: FOO=bar=baz", EnvSet("FOO", "bar=baz"), id="env"),
        pytest.param('openjd_env: "A_1=x y"', EnvSet("A_1", "x y"), id="env-json-form"),
        pytest.param("openjd_env: EMPTY=", EnvSet("EMPTY", ""), id="env-empty-value"),
        pytest.param("openjd_unset_env: FOO", EnvUnset("FOO"), id="unset-env"),
        pytest.param(
            "openjd_redacted_env: TOKEN=s3cret",
            EnvSet("TOKEN", "s3cret", redacted=True),
            id="redacted-env",
        ),
        pytest.param(
            'openjd_redacted_env: "TOKEN=a b"',
            EnvSet("TOKEN", "a b", redacted=True),
            id="redacted-env-json-form",
        ),
        pytest.param(
            "openjd_session_runtime_loglevel: DEBUG",
            Status("runtime log level DEBUG"),
            id="session-runtime-loglevel",
        ),
        pytest.param("openjd_status:", Status(""), id="status-empty"),
    ],
)
def test_well_formed_message(line: str, expected: object) -> None:
    assert parse_line(line) == expected


def test_resume_status_value_is_the_enum() -> None:
    event = parse_line('openjd_checkpoint_resume_status: {"status": "DISCARDED"}')
    assert isinstance(event, ResumeStatus)
    assert event.status is ResumeStatusValue.DISCARDED


# --- malformed messages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind", "fragment"),
    [
        pytest.param(
            "openjd_checkpoint_save: {state: 1}",
            "openjd_checkpoint_save",
            "not valid JSON",
            id="save-bad-json",
        ),
        pytest.param(
            "openjd_checkpoint_save: []",
            "openjd_checkpoint_save",
            "expected a JSON object",
            id="save-not-object",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": "x", "extra": 1}',
            "openjd_checkpoint_save",
            "unknown key(s) 'extra'",
            id="save-unknown-key",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": 5}',
            "openjd_checkpoint_save",
            "'state' must be a string",
            id="save-state-int",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": "a\\u0000b"}',
            "openjd_checkpoint_save",
            "NUL",
            id="save-state-nul",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"file": "relative/ckpt.bin"}',
            "openjd_checkpoint_save",
            "absolute path",
            id="save-relative-file",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"file": ""}',
            "openjd_checkpoint_save",
            "non-empty path",
            id="save-empty-file",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"file": ["/a"]}',
            "openjd_checkpoint_save",
            "non-empty path",
            id="save-file-list",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: {"status": "resumed"}',
            "openjd_checkpoint_resume_status",
            "RESUMED or DISCARDED",
            id="resume-lowercase",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: {"status": "FAILED"}',
            "openjd_checkpoint_resume_status",
            "RESUMED or DISCARDED",
            id="resume-unknown-status",
        ),
        pytest.param(
            "openjd_checkpoint_resume_status: {}",
            "openjd_checkpoint_resume_status",
            "RESUMED or DISCARDED",
            id="resume-missing-status",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: {"status": "RESUMED", "why": "x"}',
            "openjd_checkpoint_resume_status",
            "unknown key(s) 'why'",
            id="resume-unknown-key",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": "/a"}',
            "openjd_checkpoint_files",
            "'files' must be a list of strings",
            id="files-not-list",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"dirs": [1]}',
            "openjd_checkpoint_files",
            "'dirs' must be a list of strings",
            id="dirs-int",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": [""]}',
            "openjd_checkpoint_files",
            "empty path",
            id="files-empty-path",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": ["/a", "c.txt"]}',
            "openjd_checkpoint_files",
            "'files' must hold absolute paths, got 'c.txt'",
            id="files-relative-path",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"dirs": ["./out"]}',
            "openjd_checkpoint_files",
            "'dirs' must hold absolute paths, got './out'",
            id="dirs-relative-path",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"mode": "REPLACE"}',
            "openjd_checkpoint_files",
            "ACCUMULATE or RESET",
            id="files-bad-mode",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"file": ["/a"]}',
            "openjd_checkpoint_files",
            "unknown key(s) 'file'",
            id="files-unknown-key",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": true}',
            "openjd_task_complete",
            "must be an integer",
            id="task-complete-bool",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": 1.5}',
            "openjd_task_complete",
            "must be an integer",
            id="task-complete-float",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": "3"}',
            "openjd_task_complete",
            "must be an integer",
            id="task-complete-string",
        ),
        pytest.param(
            'openjd_task_complete: {"Frame": 1, "Other": 2}',
            "openjd_task_complete",
            "expected one key",
            id="task-complete-two-keys",
        ),
        pytest.param(
            "openjd_task_complete: {}",
            "openjd_task_complete",
            "expected one key",
            id="task-complete-empty",
        ),
        pytest.param(
            "openjd_task_complete: Frame=3",
            "openjd_task_complete",
            "not valid JSON",
            id="task-complete-bad-json",
        ),
        pytest.param("openjd_progress: 101", "openjd_progress", "0 to 100", id="progress-101"),
        pytest.param("openjd_progress: -1", "openjd_progress", "0 to 100", id="progress-neg"),
        pytest.param("openjd_progress: nan", "openjd_progress", "0 to 100", id="progress-nan"),
        pytest.param("openjd_progress: half", "openjd_progress", "0 to 100", id="progress-word"),
        pytest.param("openjd_env: 1A=x", "openjd_env", "NAME=VALUE", id="env-bad-name"),
        pytest.param("openjd_env: NOEQUALS", "openjd_env", "NAME=VALUE", id="env-no-equals"),
        pytest.param('openjd_env: "A=1', "openjd_env", "not valid JSON", id="env-bad-json"),
        pytest.param("openjd_unset_env: A B", "openjd_unset_env", "variable name", id="unset-bad"),
        pytest.param(
            "openjd_redacted_env: =x",
            "openjd_redacted_env",
            "NAME=VALUE",
            id="redacted-env-no-name",
        ),
        # from test_task_execution.py (NOISY): stderr written in the middle of a save joins it
        pytest.param(
            'openjd_checkpoint_save: {"state": "fragmstderr in between',
            "openjd_checkpoint_save",
            "not valid JSON",
            id="save-joined-with-stderr",
        ),
        # from test_task_execution.py (NOISY): bad JSON
        pytest.param(
            'openjd_checkpoint_save: {"state": "x"x"x',
            "openjd_checkpoint_save",
            "not valid JSON",
            id="save-unterminated-json",
        ),
        # from test_task_execution.py (NOISY) and test_resume_safety.py: the default state cap
        pytest.param(
            'openjd_checkpoint_save: {"state": "' + "y" * (128 * 1024) + '"}',
            "openjd_checkpoint_save",
            "over the 131071-byte cap",
            id="save-state-over-the-default-cap",
        ),
        # from test_hostile.py: saves that could never be resumed
        pytest.param(
            'openjd_checkpoint_save: {"state": "\\ud800"}',
            "openjd_checkpoint_save",
            "lone surrogate",
            id="save-state-lone-surrogate",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"file": "/tmp/\\udcff"}',
            "openjd_checkpoint_save",
            "lone surrogate",
            id="save-file-lone-surrogate",
        ),
        # from test_bounded_output.py: one path rule for both messages
        pytest.param(
            'openjd_checkpoint_save: {"file": "../ckpt.bin"}',
            "openjd_checkpoint_save",
            "must be an absolute path, got '../ckpt.bin'",
            id="save-dotdot-file",
        ),
        pytest.param(
            'openjd_checkpoint_save: {"state": "rel", "file": "ck.bin"}',
            "openjd_checkpoint_save",
            "must be an absolute path, got 'ck.bin'",
            id="save-relative-file-with-state",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": ["/abs", "./rel"]}',
            "openjd_checkpoint_files",
            "'files' must hold absolute paths, got './rel'",
            id="files-one-relative-among-absolute",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"files": ["relative.exr"]}',
            "openjd_checkpoint_files",
            "'files' must hold absolute paths, got 'relative.exr'",
            id="files-relative-name",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"dirs": ["scratch/"]}',
            "openjd_checkpoint_files",
            "'dirs' must hold absolute paths, got 'scratch/'",
            id="dirs-relative-with-slash",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"dirs": ["scratch"]}',
            "openjd_checkpoint_files",
            "'dirs' must hold absolute paths, got 'scratch'",
            id="dirs-relative-name",
        ),
        # from test_bounded_output.py: 200,000 of these, each a warning (capped)
        pytest.param(
            "openjd_progress: bogus 7", "openjd_progress", "0 to 100", id="progress-bogus"
        ),
        # from test_bounded_output.py: the warning cap's ten bad saves
        pytest.param(
            "openjd_checkpoint_save: {bad",
            "openjd_checkpoint_save",
            "not valid JSON",
            id="save-brace",
        ),
        pytest.param(
            'openjd_checkpoint_resume_status: "RESUMED"',
            "openjd_checkpoint_resume_status",
            "expected a JSON object",
            id="resume-not-object",
        ),
        pytest.param(
            'openjd_checkpoint_files: {"mode": 1}',
            "openjd_checkpoint_files",
            "ACCUMULATE or RESET",
            id="files-mode-not-a-string",
        ),
        pytest.param(
            "openjd_task_complete: [3]",
            "openjd_task_complete",
            "expected one key",
            id="task-complete-list",
        ),
        pytest.param('openjd_env: "=x"', "openjd_env", "NAME=VALUE", id="env-json-form-no-name"),
        pytest.param("openjd_env: 5", "openjd_env", "NAME=VALUE", id="env-number"),
        pytest.param("openjd_unset_env:", "openjd_unset_env", "variable name", id="unset-empty"),
    ],
)
def test_malformed_message_gives_a_warning(line: str, kind: str, fragment: str) -> None:
    result = parse_line(line)
    assert isinstance(result, MessageWarning), result
    assert result.kind == kind
    assert fragment in result.reason
    text = result.describe(7)
    assert "line 7" in text
    assert kind in text
    assert fragment in text


def test_describe_without_a_line_number() -> None:
    warning = parse_line("openjd_progress: 101")
    assert isinstance(warning, MessageWarning)
    assert warning.describe() == f"malformed openjd_progress message: {warning.reason}"


def test_state_cap_is_in_bytes_of_utf8() -> None:
    cap = 10
    at_cap = "é" * 5  # 10 bytes
    over_cap = "é" * 5 + "x"  # 11 bytes, 6 characters
    ok = parse_line("openjd_checkpoint_save: " + json.dumps({"state": at_cap}), max_state_bytes=cap)
    assert ok == CheckpointSave(state=at_cap)
    bad = parse_line(
        "openjd_checkpoint_save: " + json.dumps({"state": over_cap}), max_state_bytes=cap
    )
    assert isinstance(bad, MessageWarning)
    assert bad.kind == "openjd_checkpoint_save"
    assert "11 bytes" in bad.reason
    assert "10-byte cap" in bad.reason
    assert "line 3" in bad.describe(3)


# --- ordinary output ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "Fibonacci number 3 is 2",
        "openjd_environment: ready",
        "xopenjd_progress: 5",
        "# openjd_progress: 5",
        "openjd_progress 5",
        "openjd_: x",
        "openjd_checkpoint: {}",
        "openjd_checkpoint_saves: {}",
        "OPENJD_PROGRESS: 5",
        "echo openjd_checkpoint_save: {}",
    ],
)
def test_ordinary_line_is_not_a_message(line: str) -> None:
    assert parse_line(line) is None


# --- parser crashes found by review (fixed) ---


def test_deeply_nested_task_complete_is_a_warning() -> None:
    result = parse_line("openjd_task_complete: " + "[" * 100_000)
    assert isinstance(result, MessageWarning)
    assert result.kind == "openjd_task_complete"


@pytest.mark.parametrize(
    "line",
    [
        'openjd_checkpoint_save: {"state": ' + "1" * 5000 + "}",
        "openjd_checkpoint_files: " + "1" * 5000,
        'openjd_checkpoint_resume_status: {"status": ' + "1" * 5000 + "}",
        'openjd_task_complete: {"Frame": ' + "1" * 5000 + "}",
    ],
    ids=["save", "files", "resume-status", "task-complete"],
)
def test_huge_json_integer_is_a_warning(line: str) -> None:
    result = parse_line(line)
    assert isinstance(result, MessageWarning)
    assert result.kind == line.split(":", 1)[0]


def test_deeply_nested_save_is_a_warning() -> None:
    result = parse_line("openjd_checkpoint_save: " + "[" * 100_000)
    assert isinstance(result, MessageWarning)
    assert result.kind == "openjd_checkpoint_save"
    assert "not valid JSON" in result.reason


# --- MessageContext.check ----------------------------------------------------------------------

CHUNKED = MessageContext(chunk_parameter="Frame", chunk_frames=frozenset({1, 2, 3}))


def _check_warns(ctx: MessageContext, event: Any, kind: str, fragment: str) -> None:
    warning = ctx.check(event)
    assert isinstance(warning, MessageWarning), warning
    assert warning.kind == kind
    assert fragment in warning.reason
    assert "line 4" in warning.describe(4)


def test_task_complete_in_chunk_is_accepted() -> None:
    assert CHUNKED.check(TaskComplete("Frame", 2)) is None


def test_task_complete_wrong_key() -> None:
    _check_warns(
        CHUNKED, TaskComplete("Frames", 2), "openjd_task_complete", "not the step's CHUNK[INT]"
    )


@pytest.mark.parametrize("frame", [0, 4, -1, 10**12])
def test_task_complete_frame_outside_chunk(frame: int) -> None:
    _check_warns(
        CHUNKED, TaskComplete("Frame", frame), "openjd_task_complete", "not in the running chunk"
    )


def test_task_complete_without_chunk_parameter() -> None:
    _check_warns(
        MessageContext(), TaskComplete("Frame", 1), "openjd_task_complete", "no CHUNK[INT]"
    )


def test_resume_status_outside_the_resume_action() -> None:
    _check_warns(
        MessageContext(in_resume_action=False),
        ResumeStatus(ResumeStatusValue.RESUMED),
        "openjd_checkpoint_resume_status",
        "only inside onCheckpointResume",
    )


def test_resume_status_inside_the_resume_action() -> None:
    assert (
        MessageContext(in_resume_action=True).check(ResumeStatus(ResumeStatusValue.DISCARDED))
        is None
    )


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        (CheckpointSave(state="x"), "openjd_checkpoint_save"),
        (CheckpointFiles(files=("/a",)), "openjd_checkpoint_files"),
        (TaskComplete("Frame", 1), "openjd_task_complete"),
    ],
)
def test_checkpoint_messages_from_an_environment_action(event: Any, kind: str) -> None:
    env_ctx = MessageContext(
        chunk_parameter="Frame", chunk_frames=frozenset({1}), in_task_action=False
    )
    _check_warns(env_ctx, event, kind, "only a task's action")


def test_checkpoint_messages_from_a_task_action() -> None:
    ctx = MessageContext()
    assert ctx.check(CheckpointSave(state="x")) is None
    assert ctx.check(CheckpointFiles(files=("/a",))) is None


def test_redacted_env_needs_the_extension() -> None:
    event = EnvSet("TOKEN", "x", redacted=True)
    _check_warns(MessageContext(), event, "openjd_redacted_env", "REDACTED_ENV_VARS")
    assert MessageContext(redaction_enabled=True).check(event) is None


@pytest.mark.parametrize(
    "event", [Progress(5.0), Status("s"), Fail("f"), EnvSet("A", "1"), EnvUnset("A")]
)
def test_ordinary_events_pass_every_context(event: Any) -> None:
    for ctx in (MessageContext(), MessageContext(in_task_action=False), CHUNKED):
        assert ctx.check(event) is None


# --- properties --------------------------------------------------------------------------------

PROPS = settings(max_examples=300, deadline=None)
RESULT_TYPES = (
    Progress,
    Status,
    Fail,
    EnvSet,
    EnvUnset,
    CheckpointFiles,
    TaskComplete,
    CheckpointSave,
    ResumeStatus,
    MessageWarning,
)


@PROPS
@given(st.text())
def test_parse_line_never_raises_on_any_text(line: str) -> None:
    result = parse_line(line)
    if not line.strip().startswith("openjd_"):
        assert result is None
    else:
        assert result is None or isinstance(result, RESULT_TYPES)


@PROPS
@given(st.text())
def test_parse_line_never_raises_on_checkpoint_save_with_any_body(body: str) -> None:
    result = parse_line("openjd_checkpoint_save: " + body)
    assert isinstance(result, (CheckpointSave, MessageWarning))
    if isinstance(result, MessageWarning):
        assert result.kind == "openjd_checkpoint_save"


@PROPS
@given(st.sampled_from(PREFIXES), st.sampled_from([":", ": ", ":\t"]), st.text())
def test_parse_line_never_raises_on_any_prefix_with_any_body(
    prefix: str, sep: str, body: str
) -> None:
    result = parse_line(prefix + sep + body)
    assert result is not None
    assert isinstance(result, RESULT_TYPES)
    if isinstance(result, MessageWarning):
        assert result.kind == prefix


@PROPS
@given(
    st.sampled_from(PREFIXES),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=10,
    ),
)
def test_parse_line_never_raises_on_any_json_body(prefix: str, value: Any) -> None:
    result = parse_line(f"{prefix}: {json.dumps(value)}")
    assert isinstance(result, RESULT_TYPES)


CAP = 256
_states = st.text(max_size=120).filter(lambda s: "\x00" not in s and len(s.encode("utf-8")) <= CAP)
_files = st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s).map(lambda s: "/" + s)


@PROPS
@given(st.none() | _states, st.none() | _files, st.booleans())
def test_checkpoint_save_round_trip(state: str | None, file: str | None, ascii_only: bool) -> None:
    body: dict[str, str] = {}
    if state is not None:
        body["state"] = state
    if file is not None:
        body["file"] = file
    line = "openjd_checkpoint_save: " + json.dumps(body, ensure_ascii=ascii_only)
    assert parse_line(line, max_state_bytes=CAP) == CheckpointSave(state=state, file=file)


@PROPS
@given(st.text(max_size=40), st.text(max_size=40))
def test_state_with_nul_is_a_warning(before: str, after: str) -> None:
    state = before + "\x00" + after
    result = parse_line("openjd_checkpoint_save: " + json.dumps({"state": state}))
    assert isinstance(result, MessageWarning)
    assert result.kind == "openjd_checkpoint_save"
    assert "NUL" in result.reason


@PROPS
@given(st.text(min_size=1), st.integers())
def test_task_complete_round_trip(parameter: str, frame: int) -> None:
    result = parse_line("openjd_task_complete: " + json.dumps({parameter: frame}))
    assert result == TaskComplete(parameter=parameter, frame=frame)


@PROPS
@given(st.floats(min_value=0, max_value=100, allow_nan=False))
def test_progress_round_trip(percent: float) -> None:
    assert parse_line(f"openjd_progress: {percent!r}") == Progress(percent)


# --- read_line: one whole output line, as the reader hands it over ----------------------------

TASK_CTX = MessageContext(in_task_action=True, redaction_enabled=True)


def _read(data: bytes, ctx: MessageContext = TASK_CTX, secrets: set[str] | None = None) -> Any:
    return read_line(data, number=9, context=ctx, secrets=set() if secrets is None else secrets)


def test_read_line_of_a_well_formed_message() -> None:
    reading = _read(b'  openjd_checkpoint_save: {"state": "good"}')
    assert reading.event == CheckpointSave(state="good")
    assert reading.warning is None
    assert reading.text == '  openjd_checkpoint_save: {"state": "good"}'


@pytest.mark.parametrize(
    "data",
    [b"Fibonacci number 3 is 2", b"", b'ent"}', b"STILL RUNNING", b"\xc2\xa0openjd_progress: 5"],
    ids=["plain", "empty", "tail-of-a-joined-save", "still-running", "nbsp-before-the-prefix"],
)
def test_read_line_of_ordinary_output(data: bytes) -> None:
    # from test_task_execution.py (NOISY): the tail of a save that stderr split is plain output
    reading = _read(data)
    assert (reading.event, reading.warning) == (None, None)
    assert reading.text == data.decode("utf-8")


def test_read_line_of_a_line_over_the_line_cap() -> None:
    # from test_task_execution.py (NOISY): a 5 MiB save line is dropped, never parsed
    reading = read_line(
        b"",
        number=12,
        context=TASK_CTX,
        secrets=set(),
        dropped_size=5 * 1024 * 1024 + 16,
        max_line_bytes=4 * 1024 * 1024,
    )
    assert reading.text is None and reading.event is None
    assert reading.warning == (
        "output line 12: 5242896 bytes is over the 4194304-byte line cap; the line was dropped "
        "and not parsed"
    )


def test_read_line_of_a_message_that_is_not_utf8() -> None:
    # from test_task_execution.py (NOISY): openjd_checkpoint_save: {"state": "bad-\xff\xfe"}
    reading = _read(b'openjd_checkpoint_save: {"state": "bad-\xff\xfe"}')
    assert reading.event is None
    assert reading.warning == "output line 9: not valid UTF-8; the message was ignored"
    assert reading.text == 'openjd_checkpoint_save: {"state": "bad-\ufffd\ufffd"}'


def test_read_line_of_plain_output_that_is_not_utf8_is_shown_without_a_warning() -> None:
    # from test_task_execution.py (NOISY): b"\xff\xfe plain output that is not UTF-8"
    reading = _read(b"\xff\xfe plain output that is not UTF-8")
    assert (reading.event, reading.warning) == (None, None)
    assert reading.text == "\ufffd\ufffd plain output that is not UTF-8"


@pytest.mark.parametrize(
    ("ctx", "data", "kind", "fragment"),
    [
        # from test_task_execution.py (NOISY): no chunk parameter, not in onCheckpointResume
        (TASK_CTX, b'openjd_task_complete: {"Frame": 3}', "openjd_task_complete", "no CHUNK[INT]"),
        (
            TASK_CTX,
            b'openjd_checkpoint_resume_status: {"status": "RESUMED"}',
            "openjd_checkpoint_resume_status",
            "valid only inside onCheckpointResume",
        ),
        (
            CHUNKED,
            b'openjd_task_complete: {"Frame": 9}',
            "openjd_task_complete",
            "not in the running chunk",
        ),
        (
            MessageContext(in_task_action=False, redaction_enabled=True),
            b'openjd_checkpoint_save: {"state": "x"}',
            "openjd_checkpoint_save",
            "only a task's action may report checkpoints",
        ),
        (
            MessageContext(in_task_action=False, redaction_enabled=True),
            b'openjd_checkpoint_files: {"files": ["/a"]}',
            "openjd_checkpoint_files",
            "only a task's action may report checkpoints",
        ),
    ],
    ids=[
        "no-chunk-parameter",
        "resume-status-outside",
        "frame-outside-chunk",
        "env-save",
        "env-files",
    ],
)
def test_read_line_of_a_message_its_context_refuses(
    ctx: MessageContext, data: bytes, kind: str, fragment: str
) -> None:
    reading = _read(data, ctx)
    assert reading.event is None
    assert reading.warning is not None
    assert reading.warning.startswith(f"output line 9: malformed {kind} message: ")
    assert fragment in reading.warning
    assert reading.text == data.decode("utf-8")


def test_read_line_warnings_all_name_the_output_line() -> None:
    # from test_task_execution.py (NOISY): every warning says "output line"
    lines = [
        b'openjd_checkpoint_save: {"state": "bad-\xff"}',
        b'openjd_checkpoint_save: {"state": "x"x"x',
        b'openjd_checkpoint_save: {"state": "a\\u0000b"}',
        b'openjd_checkpoint_save: {"state": "ok", "extra": 1}',
        b'openjd_checkpoint_save: {"state": 5}',
        b'openjd_task_complete: {"Frame": 3}',
    ]
    for data in lines:
        reading = _read(data)
        assert reading.event is None and reading.warning is not None
        assert reading.warning.startswith("output line 9: "), reading.warning


def test_read_line_of_a_redacted_env_masks_it_and_every_later_line() -> None:
    # from test_task_execution.py (job environment's openjd_redacted_env) and the conformance
    # jobs REDACTED_ENV_VARS/initial-line-redacted and redaction-without-extension
    secrets: set[str] = set()
    ctx = MessageContext(in_task_action=False, redaction_enabled=True)
    reading = _read(b"openjd_redacted_env: MY_SECRET=actual_secret_value", ctx, secrets)
    assert reading.event == EnvSet("MY_SECRET", "actual_secret_value", redacted=True)
    assert reading.text == f"openjd_redacted_env: MY_SECRET={REDACTED}"
    assert secrets == {"actual_secret_value"}
    later = _read(b"v1 v2 actual_secret_value", TASK_CTX, secrets)
    assert later.text == "v1 v2 ********"
    assert (later.event, later.warning) == (None, None)


def test_read_line_of_a_redacted_env_that_its_context_refuses_is_still_masked() -> None:
    secrets: set[str] = set()
    reading = _read(b"openjd_redacted_env: TOKEN=hunter2", MessageContext(), secrets)
    assert reading.event is None
    assert reading.warning is not None and "REDACTED_ENV_VARS" in reading.warning
    assert reading.text == f"openjd_redacted_env: TOKEN={REDACTED}"
    assert secrets == {"hunter2"}


@pytest.mark.parametrize(
    "data",
    [b"openjd_redacted_env: no-equals-hunter2", b"openjd_redacted_env: TOKEN=hunter2\xff"],
    ids=["malformed", "not-utf8"],
)
def test_read_line_of_a_bad_redacted_env_shows_no_value(data: bytes) -> None:
    secrets: set[str] = set()
    reading = _read(data, TASK_CTX, secrets)
    assert reading.event is None and reading.warning is not None
    assert reading.text == f"openjd_redacted_env: {REDACTED}"
    assert secrets == set()


def test_read_line_masks_a_secret_inside_a_message() -> None:
    reading = _read(b"openjd_status: token is hunter2", TASK_CTX, {"hunter2"})
    assert reading.event == Status("token is hunter2")  # the event is the task's, unmasked
    assert reading.text == f"openjd_status: token is {REDACTED}"


# --- TaskOutput over a TaskRecorder: what a task makes of the messages, still no process -------


class _Task:
    """A TaskOutput over a TaskRecorder without a store, as a TaskExecution composes them."""

    def __init__(self, *, max_warnings: int = 100, working_dir: Any = None) -> None:
        from core import prepare_job
        from core.job._template import parse_template
        from core.task._protocol import TaskOutput
        from core.task._recorder import TaskRecorder

        doc = {
            "specificationVersion": "jobtemplate-2023-09",
            "name": "protocol",
            "steps": [{"name": "S", "script": {"actions": {"onRun": {"command": "true"}}}}],
        }
        job = prepare_job(parse_template(doc))
        self.warnings: list[str] = []
        self.events: list[tuple[str, Any]] = []
        self.shown: list[str] = []
        self.recorder = TaskRecorder(
            new_task_record(job, plan_tasks(job, "S")[0], "run"),
            store=None,
            attempt=1,
            warn=self.warnings.append,
            emit=lambda kind, value, **detail: self.events.append((kind, value)),
        )
        self.output = TaskOutput(
            self.recorder,
            max_line_bytes=1024,
            max_state_bytes=DEFAULT_STATE_CAP,
            max_warnings=max_warnings,
            warn=self.warnings.append,
            emit=lambda kind, value: self.events.append((kind, value)),
            on_output=self.shown.extend,
            working_dir=lambda: None if working_dir is None else str(working_dir),
        )

    def feed(
        self, *texts: str, ctx: MessageContext = TASK_CTX, env: dict[str, Any] | None = None
    ) -> None:
        from core.process import OutputLine

        first = len(self.shown) + 1
        lines = [OutputLine(first + i, "stdout", t.encode()) for i, t in enumerate(texts)]
        self.output.handle(lines, ctx, env)


DEFAULT_STATE_CAP = 128 * 1024 - 1


def test_task_output_commits_the_latest_save_of_a_batch(tmp_path: Any) -> None:
    task = _Task()
    task.feed(
        'openjd_checkpoint_files: {"files": ["/a"]}',
        'openjd_checkpoint_save: {"state": "one"}',
        'openjd_checkpoint_save: {"state": "two"}',
        'openjd_checkpoint_files: {"files": ["/b"], "mode": "RESET"}',
    )
    ck = task.recorder.record.checkpoint
    assert ck is not None and (ck.generation, ck.state, ck.files) == (1, "two", ["/a"])
    assert task.recorder.record.pending_files == ["/b"]
    assert ("checkpoint_saved", 1) in task.events
    assert task.warnings == []


def test_task_output_refuses_a_save_of_a_missing_file(tmp_path: Any) -> None:
    # from test_task_execution.py (NOISY): {"file": "/no/such/checkpoint.bin"}
    task = _Task()
    task.feed('openjd_checkpoint_save: {"file": "/no/such/checkpoint.bin"}')
    assert task.recorder.record.checkpoint is None
    assert task.warnings == [
        "output line 1: openjd_checkpoint_save names file '/no/such/checkpoint.bin', which does "
        "not exist; nothing was saved and the previous checkpoint stays"
    ]


def test_task_output_refuses_a_save_in_the_session_working_directory(tmp_path: Any) -> None:
    # from test_hostile.py: a checkpoint file in the session directory is refused
    (tmp_path / "ck.bin").write_text("x")
    task = _Task(working_dir=tmp_path)
    task.feed(f'openjd_checkpoint_save: {{"file": "{tmp_path / "ck.bin"}"}}')
    assert task.recorder.record.checkpoint is None
    [warning] = task.warnings
    assert warning.startswith("output line 1: openjd_checkpoint_save names file ")
    assert "in the session working directory" in warning
    assert "nothing was saved and the previous checkpoint stays" in warning


def test_task_output_refuses_files_in_the_session_working_directory(tmp_path: Any) -> None:
    # from test_managed_files.py: shared mode refuses files in the session folder
    task = _Task(working_dir=tmp_path)
    lost = tmp_path / "lost.txt"
    task.feed(
        f'openjd_checkpoint_files: {{"files": ["{lost}"]}}',
        'openjd_checkpoint_save: {"state": "s"}',
    )
    ck = task.recorder.record.checkpoint
    assert ck is not None and ck.files == [] and ck.manifest is None
    [warning] = task.warnings
    assert warning == (
        f"output line 1: openjd_checkpoint_files names {str(lost)!r} in the session working "
        "directory, which is deleted when the task ends (use a managed store, --files managed, "
        "to keep such files); the message was ignored"
    )


def test_task_output_refuses_a_state_holding_a_secret(tmp_path: Any) -> None:
    task = _Task()
    task.output.secrets.add("hunter2")
    task.feed('openjd_checkpoint_save: {"state": "token=hunter2"}')
    assert task.recorder.record.checkpoint is None
    assert task.warnings == [
        "output line 1: the checkpoint state holds a redacted value; nothing was saved and the "
        "previous checkpoint stays"
    ]
    assert task.shown == ['openjd_checkpoint_save: {"state": "token=********"}']


def test_task_output_refuses_environment_changes_from_a_task_action(tmp_path: Any) -> None:
    task = _Task()
    task.feed("openjd_env: A=1", "openjd_unset_env: B")
    assert task.warnings == [
        f"output line {n}: environment variables can only be changed by an environment's "
        "onEnter; ignored"
        for n in (1, 2)
    ]
    env: dict[str, Any] = {}
    task.feed("openjd_env: A=1", "openjd_unset_env: B", env=env)
    assert env == {"A": "1", "B": None}
    assert len(task.warnings) == 2


def test_task_output_caps_its_line_warnings(tmp_path: Any) -> None:
    # from test_bounded_output.py: the first N kept, the rest counted
    task = _Task(max_warnings=3)
    task.feed(*["openjd_checkpoint_save: {bad"] * 10, 'openjd_checkpoint_save: {"state": "ok"}')
    task.output.tell_dropped()
    ck = task.recorder.record.checkpoint
    assert ck is not None and ck.state == "ok"
    assert len(task.warnings) == 4
    assert task.warnings[0].startswith("output line 1: malformed openjd_checkpoint_save message")
    assert task.warnings[-1] == (
        "... and 7 more output line warning(s), not shown: only the first 3 are kept"
    )
    task.output.tell_dropped()  # told once
    assert len(task.warnings) == 4


def test_task_output_applies_progress_status_fail_frames_and_resume_status(tmp_path: Any) -> None:
    task = _Task()
    task.feed(
        "openjd_progress: 40",
        "openjd_status: halfway",
        "openjd_fail: out of memory",
        'openjd_checkpoint_resume_status: {"status": "DISCARDED"}',
        ctx=MessageContext(in_resume_action=True, redaction_enabled=True),
    )
    chunked = MessageContext(
        chunk_parameter="Frame", chunk_frames=frozenset({1, 2}), redaction_enabled=True
    )
    task.feed(
        'openjd_task_complete: {"Frame": 2}', 'openjd_task_complete: {"Frame": 2}', ctx=chunked
    )
    out = task.output
    assert (out.progress, out.status, out.fail_message) == (40.0, "halfway", "out of memory")
    rec = task.recorder.record
    assert rec.resume_status == "DISCARDED" and rec.completed_frames == [2]
    assert [k for k, _ in task.events] == [
        "progress",
        "status",
        "fail",
        "resume_status",
        "frame_complete",
        "frame_complete",
    ]
    assert task.warnings == []


def test_task_output_refuses_paths_a_managed_store_does_not_capture(tmp_path: Any) -> None:
    # from test_managed_files.py (the hostile task): '..', outside every root, not a regular file
    from core import CheckpointStore
    from core.task._action import StopState

    task = _Task()
    session = tmp_path / "session"
    session.mkdir()
    (session / "ok.txt").write_text("ok")
    fifo = session / "fifo"
    os.mkfifo(fifo)
    recorder = task.recorder
    recorder.store = CheckpointStore(tmp_path / "store", files="managed")
    recorder.start_capture(str(session), "job", "run")
    try:
        assert recorder.managed
        task.feed(
            f'openjd_checkpoint_files: {{"files": ["{session}/../outside.txt"]}}',
            'openjd_checkpoint_files: {"files": ["/etc/passwd"]}',
            f'openjd_checkpoint_files: {{"files": ["{fifo}"]}}',
            'openjd_checkpoint_save: {"file": "/etc/passwd"}',
            f'openjd_checkpoint_files: {{"files": ["{session / "ok.txt"}"]}}',
            'openjd_checkpoint_save: {"state": "s"}',
        )
        recorder.process_ended(StopState())  # the capture drained: the save committed
    finally:
        recorder.close_capture()
    assert len(task.warnings) == 4, task.warnings
    for n, (path, why) in enumerate(
        [
            (f"{session}/../outside.txt", "it has a '..' component"),
            ("/etc/passwd", "it is not under the session working directory"),
            (str(fifo), "it is a"),
        ],
        start=1,
    ):
        assert task.warnings[n - 1].startswith(
            f"output line {n}: openjd_checkpoint_files names {path!r}, which a managed store "
            f"does not capture: {why}"
        ), task.warnings[n - 1]
        assert task.warnings[n - 1].endswith("; the message was ignored")
    assert task.warnings[3].startswith(
        "output line 4: openjd_checkpoint_save names file '/etc/passwd', which a managed store "
        "does not capture: it is not under the session working directory"
    )
    ck = recorder.record.checkpoint
    assert ck is not None and ck.manifest and ck.files == [str(session / "ok.txt")]
