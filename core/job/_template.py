"""Load and validate job templates that use the proposed CHECKPOINT extension.

Implements the template side of the CHECKPOINT RFC idea (``shared/seeds/000_…``, sections
"The onCheckpointResume action" and "The checkpointCancelation property"):

- ``onCheckpointResume`` in ``<StepActions>``, with the same ``<Action>`` schema as ``onRun``;
- ``checkpointCancelation`` on an ``<Action>``, with the same shape as ``cancelation``;
- ``signalToNotify`` on ``NOTIFY_THEN_TERMINATE`` for both (a POSIX signal name, default
  ``SIGTERM``; refused with ``TERMINATE``);
- the value references ``Task.Checkpoint.State`` and ``Task.Checkpoint.File``, valid only
  inside ``onCheckpointResume``.

openjd-model 0.14 has no extension hooks: its models are frozen with ``extra="forbid"`` and the
extension list is a closed enum. So the CHECKPOINT parts are taken out of the document, the
rest is validated by openjd-model unchanged, the removed cancelation methods are validated by
openjd-model's own ``Action`` model plus our ``signalToNotify`` check, and ``onCheckpointResume``
is validated by putting it in place of ``onRun`` in a copy of the template (with
``Task.Checkpoint.*`` swapped for a reference that exists there), so it gets exactly onRun's
checks, and relabelling the errors.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import signal
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
from openjd.model import (
    DecodeValidationError,
    JobTemplate,
    decode_job_template,
    parse_model,
)
from openjd.model.v2023_09 import Action

from core._errors import TemplateError
from core._hashing import canonical_json, sha256_hex
from core.job._inputs import int64_problems, integer_digits_limit, load_document, read_input_file

__all__ = (
    "CHECKPOINT_EXTENSION",
    "MODEL_EXTENSIONS",
    "SUPPORTED_EXTENSIONS",
    "CancelMethod",
    "CheckpointJobTemplate",
    "load_template",
    "parse_template",
)

CHECKPOINT_EXTENSION = "CHECKPOINT"
"""The name a template lists in ``extensions`` to use what this module adds."""

FINALLY_EXTENSION = "FINALLY"
"""The name a template lists in ``extensions`` to declare a top-level ``finally:`` list of steps
(ours, after Tekton's finally tasks: seed 002)."""

JOB_STATUS_PARAMETER = "OpenJDCheckpointJobStatus"
"""``{{Job.Status}}`` in a finally step is carried as this hidden job parameter, so openjd-model
validates and resolves it like any value reference."""

SUPPORTED_EXTENSIONS = frozenset(
    {
        "TASK_CHUNKING",
        "REDACTED_ENV_VARS",
        "FEATURE_BUNDLE_1",
        "EXPR",
        "WRAP_ACTIONS",
        CHECKPOINT_EXTENSION,
        FINALLY_EXTENSION,
    }
)
"""Extensions the runner implements. All but CHECKPOINT and FINALLY are openjd-model's own
(validated by it, evaluated with ``openjd.expr``); see docs/decisions.md, "Extensions"."""

MODEL_EXTENSIONS = frozenset(
    {"TASK_CHUNKING", "REDACTED_ENV_VARS", "FEATURE_BUNDLE_1", "EXPR", "WRAP_ACTIONS"}
)
"""The extensions openjd-model 0.14 validates, which external environment templates may use."""

NOTIFY_SIGNALS = frozenset(
    {
        "SIGTERM",
        "SIGINT",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGWINCH",
        "SIGCONT",
        "SIGPWR",
        "SIGXCPU",
    }
)
"""Signal names ``signalToNotify`` takes. SIGKILL and SIGSTOP cannot be caught, so they cannot
notify anything, and are refused. See docs/decisions.md for the Windows mapping."""

WRAP_NEEDS_EXPR = (
    "extension 'WRAP_ACTIONS' requires the EXPR extension (RFC 0008): list EXPR in 'extensions' too"
)

DEFAULT_NOTIFY_PERIOD_SECONDS = 120
"""The OpenJD 2023-09 default ``notifyPeriodInSeconds`` of NOTIFY_THEN_TERMINATE."""

_JOB_STATUS_REF = re.compile(r"\bJob\.Status(?![A-Za-z0-9_])")
_STEP_INDEX = re.compile(r"\bsteps\[(\d+)\]")
_CHECKPOINT_REF = re.compile(r"Task\.Checkpoint\.(State|File)(?![A-Za-z0-9_])")
_ACTION_NAMES = (
    "onRun",
    "onCheckpointResume",
    "onEnter",
    "onExit",
    "onWrapEnvEnter",
    "onWrapTaskRun",
    "onWrapEnvExit",
)


@dataclass(frozen=True)
class CancelMethod:
    """How to stop a running action (OpenJD ``<CancelationMethod>`` plus ``signalToNotify``).

    Attributes:
        mode: ``"TERMINATE"`` (kill the process tree at once) or ``"NOTIFY_THEN_TERMINATE"``.
        notify_period_seconds: seconds between the notify signal and the kill (NOTIFY only).
        signal_to_notify: the POSIX signal sent to the action's process group first.
    """

    mode: str = "TERMINATE"
    notify_period_seconds: float = 0.0
    signal_to_notify: signal.Signals = signal.SIGTERM
    notify_period_text: str | None = None
    """A format-string ``notifyPeriodInSeconds`` (FEATURE_BUNDLE_1), resolved when used."""

    @property
    def notifies(self) -> bool:
        return self.mode == "NOTIFY_THEN_TERMINATE"


@dataclass(frozen=True)
class ActionCheckpointSpec:
    """The CHECKPOINT parts of one ``<Action>`` of the template.

    Attributes:
        cancelation: the action's ``cancelation`` with its ``signalToNotify`` applied.
        checkpoint_cancelation: the action's ``checkpointCancelation``, or None if absent.
    """

    cancelation: CancelMethod
    checkpoint_cancelation: CancelMethod | None


@dataclass(frozen=True)
class CheckpointJobTemplate:
    """A validated job template, with what CHECKPOINT adds kept beside openjd-model's model.

    Attributes:
        template: the openjd-model ``JobTemplate`` of the document with the CHECKPOINT parts
            taken out; use it for job creation, parameter spaces and environments.
        document: the template document as it was loaded (a plain dict).
        source: where it was loaded from, or None.
        extensions: the extension names the template declares.
        resume_actions: step name -> the parsed ``onCheckpointResume`` ``Action`` (openjd-model
            ``Action``, its format strings may reference ``Task.Checkpoint.State``/``File``).
        actions: dotted action path (``steps[0].script.actions.onRun``,
            ``jobEnvironments[1].script.actions.onEnter``,
            ``steps[0].stepEnvironments[0].script.actions.onExit``) -> its CHECKPOINT parts.
        template_hash: sha256 (hex) of the canonical JSON of the whole document.
        step_hashes: step name -> sha256 of what decides the step's behaviour (the step, the
            job environments and the template's extensions).
    """

    template: JobTemplate
    document: dict[str, Any]
    source: Path | None
    extensions: frozenset[str]
    resume_actions: dict[str, Action] = field(default_factory=dict)
    actions: dict[str, ActionCheckpointSpec] = field(default_factory=dict)
    template_hash: str = ""
    step_hashes: dict[str, str] = field(default_factory=dict)
    finally_steps: tuple[str, ...] = ()
    regular_steps: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.document.get("name", ""))

    def step_index(self, step_name: str) -> int:
        """Index of a step in the job's combined step list (regular steps, then finally)."""
        names = self.regular_steps + self.finally_steps
        if step_name in names:
            return names.index(step_name)
        raise KeyError(step_name)

    def is_finally(self, step_name: str) -> bool:
        return step_name in self.finally_steps

    def dependencies(self, step_name: str) -> list[str]:
        """The steps ``step_name`` depends on (its ``dependencies``), as the template lists them.

        The job's step graph has this one source: ``PreparedJob.dependencies`` and
        ``step_order`` read it, and so do the adapters that build a graph before any job exists.

        Raises:
            KeyError: no such step.
        """
        for step in self.template.steps:
            if step.name == step_name:
                return [d.dependsOn for d in (step.dependencies or [])]
        raise KeyError(step_name)

    def step_order(self) -> list[str]:
        """Step names (regular, then finally) in an order that respects ``dependencies``
        (template order otherwise)."""
        names = [s.name for s in self.template.steps]
        deps = {name: self.dependencies(name) for name in names}
        done: list[str] = []
        remaining = list(names)
        while remaining:
            for name in remaining:
                if all(d in done for d in deps[name]):
                    done.append(name)
                    remaining.remove(name)
                    break
            else:  # pragma: no cover - openjd-model refuses cycles
                raise TemplateError([f"steps: dependency cycle among {remaining}"])
        return done

    def step_path(self, step_name: str) -> str:
        """The step's field path in the template: ``steps[i]`` or ``finally[j]``."""
        i = self.step_index(step_name)
        n = len(self.regular_steps)
        return f"steps[{i}]" if i < n else f"finally[{i - n}]"

    def action_spec(self, path: str) -> ActionCheckpointSpec:
        """The CHECKPOINT parts of the action at ``path`` (TERMINATE defaults if none)."""
        return self.actions.get(path, ActionCheckpointSpec(CancelMethod(), None))

    def is_resumable(self, step_name: str) -> bool:
        return step_name in self.resume_actions

    def saves_of(self, step_name: str) -> Literal["ignored", "unused", "resumed"]:
        """What becomes of the saves of the step's tasks (docs/decisions.md, "A template that
        does not declare CHECKPOINT stores none of its saves"): ``ignored`` without the
        CHECKPOINT extension, ``unused`` (stored, but no resume runs from them) in a step
        without ``onCheckpointResume``, else ``resumed``."""
        if "CHECKPOINT" not in self.extensions:
            return "ignored"
        return "resumed" if self.is_resumable(step_name) else "unused"


