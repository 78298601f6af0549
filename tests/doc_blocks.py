"""The shell command blocks of the docs a person follows (``README.md``, ``docs/airflow.md``,
``docs/prefect.md``, ``docs/development.md``), each marked with what a test does with it.

A shell block is a fenced block tagged ``sh``, ``bash``, ``shell`` or ``console``, or an
indented (4-space) code block; other fenced blocks (``python``, ``text``, ``ini``, ...) are not
commands. The line just before a shell block (a blank line may stand between) is its marker:

- ``<!-- doc-test: run -->``: run by ``tests/test_doc_blocks.py`` in the core environment;
- ``<!-- doc-test: run prefect -->`` / ``run airflow``: run by that suite's doc test, with its
  servers on loopback ports other than the defaults;
- ``<!-- doc-test: skip REASON -->``: not run, and why.

A block without a marker, or with another, is an error (``check_markers``).

A ``text`` block marked ``<!-- doc-test: shown by COMMAND -->`` is an excerpt of what the
run-marked shell block ``COMMAND`` prints (``shown``); ``missing_lines`` says which of its lines
that block's output lacks. Other fenced blocks (``python``, ``yaml``) are found with their marker
by ``fenced``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/airflow.md", "docs/prefect.md", "docs/development.md")
SHELL_TAGS = ("sh", "bash", "shell", "console")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(run(?:\s+(?:prefect|airflow))?|skip\s+(.+?))\s*-->")
_SHOWN = re.compile(r"<!--\s*doc-test:\s*shown by\s+(.+?)\s*-->")
_RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    """1-based line of the block's first line."""
    text: str
    marker: str | None
    """``run``, ``run prefect``, ``run airflow``, ``skip``; None if unmarked (or malformed)."""
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _marker_line(lines: list[str], start: int) -> str:
    """The line before ``lines[start]`` (blank lines skipped), stripped; "" at the top."""
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    return lines[i].strip() if i >= 0 else ""


def _marker(lines: list[str], start: int) -> tuple[str | None, str]:
    m = _MARKER.fullmatch(_marker_line(lines, start))
    if m is None:
        return None, ""
    if m.group(2) is not None:
        return "skip", m.group(2)
    return " ".join(m.group(1).split()), ""


def _fence(lines: list[str], i: int) -> tuple[str, int]:
    """The tag of the fenced block opening at ``lines[i]`` and the index of its closing line."""
    j = i + 1
    while j < len(lines) and not lines[j].startswith("```"):
        j += 1
    return lines[i][3:].strip().split(" ")[0], j


def fenced(doc: str, tag: str) -> list[Block]:
    """The fenced blocks of ``doc`` tagged ``tag`` (``python``, ``yaml``), in order, with the
    marker before each (None when it has none)."""
    lines = (ROOT / doc).read_text().split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            found, j = _fence(lines, i)
            if found == tag:
                marker, reason = _marker(lines, i)
                out.append(Block(doc, i + 2, "\n".join(lines[i + 1 : j]), marker, reason))
            i = j
        i += 1
    return out


@dataclass(frozen=True)
class Shown:
    """A ``text`` block marked ``<!-- doc-test: shown by COMMAND -->``: lines ``COMMAND`` prints."""

    doc: str
    line: int
    text: str
    command: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def shown(doc: str) -> list[Shown]:
    """The excerpts of command output in ``doc``, in order."""
    lines = (ROOT / doc).read_text().split("\n")
    out: list[Shown] = []
    for block in fenced(doc, "text"):
        m = _SHOWN.fullmatch(_marker_line(lines, block.line - 2))
        if m is not None:
            out.append(Shown(doc, block.line, block.text, m.group(1)))
    return out


def _same(line: str) -> str:
    """A line as compared: run ids and numbers differ from run to run."""
    return re.sub(r"\d+", "N", _RUN_ID.sub("RUN_ID", line.rstrip()))


def missing_lines(excerpt: str, output: str) -> list[str]:
    """The lines of ``excerpt`` that are not lines of ``output``, run ids and numbers aside.

    Lines that stand for the person's part are not compared: commands (``$ ...``), a Ctrl-C
    (``^C``) and elisions (``...``). Order is not compared either: the task's output and the
    runner's notes are written by different threads, and a note may come a line early or late.
    """
    have = {_same(line) for line in output.splitlines()}
    return [
        line
        for line in excerpt.splitlines()
        if line.strip() and not line.startswith(("$ ", "^C", "...")) and _same(line) not in have
    ]


def blocks(doc: str) -> list[Block]:
    """The shell blocks of ``doc`` (a path relative to the repository), in order."""
    lines = (ROOT / doc).read_text().split("\n")
    out: list[Block] = []
    i = 0
    in_list = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            tag, j = _fence(lines, i)
            if tag in SHELL_TAGS:
                marker, reason = _marker(lines, i)
                out.append(Block(doc, i + 2, "\n".join(lines[i + 1 : j]), marker, reason))
            i = j + 1
            continue
        stripped = line.strip()
        if stripped and not line.startswith(" "):  # a list starts, or a paragraph ends one
            if re.match(r"([-*+]|\d+\.)\s", stripped):
                in_list = True
            elif i == 0 or not lines[i - 1].strip():
                in_list = False
        if (
            line.startswith("    ")
            and not in_list
            and i > 0
            and not lines[i - 1].strip()
            and stripped
        ):
            j = i
            body: list[str] = []
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            marker, reason = _marker(lines, i)
            out.append(Block(doc, i + 1, "\n".join(body).strip("\n"), marker, reason))
            i = j
            continue
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def check_markers(found: list[Block]) -> list[str]:
    """One problem per block without a valid marker, naming the doc and line."""
    return [
        f"{b.where}: a shell block without a doc-test marker (<!-- doc-test: run -->, "
        f"'run prefect', 'run airflow' or 'skip REASON'): {b.text.splitlines()[0][:60]!r}"
        for b in found
        if b.marker is None
    ]
