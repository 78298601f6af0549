"""``core.job._expr``: EXPR typed results applied to an action's fields, as openjd-sessions does."""

from __future__ import annotations

import pytest
from openjd.model import SymbolTable
from openjd.model._format_strings import FormatString
from openjd.model.v2023_09 import ModelParsingContext

from core.job import resolve_args, resolve_int_field


def fs(text: str) -> FormatString:
    return FormatString(
        text, context=ModelParsingContext(supported_extensions=["EXPR", "FEATURE_BUNDLE_1"])
    )


def table() -> SymbolTable:
    symtab = SymbolTable()
    symtab["Param.Frames"] = [1, 2, 3]
    symtab.expr_types["Param.Frames"] = "LIST[INT]"
    symtab["Param.Name"] = "a b"
    return symtab


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["{{ Param.Frames }}"], ["1", "2", "3"], id="list-flattens"),
        pytest.param(["x", "{{ null }}", "y"], ["x", "y"], id="null-is-left-out"),
        pytest.param(["n={{ Param.Frames }}"], ["n=[1, 2, 3]"], id="list-inside-text"),
        pytest.param(["{{ Param.Name }}"], ["a b"], id="string-is-one-argument"),
        pytest.param(["{{ len(Param.Frames) * 2 }}"], ["6"], id="number"),
    ],
)
def test_resolve_args(args: list[str], expected: list[str]) -> None:
    assert resolve_args([fs(a) for a in args], table()) == expected


def test_resolve_int_field() -> None:
    symtab = table()
    assert resolve_int_field(None, symtab, description="timeout") is None
    assert resolve_int_field(5, symtab, description="timeout") == 5
    assert resolve_int_field(fs("{{ len(Param.Frames) }}"), symtab, description="t") == 3
    assert resolve_int_field(fs("{{ null }}"), symtab, description="t") is None
    with pytest.raises(ValueError, match="must be between 1 and 600"):
        resolve_int_field(fs("{{ 601 }}"), symtab, ge=1, le=600, description="period")
    with pytest.raises(ValueError, match="must be an integer"):
        resolve_int_field(fs("{{ Param.Name }}"), symtab, description="timeout")


@pytest.mark.parametrize(
    ("value", "kind"), [("1,2", "LIST[INT]"), ("left", "LIST[STRING]"), ('{"a": 1}', "LIST[INT]")]
)
def test_a_list_value_that_is_not_json_is_named_with_how_to_write_one(value, kind) -> None:
    """openjd-model says only "not valid JSON", then that every required parameter is missing,
    those with defaults included; the refusal names the parameter and shows a JSON list."""
    from pathlib import Path

    from core import TemplateError, prepare_job

    sample = Path(__file__).resolve().parent / "data" / "expr-test-job.yaml"
    name = "Frames" if kind == "LIST[INT]" else "Cameras"
    with pytest.raises(TemplateError) as info:
        prepare_job(sample, {name: value})
    text = str(info.value)
    assert f"{name}: {value!r} is not a {kind} value: write a list as JSON" in text
    assert "missing" not in text
    assert prepare_job(sample, {name: "[1, 2]" if name == "Frames" else '["a"]'}).parameters


def test_one_bad_value_is_one_problem_and_only_missing_parameters_are_called_missing(
    tmp_path,
) -> None:
    """openjd-model follows a bad value with "Values missing for required job parameters"
    naming every parameter; only the one really missing (no value, no default) is kept."""
    from core import TemplateError, prepare_job

    template = tmp_path / "bools.yaml"
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "extensions: [EXPR]\n"
        "name: bools\n"
        "parameterDefinitions:\n"
        "- {name: Flag, type: BOOL, default: true}\n"
        "- {name: Flags, type: 'LIST[BOOL]', default: [true]}\n"
        "- {name: Needed, type: STRING}\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, 'print(1)']}\n"
    )
    with pytest.raises(TemplateError) as info:
        prepare_job(template, {"Flag": "maybe", "Needed": "x"})
    [problem] = info.value.problems
    assert "'maybe' is not a valid boolean" in problem
    with pytest.raises(TemplateError) as info:
        prepare_job(template, {"Flag": "maybe"})
    text = "\n".join(info.value.problems)
    assert "Values missing for required job parameters: Needed" in text
    assert "Flag," not in text and "Flags" not in text, text
