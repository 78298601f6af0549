"""Tests of ``core._messages.parse_line`` and ``MessageContext.check``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core._messages import (
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
)

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