def load_template(path: str | Path) -> CheckpointJobTemplate:
    """Read a YAML or JSON job template file and validate it.

    Args:
        path: the template file (``.json`` is read as JSON, anything else as YAML).

    The file is read on every call; a content already validated in this process (the same
    file, the same text, the same integer digits limit) returns the same object as before,
    without validating it again (the ``LOADED_TEMPLATES_KEPT`` most recent): treat it as
    read-only.

    Returns:
        CheckpointJobTemplate

    Raises:
        TemplateError: the file cannot be read or parsed, or the template is invalid; every
            problem names its field path.
    """
    p = Path(path)
    text = read_input_file(p, "template file")
    source = p.resolve()
    key = (str(source), text, integer_digits_limit())
    with _LOADED_LOCK:
        cached = _LOADED.get(key)
        if cached is not None:
            _LOADED.move_to_end(key)
            return cached
    document = load_document(text, json_format=p.suffix.lower() == ".json", source=p)
    template = parse_template(document, source=source)
    with _LOADED_LOCK:
        _LOADED[key] = template
        while len(_LOADED) > LOADED_TEMPLATES_KEPT:
            _LOADED.popitem(last=False)
    return template


LOADED_TEMPLATES_KEPT = 8
"""How many validated templates ``load_template`` keeps per process, by file and content: an
Airflow task process validates its template when it parses the DAG file and again when its
operator rebuilds the run's job (``prepare_run_job``); a Prefect flow run on every run."""

