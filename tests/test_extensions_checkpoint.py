"""CHECKPOINT together with openjd-model's extensions: an EXPR template (``let`` at template and
script scope, a LIST parameter, an expression in ``checkpointCancelation`` and in
``onCheckpointResume``) interrupted through ``TaskExecution`` and resumed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import CheckpointStore, StopIntent, TaskOutcome, TemplateError, prepare_job  # noqa: E402
from core.job._template import parse_template  # noqa: E402
from tests.test_task_execution import Runner  # noqa: E402

pytestmark = pytest.mark.slow

WORKER = """
import json, os, signal, sys, time
print("ARGS " + " ".join(sys.argv[1:]), flush=True)
def on_signal(sig, frame):
    info = json.load(open("cancel_info.json"))
    print("NOTIFIED " + signal.Signals(sig).name + " " + info["NotifyEnd"], flush=True)
    print("openjd_checkpoint_save: " + json.dumps({"state": "frame-7"}), flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_signal)
print("READY", flush=True)
time.sleep(60)
"""


def expr_template(**step_extra: Any) -> dict[str, Any]:
    return {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["EXPR", "FEATURE_BUNDLE_1", "CHECKPOINT"],
        "name": "expr checkpoint",
        "parameterDefinitions": [{"name": "Frames", "type": "LIST[INT]", "default": [3, 4, 5]}],
        "steps": [
            {
                "name": "S",
                "let": ["period = len(Param.Frames) * 10"],
                "script": {
                    "let": ["label = 'frames=' + string(len(Param.Frames))"],
                    "embeddedFiles": [{"name": "Worker", "type": "TEXT", "data": WORKER}],
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": ["{{Task.File.Worker}}", "{{label}}", "{{Param.Frames}}"],
                            "checkpointCancelation": {
                                "mode": "NOTIFY_THEN_TERMINATE",
                                "notifyPeriodInSeconds": "{{ period }}",
                                "signalToNotify": "SIGUSR1",
                            },
                        },
                        "onCheckpointResume": {
                            "command": "python3",
                            "args": [
                                "-c",
                                "import sys; print('RESUMED ' + ' '.join(sys.argv[1:]))",
                                "{{ upper(Task.Checkpoint.State) }}",
                                "{{label}}",
                                "{{ Param.Frames[-1] + 1 }}",
                            ],
                        },
                    },
                },
                **step_extra,
            }
        ],
    }


def test_expr_template_checkpoints_and_resumes(tmp_path: Path) -> None:
    job = prepare_job(parse_template(expr_template()))
    store = CheckpointStore(tmp_path / "store")
    r = Runner(job, store)
    r.wait_line("READY")
    # GIVEN the script-scope let and the list parameter flattened into arguments
    assert "ARGS frames=3 3 4 5" in r.lines
    # WHEN the task is asked to checkpoint
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    # THEN the notify period is the expression's value (3 * 10 s) and the state is kept
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT
    assert result.record.checkpoint is not None
    assert result.record.checkpoint.state == "frame-7"
    assert any(line.startswith("NOTIFIED SIGUSR1 ") for line in r.lines), r.lines

    # WHEN it is resumed, onCheckpointResume's expressions see the checkpoint and the lets
    again = Runner(job, store, resume=result.record.checkpoint)
    resumed = again.join()
    assert resumed.outcome == TaskOutcome.SUCCEEDED, (resumed.message, again.lines)
    assert "RESUMED FRAME-7 frames=3 6" in again.lines


def test_expr_notify_period_resolves_from_let(tmp_path: Path) -> None:
    job = prepare_job(parse_template(expr_template()))
    r = Runner(job, CheckpointStore(tmp_path / "store"))
    r.wait_line("READY")
    r.ex.stop(StopIntent.CHECKPOINT)
    r.join()
    line = next(x for x in r.lines if x.startswith("NOTIFIED"))
    # cancel_info.json's NotifyEnd is about 30 s (the let's value) after the notify, not 120 s.
    from datetime import datetime, timezone

    end = datetime.strptime(line.split()[2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    left = (end - datetime.now(timezone.utc)).total_seconds()
    assert 20 < left <= 31, left


def test_checkpoint_rules_still_apply_under_expr() -> None:
    # GIVEN an EXPR template whose onRun refers to the checkpoint state (only valid in resume)
    doc = expr_template()
    doc["steps"][0]["script"]["actions"]["onRun"]["args"].append("{{Task.Checkpoint.State}}")
    # THEN strip-and-shadow validation refuses it, naming onRun
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    assert any("steps[0].script.actions.onRun" in p for p in info.value.problems), info.value
    # AND a misspelled reference in onCheckpointResume is refused under its own name
    doc = expr_template()
    doc["steps"][0]["script"]["actions"]["onCheckpointResume"]["args"].append(
        "{{Task.Checkpoint.Stat}}"
    )
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    text = json.dumps(info.value.problems)
    assert "onCheckpointResume" in text and "Task.Checkpoint.Stat" in text, text


FILE_WORKER = """
import json, os, signal, sys, time
path = os.path.join(sys.argv[1], "ck", "model.txt")
os.makedirs(os.path.dirname(path), exist_ok=True)
open(path, "w").write("7")
def on_signal(sig, frame):
    print("openjd_checkpoint_save: " + json.dumps({"state": "a,b", "file": path}), flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_signal)
