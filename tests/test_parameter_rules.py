"""Job parameter rules openjd-model 0.14 leaves to us: INT values inside the signed 64-bit range
(templates and environment templates), and environment templates processed before the job
template whose constraints a later template may only narrow (Template Schemas 1.2.1)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from core import TemplateError, prepare_job
from core.job import load_environment_template
from core.job._template import parse_template

INT64_MAX = 2**63 - 1

JOB: dict[str, Any] = {
    "specificationVersion": "jobtemplate-2023-09",
    "name": "Rules",
    "parameterDefinitions": [{"name": "P", "type": "INT"}],
    "steps": [
        {
            "name": "S",
            "script": {"actions": {"onRun": {"command": "python", "args": ["{{Param.P}}"]}}},
        }
    ],
}


def job_with(**fields: Any) -> dict[str, Any]:
    doc = copy.deepcopy(JOB)
    doc["parameterDefinitions"][0].update(fields)
    return doc


# --- INT values and the signed 64-bit range --------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"default": INT64_MAX + 1}, "parameterDefinitions[0] (P).default"),
        ({"default": str(INT64_MAX + 1)}, "parameterDefinitions[0] (P).default"),
        ({"default": -(2**63) - 1}, "parameterDefinitions[0] (P).default"),
        ({"minValue": INT64_MAX + 1}, "parameterDefinitions[0] (P).minValue"),
        ({"maxValue": INT64_MAX + 1}, "parameterDefinitions[0] (P).maxValue"),
        ({"allowedValues": [1, INT64_MAX + 1]}, "parameterDefinitions[0] (P).allowedValues[1]"),
    ],
)
def test_int_parameter_outside_int64_is_refused_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(TemplateError) as err:
        parse_template(job_with(**fields))
    assert f"{field}: " in str(err.value)
    assert "outside the signed 64-bit integer range" in str(err.value)


def test_int64_bounds_themselves_are_accepted() -> None:
    parse_template(job_with(default=INT64_MAX, minValue=-(2**63), maxValue=INT64_MAX))
    parse_template(job_with(allowedValues=[INT64_MAX, -(2**63)]))


@pytest.mark.parametrize(
    ("rng", "field"),
    [
        ([1, INT64_MAX + 1], "taskParameterDefinitions[0].range[1]"),
        (f"1-{INT64_MAX + 1}", "taskParameterDefinitions[0].range"),
        (str(-(2**63) - 1), "taskParameterDefinitions[0].range"),
    ],
)
def test_int_task_range_outside_int64_is_refused(rng: Any, field: str) -> None:
    doc = copy.deepcopy(JOB)
    del doc["parameterDefinitions"]
    doc["steps"][0]["parameterSpace"] = {
        "taskParameterDefinitions": [{"name": "F", "type": "INT", "range": rng}]
    }
    doc["steps"][0]["script"]["actions"]["onRun"]["args"] = ["{{Task.Param.F}}"]
    with pytest.raises(TemplateError) as err:
        parse_template(doc)
    assert f"steps[0].parameterSpace.{field}: " in str(err.value)


def test_environment_template_int_outside_int64_is_refused(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(
        yaml.safe_dump(
            {
                "specificationVersion": "environment-2023-09",
                "parameterDefinitions": [{"name": "P", "type": "INT", "maxValue": 2**63}],
                "environment": {"name": "E", "variables": {"X": "1"}},
            }
        )
    )
    with pytest.raises(TemplateError) as err:
        load_environment_template(env)
    assert "env.yaml" in str(err.value)
    assert "parameterDefinitions[0] (P).maxValue: 9223372036854775808 is outside" in str(err.value)


# --- constraints may only narrow in processing order (environments, then the job) -------------


def env_file(tmp_path: Path, name: str, definition: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "specificationVersion": "environment-2023-09",
                "parameterDefinitions": [definition],
                "environment": {"name": name, "variables": {"X": "{{Param.P}}"}},
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("text", "what"),
    [("root:x:0:0:root:/root:/bin/bash\n", "a single text value"), ("", "empty"),
     ("- a\n- b\n", "a list"), ("12\n", "a number")],
)  # fmt: skip
def test_an_environment_file_that_is_no_mapping_is_named_so(
    tmp_path: Path, text: str, what: str
) -> None:
    """``--env /etc/passwd`` said ``string indices must be integers`` (openjd-model's
    TypeError); a hostile-input try."""
    env = tmp_path / "env.yaml"
    env.write_text(text)
    with pytest.raises(TemplateError) as info:
        load_environment_template(env)
    assert f"an environment template must be a mapping; this file is {what}" in str(info.value)
    assert str(env) in str(info.value)


@pytest.mark.parametrize(
    ("env_def", "job_fields", "says"),
    [
        (
            {"type": "INT", "minValue": 10, "maxValue": 100},
            {"minValue": 0, "default": 50},
            "minValue 0 widens the minValue 10",
        ),
        (
            {"type": "INT", "minValue": 10, "maxValue": 100},
            {"maxValue": 1000, "default": 50},
            "maxValue 1000 widens the maxValue 100",
        ),
        (
            {"type": "INT", "allowedValues": [1, 2]},
            {"allowedValues": [1, 2, 3], "default": 1},
            "allowedValues ['1', '2', '3'] widens the allowedValues ['1', '2'] of environment "
            "template",
        ),
        (
            {"type": "STRING", "minLength": 5},
            {"type": "STRING", "minLength": 2, "default": "long enough"},
            "minLength 2 widens the minLength 5",
        ),
        (
            {"type": "STRING", "maxLength": 5},
            {"type": "STRING", "maxLength": 9, "default": "abc"},
            "maxLength 9 widens the maxLength 5",
        ),
    ],
)
def test_a_job_template_may_not_widen_an_environment_constraint(
    tmp_path: Path, env_def: dict[str, Any], job_fields: dict[str, Any], says: str
) -> None:
    env = env_file(tmp_path, "Env", {"name": "P", **env_def})
    job = parse_template(job_with(**job_fields))
    with pytest.raises(TemplateError) as err:
        prepare_job(job, {}, environments=[env], current_working_dir=tmp_path)
    text = str(err.value)
    assert says in text, text
    # both definitions are named, with where each is
    assert "the job template, parameterDefinitions[0]" in text
    assert f"environment template {str(env)!r} (Env), parameterDefinitions[0]" in text


def test_a_later_environment_may_not_widen_an_earlier_one(tmp_path: Path) -> None:
    first = env_file(tmp_path, "First", {"name": "P", "type": "INT", "maxValue": 10})
    second = env_file(tmp_path, "Second", {"name": "P", "type": "INT", "maxValue": 20})
    job = parse_template(job_with(default=5))
    with pytest.raises(TemplateError) as err:
        prepare_job(job, {}, environments=[first, second], current_working_dir=tmp_path)
    assert "(Second), parameterDefinitions[0]: maxValue 20 widens the maxValue 10" in str(err.value)
    # in the other order each narrows the one before
    prepare_job(job, {}, environments=[second, first], current_working_dir=tmp_path)


def test_narrowing_and_leaving_a_constraint_out_are_accepted(tmp_path: Path) -> None:
    env = env_file(tmp_path, "Env", {"name": "P", "type": "INT", "minValue": 0, "maxValue": 100})
    for fields in (
        {"minValue": 10, "maxValue": 50, "default": 20},  # narrower
        {"minValue": 0, "maxValue": 100, "default": 20},  # the same
        {"default": 20},  # left out: the environment's constraint holds
    ):
        job = parse_template(job_with(**fields))
        prepared = prepare_job(job, {}, environments=[env], current_working_dir=tmp_path)
        assert prepared.parameter_values["P"].value == "20"
    allowed = env_file(tmp_path, "Allowed", {"name": "P", "type": "INT", "allowedValues": [1, 2]})
    job = parse_template(job_with(allowedValues=[2], default=2))
    prepare_job(job, {}, environments=[allowed], current_working_dir=tmp_path)


def test_a_looser_bound_beside_a_narrower_list_of_values_admits_nothing_more(
    tmp_path: Path,
) -> None:
    """base/jobs/1.2.1--allowedvalues-intersection-string: the job's maxLength 10 is looser than
    the environment's 9, but its allowedValues (5 and 6 characters) are a subset of the
    environment's and meet its bounds, so the job admits no value the environment refused."""
    env = env_file(
        tmp_path,
        "Env",
        {
            "name": "P",
            "type": "STRING",
            "allowedValues": ["aaa", "bbbbb", "cccccc"],
            "minLength": 1,
            "maxLength": 9,
        },
    )
    doc = job_with(
        type="STRING",
        allowedValues=["bbbbb", "cccccc"],
        minLength=2,
        maxLength=10,
        default="bbbbb",
    )
    prepared = prepare_job(
        parse_template(doc), {}, environments=[env], current_working_dir=tmp_path
    )
    assert prepared.parameter_values["P"].value == "bbbbb"


