"""Every shell command block of ``README.md``, ``docs/airflow.md``, ``docs/prefect.md`` and
``docs/development.md`` is marked to run or to skip with a reason (``doc_blocks.py``); the core
environment's blocks run here, as written, and succeed (the Prefect ones run in
``tests/prefect/test_doc_blocks.py``, the Airflow ones in ``tests/airflow/test_doc_blocks.py``),
and print what the docs show of their output. The README's job template and Python files are
the examples' own."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from doc_blocks import (
    DOCS,
    ROOT,
    all_blocks,
    blocks,
    check_markers,
    fenced,
    missing_lines,
    shown,
)
from doc_runner import run_block


def test_every_shell_block_of_the_docs_is_marked() -> None:
    found = all_blocks()
    assert len(found) >= 10, found  # the parser finds the docs' blocks
    problems = check_markers(found)
    assert not problems, "\n".join(problems)
    for block in found:
        if block.marker == "skip":
            assert len(block.reason) >= 10, f"{block.where}: say why it is skipped"


def test_an_unmarked_block_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doc_blocks

    doc = tmp_path / "doc.md"
    doc.write_text(
        "Text\n\n<!-- doc-test: run -->\n\n    echo one\n\nMore\n\n    echo two\n\n"
        "- a list\n\n```sh\necho three\n```\n\n```python\nprint(4)\n```\n"
        "\n<!-- doc-test: run prefect -->\n\n    echo five\n\n"
        "<!-- doc-test:  run   airflow -->\n```bash\necho six\n```\n\n"
        "<!-- doc-test: run celery -->\n\n    echo seven\n"
    )
    monkeypatch.setattr(doc_blocks, "ROOT", tmp_path)
    found = blocks("doc.md")
    assert [(b.text, b.marker) for b in found] == [
        ("echo one", "run"),
        ("echo two", None),
        ("echo three", None),
        ("echo five", "run prefect"),
        ("echo six", "run airflow"),
        ("echo seven", None),  # no suite of that name
    ]
    assert len(check_markers(found)) == 3 and "doc.md:9" in check_markers(found)[0]


def test_each_suite_marker_has_its_blocks_and_its_test() -> None:
    found = all_blocks()
    for marker, test in (
        ("run prefect", "tests/prefect/test_doc_blocks.py"),
        ("run airflow", "tests/airflow/test_doc_blocks.py"),
    ):
        assert any(b.marker == marker for b in found), f"no block marked {marker!r}"
        assert (ROOT / test).is_file(), f"blocks marked {marker!r} are run by {test}"


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.marker == "run"], ids=lambda b: b.where
)
def test_a_core_block_runs_as_written(block) -> None:
    done = run_block(block, venv=Path(sys.prefix), timeout=600)
    assert done.returncode == 0, f"{block.where} failed ({done.returncode}):\n{done.stdout[-3000:]}"
    for excerpt in shown(block.doc):
        if excerpt.command == block.text:
            missing = missing_lines(excerpt.text, done.stdout)
            assert not missing, (
                f"{excerpt.where} shows lines that {block.text!r} did not print: {missing}\n"
                f"it printed:\n{done.stdout[-4000:]}"
            )


def test_every_output_shown_is_of_a_block_that_runs() -> None:
    """An excerpt names a run-marked block of its doc, so the test above compares it."""
    excerpts = [e for doc in DOCS for e in shown(doc)]
    assert {e.command for e in excerpts if e.doc == "README.md"} >= {"make demo"}, excerpts
    for excerpt in excerpts:
        commands = {b.text for b in blocks(excerpt.doc) if b.marker == "run"}
        assert excerpt.command in commands, f"{excerpt.where}: no block {excerpt.command!r} runs"


def test_missing_lines_compares_lines_not_numbers() -> None:
    output = "openjd-checkpoint: run 20261205-030503-6fcb4b: Suspended\n[T] saved 3,2,3\n"
    assert missing_lines("$ cmd\n^C\n...\n[T] saved 5,5,8\n", output) == []
    assert missing_lines("openjd-checkpoint: run 20261201-101010-a1b2c3: Suspended", output) == []
    assert missing_lines("[T] saved 3,2,3 later\n[T] stored", output) == [
        "[T] saved 3,2,3 later",
        "[T] stored",
    ]


def test_the_readme_shows_the_examples_as_they_are() -> None:
    """The README's template is ``examples/fibonacci/fibonacci.yaml``; each Python block is
    skip-marked, names its example file on its first line, and its lines are that file's, in
    order (a block may leave lines out)."""
    [template] = fenced("README.md", "yaml")
    assert template.text + "\n" == (ROOT / "examples/fibonacci/fibonacci.yaml").read_text()
    pythons = fenced("README.md", "python")
    assert len(pythons) >= 2, pythons
    for block in pythons:
        assert block.marker == "skip" and len(block.reason) >= 10, f"{block.where}: no reason"
        first, *code = block.text.splitlines()
        m = re.match(r"# (examples/\S+?\.py)\b", first)
        assert m, f"{block.where}: the first line names no example file: {first!r}"
        source = iter((ROOT / m.group(1)).read_text().splitlines())
        for line in code:
            if line.strip():
                assert any(line == s for s in source), (
                    f"{block.where}: {line!r} is not in {m.group(1)} (in this order)"
                )