_LOADED: OrderedDict[tuple[str, str, int], CheckpointJobTemplate] = OrderedDict()
_LOADED_LOCK = threading.Lock()


def parse_template(document: Any, *, source: Path | None = None) -> CheckpointJobTemplate:
    """Validate a template document (already decoded to a dict).

    Implements: CHECKPOINT RFC idea (seed 000), all template-side rules; the OpenJD 2023-09
    Template Schemas through openjd-model.

    Raises:
        TemplateError: with one problem per finding, each ``<field path>: <message>``.
    """
    where = str(source) if source else None
    if not isinstance(document, dict):
        raise TemplateError(["<root>: a job template must be a mapping"], source=where)
    try:
        return _parse_template(document, source=source)
    except RecursionError:
        raise TemplateError(
            ["<root>: the document is nested too deeply to be a job template"], source=where
        ) from None
    except OverflowError as exc:  # openjd-model 0.14 on a range endpoint past int64 (EXPR)
        raise TemplateError([f"<root>: a number is out of range: {exc}"], source=where) from None


def _parse_template(document: dict[str, Any], *, source: Path | None) -> CheckpointJobTemplate:
    where = str(source) if source else None
    original = copy.deepcopy(document)
    doc = copy.deepcopy(document)

    raw_ext = doc.get("extensions")
    extensions: list[str] = []
    problems: list[str] = []
    if raw_ext is not None:
        if not isinstance(raw_ext, list) or not all(isinstance(e, str) for e in raw_ext):
            problems.append("extensions: must be a list of extension names")
        else:
            extensions = list(raw_ext)
    for i, name in enumerate(extensions):
        if name in extensions[:i]:
            problems.append(f"extensions[{i}]: extension '{name}' is listed twice")
        elif name not in SUPPORTED_EXTENSIONS:
            problems.append(
                f"extensions[{i}]: extension '{name}' is not supported by openjd-checkpoint "
                f"(supported: {', '.join(sorted(SUPPORTED_EXTENSIONS))})"
            )
    if "WRAP_ACTIONS" in extensions and "EXPR" not in extensions:
        i = extensions.index("WRAP_ACTIONS")
        problems.append(f"extensions[{i}]: {WRAP_NEEDS_EXPR}")
    if problems:
        raise TemplateError(problems, source=where)
    has_checkpoint = CHECKPOINT_EXTENSION in extensions
    ours = (CHECKPOINT_EXTENSION, FINALLY_EXTENSION)
    model_ext = [e for e in extensions if e not in ours]
    if raw_ext is not None:
        if model_ext:
            doc["extensions"] = model_ext
        else:
            del doc["extensions"]
    regular: list[Any] = doc["steps"] if isinstance(doc.get("steps"), list) else []
    n_regular = len(regular)
    finally_names = _merge_finally(doc, FINALLY_EXTENSION in extensions, problems)
    if problems:
        raise TemplateError(problems, source=where)
    try:
        result = _parse_merged(doc, original, source, extensions, model_ext, has_checkpoint)
    except TemplateError as exc:
        raise TemplateError([_relabel(p, n_regular) for p in exc.problems], source=where) from None
    return dataclasses.replace(
        result,
        finally_steps=tuple(finally_names),
        regular_steps=tuple(str(s.get("name")) for s in regular if isinstance(s, dict)),
    )