print("READY", flush=True)
time.sleep(60)
"""


def test_checkpoint_file_is_a_path_and_state_a_string_under_expr(tmp_path: Path) -> None:
    """With EXPR, Task.Checkpoint.File is a path (``.parent``, ``.name``) and
    Task.Checkpoint.State a string (``.split``), both when the template is checked and when
    the task resumes: a template that passes the check does not fail at resume."""
    doc = expr_template()
    actions = doc["steps"][0]["script"]["actions"]
    doc["steps"][0]["script"]["embeddedFiles"].append(
        {"name": "FileWorker", "type": "TEXT", "data": FILE_WORKER}
    )
    actions["onRun"]["args"] = ["{{Task.File.FileWorker}}", str(tmp_path)]
    actions["onCheckpointResume"]["args"] = [
        "-c",
        "import sys; print('RESUMED ' + ' '.join(sys.argv[1:]))",
        "{{ Task.Checkpoint.File.parent.name }}",
        "{{ Task.Checkpoint.File.name }}",
        "{{ Task.Checkpoint.State.split(',') }}",
    ]
    job = prepare_job(parse_template(doc))
    store = CheckpointStore(tmp_path / "store")
    r = Runner(job, store)
    r.wait_line("READY")
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    assert result.record.checkpoint is not None, (result.message, r.lines)
    again = Runner(job, store, resume=result.record.checkpoint)
    resumed = again.join()
    assert resumed.outcome == TaskOutcome.SUCCEEDED, (resumed.message, again.lines)
    assert "RESUMED ck model.txt a b" in again.lines, again.lines


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("{{ Task.Checkpoint.State.parent }}", "'parent' property is not available for string"),
        ("{{ Task.Checkpoint.State + 1 }}", "with string and int"),
        ("{{ upper(Task.Checkpoint.State }}", "upper(Task.Checkpoint.State"),
    ],
)
def test_checkpoint_references_are_checked_with_their_types_and_named(
    expression: str, message: str
) -> None:
    """A misuse is refused by check, in the user's own words (never a stand-in's name)."""
    doc = expr_template()
    doc["steps"][0]["script"]["actions"]["onCheckpointResume"]["args"].append(expression)
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    text = "\n".join(info.value.problems)
    assert "onCheckpointResume" in text and message in text, text
    assert "Job.Name" not in text and "Session." not in text, text
    # One problem: the expression and the caret under it belong to its message.
    assert len(info.value.problems) == 1, info.value.problems


WRAPPED_WORKER = """
import json, signal, sys, time
print("WORKER " + " ".join(sys.argv[1:]), flush=True)
def on_signal(sig, frame):
    print("WORKER GOT " + signal.Signals(sig).name, flush=True)
    print("openjd_checkpoint_save: " + json.dumps({"state": "wrapped-9"}), flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR2, on_signal)
