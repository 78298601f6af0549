"""What job creation refuses that openjd-model 0.14 lets through (docs/decisions.md, "Inputs").

``prepare_job`` (``core.job._job``) runs these checks around openjd-model's own, so that every
adapter refuses, before it plans anything, what no run could take: a job parameter definition
that widens an earlier template's constraints (Template Schemas 1.2.1), INT values that are not
base-10 int64 integers, list values not written as JSON lists, values no command line can carry
(a NUL byte, a non-finite FLOAT, longer than one argument), LIST[PATH] elements that break the
PATH rules, and a step of more than ``MAX_TASKS_PER_STEP`` tasks. It also normalizes the given
PATH values and keeps openjd-model's refusal lines to what is true.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from openjd.model import (
    EnvironmentTemplate,
    Job,
    JobParameterValues,
    ParameterValue,
    ParameterValueType,
    StepParameterSpaceIterator,
)

from core._errors import TemplateError
from core.job._inputs import decode_json
from core.job._template import CheckpointJobTemplate

__all__ = (
    "MAX_TASKS_PER_STEP",
    "int_value_problems",
    "join_list_paths",
    "list_value_problems",
    "long_int_problems",
    "normalize_given_paths",
    "task_count_problems",
    "true_missing",
    "value_problems",
    "widening_problems",
)

_INT64 = (-(2**63), 2**63 - 1)
"""OpenJD INT values are 64-bit (Template Schemas 2.3); openjd-model 0.14 does not check it."""
_INT_TEXT = re.compile(r"[-+]?[0-9]+")
"""How an INT value is written (Template Schemas 2.3: a base-10 integer)."""

MAX_TASKS_PER_STEP = 1_000_000
"""The most tasks (chunks, for a chunked step) a step's parameter space may define, and the most
frames a CHUNK[INT] parameter may hold. Planning a step builds every task it runs (about 20 s and
0.7 GB for a million), so a larger space is refused when the job is prepared
(docs/decisions.md, "Inputs")."""


_NARROWED: tuple[tuple[str, Any, str], ...] = (
    # (constraint, whether a later value is no looser than the earlier one, in words)
    ("minValue", lambda later, earlier: later >= earlier, "at least"),
    ("maxValue", lambda later, earlier: later <= earlier, "at most"),
    ("minLength", lambda later, earlier: later >= earlier, "at least"),
    ("maxLength", lambda later, earlier: later <= earlier, "at most"),
)


def _constraint_value(value: Any) -> Any:
    """A constraint's value, comparable across definitions (INT and FLOAT bounds as Decimal,
    so that ``10`` and ``"10"`` and ``10.0`` compare equal)."""
    if isinstance(value, bool) or value is None:
        return value
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)


def _admits(key: str, bound: Any, value: Any) -> bool:
    """Whether a bound (``minValue``, ``maxLength``, ...) admits an allowed value."""
    if key in ("minLength", "maxLength"):
        measure: Any = Decimal(len(str(value)))
    else:
        measure = _constraint_value(value)
        if not isinstance(measure, Decimal):
            return True  # not a number: openjd-model judges it
    return bool(measure >= bound if key.startswith("min") else measure <= bound)


def _shown_values(values: list[str], limit: int = 5) -> str:
    more = f" and {len(values) - limit} more" if len(values) > limit else ""
    return ", ".join(repr(v) for v in values[:limit]) + more


def widening_problems(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    sources: list[Any],
) -> list[str]:
    """Job parameter definitions that admit a value an earlier template's definition refused.

    Template Schemas 1.2.1: the definitions of one job parameter are processed in order, the
    external environment templates in the order given and then the job template, and each
    constraint may only become more constrained. Read as sets of admissible values: what a later
    definition admits (with the constraints it leaves out taken from the earlier ones) must be
    admitted by the earlier ones too. So a later ``allowedValues`` must be a subset of the
    earlier, and each of its values must meet the earlier bounds (then a looser bound beside it
    admits nothing more); without a list of allowed values, a later ``minValue``/``minLength``
    may be no lower and ``maxValue``/``maxLength`` no higher. openjd-model 0.14 intersects the
    constraints instead, so a job template that widens an environment's range is accepted
    there; here it is refused, naming both definitions. (The type must be the same too:
    openjd-model refuses a change of type.)
    """
    chain: dict[str, list[tuple[str, Any]]] = {}
    for env, source in zip(envs, sources, strict=True):
        env_name = getattr(getattr(env, "environment", None), "name", "?")
        label = (
            f"environment template {str(source)!r} ({env_name})"
            if isinstance(source, (str, Path))
            else f"environment template {env_name!r}"
        )
        for i, definition in enumerate(getattr(env, "parameterDefinitions", None) or []):
            where = f"{label}, parameterDefinitions[{i}]"
            chain.setdefault(str(definition.name), []).append((where, definition))
    job_label = f"job template {str(tmpl.source)!r}" if tmpl.source else "the job template"
    for i, definition in enumerate(getattr(tmpl.template, "parameterDefinitions", None) or []):
        where = f"{job_label}, parameterDefinitions[{i}]"
        chain.setdefault(str(definition.name), []).append((where, definition))
    problems: list[str] = []
    rule = "a template processed later may only narrow a job parameter's constraints"
    for name, definitions in chain.items():
        if len(definitions) < 2:
            continue
        bounds: dict[str, tuple[Any, Any, str]] = {}  # key -> (value, as written, where)
        allowed: tuple[list[Any], str] | None = None  # the allowed values so far, where set
        for where, definition in definitions:
            numeric = str(getattr(definition.type, "value", definition.type)) in ("INT", "FLOAT")

            def norm(value: Any, numeric: bool = numeric) -> Any:
                return _constraint_value(value) if numeric else str(value)

            own = {
                key: (_constraint_value(raw), raw)
                for key, *_ in _NARROWED
                if (raw := getattr(definition, key, None)) is not None
            }
            own_allowed = list(getattr(definition, "allowedValues", None) or [])
            candidates = own_allowed or (allowed[0] if allowed else [])
            if bounds or allowed:
                if candidates:  # a finite set: each value its own constraints admit must have
                    # been admitted before (a value it lists must not be one an earlier bound
                    # refused, though openjd-model's merge would drop it)
                    admitted = [
                        v for v in candidates if all(_admits(k, b, v) for k, (b, _r) in own.items())
                    ]
                    if allowed and own_allowed:
                        earlier = {norm(a) for a in allowed[0]}
                        extra = [str(v) for v in admitted if norm(v) not in earlier]
                        if extra:
                            problems.append(
                                f"job parameter {name}: {where}: allowedValues "
                                f"{[str(a) for a in own_allowed]} widens the allowedValues "
                                f"{[str(a) for a in allowed[0]]} of {allowed[1]} (adds "
                                f"{_shown_values(extra)}); {rule} (allowedValues a subset; "
                                "Template Schemas 1.2.1)"
                            )
                    for key, (bound, raw_bound, bound_where) in bounds.items():
                        outside = [str(v) for v in admitted if not _admits(key, bound, v)]
                        if outside:
                            subject = (
                                f"{key} {own[key][1]}"
                                if key in own
                                else f"allowedValues {[str(a) for a in own_allowed]}"
                            )
                            problems.append(
                                f"job parameter {name}: {where}: its {subject} admits "
                                f"{_shown_values(outside)}, outside the {key} {raw_bound} of "
                                f"{bound_where}; {rule} (Template Schemas 1.2.1)"
                            )
                else:  # no list of values anywhere: compare the bounds themselves
                    for key, narrower, words in _NARROWED:
                        if key in own and key in bounds:
                            value, raw = own[key]
                            earlier, raw_earlier, earlier_where = bounds[key]
                            if not narrower(value, earlier):
                                problems.append(
                                    f"job parameter {name}: {where}: {key} {raw} widens the "
                                    f"{key} {raw_earlier} of {earlier_where}; {rule} ({key} "
                                    f"{words} {raw_earlier}; Template Schemas 1.2.1)"
                                )
            # the merged constraints so far (the tighter of each, as openjd-model merges them)
            for key, narrower, _words in _NARROWED:
                if key in own and (key not in bounds or narrower(own[key][0], bounds[key][0])):
                    bounds[key] = (own[key][0], own[key][1], where)
            if own_allowed:
                if allowed:
                    earlier = {norm(a) for a in allowed[0]}
                    allowed = ([a for a in own_allowed if norm(a) in earlier], where)
                else:
                    allowed = (own_allowed, where)
    return problems


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


_MISSING_LINE = "Values missing for required job parameters: "


def true_missing(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    given: Mapping[str, str],
    lines: list[str],
) -> list[str]:
    """openjd-model 0.14's refusal lines, with its "Values missing for required job
    parameters" line keeping only the parameters that are missing: after one bad value it
    names every parameter, those given and those with a default included."""
    out: list[str] = []
    for line in lines:
        if line.startswith(_MISSING_LINE) and len(lines) > 1:
            with_default = {
                d.name
                for t in [tmpl.template, *envs]
                for d in (getattr(t, "parameterDefinitions", None) or [])
                if getattr(d, "default", None) is not None
            }
            names = [n.strip() for n in line[len(_MISSING_LINE) :].split(",")]
            missing = [n for n in names if n and n not in given and n not in with_default]
            if not missing:
                continue
            line = _MISSING_LINE + ", ".join(missing)
        out.append(line)
    return out


def long_int_problems(
    tmpl: CheckpointJobTemplate, envs: list[Any], raw: Mapping[str, str]
) -> list[str]:
    """A given INT value of more digits than Python converts, named (openjd-model 0.14 says it
    "must an integer", echoing every digit)."""
    int_names = {
        str(d.name)
        for source in (tmpl.template, *envs)
        for d in (getattr(source, "parameterDefinitions", None) or [])
        if str(getattr(d.type, "value", d.type)) == "INT"
    }
    problems: list[str] = []
    for name in sorted(int_names & set(raw)):
        text = raw[name].strip()
        if _INT_TEXT.fullmatch(text) and len(text) > 19:
            try:
                int(text)
            except ValueError:
                problems.append(
                    f"job parameters: {name}: an integer of {len(text.lstrip('+-')):,} digits "
                    "is outside the 64-bit integer range"
                )
    return problems


def list_value_problems(tmpl: CheckpointJobTemplate, raw: Mapping[str, str]) -> list[str]:
    """A given value of a list parameter (EXPR's ``LIST[...]`` types) that is not a JSON list,
    named with how to write one. openjd-model 0.14 says only that it "is not valid JSON", and
    then that every required parameter is missing, including those with defaults."""
    problems: list[str] = []
    for definition in tmpl.template.parameterDefinitions or []:
        kind = str(getattr(definition.type, "value", definition.type))
        value = raw.get(definition.name)
        if not kind.startswith("LIST[") or value is None:
            continue
        try:
            parsed = decode_json(value)
        except TemplateError as exc:  # an element too long to read, named by its index
            problems += [f"job parameters: {definition.name}{p}" for p in exc.problems]
            continue
        except ValueError:
            parsed = None
        if not isinstance(parsed, list):
            example = {
                "LIST[INT]": "[1, 2, 3]",
                "LIST[FLOAT]": "[0.5, 1.0]",
                "LIST[BOOL]": "[true, false]",
                "LIST[LIST[INT]]": "[[1, 2], [3]]",
            }.get(kind, '["a", "b"]')
            problems.append(
                f"job parameters: {definition.name}: {value!r} is not a {kind} value: write a "
                f"list as JSON, e.g. -p '{definition.name}={example}'"
            )
    return problems


def normalize_given_paths(
    tmpl: CheckpointJobTemplate,
    envs: list[EnvironmentTemplate],
    raw: Mapping[str, str],
    cwd: Path,
    *,
    keep_uris: bool,
) -> dict[str, str]:
    """The given job parameter values with each relative PATH value joined with the current
    directory and normalized lexically (Template Schemas 2.2): ``a/../b``, ``./x``, ``x/`` and
    ``x//y`` become ``<cwd>/b``, ``<cwd>/x``, ``<cwd>/x`` and ``<cwd>/x/y``, as a default is
    normalized against the template's folder. openjd-model 0.14 joins without collapsing
    ``..``; joining here first means its constraint checks see the normalized value. The empty
    value, absolute values and (under EXPR) URIs stay as they are."""
    path_names = {
        str(d.name)
        for source in (tmpl.template, *envs)
        for d in (getattr(source, "parameterDefinitions", None) or [])
        if str(getattr(d.type, "value", d.type)) == "PATH"
    }
    out = dict(raw)
    for name in path_names & set(raw):
        value = raw[name]
        if value == "" or os.path.isabs(value) or (keep_uris and _URI.match(value)):
            continue
        out[name] = os.path.normpath(os.path.join(cwd, value))
    return out


def join_list_paths(
    tmpl: CheckpointJobTemplate,
    raw: Mapping[str, str],
    values: JobParameterValues,
    template_dir: Path,
    cwd: Path,
) -> JobParameterValues:
    """Each element of a LIST[PATH] value follows the PATH rules (EXPR, Template Schemas 2.12
    with 2.2), which openjd-model 0.14 applies to PATH only: an element of a default is joined
    with the template's folder, must be relative and stay inside it, and ``item.allowedValues``
    is checked after the join; a relative element of a given value is joined with the current
    directory. URIs (``s3://...``) and empty elements stay as they are.

    Raises:
        ValueError: an element of a default is absolute, leaves the template's folder, or is
            not allowed.
    """
    out = dict(values)
    for definition in getattr(tmpl.template, "parameterDefinitions", None) or []:
        name = str(definition.name)
        value = values.get(name)
        if value is None or value.type != ParameterValueType.LIST_PATH:
            continue
        if not isinstance(value.value, list):
            continue
        joined: list[str] = []
        for element in (str(e) for e in value.value):
            if element == "" or _URI.match(element):
                joined.append(element)
            elif name in raw:
                joined.append(
                    element if os.path.isabs(element) else os.path.normpath(cwd / element)
                )
            elif os.path.isabs(element):
                raise ValueError(
                    f"The default value of LIST[PATH] parameter {name} holds the absolute path "
                    f"{element!r}. Default paths must be relative, and are joined to the job "
                    "template's directory."
                )
            else:
                path = os.path.normpath(template_dir / element)
                if not Path(path).is_relative_to(template_dir):
                    raise ValueError(
                        f"The default value of LIST[PATH] parameter {name} holds {element!r}, "
                        "a path outside of the template directory. Walking up from the template "
                        "directory is not permitted."
                    )
                joined.append(path)
        allowed = getattr(getattr(definition, "item", None), "allowedValues", None)
        if name not in raw and allowed:
            for element in joined:
                if element not in [str(a) for a in allowed]:
                    raise ValueError(
                        f"The default value of LIST[PATH] parameter {name} holds {element!r} "
                        f"(joined with the template's directory), which is not one of its "
                        f"item.allowedValues {[str(a) for a in allowed]}"
                    )
        out[name] = ParameterValue(type=value.type, value=joined)
    return out


def _max_argument_bytes() -> int:
    """The longest one command-line argument or environment entry ``exec`` takes, in bytes
    (without its NUL): Linux's MAX_ARG_STRLEN (32 pages), elsewhere the whole of ARG_MAX."""
    try:
        arg_max = int(os.sysconf("SC_ARG_MAX"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        arg_max = 131072
    if sys.platform.startswith("linux"):
        arg_max = min(arg_max, 32 * int(os.sysconf("SC_PAGE_SIZE")))
    return arg_max - 1


def _uses(documents: Iterable[Any], name: str) -> str | None:
    """Where a command, an argument or an environment variable of these documents refers to job
    parameter ``name`` (the first such field's path), or None."""
    ref = re.compile(r"\{\{\s*(?:Raw)?Param\." + re.escape(name) + r"\s*\}\}")
    stack: list[tuple[str, Any, bool]] = [("", d, False) for d in documents]
    while stack:
        path, node, in_command = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                sub = f"{path}.{key}" if path else str(key)
                stack.append((sub, value, in_command or key in ("command", "args", "variables")))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v, in_command) for i, v in enumerate(node))
        elif in_command and ref.search(str(node)):
            return path
    return None


def value_problems(values: JobParameterValues, documents: list[Any]) -> list[str]:
    """Job parameter values no task could be given: a NUL byte (no argument, environment
    variable or path holds one), a FLOAT that is not a finite number (Template Schemas 2.4: a
    base-10 number), a value longer than one argument may be, where an action's command,
    arguments or environment variables use it."""
    problems: list[str] = []
    longest = _max_argument_bytes()
    for name, value in sorted(values.items()):
        text = str(value.value)
        if "\x00" in text:
            problems.append(
                f"job parameters: {name}: the value holds a NUL byte (\\0), which no command "
                "line, environment variable or path can carry"
            )
            continue
        if value.type == ParameterValueType.FLOAT:
            try:
                number = float(text)
            except ValueError:  # openjd-model has refused it already
                number = 0.0
            if math.isnan(number) or text.strip().lower().lstrip("+-") in ("inf", "infinity"):
                problems.append(
                    f"job parameters: {name}: {text!r} is not a number; a FLOAT value is a "
                    "finite base-10 number"
                )
            elif not math.isfinite(number):
                problems.append(
                    f"job parameters: {name}: {text} is outside the range of a 64-bit float "
                    f"(at most {sys.float_info.max:g} either way)"
                )
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > longest:
            where = _uses(documents, name)
            if where is not None:
                problems.append(
                    f"job parameters: {name}: the value is {size:,} bytes; {where} uses it, and "
                    f"one command-line argument or environment variable takes at most "
                    f"{longest:,} bytes on this system"
                )
    return problems


def task_count_problems(job: Job) -> list[str]:
    """Each step whose parameter space is larger than ``MAX_TASKS_PER_STEP``, counted without
    building it: openjd-model's ``len()`` of a parameter space is arithmetic, but it expands a
    CHUNK[INT] parameter's frames into a list first, so those are counted from the range."""
    problems: list[str] = []
    for index, step in enumerate(job.steps):
        space = step.parameterSpace
        if space is None:
            continue
        where = f"steps[{index}] ({step.name})"
        override: int | None = None
        too_many_frames = False
        for name, definition in space.taskParameterDefinitions.items():
            if str(getattr(definition.type, "value", definition.type)) != "CHUNK[INT]":
                continue
            frames = len(definition.range)
            if frames > MAX_TASKS_PER_STEP:
                problems.append(
                    f"{where}: CHUNK[INT] parameter {name} has {frames:,} frames; the limit is "
                    f"{MAX_TASKS_PER_STEP:,}"
                )
                too_many_frames = True
            chunks = getattr(definition, "chunks", None)
            if chunks is not None:  # adaptive chunking has no length: count default-size chunks
                override = int(chunks.defaultTaskCount)
        if too_many_frames:
            continue
        count = len(StepParameterSpaceIterator(space=space, chunks_task_count_override=override))
        if count > MAX_TASKS_PER_STEP:
            problems.append(
                f"{where}: the parameter space has {count:,} tasks; the limit is "
                f"{MAX_TASKS_PER_STEP:,} tasks per step"
            )
    return problems


def int_value_problems(values: JobParameterValues) -> list[str]:
    """INT job parameter values written otherwise than as base-10 digits, or outside int64."""
    problems: list[str] = []
    for name, value in sorted(values.items()):
        if value.type != ParameterValueType.INT:
            continue
        if not _INT_TEXT.fullmatch(str(value.value)):
            # Python's int() (and so openjd-model 0.14) takes '1_000', ' 12' and non-ASCII
            # digits; a task would get the text as typed, and openjd run fails on it.
            problems.append(
                f"job parameters: {name}: {str(value.value)!r} is not an integer; an INT value "
                "is written with the digits 0-9 and an optional sign, nothing else"
            )
        elif not _INT64[0] <= int(value.value) <= _INT64[1]:
            problems.append(
                f"job parameters: {name}: {value.value} is outside the 64-bit integer range"
            )
    return problems
