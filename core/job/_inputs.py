"""Bounded reading of the files a user hands to openjd-checkpoint.

Job templates, environment templates, parameter files (``-p @FILE``) and path mapping rules all
come through ``read_input_file`` and ``load_document``, so that none of them can take unbounded
memory or time (docs/decisions.md, "Inputs"):

- a file is read only when it is a regular file (``/dev/zero``, a FIFO, a terminal or a directory
  is refused without reading it; a FIFO is opened with ``O_NONBLOCK`` so that the open cannot
  wait for a writer), and only up to ``MAX_INPUT_BYTES``;
- YAML is composed first and its aliases' expansion is counted before anything is built, so a
  "billion laughs" document is refused in milliseconds (PyYAML shares an alias's object, but every
  later walk of the document, validation and hashing included, visits it once per reference);
- an integer of more digits than Python converts (``sys.get_int_max_str_digits()``, 4,300 by
  default), in JSON or YAML, is refused naming its field, instead of the ``ValueError`` that
  the conversion (or any later ``str()`` of it) raises;
- an INT value of a template document outside the signed 64-bit range (``int64_problems``),
  which openjd-model 0.14 takes as a Python integer, is refused naming its field.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from core._errors import TemplateError

__all__ = (
    "MAX_INPUT_BYTES",
    "MAX_YAML_ALIAS_NODES",
    "decode_json",
    "int64_problems",
    "integer_digits_limit",
    "load_document",
    "read_input_file",
    "safe_yaml_load",
)

MAX_INPUT_BYTES = 10 * 1024 * 1024
"""The largest template, environment template, parameter file or path mapping file read: 10 MiB."""

MAX_YAML_ALIAS_NODES = 100_000
"""How many nodes YAML aliases may add to a document once expanded (each ``*name`` counts the
nodes of what it names)."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str | Path, what: str, reason: str) -> TemplateError:
    return TemplateError([f"cannot read the {what}: {reason}"], source=str(path))


