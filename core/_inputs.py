"""Bounded reading of the files a user hands to openjd-checkpoint.

Job templates, environment templates, parameter files (``-p @FILE``) and path mapping rules all
come through ``read_input_file`` and ``load_document``, so that none of them can take unbounded
memory or time (docs/decisions.md, "Inputs"):

- a file is read only when it is a regular file (``/dev/zero``, a FIFO, a terminal or a directory
  is refused without reading it; a FIFO is opened with ``O_NONBLOCK`` so that the open cannot
  wait for a writer), and only up to ``MAX_INPUT_BYTES``;
- YAML is composed first and its aliases' expansion is counted before anything is built, so a
  "billion laughs" document is refused in milliseconds (PyYAML shares an alias's object, but every
  later walk of the document, validation and hashing included, visits it once per reference).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from ._errors import TemplateError

__all__ = (
    "MAX_INPUT_BYTES",
    "MAX_YAML_ALIAS_NODES",
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


try:  # libyaml's parser when it is there: much faster on large documents
    _Base: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Base = yaml.SafeLoader


def safe_yaml_load(text: str, source: str | Path | None = None) -> Any:
    """``yaml.safe_load(text)``, refusing documents whose aliases expand past
    ``MAX_YAML_ALIAS_NODES`` nodes, or that refer to themselves.

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
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise TemplateError(
                [f"not a valid YAML document: {_yaml_problem(exc)}"], source=where
            ) from None
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
    """A JSON or YAML document decoded (YAML through ``safe_yaml_load``).

    Raises:
        TemplateError: with ``source``, and where the syntax error is.
    """
    if not json_format:
        return safe_yaml_load(text, source)
    where = str(source) if source is not None else None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TemplateError(
            [f"not a valid JSON document: {exc.msg} at line {exc.lineno}, column {exc.colno}"],
            source=where,
        ) from None
    except RecursionError:
        raise TemplateError(["the document is nested too deeply"], source=where) from None
