"""The structure rules of ``make lint`` (``.ci/check_structure.py``): size limits, ceilings that
only shrink, every private module of core in the face contract."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "check_structure", ROOT / ".ci" / "check_structure.py"
)
assert _spec is not None and _spec.loader is not None
check_structure = importlib.util.module_from_spec(_spec)
sys.modules["check_structure"] = check_structure
_spec.loader.exec_module(check_structure)


def test_the_tree_as_it_is_passes() -> None:
    failures, notes = check_structure.problems(check_structure.sizes(ROOT))
    assert failures == [] and notes == []
    assert check_structure.CEILINGS == {}  # every unit of the product is under the limits


def test_a_new_module_or_class_over_the_limit_fails() -> None:
    failures, _ = check_structure.problems({"core/_new.py": 801, "core/_x.py::Big": 401})
    assert len(failures) == 2
    assert "core/_new.py: 801 lines, over the limit of 800" in failures[0]
    assert "core/_x.py::Big: 401 lines, over the limit of 400" in failures[1]
    assert check_structure.problems({"core/_new.py": 800, "core/_x.py::Big": 400})[0] == []


def test_a_listed_unit_may_shrink_but_not_grow(monkeypatch) -> None:
    # Every unit of the product is under the limits now (CEILINGS is empty): the rule is checked on
    # a unit of its own, as a ceiling listed when a limit came would be.
    monkeypatch.setattr(check_structure, "CEILINGS", {"core/_old.py": 900})
    unit, ceiling = next(iter(check_structure.CEILINGS.items()))
    failures, _ = check_structure.problems({unit: ceiling + 1})
    assert failures and "it may only shrink" in failures[0]
    failures, notes = check_structure.problems({unit: ceiling - 1})
    assert failures == [] and any("lower it" in n for n in notes)
    failures, notes = check_structure.problems({unit: 10})
    assert failures == [] and any("drop its ceiling" in n for n in notes)


def test_a_private_module_missing_from_the_face_contract_fails(tmp_path) -> None:
    (tmp_path / "core").mkdir()
    for name in ("__init__", "_a", "_b", "local"):
        (tmp_path / "core" / f"{name}.py").write_text("")
    (tmp_path / "core" / "pkg").mkdir()
    (tmp_path / "core" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        "[[tool.importlinter.contracts]]\n"
        'source_modules = ["airflow_plugin", "prefect_integration", "core.cli"]\n'
        'forbidden_modules = ["core._a", "core._gone"]\n'
        "[[tool.importlinter.contracts]]\n"
        'type = "layers"\n'
        'layers = ["cli", "_a | _gone"]\n'
    )
    assert check_structure.face_problems(tmp_path) == [
        "pyproject.toml: core._b is not in the face contract's forbidden_modules: add it",
        "pyproject.toml: core.pkg is not in the face contract's forbidden_modules: add it",
        "pyproject.toml: the face contract lists core._gone, which does not exist: drop it",
        "pyproject.toml: core._b is on no floor of the layers contract: put it on one",
        "pyproject.toml: core.local is on no floor of the layers contract: put it on one",
        "pyproject.toml: core.pkg is on no floor of the layers contract: put it on one",
    ]
    assert check_structure.face_problems(ROOT) == []