def _relabel(problem: str, n_regular: int) -> str:
    """Name finally steps as the author wrote them (``finally[j]``) and ``Job.Status`` as such."""

    def sub(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return f"steps[{k}]" if k < n_regular else f"finally[{k - n_regular}]"

    return _STEP_INDEX.sub(sub, problem).replace(f"Param.{JOB_STATUS_PARAMETER}", "Job.Status")


def _merge_finally(doc: dict[str, Any], declared: bool, problems: list[str]) -> list[str]:
    """Append the ``finally:`` steps to ``steps`` (to validate and create them with
    openjd-model), checking what openjd-model cannot: the extension is declared, names are
    unique across both lists, and no dependency crosses between the lists."""
    if "finally" not in doc:
        return []
    raw = doc.pop("finally")
    if not declared:
        problems.append(
            "finally: is part of the FINALLY extension, which the template does not declare "
            "in 'extensions'"
        )
        return []
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        problems.append("finally: must be a non-empty list of steps")
        return []
    steps: list[Any] = doc["steps"] if isinstance(doc.get("steps"), list) else []
    regular_names = {s.get("name") for s in steps if isinstance(s, dict)}
    finally_names = [s.get("name") for s in raw]
    for j, name in enumerate(finally_names):
        if name in regular_names or name in finally_names[:j]:
            problems.append(
                f"finally[{j}].name: step name {name!r} is already used; step names must be "
                "unique across steps and finally"
            )
        for k, dep in enumerate(raw[j].get("dependencies") or []):
            target = dep.get("dependsOn") if isinstance(dep, dict) else None
            if target in regular_names:
                problems.append(
                    f"finally[{j}].dependencies[{k}].dependsOn: a finally step may depend only "
                    f"on other finally steps, not on {target!r}"
                )
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        for k, dep in enumerate(step.get("dependencies") or []):
            target = dep.get("dependsOn") if isinstance(dep, dict) else None
            if target in finally_names:
                problems.append(
                    f"steps[{i}].dependencies[{k}].dependsOn: a step cannot depend on the "
                    f"finally step {target!r}"
                )
    if problems:
        return []
    swapped = [_swap_job_status(s) for s in raw]
    doc["steps"] = list(steps) + swapped
    params = doc.setdefault("parameterDefinitions", [])
    if isinstance(params, list):
        params.append(
            {
                "name": JOB_STATUS_PARAMETER,
                "type": "STRING",
                "default": "Unknown",
                "description": "The run's outcome so far, for finally steps ({{Job.Status}}).",
            }
        )
    return [str(n) for n in finally_names]


def _swap_job_status(value: Any) -> Any:
    if isinstance(value, str):
        return _JOB_STATUS_REF.sub(f"Param.{JOB_STATUS_PARAMETER}", value)
    if isinstance(value, list):
        return [_swap_job_status(v) for v in value]
    if isinstance(value, dict):
        return {k: _swap_job_status(v) for k, v in value.items()}
    return value


def _parse_merged(
    doc: dict[str, Any],
    original: dict[str, Any],
    source: Path | None,
    extensions: list[str],
    model_ext: list[str],
    has_checkpoint: bool,
) -> CheckpointJobTemplate:
    where = str(source) if source else None
    problems: list[str] = []

    # 1. Take the CHECKPOINT parts out of the document, remembering where they were.
    resume_raw: dict[int, Any] = {}
    removed: dict[str, dict[str, Any]] = {}
    for path, action in _iter_actions(doc):
        parts: dict[str, Any] = {}
        if isinstance(action, dict):
            if "checkpointCancelation" in action:
                parts["checkpointCancelation"] = action.pop("checkpointCancelation")
            cancel = action.get("cancelation")
            if isinstance(cancel, dict) and "signalToNotify" in cancel:
                parts["signalToNotify"] = cancel.pop("signalToNotify")
            if isinstance(cancel, dict):
                parts["cancelation"] = copy.deepcopy(cancel)
        removed[path] = parts
        if not has_checkpoint:
            for key in ("checkpointCancelation", "signalToNotify"):
                if key in parts:
                    sub = ".cancelation" if key == "signalToNotify" else ""
                    problems.append(
                        f"{path}{sub}.{key}: is part of the CHECKPOINT extension, which the "
                        "template does not declare in 'extensions'"
                    )
    for i, step in enumerate(doc.get("steps") or []):
        actions = _get(step, "script", "actions")
        if isinstance(actions, dict) and "onCheckpointResume" in actions:
            resume_raw[i] = actions.pop("onCheckpointResume")
            if not has_checkpoint:
                problems.append(
                    f"steps[{i}].script.actions.onCheckpointResume: is part of the CHECKPOINT "
                    "extension, which the template does not declare in 'extensions'"
                )
    if problems:
        raise TemplateError(problems, source=where)

    # INT values past int64, which openjd-model takes as Python integers (or fails on with a
    # message about C types).
    problems.extend(int64_problems(doc))
    if problems:
        raise TemplateError(problems, source=where)

    # 2. openjd-model validates the rest (and refuses Task.Checkpoint.* outside the resume action).
    try:
        template = _decode_job_template(doc, model_ext)
    except DecodeValidationError as exc:
        raise TemplateError(_model_problems(str(exc)), source=where) from None

    # 3. The removed cancelation methods.
    action_specs: dict[str, ActionCheckpointSpec] = {}
    for path, parts in removed.items():
        spec = _validate_action_parts(path, parts, problems, model_ext)
        if spec is not None:
            action_specs[path] = spec

    # 4. onCheckpointResume: onRun's checks, in a copy where it stands in place of onRun.
    resume_actions: dict[str, Action] = {}
    for i, raw in resume_raw.items():
        step_name = str(doc["steps"][i]["name"])
        rpath = f"steps[{i}].script.actions.onCheckpointResume"
        trial = copy.deepcopy(doc)
        stand_ins = _checkpoint_stand_ins("EXPR" in model_ext)
        trial["steps"][i]["script"]["actions"]["onRun"] = _swap_checkpoint_refs(raw, stand_ins)
        try:
            _decode_job_template(trial, model_ext)
        except DecodeValidationError as exc:
            written = json.dumps(raw)
            for msg in _model_problems(str(exc)):
                msg = msg.replace(f"steps[{i}].script.actions.onRun", rpath)
                for name, stand_in in stand_ins.items():
                    if stand_in not in written:  # say what the user wrote, not the stand-in
                        msg = msg.replace(stand_in, f"Task.Checkpoint.{name}")
                problems.append(msg)
            continue
        try:
            resume_actions[step_name] = parse_model(
                model=Action, obj=raw, supported_extensions=model_ext
            )
        except DecodeValidationError as exc:  # pragma: no cover - the trial above catches it
            problems.extend(f"{rpath}: {m}" for m in _model_problems(str(exc)))
    if problems:
        raise TemplateError(problems, source=where)

    return CheckpointJobTemplate(
        template=template,
        document=original,
        source=source,
        extensions=frozenset(extensions),
        resume_actions=resume_actions,
        actions=action_specs,
        template_hash=sha256_hex(canonical_json(original)),
        step_hashes=_step_hashes(original),
    )  # finally_steps and regular_steps are filled in by parse_template


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _iter_actions(doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield (dotted path, action dict) for every ``<Action>`` of a template document."""

    def env_actions(prefix: str, envs: Any) -> Iterator[tuple[str, Any]]:
        if not isinstance(envs, list):
            return
        for j, env in enumerate(envs):
            acts = _get(env, "script", "actions")
            if isinstance(acts, dict):
                for name in _ACTION_NAMES:
                    if name in acts:
                        yield f"{prefix}[{j}].script.actions.{name}", acts[name]

    yield from env_actions("jobEnvironments", doc.get("jobEnvironments"))
    steps = doc.get("steps")
    if not isinstance(steps, list):
        return
    for i, step in enumerate(steps):
        acts = _get(step, "script", "actions")
        if isinstance(acts, dict):
            for name in ("onRun", "onCheckpointResume"):
                if name in acts:
                    yield f"steps[{i}].script.actions.{name}", acts[name]
        if isinstance(step, dict):
            yield from env_actions(f"steps[{i}].stepEnvironments", step.get("stepEnvironments"))


def _checkpoint_stand_ins(expr: bool) -> dict[str, str]:
    """For each ``Task.Checkpoint.X``, a reference of the same type that exists wherever onRun
    is evaluated, so that openjd-model checks onCheckpointResume with onRun's rules: the state
    is a string (``Job.Name`` with EXPR, which types expressions; any reference without it),
    the file a path (``Session.PathMappingRulesFile``). openjd-model 0.14 has no way to
    declare a symbol of our own for validation."""
    return {
        "State": "Job.Name" if expr else "Session.WorkingDirectory",
        "File": "Session.PathMappingRulesFile",
    }


def _swap_checkpoint_refs(value: Any, stand_ins: dict[str, str]) -> Any:
    """Replace each ``Task.Checkpoint.X`` by its stand-in (``_checkpoint_stand_ins``).

    The regex matches whole names only, so a misspelling (``Task.Checkpoint.StateX``) is left
    in place and reported by openjd-model under its own name."""
    if isinstance(value, str):
        return _CHECKPOINT_REF.sub(lambda m: stand_ins[m.group(1)], value)
    if isinstance(value, list):
        return [_swap_checkpoint_refs(v, stand_ins) for v in value]
    if isinstance(value, dict):
        return {k: _swap_checkpoint_refs(v, stand_ins) for k, v in value.items()}
    return value


def _decode_job_template(doc: dict[str, Any], model_ext: list[str]) -> JobTemplate:
    """``decode_job_template``, with openjd-model 0.14's crash on template-wide errors turned
    into the refusal it meant.

    openjd-model formats each pydantic error by its location, and a check of the whole template
    (``Step dependencies form a cycle: A -> B -> A``) has none: its formatter raises IndexError
    while handling the ValidationError. That ValidationError is the refusal, so it is reported
    here as a DecodeValidationError, each error under its location (none for template-wide).
    """
    try:
        return decode_job_template(template=doc, supported_extensions=model_ext)
    except IndexError as exc:
        cause = exc.__context__
        if not isinstance(cause, pydantic.ValidationError):
            raise
        lines = []
        for err in cause.errors():
            loc = " -> ".join(str(x) for x in err.get("loc", ()))
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"{loc}:\n\t{msg}" if loc else f"\t{msg}")
        raise DecodeValidationError("\n".join(lines)) from None


def _model_problems(text: str) -> list[str]:
    """Turn openjd-model's ``a -> b -> c:\\n\\tmessage`` report into ``a.b.c: message`` lines."""
    lines = text.splitlines()
    out: list[str] = []
    current: str | None = None
    for line in lines[1:] if lines and "validation error" in lines[0] else lines:
        if not line.strip():
            continue
        if not line.startswith(("\t", " ")) and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1].replace(" -> ", ".")
            current = re.sub(r"\.notify_then_terminate|\.terminate(?=\.|$)", "", current)
            continue
        if line.startswith("  ") and out and out[-1].startswith(f"{current}: "):
            # An EXPR error's own lines (the expression, then a caret under the fault): part
            # of the message above, kept aligned, not problems of their own.
            out[-1] += "\n      " + line[2:].rstrip()
            continue
        msg = line.strip()
        out.append(f"{current}: {msg}" if current else msg)
    return out or [text]


def _validate_action_parts(
    path: str, parts: dict[str, Any], problems: list[str], model_ext: list[str]
) -> ActionCheckpointSpec | None:
    cancel_raw = parts.get("cancelation")
    signal_name = parts.get("signalToNotify")
    ok = True
    cancelation = _cancel_method(
        cancel_raw,
        signal_name,
        f"{path}.cancelation",
        problems,
        signal_given="signalToNotify" in parts,
    )
    if cancelation is None:
        ok = False
    ckpt: CancelMethod | None = None
    ckpt_raw = parts.get("checkpointCancelation")
    if ckpt_raw is not None or "checkpointCancelation" in parts:
        cpath = f"{path}.checkpointCancelation"
        if not isinstance(ckpt_raw, dict):
            problems.append(f"{cpath}: must be a mapping with 'mode'")
            return None
        ckpt_raw = dict(ckpt_raw)
        if ckpt_raw.get("mode") not in ("TERMINATE", "NOTIFY_THEN_TERMINATE"):
            problems.append(
                f"{cpath}.mode: must be TERMINATE or NOTIFY_THEN_TERMINATE, "
                f"got {ckpt_raw.get('mode')!r}"
            )
            return None
        ck_signal = ckpt_raw.pop("signalToNotify", None)
        has_signal = "signalToNotify" in parts["checkpointCancelation"]
        try:
            parse_model(
                model=Action,
                obj={"command": "x", "cancelation": ckpt_raw},
                supported_extensions=model_ext,
            )
        except DecodeValidationError as exc:
            for msg in _model_problems(str(exc)):
                problems.append(
                    msg.replace("Action.cancelation", cpath).replace("cancelation", cpath, 1)
                    if msg.startswith(("cancelation", "Action"))
                    else f"{cpath}: {msg}"
                )
            return None
        ckpt = _cancel_method(
            ckpt_raw, ck_signal if has_signal else None, cpath, problems, signal_given=has_signal
        )
        if ckpt is None:
            ok = False
    if not ok or cancelation is None:
        return None
    return ActionCheckpointSpec(cancelation=cancelation, checkpoint_cancelation=ckpt)


def _cancel_method(
    raw: Any,
    signal_name: Any,
    path: str,
    problems: list[str],
    *,
    signal_given: bool | None = None,
) -> CancelMethod | None:
    if signal_given is None:
        signal_given = signal_name is not None
    if not isinstance(raw, dict):
        if signal_given:
            problems.append(f"{path}.signalToNotify: needs a cancelation with a mode")
            return None
        return CancelMethod()
    mode = raw.get("mode")
    if mode == "TERMINATE":
        if signal_given:
            problems.append(
                f"{path}.signalToNotify: only NOTIFY_THEN_TERMINATE notifies; TERMINATE kills at "
                "once and takes no signalToNotify"
            )
            return None
        return CancelMethod()
    period = raw.get("notifyPeriodInSeconds", DEFAULT_NOTIFY_PERIOD_SECONDS)
    period_text: str | None = None
    try:
        period_f = float(period)
    except (TypeError, ValueError):
        # A format string (FEATURE_BUNDLE_1): resolved when the task is stopped.
        period_f = float(DEFAULT_NOTIFY_PERIOD_SECONDS)
        period_text = str(period)
    sig = signal.SIGTERM
    if signal_given:
        if not isinstance(signal_name, str) or signal_name not in NOTIFY_SIGNALS:
            problems.append(
                f"{path}.signalToNotify: {signal_name!r} is not a POSIX signal that can notify a "
                f"task; use one of {', '.join(sorted(NOTIFY_SIGNALS))}"
            )
            return None
        sig = signal.Signals[signal_name]
    return CancelMethod(
        mode="NOTIFY_THEN_TERMINATE",
        notify_period_seconds=period_f,
        signal_to_notify=sig,
        notify_period_text=period_text,
    )


def _step_hashes(document: dict[str, Any]) -> dict[str, str]:
    common = {
        "specificationVersion": document.get("specificationVersion"),
        "extensions": document.get("extensions"),
        "jobEnvironments": document.get("jobEnvironments"),
    }
    out: dict[str, str] = {}
    steps = [s for key in ("steps", "finally") for s in (document.get(key) or [])]
    for step in steps:
        if isinstance(step, dict) and "name" in step:
            out[str(step["name"])] = sha256_hex(canonical_json({"common": common, "step": step}))
    return out