def read_input_file(path: str | Path, what: str, *, limit: int = MAX_INPUT_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes of UTF-8.

    Args:
        path: the file.
        what: what the file is, for messages ("job template", "parameter file", ...).
        limit: the most bytes read.

    Raises:
        TemplateError: naming the file and the reason: missing or unreadable, not a regular file
            (a FIFO, a device, a directory), larger than ``limit``, or not UTF-8.
    """
    try:
        before = os.stat(path)  # no open yet: opening a device can have effects of its own
    except OSError as exc:
        raise _refuse(path, what, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(before.st_mode):
        raise _refuse(path, what, f"it is {_kind(before.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _refuse(path, what, exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)  # what was opened, whatever the path names now
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, what, f"it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise _refuse(path, what, _too_large(st.st_size, limit))
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1024 * 1024, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise _refuse(path, what, _too_large(size, limit, more=True))
    except OSError as exc:
        raise _refuse(path, what, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(path, what, f"not UTF-8 text (byte {exc.start})") from None


def _too_large(size: int, limit: int, *, more: bool = False) -> str:
    amount = f"more than {limit:,}" if more else f"{size:,}"
    return f"it is {amount} bytes; the limit is {limit:,} bytes ({limit // (1024 * 1024)} MiB)"


def integer_digits_limit() -> int:
    """The most decimal digits Python converts between an int and a string (CPython's
    ``sys.get_int_max_str_digits()``: 4,300 unless ``PYTHONINTMAXSTRDIGITS`` changes it); 0
    where there is no limit."""
    get = getattr(sys, "get_int_max_str_digits", None)
    return int(get()) if get is not None else 0


class _LongInteger:
    """Stands for an integer of a decoded document that Python cannot convert (more digits than
    ``integer_digits_limit()``), until ``_long_integer_problems`` names its field."""

    __slots__ = ("digits", "line")

    def __init__(self, digits: int | None, line: int | None = None) -> None:
        self.digits = digits  # None: written in another base, its digits not counted
        self.line = line


def _long_integer_problems(document: Any, limit: int) -> list[str]:
    """One problem per ``_LongInteger`` in ``document``, named by its field path
    (``parameterDefinitions[0].default``; ``<root>`` for the document itself)."""
    problems: list[str] = []
    stack: list[tuple[str, Any]] = [("", document)]
    while stack and len(problems) < 20:
        path, value = stack.pop()
        if isinstance(value, _LongInteger):
            digits = f"{value.digits:,} digits" if value.digits else f"more than {limit:,} digits"
            at = f" (line {value.line})" if value.line else ""
            problems.append(
                f"{path or '<root>'}: an integer of {digits}{at} is too long to read (at most "
                f"{limit:,} digits; an INT value is a signed 64-bit integer)"
            )
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, _LongInteger):
                    stack.append((f"{path or '<root>'} (a key)", key))
                else:
                    stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return problems


def decode_json(text: str, source: str | Path | None = None) -> Any:
    """``json.loads(text)``, refusing an integer of more than ``integer_digits_limit()`` digits
    by its field path instead of raising Python's conversion ``ValueError``.

    Raises:
        json.JSONDecodeError: not JSON; RecursionError: nested too deeply (the callers word
            both).
        TemplateError: with ``source``, one problem per integer too long to read.
    """
    found: list[bool] = []

    def parse_int(digits: str) -> Any:
        try:
            return int(digits)
        except ValueError:
            found.append(True)
            return _LongInteger(len(digits.lstrip("-")))

    document = json.loads(text, parse_int=parse_int)
    if found:
        problems = _long_integer_problems(document, integer_digits_limit())
        raise TemplateError(problems, source=str(source) if source is not None else None)
    return document


try:  # libyaml's parser when it is there: much faster on large documents
    _Parser: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Parser = yaml.SafeLoader


@functools.lru_cache(maxsize=4)
def _power_of_ten(exponent: int) -> int:
    return 10**exponent


class _Base(_Parser):
    """The safe loader, building an integer Python cannot convert as a ``_LongInteger``."""

    long_integers = False

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        limit = integer_digits_limit()
        line = node.start_mark.line + 1 if node.start_mark is not None else None
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # a decimal (or sexagesimal) integer of too many digits
            self.long_integers = True
            text = str(node.value)
            return _LongInteger(sum(c.isdigit() for c in text) or None, line)
        if limit and isinstance(value, int) and abs(value) >= _power_of_ten(limit):
            # Written in base 2, 8 or 16 it converts, but no str() of it would.
            self.long_integers = True
            return _LongInteger(None, line)
        return value


_Base.add_constructor("tag:yaml.org,2002:int", _Base.construct_yaml_int)


def safe_yaml_load(text: str, source: str | Path | None = None) -> Any:
    """``yaml.safe_load(text)``, refusing documents whose aliases expand past
    ``MAX_YAML_ALIAS_NODES`` nodes, or that refer to themselves, and integers of more than
    ``integer_digits_limit()`` digits (named by their field path and line).

    Raises:
        TemplateError: with ``source``; a syntax error gives its line and column.
    """
    where = str(source) if source is not None else None
    loader = _Base(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise TemplateError(
                [f"not a valid YAML document: {_yaml_problem(exc)}"], source=where
            ) from None
        if node is None:
            return None
        problem = _alias_problem(node)
        if problem:
            raise TemplateError([f"not accepted as YAML: {problem}"], source=where)
        try:
            document = loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise TemplateError(
                [f"not a valid YAML document: {_yaml_problem(exc)}"], source=where
            ) from None
        if loader.long_integers:
            problems = _long_integer_problems(document, integer_digits_limit())
            raise TemplateError(problems, source=where)
        return document
    except RecursionError:
        raise TemplateError(["the document is nested too deeply"], source=where) from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(problem)


def _alias_problem(root: yaml.Node) -> str | None:
    """Why the composed document is refused, or None: the nodes its aliases add once expanded
    (counted without expanding them), or an alias inside what it names."""
    distinct: set[int] = set()
    expanded: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            visiting.discard(key)
            total = 1 + sum(expanded[id(c)] for c in _children(node))
            expanded[key] = total
            continue
        if key in expanded:
            continue
        if key in visiting:
            return "an alias refers to a node that contains it (a recursive document)"
        visiting.add(key)
        distinct.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in expanded)
    added = expanded[id(root)] - len(distinct)
    if added > MAX_YAML_ALIAS_NODES:
        return (
            f"its aliases expand to {added:,} more nodes; the limit is "
            f"{MAX_YAML_ALIAS_NODES:,} (a 'billion laughs' document?)"
        )
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_document(text: str, *, json_format: bool, source: str | Path | None = None) -> Any:
    """A JSON or YAML document decoded (YAML through ``safe_yaml_load``, JSON through
    ``decode_json``).

    Raises:
        TemplateError: with ``source``, and where the syntax error is, or which field holds an
            integer too long to read.
    """
    if not json_format:
        return safe_yaml_load(text, source)
    where = str(source) if source is not None else None
    try:
        return decode_json(text, source)
    except json.JSONDecodeError as exc:
        raise TemplateError(
            [f"not a valid JSON document: {exc.msg} at line {exc.lineno}, column {exc.colno}"],
            source=where,
        ) from None
    except RecursionError:
        raise TemplateError(["the document is nested too deeply"], source=where) from None


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of an INT value (Expression Language 1.2.1: a 64-bit signed integer; both reference
implementations store INT as int64)."""

_INT64_RANGE = f"the signed 64-bit integer range of an INT value ({INT64_MIN} to {INT64_MAX})"
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_RANGE_PART = re.compile(r"^\s*([+-]?\d+)\s*(?:-\s*([+-]?\d+)\s*(?::\s*([+-]?\d+)\s*)?)?$")


def _int64_problem(where: str, value: Any) -> str | None:
    """A problem if ``value`` (an ``<integer>`` or ``<intstring>``) is outside int64."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            if _INT_TEXT.fullmatch(value):  # more digits than Python converts
                digits = sum(c.isdigit() for c in value)
                return f"{where}: an integer of {digits:,} digits is outside {_INT64_RANGE}"
            return None  # a format string, or not an integer (openjd-model judges those)
        if not _INT_TEXT.fullmatch(value):
            # openjd-model 0.14 (Python's int()) takes ' 12', '1_000' and non-ASCII digits,
            # and a task would get the text as written
            return (
                f"{where}: {value!r} is not an integer; an INT value is written with the "
                "digits 0-9 and an optional sign, nothing else"
            )
    elif isinstance(value, int):
        number = value
    else:
        return None
    if INT64_MIN <= number <= INT64_MAX:
        return None
    return f"{where}: {number} is outside {_INT64_RANGE}"


def int64_problems(document: Any) -> list[str]:
    """INT values of a job or environment template document outside the signed 64-bit range,
    each named by its field path: an INT (or LIST[INT]) job parameter's ``default``,
    ``minValue``, ``maxValue`` and ``allowedValues`` (and ``item.*``), and an INT or CHUNK[INT]
    task parameter's ``range`` (a list, or a range expression). openjd-model 0.14 takes
    Python's unbounded integers there."""
    if not isinstance(document, dict):
        return []
    problems: list[str] = []

    def check(where: str, value: Any) -> None:
        found = _int64_problem(where, value)
        if found:
            problems.append(found)

    def scalar_fields(where: str, node: dict[str, Any], *, default: bool) -> None:
        keys = ("default", "minValue", "maxValue") if default else ("minValue", "maxValue")
        for key in keys:
            if key in node:
                check(f"{where}.{key}", node[key])
        allowed = node.get("allowedValues")
        if isinstance(allowed, list):
            for j, value in enumerate(allowed):
                check(f"{where}.allowedValues[{j}]", value)

    params = document.get("parameterDefinitions")
    for i, param in enumerate(params if isinstance(params, list) else []):
        if not isinstance(param, dict):
            continue
        where = f"parameterDefinitions[{i}]"
        if isinstance(param.get("name"), str):
            where += f" ({param['name']})"
        if param.get("type") == "INT":
            scalar_fields(where, param, default=True)
        elif param.get("type") == "LIST[INT]":
            default = param.get("default")
            for j, value in enumerate(default if isinstance(default, list) else []):
                check(f"{where}.default[{j}]", value)
            item = param.get("item")
            if isinstance(item, dict):
                scalar_fields(f"{where}.item", item, default=False)
    steps = document.get("steps")
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        space = step.get("parameterSpace") if isinstance(step, dict) else None
        defs = space.get("taskParameterDefinitions") if isinstance(space, dict) else None
        for j, task_param in enumerate(defs if isinstance(defs, list) else []):
            if not isinstance(task_param, dict):
                continue
            if task_param.get("type") not in ("INT", "CHUNK[INT]"):
                continue
            where = f"steps[{i}].parameterSpace.taskParameterDefinitions[{j}].range"
            rng = task_param.get("range")
            if isinstance(rng, list):
                for k, value in enumerate(rng):
                    check(f"{where}[{k}]", value)
            elif isinstance(rng, str) and "{{" not in rng:
                for part in rng.split(","):
                    m = _RANGE_PART.match(part)
                    for number in m.groups() if m else ():
                        if number is not None:
                            check(where, number)
    return problems
