"""The size rule of ``make lint`` (``.ci/check_sizes.py``): limits, ceilings that only shrink."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("check_sizes", ROOT / ".ci" / "check_sizes.py")
assert _spec is not None and _spec.loader is not None
check_sizes = importlib.util.module_from_spec(_spec)
sys.modules["check_sizes"] = check_sizes
_spec.loader.exec_module(check_sizes)


def test_the_tree_as_it_is_passes() -> None:
    failures, _ = check_sizes.problems(check_sizes.sizes(ROOT))
    assert failures == []


def test_a_new_module_or_class_over_the_limit_fails() -> None:
    failures, _ = check_sizes.problems({"core/_new.py": 801, "core/_x.py::Big": 401})
    assert len(failures) == 2
    assert "core/_new.py: 801 lines, over the limit of 800" in failures[0]
    assert "core/_x.py::Big: 401 lines, over the limit of 400" in failures[1]
    assert check_sizes.problems({"core/_new.py": 800, "core/_x.py::Big": 400})[0] == []


def test_a_listed_unit_may_shrink_but_not_grow() -> None:
    unit, ceiling = next(iter(check_sizes.CEILINGS.items()))
    failures, _ = check_sizes.problems({unit: ceiling + 1})
    assert failures and "it may only shrink" in failures[0]
    failures, notes = check_sizes.problems({unit: ceiling - 1})
    assert failures == [] and any("lower it" in n for n in notes)
    failures, notes = check_sizes.problems({unit: 10})
    assert failures == [] and any("drop its ceiling" in n for n in notes)
