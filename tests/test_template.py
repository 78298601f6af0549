"""Tests of ``core.load_template`` / ``core.parse_template`` (the CHECKPOINT template rules)."""

from __future__ import annotations

import copy
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core import TemplateError, load_template
from core.job._template import parse_template

REPO = Path(__file__).resolve().parent.parent
FIBONACCI = REPO / "examples" / "fibonacci" / "fibonacci.yaml"

ONRUN = "steps[0].script.actions.onRun"
RESUME = "steps[0].script.actions.onCheckpointResume"

BASE: dict[str, Any] = {
    "specificationVersion": "jobtemplate-2023-09",
    "extensions": ["CHECKPOINT"],
    "name": "Small",
    "steps": [
        {
            "name": "Work",
            "script": {
                "actions": {
                    "onRun": {
                        "command": "python",
                        "args": ["{{Task.File.Run}}"],
                        "cancelation": {
                            "mode": "NOTIFY_THEN_TERMINATE",
                            "notifyPeriodInSeconds": 30,
                        },
                    }
                },
                "embeddedFiles": [{"name": "Run", "type": "TEXT", "data": "print('hi')\n"}],
            },
        }
    ],
}


def base(edit: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
    """A deep copy of BASE, changed by ``edit`` (which may return anything; it is ignored)."""
    doc = copy.deepcopy(BASE)
    if edit is not None:
        edit(doc)
    return doc


def _actions(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["steps"][0]["script"]["actions"]


def _onrun(doc: dict[str, Any]) -> dict[str, Any]:
    return _actions(doc)["onRun"]


def _no_ext(doc: dict[str, Any]) -> None:
    del doc["extensions"]


def _set_resume(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        _actions(doc)["onCheckpointResume"] = value

    return edit


def _set_ckpt_cancel(value: Any, *, ext: bool = True) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        if not ext:
            _no_ext(doc)
        _onrun(doc)["checkpointCancelation"] = value

    return edit


def _set_cancel(value: Any, *, ext: bool = True) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        if not ext:
            _no_ext(doc)
        _onrun(doc)["cancelation"] = value

    return edit


def _notify(**extra: Any) -> dict[str, Any]:
    return {"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 30, **extra}


def _job_env(action: str, body: dict[str, Any], *, ext: bool) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        if not ext:
            _no_ext(doc)
        doc["jobEnvironments"] = [
            {"name": "Env", "script": {"actions": {action: {"command": "true", **body}}}}
        ]

    return edit


def _step_env(action: str, body: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["steps"][0]["stepEnvironments"] = [
            {"name": "StepEnv", "script": {"actions": {action: {"command": "true", **body}}}}
        ]

    return edit


def _set_extensions(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["extensions"] = value

    return edit


NOT_DECLARED = "is part of the CHECKPOINT extension"
BAD_SIGNAL = "is not a POSIX signal that can notify a task"
TERMINATE_SIGNAL = "TERMINATE kills at once and takes no signalToNotify"
PERIOD = "must be between 1 and 600"
NO_VARIABLE = "does not exist at this location"

# (edit, exact dotted field path, a fragment of that problem's message)
INVALID = [
    pytest.param(
        lambda d: (_no_ext(d), _set_resume({"command": "python"})(d)),
        RESUME,
        NOT_DECLARED,
        id="onCheckpointResume-without-extension",
    ),
    pytest.param(
        _set_ckpt_cancel({"mode": "TERMINATE"}, ext=False),
        f"{ONRUN}.checkpointCancelation",
        NOT_DECLARED,
        id="checkpointCancelation-without-extension",
    ),
    pytest.param(
        _set_cancel(_notify(signalToNotify="SIGINT"), ext=False),
        f"{ONRUN}.cancelation.signalToNotify",
        NOT_DECLARED,
        id="signalToNotify-on-cancelation-without-extension",
    ),
    pytest.param(
        lambda d: (
            d.__setitem__("extensions", ["TASK_CHUNKING"]),
            _onrun(d)["cancelation"].__setitem__("signalToNotify", "SIGINT"),
        ),
        f"{ONRUN}.cancelation.signalToNotify",
        NOT_DECLARED,
        id="signalToNotify-with-other-extension-only",
    ),
    pytest.param(
        _set_cancel({"mode": "TERMINATE", "signalToNotify": "SIGINT"}),
        f"{ONRUN}.cancelation.signalToNotify",
        TERMINATE_SIGNAL,
        id="signalToNotify-with-TERMINATE-on-cancelation",
    ),
    pytest.param(
        _set_ckpt_cancel({"mode": "TERMINATE", "signalToNotify": "SIGUSR1"}),
        f"{ONRUN}.checkpointCancelation.signalToNotify",
        TERMINATE_SIGNAL,
        id="signalToNotify-with-TERMINATE-on-checkpointCancelation",
    ),
    pytest.param(
        _set_cancel({"mode": "TERMINATE", "signalToNotify": None}),
        f"{ONRUN}.cancelation.signalToNotify",
        TERMINATE_SIGNAL,
        id="signalToNotify-null-with-TERMINATE-on-cancelation",
    ),
    pytest.param(
        _set_cancel(_notify(signalToNotify=None)),
        f"{ONRUN}.cancelation.signalToNotify",
        BAD_SIGNAL,
        id="signalToNotify-null-on-cancelation",
    ),
    *[
        pytest.param(
            _set_cancel(_notify(signalToNotify=name)),
            f"{ONRUN}.cancelation.signalToNotify",
            BAD_SIGNAL,
            id=f"cancelation-signalToNotify-{name}",
        )
        for name in ("SIGFOO", 15, "SIGKILL", "SIGSTOP", "sigint", "INT")
    ],
    *[
        pytest.param(
            _set_ckpt_cancel(_notify(signalToNotify=name)),
            f"{ONRUN}.checkpointCancelation.signalToNotify",
            BAD_SIGNAL,
            id=f"checkpointCancelation-signalToNotify-{name}",
        )
        for name in ("SIGFOO", 15, "SIGKILL", "SIGSTOP", None)
    ],
    pytest.param(
        _set_ckpt_cancel({"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 0}),
        f"{ONRUN}.checkpointCancelation.notifyPeriodInSeconds",
        PERIOD,
        id="checkpointCancelation-period-0",
    ),
    pytest.param(
        _set_ckpt_cancel({"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 601}),
        f"{ONRUN}.checkpointCancelation.notifyPeriodInSeconds",
        PERIOD,
        id="checkpointCancelation-period-601",
    ),
    pytest.param(
        _set_ckpt_cancel({"mode": "KILL_POLITELY"}),
        f"{ONRUN}.checkpointCancelation.mode",
        "must be TERMINATE or NOTIFY_THEN_TERMINATE",
        id="checkpointCancelation-unknown-mode",
    ),
    pytest.param(
        _set_ckpt_cancel({"mode": "TERMINATE", "extra": 1}),
        f"{ONRUN}.checkpointCancelation.extra",
        "Extra inputs are not permitted",
        id="checkpointCancelation-unknown-key",
    ),
    pytest.param(
        _set_ckpt_cancel("NOTIFY_THEN_TERMINATE"),
        f"{ONRUN}.checkpointCancelation",
        "must be a mapping",
        id="checkpointCancelation-string",
    ),
    pytest.param(
        _set_ckpt_cancel(["TERMINATE"]),
        f"{ONRUN}.checkpointCancelation",
        "must be a mapping",
        id="checkpointCancelation-list",
    ),
    pytest.param(
        lambda d: _onrun(d)["args"].append("{{Task.Checkpoint.State}}"),
        f"{ONRUN}.args[1]",
        f"Task.Checkpoint.State {NO_VARIABLE}",
        id="Checkpoint.State-in-onRun-args",
    ),
    pytest.param(
        lambda d: d["steps"][0]["script"]["embeddedFiles"][0].__setitem__(
            "data", "path = '{{Task.Checkpoint.File}}'\n"
        ),
        "steps[0].script.embeddedFiles[0].data",
        f"Task.Checkpoint.File {NO_VARIABLE}",
        id="Checkpoint.File-in-embedded-file",
    ),
    pytest.param(
        _set_resume({"args": ["{{Task.Checkpoint.State}}"]}),
        f"{RESUME}.command",
        "Field required",
        id="onCheckpointResume-missing-command",
    ),
    pytest.param(
        _set_resume({"command": "python", "args": ["{{Task.File.Nope}}"]}),
        f"{RESUME}.args[0]",
        f"Task.File.Nope {NO_VARIABLE}",
        id="onCheckpointResume-unknown-file-reference",
    ),
    pytest.param(
        _set_resume({"command": "python", "retries": 3}),
        f"{RESUME}.retries",
        "Extra inputs are not permitted",
        id="onCheckpointResume-unknown-key",
    ),
    pytest.param(
        _set_resume("python resume.py"),
        RESUME,
        "valid dictionary",
        id="onCheckpointResume-not-a-mapping",
    ),
    pytest.param(
        _set_resume(
            {
                "command": "python",
                "checkpointCancelation": {
                    "mode": "NOTIFY_THEN_TERMINATE",
                    "notifyPeriodInSeconds": 0,
                },
            }
        ),
        f"{RESUME}.checkpointCancelation.notifyPeriodInSeconds",
        PERIOD,
        id="onCheckpointResume-checkpointCancelation-period-0",
    ),
    pytest.param(
        _set_extensions(["CHECKPOINT", "WRAP_ACTIONS"]),
        "extensions[1]",
        "'WRAP_ACTIONS' requires the EXPR extension",
        id="extension-WRAP_ACTIONS-without-EXPR",
    ),
    pytest.param(
        _set_extensions(["BOGUS", "CHECKPOINT"]),
        "extensions[0]",
        "'BOGUS' is not supported",
        id="extension-BOGUS",
    ),
    pytest.param(
        _set_extensions("CHECKPOINT"),
        "extensions",
        "must be a list",
        id="extensions-not-a-list",
    ),
    pytest.param(
        _set_extensions(["CHECKPOINT", "CHECKPOINT"]),
        "extensions[1]",
        "listed twice",
        id="extension-CHECKPOINT-twice",
    ),
    pytest.param(
        _job_env("onEnter", {"checkpointCancelation": {"mode": "TERMINATE"}}, ext=False),
        "jobEnvironments[0].script.actions.onEnter.checkpointCancelation",
        NOT_DECLARED,
        id="jobEnvironment-onEnter-checkpointCancelation-without-extension",
    ),
    pytest.param(
        _job_env(
            "onExit",
            {
                "checkpointCancelation": {
                    "mode": "NOTIFY_THEN_TERMINATE",
                    "notifyPeriodInSeconds": 601,
                }
            },
            ext=True,
        ),
        "jobEnvironments[0].script.actions.onExit.checkpointCancelation.notifyPeriodInSeconds",
        PERIOD,
        id="jobEnvironment-onExit-checkpointCancelation-period-601",
    ),
    pytest.param(
        _step_env("onExit", {"cancelation": _notify(signalToNotify="SIGKILL")}),
        "steps[0].stepEnvironments[0].script.actions.onExit.cancelation.signalToNotify",
        BAD_SIGNAL,
        id="stepEnvironment-onExit-signalToNotify-SIGKILL",
    ),
]


@pytest.mark.parametrize(("edit", "path", "fragment"), INVALID)
def test_invalid_checkpoint_template_is_refused_with_its_field_path(
    edit: Callable[[dict[str, Any]], object], path: str, fragment: str
) -> None:
    doc = base(edit)
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    err = info.value
    # The exact path: it is followed by ": " so a longer or shorter path does not match.
    matching = [p for p in err.problems if p.startswith(f"{path}: ")]
    assert matching, f"no problem names {path!r}: {err.problems}"
    assert f"{path}: " in str(err)
    assert any(fragment in p for p in matching), matching


def test_invalid_template_reports_the_source_it_was_given() -> None:
    with pytest.raises(TemplateError) as info:
        parse_template(base(_set_resume({"args": []})), source=Path("/tmp/x.yaml"))
    assert info.value.source == "/tmp/x.yaml"
    assert str(info.value).startswith("/tmp/x.yaml: ")


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(TemplateError) as info:
        parse_template(["not", "a", "template"])
    assert info.value.problems == ["<root>: a job template must be a mapping"]


def test_invalid_template_lists_every_problem() -> None:
    def edit(doc: dict[str, Any]) -> None:
        _no_ext(doc)
        _onrun(doc)["checkpointCancelation"] = {"mode": "TERMINATE"}
        _actions(doc)["onCheckpointResume"] = {"command": "python"}

    with pytest.raises(TemplateError) as info:
        parse_template(base(edit))
    paths = sorted(p.split(": ", 1)[0] for p in info.value.problems)
    assert paths == sorted([f"{ONRUN}.checkpointCancelation", RESUME])
    assert "2 problems" in str(info.value)


def test_the_input_document_is_not_changed() -> None:
    doc = base(
        lambda d: (
            _onrun(d)["cancelation"].__setitem__("signalToNotify", "SIGINT"),
            _onrun(d).__setitem__("checkpointCancelation", _notify(signalToNotify="SIGUSR1")),
            _set_resume({"command": "python", "args": ["{{Task.Checkpoint.State}}"]})(d),
        )
    )
    before = copy.deepcopy(doc)
    result = parse_template(doc)
    assert doc == before
    assert result.document == before


# --- the seed example --------------------------------------------------------------------------


def test_fibonacci_seed_template_is_accepted() -> None:
    tpl = load_template(FIBONACCI)
    assert tpl.name == "Fibonacci checkpointing job"
    assert tpl.extensions == frozenset({"CHECKPOINT"})
    assert tpl.source == FIBONACCI.resolve()
    assert set(tpl.resume_actions) == {"ResumableFibonacci"}
    assert tpl.is_resumable("ResumableFibonacci")
    resume = tpl.resume_actions["ResumableFibonacci"]
    assert "{{Task.Checkpoint.State}}" in [str(a) for a in resume.args or []]

    onrun = tpl.actions["steps[0].script.actions.onRun"]
    assert onrun.cancelation.mode == "TERMINATE"
    assert not onrun.cancelation.notifies
    ckpt = onrun.checkpoint_cancelation
    assert ckpt is not None
    assert ckpt.mode == "NOTIFY_THEN_TERMINATE"
    assert ckpt.signal_to_notify is signal.SIGUSR1
    assert ckpt.notify_period_seconds == 300

    resumed = tpl.actions["steps[0].script.actions.onCheckpointResume"].checkpoint_cancelation
    assert resumed is not None
    assert resumed.signal_to_notify is signal.SIGUSR1
    assert resumed.notify_period_seconds == 300


# --- valid cases -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["SIGINT", "SIGHUP", "SIGUSR2"])
def test_signalToNotify_on_cancelation_is_applied(name: str) -> None:
    tpl = parse_template(
        base(lambda d: _onrun(d)["cancelation"].__setitem__("signalToNotify", name))
    )
    spec = tpl.action_spec(ONRUN)
    assert spec.cancelation.mode == "NOTIFY_THEN_TERMINATE"
    assert spec.cancelation.signal_to_notify is signal.Signals[name]
    assert spec.cancelation.notify_period_seconds == 30
    assert spec.checkpoint_cancelation is None


def test_signalToNotify_defaults_to_SIGTERM() -> None:
    tpl = parse_template(base())
    assert tpl.action_spec(ONRUN).cancelation.signal_to_notify is signal.SIGTERM


def test_checkpointCancelation_default_period_and_signal() -> None:
    tpl = parse_template(base(_set_ckpt_cancel({"mode": "NOTIFY_THEN_TERMINATE"})))
    ckpt = tpl.action_spec(ONRUN).checkpoint_cancelation
    assert ckpt is not None
    assert ckpt.notify_period_seconds == 120
    assert ckpt.signal_to_notify is signal.SIGTERM


def test_checkpoint_references_inside_onCheckpointResume_are_accepted() -> None:
    resume = {
        "command": "python",
        "args": [
            "{{Task.File.Run}}",
            "--state",
            "{{Task.Checkpoint.State}}",
            "--file",
            "{{Task.Checkpoint.File}}",
        ],
        "checkpointCancelation": _notify(signalToNotify="SIGINT"),
    }
    tpl = parse_template(base(_set_resume(resume)))
    assert set(tpl.resume_actions) == {"Work"}
    args = [str(a) for a in tpl.resume_actions["Work"].args or []]
    assert args == resume["args"]
    spec = tpl.action_spec(RESUME)
    assert spec.checkpoint_cancelation is not None
    assert spec.checkpoint_cancelation.signal_to_notify is signal.SIGINT
    # The template model openjd-model built is onRun's, untouched by the resume action.
    onrun_args = tpl.template.steps[0].script.actions.onRun.args or []
    assert [str(a) for a in onrun_args] == ["{{Task.File.Run}}"]


def test_template_without_checkpoint_stays_valid() -> None:
    doc = base(_no_ext)
    tpl = parse_template(doc)
    assert tpl.extensions == frozenset()
    assert tpl.resume_actions == {}
    assert not tpl.is_resumable("Work")
    assert tpl.action_spec(ONRUN).checkpoint_cancelation is None
    assert "extensions" not in tpl.document


def test_checkpoint_with_other_extensions_keeps_them() -> None:
    tpl = parse_template(base(_set_extensions(["TASK_CHUNKING", "CHECKPOINT"])))
    assert tpl.extensions == frozenset({"TASK_CHUNKING", "CHECKPOINT"})
    assert tpl.template.extensions is not None
    assert [str(e.value if hasattr(e, "value") else e) for e in tpl.template.extensions] == [
        "TASK_CHUNKING"
    ]


def test_checkpointCancelation_on_environment_actions() -> None:
    tpl = parse_template(
        base(
            _job_env(
                "onEnter", {"checkpointCancelation": _notify(signalToNotify="SIGHUP")}, ext=True
            )
        )
    )
    spec = tpl.action_spec("jobEnvironments[0].script.actions.onEnter")
    assert spec.checkpoint_cancelation is not None
    assert spec.checkpoint_cancelation.signal_to_notify is signal.SIGHUP


# --- hashes ------------------------------------------------------------------------------------


def _two_steps() -> dict[str, Any]:
    doc = base()
    second = copy.deepcopy(doc["steps"][0])
    second["name"] = "Other"
    doc["steps"].append(second)
    return doc


def test_hashes_are_deterministic() -> None:
    a = parse_template(_two_steps())
    b = parse_template(_two_steps())
    assert a.template_hash == b.template_hash
    assert len(a.template_hash) == 64
    assert a.step_hashes == b.step_hashes
    assert set(a.step_hashes) == {"Work", "Other"}
    assert a.step_hashes["Work"] != a.step_hashes["Other"]


def test_template_hash_changes_with_a_step_script_and_only_that_step_hash() -> None:
    before = parse_template(_two_steps())
    changed = _two_steps()
    changed["steps"][1]["script"]["actions"]["onRun"]["args"].append("--fast")
    after = parse_template(changed)
    assert after.template_hash != before.template_hash
    differing = {n for n in before.step_hashes if before.step_hashes[n] != after.step_hashes[n]}
    assert differing == {"Other"}


def test_job_environment_change_changes_every_step_hash() -> None:
    before = parse_template(_two_steps())
    changed = _two_steps()
    _job_env("onEnter", {}, ext=True)(changed)
    after = parse_template(changed)
    assert all(before.step_hashes[n] != after.step_hashes[n] for n in before.step_hashes)


# --- load_template -----------------------------------------------------------------------------


def test_load_template_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(TemplateError) as info:
        load_template(missing)
    assert info.value.source == str(missing)
    assert str(missing) in str(info.value)
    assert "cannot read the template file" in str(info.value)


def test_load_template_invalid_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\nsteps: {\n", encoding="utf-8")
    with pytest.raises(TemplateError) as info:
        load_template(bad)
    assert info.value.source == str(bad)
    assert str(bad) in str(info.value)
    assert "not a valid YAML document" in str(info.value)


def test_load_template_invalid_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": ', encoding="utf-8")
    with pytest.raises(TemplateError) as info:
        load_template(bad)
    assert str(bad) in str(info.value)
    assert "not a valid JSON document" in str(info.value)


def test_load_template_invalid_template_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(base(_set_ckpt_cancel({"mode": "TERMINATE"}, ext=False))))
    with pytest.raises(TemplateError) as info:
        load_template(path)
    text = str(info.value)
    assert text.startswith(f"{path.resolve()}: ")
    assert f"{ONRUN}.checkpointCancelation: " in text


def test_load_template_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(base()), encoding="utf-8")
    tpl = load_template(str(path))
    assert tpl.source == path.resolve()
    assert tpl.document == base()


def test_load_template_validates_a_content_once_and_sees_every_change(tmp_path: Path) -> None:
    # GIVEN a template file loaded once
    path = tmp_path / "t.json"
    path.write_text(json.dumps(base()), encoding="utf-8")
    first = load_template(path)
    # WHEN it is loaded again unchanged (by another spelling of its path), then changed
    again = load_template(tmp_path / "." / "t.json")
    changed_doc = base()
    changed_doc["name"] = "changed"
    path.write_text(json.dumps(changed_doc), encoding="utf-8")
    changed = load_template(path)
    # THEN the unchanged content is the template validated before; the change is read
    assert again is first
    assert changed.name == "changed" and changed.template_hash != first.template_hash
    # AND a content made invalid is refused, not served from what was validated before
    path.write_text(json.dumps(base(_set_ckpt_cancel({"mode": "TERMINATE"}, ext=False))))
    with pytest.raises(TemplateError):
        load_template(path)
    path.write_text(json.dumps(base()), encoding="utf-8")
    assert load_template(path) is first


@pytest.mark.parametrize("where", ["steps", "finally"])
def test_dependency_cycle_is_refused_not_a_crash(where: str) -> None:
    # GIVEN two steps that depend on each other (openjd-model 0.14's error formatter crashes
    # with IndexError on this template-wide error), among the regular or the finally steps
    def step(name: str, other: str) -> dict[str, Any]:
        return {
            "name": name,
            "dependencies": [{"dependsOn": other}],
            "script": {"actions": {"onRun": {"command": "echo"}}},
        }

    doc: dict[str, Any] = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "cycle",
        "steps": [{"name": "S", "script": {"actions": {"onRun": {"command": "echo"}}}}],
    }
    if where == "steps":
        doc["steps"] += [step("A", "B"), step("B", "A")]
    else:
        doc["extensions"] = ["FINALLY"]
        doc["finally"] = [step("A", "B"), step("B", "A")]
    # THEN it is refused as a template error that names the cycle
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    assert any("Step dependencies form a cycle: A -> B -> A" in p for p in info.value.problems)
