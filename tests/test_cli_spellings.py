"""``openjd-checkpoint run`` and ``check`` take the reference runtime's spellings (openjd-cli
0.8: ``--job-param``, ``file://``, inline JSON, ``--env``) as well as ours; bad values are
refused with exit 2, naming the option, and never with a traceback. Real subprocesses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli

TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
name: Spellings
parameterDefinitions:
- {name: N, type: INT, default: 1}
- {name: S, type: STRING, default: dflt}
- {name: P, type: PATH, default: here}
steps:
- name: A
  script:
    actions:
      onRun:
        command: python
        args: ["-c", "print('N={{Param.N}} S={{Param.S}} P={{Param.P}}')"]
"""

ENV = """\
specificationVersion: environment-2023-09
environment:
  name: {name}
  script:
    actions:
      onEnter: {{command: python, args: ["-c", "print('ENTER {name}')"]}}
      onExit: {{command: python, args: ["-c", "print('EXIT {name}')"]}}
"""


def cli(*args: str | Path, cwd: Path) -> tuple[int, str, str]:
    """The CLI in ``cwd``; ``python`` in its templates is this interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    r = run_cli(*args, cwd=cwd, env=env)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(TEMPLATE)
    (tmp_path / "p.json").write_text(json.dumps({"N": 7, "S": "from-json"}))
    (tmp_path / "p.yaml").write_text("N: 8\nS: from-yaml\n")
    return path


def run(job: Path, *args: str) -> tuple[int, str, str]:
    return cli("run", job, "--store", job.parent / "store", "-q", "--fresh", *args, cwd=job.parent)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["-p", "N=3"], "N=3 S=dflt"),
        (["--job-param", "N=4", "--parameter", "S=a=b"], "N=4 S=a=b"),
        (["-p", "file://p.json"], "N=7 S=from-json"),
        (["--job-param", "file://p.yaml"], "N=8 S=from-yaml"),
        (["-p", "@p.yaml"], "N=8 S=from-yaml"),
        (["-p", '{"N": 5, "S": "inline"}'], "N=5 S=inline"),
        # combined in the order given: a later value of a name wins
        (["-p", "file://p.yaml", "-p", "N=9", "-p", '{"S": "last"}'], "N=9 S=last"),
    ],
)
def test_job_parameter_forms(job: Path, args: list[str], want: str) -> None:
    code, out, err = run(job, *args)
    assert code == 0, err
    assert want in out


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("garbage", "expected NAME=VALUE, file://PATH"),
        ('{"N": 5', "not valid inline JSON"),
        ("file://missing.yaml", "missing.yaml: cannot read the parameter file"),
        ("file://list.yaml", "must hold a mapping of job parameter names to values, not a list"),
        ('{"N": null}', "N: the value is null"),
        ("=5", "expected NAME=VALUE"),
    ],
)
def test_bad_job_parameter_is_refused_naming_the_option(job: Path, arg: str, says: str) -> None:
    (job.parent / "list.yaml").write_text("- 1\n- 2\n")
    code, out, err = run(job, "-p", arg)
    assert code == 2, (out, err)
    assert f"-p/--job-param {arg}" in err
    assert says in err
    assert "Traceback" not in err and out == ""


RULES = {
    "version": "pathmapping-1.0",
    "path_mapping_rules": [
        {"source_path_format": "POSIX", "source_path": "/mnt/src", "destination_path": "/dst"}
    ],
}


@pytest.mark.parametrize("form", ["inline", "file-json", "file-yaml", "plain-path"])
def test_path_mapping_rules_forms(job: Path, form: str) -> None:
    (job.parent / "rules.json").write_text(json.dumps(RULES))
    (job.parent / "rules.yaml").write_text(yaml.safe_dump(RULES))
    value = {
        "inline": json.dumps(RULES),
        "file-json": "file://rules.json",
        "file-yaml": f"file://{job.parent / 'rules.yaml'}",
        "plain-path": "rules.json",
    }[form]
    code, out, err = run(job, "-p", "P=/mnt/src/scene.ma", "--path-mapping-rules", value)
    assert code == 0, err
    assert "P=/dst/scene.ma" in out


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{bad", "not valid inline JSON"),
        ('{"version": "v9", "path_mapping_rules": []}', "'version' must be 'pathmapping-1.0'"),
        ('{"version": "pathmapping-1.0"}', "'path_mapping_rules' must be a list"),
        ("file://nope.json", "nope.json: cannot read the path mapping rules file"),
        ("nope.json", "nope.json: cannot read the path mapping rules file"),
    ],
)
def test_bad_path_mapping_rules_are_refused_naming_the_option(
    job: Path, value: str, says: str
) -> None:
    code, out, err = run(job, "--path-mapping-rules", value)
    assert code == 2, (out, err)
    assert f"--path-mapping-rules {value}" in err
    assert says in err
    assert "Traceback" not in err and out == ""


def test_environments_are_entered_in_the_order_given(job: Path) -> None:
    for name in ("First", "Second", "Third"):
        (job.parent / f"{name}.yaml").write_text(ENV.format(name=name))
    code, out, err = run(
        job, "--environment", "First.yaml", "--env", "Second.yaml", "--environment", "Third.yaml"
    )
    assert code == 0, err
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines()]
    marks = [ln for ln in lines if ln.startswith(("ENTER", "EXIT", "N="))]
    assert marks == [
        "ENTER First",
        "ENTER Second",
        "ENTER Third",
        "N=1 S=dflt P=" + str(job.parent / "here"),
        "EXIT Third",
        "EXIT Second",
        "EXIT First",
    ], out


def test_a_bad_environment_is_refused_naming_the_option(job: Path) -> None:
    code, out, err = run(job, "--env", "missing.yaml")
    assert code == 2, (out, err)
    assert "--environment missing.yaml: missing.yaml: cannot read the environment template" in err
    (job.parent / "bad.yaml").write_text(ENV.format(name="Bad") + "  bogus: 1\n")
    code, out, err = run(job, "--environment", "bad.yaml")
    assert code == 2 and "--environment bad.yaml: " in err and "bogus" in err, (out, err)
    assert "Traceback" not in err


def test_check_validates_an_environment_template(tmp_path: Path) -> None:
    good = tmp_path / "env.yaml"
    good.write_text(ENV.format(name="Good"))
    code, out, err = cli("check", good, cwd=tmp_path)
    assert code == 0, err
    assert "valid environment template 'Good'" in out
    bad = tmp_path / "bad-env.yaml"
    bad.write_text(ENV.format(name="Bad") + "  bogus: 1\n")
    code, out, err = cli("check", bad, cwd=tmp_path)
    assert code == 2 and "bad-env.yaml" in err and "bogus" in err, (out, err)
    assert "Traceback" not in err


def test_help_names_the_reference_spellings(tmp_path: Path) -> None:
    code, out, _ = cli("run", "--help", cwd=tmp_path)
    assert code == 0
    for spelling in ("--job-param", "file://PATH", "--env", "--path-mapping-rules", "inline"):
        assert spelling in out
