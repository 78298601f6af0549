"""docs/core-api.md names real code: every dotted name ``core.…`` in it (the packages, their
modules, and the functions, classes and methods of the walks it draws) imports or is an
attribute of what imports."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "core-api.md"
NAME = re.compile(r"\bcore(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_core_name_of_the_doc_exists() -> None:
    names = sorted(set(NAME.findall(DOC.read_text())))
    assert len(names) >= 40, names  # the walks are drawn with qualified names
    missing = [n for n in names if not resolves(n)]
    assert not missing, missing


def test_a_name_that_does_not_exist_is_found() -> None:
    assert resolves("core.task._task.TaskExecution.stop")
    assert not resolves("core.task._task.TaskExecution.halt")
    assert not resolves("core.nowhere.Thing")
