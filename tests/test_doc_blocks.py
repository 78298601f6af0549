"""Every shell command block of ``README.md``, ``docs/airflow.md``, ``docs/prefect.md`` and
``docs/development.md`` is marked to run or to skip with a reason (``doc_blocks.py``); the core
environment's blocks run here, as written, and succeed (the Prefect ones run in
``tests/prefect/test_doc_blocks.py``, the Airflow ones in ``tests/airflow/test_doc_blocks.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from doc_blocks import ROOT, all_blocks, blocks, check_markers
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
