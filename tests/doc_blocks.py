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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/airflow.md", "docs/prefect.md", "docs/development.md")
SHELL_TAGS = ("sh", "bash", "shell", "console")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(run(?:\s+(?:prefect|airflow))?|skip\s+(.+?))\s*-->")


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


def _marker(lines: list[str], start: int) -> tuple[str | None, str]:
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0:
        return None, ""
    m = _MARKER.fullmatch(lines[i].strip())
    if m is None:
        return None, ""
    if m.group(2) is not None:
        return "skip", m.group(2)
    return " ".join(m.group(1).split()), ""


def blocks(doc: str) -> list[Block]:
    """The shell blocks of ``doc`` (a path relative to the repository), in order."""
    lines = (ROOT / doc).read_text().split("\n")
    out: list[Block] = []
    i = 0
    in_list = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            tag = line[3:].strip().split(" ")[0]
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
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
