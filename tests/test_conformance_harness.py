"""The conformance harness itself (tests/conformance.py): it finds every folder's fixtures,
``proposed/`` template folders included, and spells the CLI's options as ``openjd run`` users
write them, spread over the cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conformance import (  # noqa: E402
    build_command,
    discover,
    first_nonzero_exit_code,
    fixture_dirs,
    fixture_kind,
    spelling,
)

TEST = {
    "template": {"specificationVersion": "jobtemplate-2023-09", "name": "T", "steps": []},
    "parameters": {"N": 5, "L": [1, 2]},
    "environments": [
        {"specificationVersion": "environment-2023-09", "environment": {"name": f"E{i}"}}
        for i in range(3)
    ],
    "pathMapping": [{"source_path_format": "POSIX", "source_path": "/a", "destination_path": "/b"}],
}


def test_fixture_kind_of_a_proposed_folder_is_its_parents() -> None:
    assert fixture_kind("base/job_templates/proposed") == "job_templates"
    assert fixture_kind("EXPR/jobs/proposed") == "jobs"
    assert fixture_kind("base/env_templates") == "env_templates"


def test_discover_finds_proposed_template_fixtures(tmp_path: Path) -> None:
    folder = tmp_path / "base/job_templates/proposed"
    folder.mkdir(parents=True)
    (folder / "2.3--x.invalid.yaml").write_text("{}")
    (folder / "README.md").write_text("not a fixture")
    jobs = tmp_path / "base/jobs"
    jobs.mkdir(parents=True)
    (jobs / "a.test.yaml").write_text("{}")
    found = discover(tmp_path, ["base/job_templates/proposed", "base/jobs"])
    assert [(g, p.name) for g, p in found] == [
        ("base/job_templates/proposed", "2.3--x.invalid.yaml"),
        ("base/jobs", "a.test.yaml"),
    ]
    assert fixture_dirs(tmp_path) == ["base/job_templates/proposed", "base/jobs"]


def _name_with(form: int) -> str:
    return next(
        f"case-{i}.test.yaml" for i in range(100) if spelling(f"case-{i}.test.yaml", 3) == form
    )


def test_each_spelling_of_job_parameters(tmp_path: Path) -> None:
    forms = {}
    for form in range(3):
        work = tmp_path / str(form)
        work.mkdir()
        cmd = build_command(TEST, work, ["cli"], _name_with(form))
        assert "-p" not in cmd and "--parameter" not in cmd
        forms[form] = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--job-param"]
    assert forms[0] == ["N=5", "L=[1, 2]"]
    assert [json.loads(a) for a in forms[1]] == [{"N": 5, "L": [1, 2]}]
    (file_arg,) = forms[2]
    assert file_arg.startswith("file://")
    assert yaml.safe_load(Path(file_arg[len("file://") :]).read_text()) == {"N": 5, "L": [1, 2]}


def test_each_spelling_of_path_mapping_rules(tmp_path: Path) -> None:
    want = {"version": "pathmapping-1.0", "path_mapping_rules": TEST["pathMapping"]}
    for form in range(3):
        work = tmp_path / str(form)
        work.mkdir()
        cmd = build_command(TEST, work, ["cli"], _name_with(form))
        value = cmd[cmd.index("--path-mapping-rules") + 1]
        if form == 0:
            assert json.loads(value) == want
        else:
            assert value.startswith("file://")
            assert value.endswith(".json" if form == 1 else ".yaml")
            assert yaml.safe_load(Path(value[len("file://") :]).read_text()) == want


def test_environments_are_repeated_in_order_with_both_spellings(tmp_path: Path) -> None:
    cmd = build_command(TEST, tmp_path, ["cli"], "x.test.yaml")
    flags = [
        (a, Path(cmd[i + 1]).name) for i, a in enumerate(cmd) if a in ("--environment", "--env")
    ]
    assert flags == [
        ("--environment", "env-0.yaml"),
        ("--env", "env-1.yaml"),
        ("--environment", "env-2.yaml"),
    ]


def test_the_exit_code_is_read_only_from_the_line_the_data_names() -> None:
    """The data's README: "the first non-zero `exited with code: <N>` line"; a line in another
    wording (no colon) is not read, so an action reported in it cannot pass a taskFailure."""
    assert first_nonzero_exit_code("a: exited with code: 0\nb failed: exited with code: 7\n") == 7
    assert first_nonzero_exit_code("onEnter failed: exited with code 7\n") is None
    assert first_nonzero_exit_code("killed by SIGKILL (exit code -9)\n") is None
