"""Template rules of the FINALLY extension (finally steps, ``{{Job.Status}}``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from core import TemplateError, prepare_job
from core.job import JOB_STATUS_PARAMETER
from core.job._template import parse_template


def step(name: str, arg: str = "x", deps: list[str] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {
        "name": name,
        "script": {"actions": {"onRun": {"command": "echo", "args": [arg]}}},
    }
    if deps:
        s["dependencies"] = [{"dependsOn": d} for d in deps]
    return s


BASE: dict[str, Any] = {
    "specificationVersion": "jobtemplate-2023-09",
    "extensions": ["FINALLY"],
    "name": "fin",
    "steps": [step("A"), step("B", deps=["A"])],
    "finally": [step("Cleanup", "{{Job.Status}}"), step("Report", deps=["Cleanup"])],
}


def test_valid_finally_template() -> None:
    t = parse_template(copy.deepcopy(BASE))
    assert t.regular_steps == ("A", "B")
    assert t.finally_steps == ("Cleanup", "Report")
    assert t.step_path("Report") == "finally[1]" and t.step_path("B") == "steps[1]"
    assert set(t.step_hashes) == {"A", "B", "Cleanup", "Report"}
    job = prepare_job(t)
    assert JOB_STATUS_PARAMETER not in job.parameters  # not part of the job's identity


def test_the_step_graph_is_the_template_s_and_the_job_reads_it() -> None:
    # GIVEN a template whose steps and finally steps depend on others, listed out of order
    doc = copy.deepcopy(BASE)
    doc["steps"] = [step("B", deps=["A"]), step("A")]
    t = parse_template(doc)
    job = prepare_job(t)
    # THEN the template and the job give one graph: regular steps, then finally steps
    assert t.dependencies("B") == job.dependencies("B") == ["A"]
    assert t.dependencies("A") == [] and t.dependencies("Report") == ["Cleanup"]
    assert t.step_order() == job.step_order() == ["A", "B", "Cleanup", "Report"]
    with pytest.raises(KeyError):
        t.dependencies("Nope")
    with pytest.raises(KeyError):
        job.dependencies("Nope")


def with_(mutate) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    ("doc", "path", "text"),
    [
        pytest.param(
            with_(lambda d: d.pop("extensions")),
            "finally",
            "FINALLY extension",
            id="finally-without-extension",
        ),
        pytest.param(
            with_(lambda d: d["finally"].__setitem__(1, step("Report", deps=["A"]))),
            "finally[1].dependencies[0].dependsOn",
            "only on other finally steps",
            id="finally-depends-on-regular",
        ),
        pytest.param(
            with_(lambda d: d["steps"].__setitem__(1, step("B", deps=["Cleanup"]))),
            "steps[1].dependencies[0].dependsOn",
            "cannot depend on the finally step",
            id="regular-depends-on-finally",
        ),
        pytest.param(
            with_(lambda d: d["finally"].__setitem__(0, step("A", "{{Job.Status}}"))),
            "finally[0].name",
            "unique across steps and finally",
            id="name-used-twice",
        ),
        pytest.param(
            with_(lambda d: d["steps"].__setitem__(0, step("A", "{{Job.Status}}"))),
            "steps[0].script.actions.onRun.args[0]",
            "Job.Status",
            id="job-status-in-a-regular-step",
        ),
        pytest.param(
            with_(lambda d: d["finally"].__setitem__(1, step("Report", "{{Param.Nope}}"))),
            "finally[1].script.actions.onRun.args[0]",
            "Param.Nope",
            id="finally-error-is-named-finally",
        ),
        pytest.param(
            with_(lambda d: d.__setitem__("finally", [])),
            "finally",
            "non-empty list",
            id="empty-finally",
        ),
    ],
)
def test_invalid_finally_template(doc: dict[str, Any], path: str, text: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse_template(doc)
    assert any(p.startswith(f"{path}: ") and text in p for p in info.value.problems), (
        info.value.problems
    )