print("READY", flush=True)
time.sleep(60)
"""


def wrap_template() -> dict[str, Any]:
    wrap_run = {
        "command": "bash",
        "args": [
            "-c",
            'echo "WRAP {{WrappedStep.Name}} $1"; "$@"',
            "wrap",
            "{{WrappedAction.Command}}",
            "{{WrappedAction.Args}}",
        ],
    }
    return {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["EXPR", "WRAP_ACTIONS", "CHECKPOINT"],
        "name": "wrap checkpoint",
        "jobEnvironments": [
            {
                "name": "Wrapper",
                "script": {
                    "actions": {
                        "onWrapEnvEnter": {"command": "true"},
                        "onWrapTaskRun": wrap_run,
                        "onWrapEnvExit": {"command": "true"},
                    }
                },
            }
        ],
        "steps": [
            {
                "name": "S",
                "script": {
                    "embeddedFiles": [{"name": "Worker", "type": "TEXT", "data": WRAPPED_WORKER}],
                    "actions": {
                        "onRun": {
                            "command": "python3",
                            "args": ["{{Task.File.Worker}}", "fresh"],
                            "checkpointCancelation": {
                                "mode": "NOTIFY_THEN_TERMINATE",
                                "notifyPeriodInSeconds": 20,
                                "signalToNotify": "SIGUSR2",
                            },
                        },
                        "onCheckpointResume": {
                            "command": "python3",
                            "args": [
                                "-c",
                                "import sys; print('RESUMED ' + sys.argv[1])",
                                "{{Task.Checkpoint.State}}",
                            ],
                        },
                    },
                },
            }
        ],
    }


def test_wrapped_task_checkpoints_through_its_wrapper_and_resumes_wrapped(tmp_path: Path) -> None:
    job = prepare_job(parse_template(wrap_template()))
    store = CheckpointStore(tmp_path / "store")
    r = Runner(job, store)
    r.wait_line("READY")
    # GIVEN onRun runs inside the wrap hook
    assert "WRAP S python3" in r.lines and "WORKER fresh" in r.lines
    # WHEN a checkpoint is requested, the wrapped action's signal reaches the worker behind
    # the wrapper (the whole process group is notified) and its save is kept
    r.ex.stop(StopIntent.CHECKPOINT)
    result = r.join()
    assert "WORKER GOT SIGUSR2" in r.lines
    assert result.outcome == TaskOutcome.INTERRUPTED_WITH_CHECKPOINT
    assert result.record.checkpoint is not None
    assert result.record.checkpoint.state == "wrapped-9"
    # THEN onCheckpointResume is wrapped as onRun is
    again = Runner(job, store, resume=result.record.checkpoint)
    resumed = again.join()
    assert resumed.outcome == TaskOutcome.SUCCEEDED, (resumed.message, again.lines)
    assert "WRAP S python3" in again.lines and "RESUMED wrapped-9" in again.lines


def test_checkpoint_fields_on_a_wrap_hook_follow_the_checkpoint_rules() -> None:
    doc = wrap_template()
    hook = doc["jobEnvironments"][0]["script"]["actions"]["onWrapTaskRun"]
    hook["checkpointCancelation"] = {"mode": "NOTIFY_THEN_TERMINATE", "signalToNotify": "SIGHUP"}
    spec = parse_template(doc).action_spec("jobEnvironments[0].script.actions.onWrapTaskRun")
    assert spec.checkpoint_cancelation is not None
    assert spec.checkpoint_cancelation.signal_to_notify.name == "SIGHUP"
    hook["checkpointCancelation"]["signalToNotify"] = "SIGKILL"
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    assert any(
        p.startswith(
            "jobEnvironments[0].script.actions.onWrapTaskRun.checkpointCancelation.signalToNotify"
        )
        for p in info.value.problems
    ), info.value.problems
    doc["extensions"] = ["EXPR", "WRAP_ACTIONS"]
    del hook["checkpointCancelation"]
    with pytest.raises(TemplateError) as info:  # onCheckpointResume without CHECKPOINT
        parse_template(doc)
    assert "CHECKPOINT extension" in str(info.value)
