"""PATH job parameter values (Template Schemas 2.2) in every form a user gives them: a relative
value is joined with the current directory and normalized lexically, a default with the
template's folder the same way; absolute values, the empty value and (under EXPR) URIs stay as
given. The forms and what ``openjd run`` (openjd-cli 0.8) gives for each are in
docs/decisions.md ("PATH values")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from core import TemplateError, prepare_job

TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
{extensions}name: Paths
parameterDefinitions:
- {{name: P, type: PATH, default: {default!r}}}
steps:
- name: A
  script:
    actions:
      onRun:
        command: python
        args: ["-c", "print('VAL[{{{{Param.P}}}}] RAW[{{{{RawParam.P}}}}]')"]
"""


def template(folder: Path, default: str = ".", extensions: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(TEMPLATE.format(default=default, extensions=extensions))
    return path


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("x", "cwd/x"),
        ("./x", "cwd/x"),
        ("x/", "cwd/x"),
        ("x//y", "cwd/x/y"),
        ("a/../b", "cwd/b"),  # openjd run keeps "a/../b"
        ("a/b/..", "cwd/a"),  # openjd run keeps "a/b/.."
        ("../up", "up"),  # openjd run keeps "cwd/../up"
        (".", "cwd"),
        ("sub/./deep/../x/", "cwd/sub/x"),
    ],
)
def test_a_relative_value_is_joined_with_the_current_directory_and_normalized(
    tmp_path: Path, given: str, want: str
) -> None:
    job = prepare_job(
        template(tmp_path / "tmpl"), {"P": given}, current_working_dir=tmp_path / "cwd"
    )
    assert job.parameter_values["P"].value == str(tmp_path / want)


@pytest.mark.parametrize("given", ["/abs/x", "/abs/../y", "/abs/./z/", ""])
def test_absolute_and_empty_values_stay_as_given(tmp_path: Path, given: str) -> None:
    job = prepare_job(template(tmp_path / "tmpl"), {"P": given}, current_working_dir=tmp_path)
    assert job.parameter_values["P"].value == given


def test_a_uri_stays_as_given_under_expr(tmp_path: Path) -> None:
    path = template(tmp_path / "tmpl", extensions="extensions: [EXPR]\n")
    job = prepare_job(path, {"P": "s3://bucket/a/../b"}, current_working_dir=tmp_path)
    assert job.parameter_values["P"].value == "s3://bucket/a/../b"


@pytest.mark.parametrize(
    ("default", "want"),
    [
        (".", "tmpl"),
        ("x", "tmpl/x"),
        ("./x", "tmpl/x"),
        ("x/", "tmpl/x"),
        ("a//b", "tmpl/a/b"),
        ("sub/../x", "tmpl/x"),
        ("sub/./deep/../x/", "tmpl/sub/x"),
    ],
)
def test_a_default_is_joined_with_the_template_folder_and_normalized(
    tmp_path: Path, default: str, want: str
) -> None:
    job = prepare_job(template(tmp_path / "tmpl", default), {}, current_working_dir=tmp_path)
    assert job.parameter_values["P"].value == str(tmp_path / want)


@pytest.mark.parametrize("default", ["..", "../x", "sub/../../x", "/abs"])
def test_a_default_outside_the_template_folder_is_refused(tmp_path: Path, default: str) -> None:
    with pytest.raises(TemplateError) as err:
        prepare_job(template(tmp_path / "tmpl", default), {}, current_working_dir=tmp_path)
    assert "P" in str(err.value)


def test_allowed_values_are_checked_against_the_normalized_value(tmp_path: Path) -> None:
    folder = tmp_path / "tmpl"
    folder.mkdir()
    path = folder / "job.yaml"
    path.write_text(
        TEMPLATE.format(default=".", extensions="").replace(
            "default: '.'}", f"allowedValues: [{str(tmp_path / 'b')!r}]}}"
        )
    )
    job = prepare_job(path, {"P": "a/../b"}, current_working_dir=tmp_path)
    assert job.parameter_values["P"].value == str(tmp_path / "b")
    with pytest.raises(TemplateError):
        prepare_job(path, {"P": "a/../c"}, current_working_dir=tmp_path)


def test_the_cli_joins_with_its_current_directory(tmp_path: Path) -> None:
    path = template(tmp_path / "tmpl")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    r = run_cli(
        "run",
        str(path),
        "--store",
        str(tmp_path / "store"),
        "-q",
        "-p",
        "P=a/../b/",
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert f"VAL[{tmp_path / 'b'}] RAW[{tmp_path / 'b'}]" in r.stdout


FRAMEWORK_VALUES = """\
specificationVersion: jobtemplate-2023-09
extensions: [EXPR]
name: framework values
parameterDefinitions:
- {name: Scene, type: PATH, default: show/scene.blend}
- {name: Shots, type: "LIST[PATH]", default: [a.exr, b.exr]}
- {name: Cameras, type: "LIST[STRING]", default: [left]}
- {name: Frames, type: "LIST[INT]", default: [1]}
- {name: Draft, type: BOOL, default: false}
- {name: Note, type: STRING, default: x}
- {name: Wait, type: FLOAT, default: 40}
steps:
- name: A
  script:
    actions:
      onRun: {command: python, args: ["-c", "print(1)"]}
"""


def test_framework_values_keep_relative_path_defaults_in_the_template_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Airflow DAG run or a Prefect flow run fills every default in; a PATH (or LIST[PATH])
    value equal to its default still means the default, taken from the template's folder as on
    the CLI, not from the worker's current directory. Lists go on as JSON, bools as text."""
    from core import framework_parameter_values, load_template

    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "job.yaml").write_text(FRAMEWORK_VALUES)
    elsewhere = tmp_path / "worker-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    template = load_template(folder / "job.yaml")
    given = {
        "Scene": "show/scene.blend",
        "Shots": ["a.exr", "b.exr"],
        "Cameras": ["left", "right side"],
        "Frames": [1, 2],
        "Draft": True,
        "Note": None,
    }
    values = framework_parameter_values(template, given)
    assert values == {"Cameras": '["left", "right side"]', "Frames": "[1, 2]", "Draft": "true"}
    job = prepare_job(template, values)
    assert job.parameters["Scene"] == str(folder / "show/scene.blend")
    assert json.loads(job.parameters["Shots"]) == [str(folder / "a.exr"), str(folder / "b.exr")]
    assert json.loads(job.parameters["Cameras"]) == ["left", "right side"]
    assert job.parameters["Draft"] == "true" and job.parameters["Note"] == "x"
    # A value that differs from the default is the user's: taken from the current directory.
    other = prepare_job(template, framework_parameter_values(template, {"Scene": "s.blend"}))
    assert other.parameters["Scene"] == str(elsewhere / "s.blend")
    # A FLOAT default keeps the template's spelling: a framework's 40.0 is the default 40.
    assert framework_parameter_values(template, {"Wait": 40.0}) == {}
    assert prepare_job(template, {}).parameters["Wait"] == "40"
    assert framework_parameter_values(template, {"Wait": 40.5}) == {"Wait": "40.5"}