def test_allowed_values_outside_an_earlier_bound_are_refused(tmp_path: Path) -> None:
    env = env_file(tmp_path, "Env", {"name": "P", "type": "STRING", "minLength": 4})
    doc = job_with(type="STRING", allowedValues=["aaa", "bbbbb"], default="bbbbb")
    with pytest.raises(TemplateError) as err:
        prepare_job(parse_template(doc), {}, environments=[env], current_working_dir=tmp_path)
    assert (
        "its allowedValues ['aaa', 'bbbbb'] admits 'aaa', outside the minLength 4 of "
        "environment template"
    ) in str(err.value)


def test_a_looser_bound_that_admits_an_earlier_allowed_value_is_refused(tmp_path: Path) -> None:
    first = env_file(tmp_path, "First", {"name": "P", "type": "INT", "maxValue": 10})
    second = env_file(tmp_path, "Second", {"name": "P", "type": "INT", "allowedValues": [5, 8]})
    doc = job_with(maxValue=20, default=5)
    prepare_job(parse_template(doc), {}, environments=[first, second], current_working_dir=tmp_path)
    doc = job_with(allowedValues=[5, 12], default=5)
    with pytest.raises(TemplateError) as err:
        prepare_job(
            parse_template(doc), {}, environments=[first, second], current_working_dir=tmp_path
        )
    text = str(err.value)
    assert "allowedValues ['5', '12'] widens the allowedValues ['5', '8'] of environment" in text
    assert "its allowedValues ['5', '12'] admits '12', outside the maxValue 10 of" in text


# --- INT values written as Python reads them, not as OpenJD writes them -----------------------


@pytest.mark.parametrize("text", ["1_000", " 12", "12 ", "\u0663"])
def test_int_value_not_written_with_digits_is_refused_by_name(text: str) -> None:
    """Python's int() takes '1_000', ' 12' and '٣' (openjd-model 0.14 does too); a task would
    get the text as written, and openjd run fails on it with a traceback."""
    with pytest.raises(TemplateError) as err:
        prepare_job(parse_template(JOB), parameters={"P": text})
    assert f"job parameters: P: {text!r} is not an integer" in str(err.value), str(err.value)


@pytest.mark.parametrize("text", ["12", "+12", "-12", "0", "007"])
def test_int_value_written_with_digits_and_a_sign_is_accepted(text: str) -> None:
    prepare_job(parse_template(JOB), parameters={"P": text})


@pytest.mark.parametrize("field", ["default", "minValue", "maxValue"])
def test_int_template_field_not_written_with_digits_is_refused_naming_the_field(
    field: str,
) -> None:
    with pytest.raises(TemplateError) as err:
        parse_template(job_with(**{field: "1_000"}))
    assert f"parameterDefinitions[0] (P).{field}: '1_000' is not an integer" in str(err.value)
