"""Bounded memory and time on any input: files that are not regular files or too large, YAML
bombs, parameter spaces too large to build, parameter values no task could be given, and absurd
option values are refused at once with exit 2 and a message naming what was refused.

Every CLI call runs as a subprocess with a time limit (a hang fails the test instead of
blocking it) and an address-space limit (a runaway read fails instead of filling the host).
"At once" is judged by the CPU seconds the process used, not by the wall clock: on a loaded
machine the CLI's start-up alone can take many wall seconds, while a YAML bomb expanded or a
trillion tasks built would take minutes of CPU."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, cli_cmd

from core import TemplateError, prepare_job
from core.job._planning import task_count

TIMEOUT = 120  # wall seconds: only a hang (a FIFO opened and waited on) comes near it
CPU_AT_ONCE = 10  # CPU seconds: start-up, parsing and the refusal take about 1.5
MAX_TASKS_PER_STEP = 1_000_000  # core.job._job.MAX_TASKS_PER_STEP (docs/decisions.md)
MEMORY = 3 * 1024**3

TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
name: bounded
parameterDefinitions:
- {name: N, type: INT, default: 2}
- {name: F, type: FLOAT, default: 1.5}
- {name: S, type: STRING, default: x}
steps:
- name: Work
  parameterSpace:
    taskParameterDefinitions:
    - {name: I, type: INT, range: "1-{{Param.N}}"}
  script:
    actions:
      onRun:
        command: python3
        args: [-c, "print('ran')", "{{Task.Param.I}}", "{{Param.F}}", "{{Param.S}}"]
"""

CHUNKED = """\
specificationVersion: jobtemplate-2023-09
extensions: [TASK_CHUNKING]
name: chunked
parameterDefinitions:
- {name: N, type: INT, default: 10}
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - name: Frame
      type: CHUNK[INT]
      range: "1-{{Param.N}}"
      chunks: {defaultTaskCount: 100, rangeConstraint: CONTIGUOUS}
  script:
    actions:
      onRun: {command: python3, args: [-c, "print('ran')", "{{Task.Param.Frame}}"]}
"""

ENVIRONMENT = """\
specificationVersion: environment-2023-09
environment:
  name: Env
  script:
    actions:
      onEnter: {command: python3, args: [-c, "print('entered')"]}
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def cli(*args: str | Path) -> tuple[int, str, float]:
    """Run the CLI; (exit code, stdout and stderr, CPU seconds it used, user and system). A
    hang fails the test."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(
            cli_cmd(*map(str, args)),
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"openjd-checkpoint {' '.join(map(str, args))} hung for {exc.timeout} s")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.returncode, proc.stdout + proc.stderr, cpu


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(TEMPLATE)
    return path


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        return Path("/dev/zero")
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    return fifo


def _as_role(role: str, special: Path, template: Path, store: Path) -> list[str | Path]:
    if role == "check":
        return ["check", special]
    if role == "template":
        return ["run", special, "--store", store]
    if role == "parameter-file":
        return ["run", template, "--store", store, "-p", f"@{special}"]
    if role == "environment":
        return ["run", template, "--store", store, "--environment", special]
    assert role == "path-mapping"
    return ["run", template, "--store", store, "--path-mapping-rules", special]


# --- files that are not regular files ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
@pytest.mark.parametrize(
    "role", ["check", "template", "parameter-file", "environment", "path-mapping"]
)
def test_a_file_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, template: Path, kind: str, role: str
) -> None:
    special = _special(tmp_path, kind)
    code, out, seconds = cli(*_as_role(role, special, template, tmp_path / "store"))
    assert code == 2, out
    assert str(special) in out
    assert "not a regular file" in out
    assert ("character device" if kind == "dev-zero" else "FIFO") in out
    assert "Traceback" not in out
    assert "ran" not in out.split()  # no task ran
    assert seconds < CPU_AT_ONCE


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_template_larger_than_the_cap_is_refused_unread(tmp_path: Path, suffix: str) -> None:
    big = tmp_path / f"big{suffix}"
    with open(big, "wb") as fh:
        fh.truncate(11 * 1024 * 1024)  # sparse: 11 MiB of NUL bytes
    code, out, _ = cli("check", big)
    assert code == 2, out
    assert "11,534,336 bytes" in out and "10 MiB" in out


def test_a_parameter_file_larger_than_the_cap_is_refused(tmp_path: Path, template: Path) -> None:
    big = tmp_path / "params.yaml"
    big.write_text("S: " + "x" * (10 * 1024 * 1024) + "\n")
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "-p", f"@{big}")
    assert code == 2, out
    assert f"-p/--job-param @{big}" in out and "the limit is 10,485,760 bytes" in out


# --- YAML bombs -------------------------------------------------------------------------------


def _bomb() -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("role", ["check", "parameter-file", "environment"])
def test_a_yaml_bomb_is_refused_at_once(tmp_path: Path, template: Path, role: str) -> None:
    bomb = tmp_path / "bomb.yaml"
    head = {
        "check": "specificationVersion: jobtemplate-2023-09\nname: bomb\n",
        "parameter-file": "",
        "environment": "specificationVersion: environment-2023-09\n",
    }[role]
    bomb.write_text(head + _bomb())
    code, out, seconds = cli(*_as_role(role, bomb, template, tmp_path / "store"))
    assert code == 2, out
    assert str(bomb) in out
    assert "aliases expand to" in out and "the limit is 100,000" in out
    assert seconds < CPU_AT_ONCE


def test_a_recursive_yaml_alias_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "loop.yaml"
    doc.write_text("specificationVersion: jobtemplate-2023-09\nname: &n [x, *n]\n")
    code, out, _ = cli("check", doc)
    assert code == 2, out
    assert "recursive" in out


def test_a_few_yaml_aliases_are_still_accepted(tmp_path: Path) -> None:
    doc = tmp_path / "aliases.yaml"
    doc.write_text(
        TEMPLATE.replace("  parameterSpace:", "  parameterSpace: &space").replace(
            "  script:", "  script: &script"
        )
        + "- name: Again\n  parameterSpace: *space\n  script: *script\n"
    )
    code, out, _ = cli("check", doc)
    assert code == 0, out


# --- parameter spaces too large to build ------------------------------------------------------


def test_a_step_of_a_trillion_tasks_is_refused_at_once(tmp_path: Path, template: Path) -> None:
    code, out, seconds = cli("run", template, "--store", tmp_path / "store", "-p", f"N={10**12}")
    assert code == 2, out
    assert "Work" in out
    assert "1,000,000,000,000 tasks" in out
    assert f"the limit is {MAX_TASKS_PER_STEP:,} tasks per step" in out
    assert seconds < CPU_AT_ONCE


def test_check_warns_of_a_step_too_large_with_the_defaults_and_run_refuses_it(
    tmp_path: Path,
) -> None:
    """``check`` accepts a template whose defaults make a step too large (other values may
    not, and ``openjd check`` accepts it) and warns that ``run`` refuses it as it is."""
    path = tmp_path / "big.yaml"
    path.write_text(TEMPLATE.replace("default: 2}", f"default: {10**7}}}"))
    code, out, _ = cli("check", path)
    assert code == 0, out
    assert "warning: with its parameters' defaults steps[0] (Work): the parameter space has " in out
    assert "10,000,000 tasks" in out and "run refuses that; give smaller values with -p" in out
    proc = subprocess.run(cli_cmd("check", str(path), "--json"), capture_output=True, text=True)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["warnings"]) == 1, proc.stdout
    code, out, _ = cli("run", path, "--store", tmp_path / "store")
    assert code == 2 and "10,000,000 tasks" in out, out
    small = tmp_path / "small.yaml"
    small.write_text(TEMPLATE)
    proc = subprocess.run(cli_cmd("check", str(small), "--json"), capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(proc.stdout)["warnings"] == [], proc.stdout


def test_a_chunked_step_of_a_trillion_frames_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "chunked.yaml"
    path.write_text(CHUNKED)
    code, out, seconds = cli("run", path, "--store", tmp_path / "store", "-p", f"N={10**12}")
    assert code == 2, out
    assert "Frame" in out and "1,000,000,000,000 frames" in out
    assert f"the limit is {MAX_TASKS_PER_STEP:,}" in out
    assert seconds < CPU_AT_ONCE


AB = """\
specificationVersion: 'jobtemplate-2023-09'
name: AB
parameterDefinitions: [{name: A, type: INT}, {name: B, type: INT}]
steps:
- name: S
  parameterSpace:
    taskParameterDefinitions: [{name: I, type: INT, range: "{{Param.A}}-{{Param.B}}"}]
  script: {actions: {onRun: {command: echo, args: ["{{Task.Param.I}}"]}}}
"""


def test_a_range_from_parameters_too_large_to_count_is_refused_not_a_crash(
    tmp_path: Path,
) -> None:
    """openjd-model's ``len()`` of a range of more than 2**63 values raises OverflowError
    (found by a hostile-input try: an internal error, exit 70)."""
    path = tmp_path / "ab.yaml"
    path.write_text(AB)
    code, out, _ = cli(
        "run", path, "--store", tmp_path / "store",
        "-p", f"A={-(2**63)}", "-p", f"B={2**63 - 1}",
    )  # fmt: skip
    assert code == 2, out
    assert "too large to count" in out and f"at most {MAX_TASKS_PER_STEP:,} tasks" in out
    assert "Traceback" not in out


def test_prepare_job_refuses_a_step_over_the_limit_for_every_adapter(template: Path) -> None:
    """The check is in prepare_job, so the CLI, Airflow and Prefect all get it."""
    start = time.process_time()
    with pytest.raises(TemplateError) as info:
        prepare_job(template, {"N": MAX_TASKS_PER_STEP + 1})
    assert time.process_time() - start < CPU_AT_ONCE
    assert f"{MAX_TASKS_PER_STEP + 1:,} tasks" in str(info.value)
    assert info.value.too_large == info.value.problems  # the one problem is the step's size
    with pytest.raises(TemplateError) as info:  # the largest INT: its size again
        prepare_job(template, {"N": 2**63 - 1})
    assert info.value.too_large and info.value.too_large == info.value.problems
    with pytest.raises(TemplateError) as info:  # another problem is not
        prepare_job(template, {"N": "x"})
    assert info.value.problems and info.value.too_large == []
    job = prepare_job(template, {"N": MAX_TASKS_PER_STEP})
    assert task_count(job, "Work") == MAX_TASKS_PER_STEP


# --- parameter values no task could be given ---------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity", "1e309", "-1e400"])
def test_a_float_that_is_not_finite_is_refused(tmp_path: Path, template: Path, value: str) -> None:
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "-p", f"F={value}")
    assert code == 2, out
    assert "job parameters: F:" in out and value in out
    assert "ran" not in out.split()


def test_a_nul_byte_in_a_parameter_value_is_refused(tmp_path: Path, template: Path) -> None:
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"S": "a\x00b"}))
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "-p", f"@{params}")
    assert code == 2, out
    assert "job parameters: S:" in out and "NUL" in out


def test_a_value_too_long_for_one_argument_is_refused(tmp_path: Path, template: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("S: " + "x" * 200_000 + "\n")
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "-p", f"@{params}")
    assert code == 2, out
    assert "job parameters: S:" in out and "200,000 bytes" in out
    assert "steps[0].script.actions.onRun.args" in out


# --- integers longer than Python converts (sys.get_int_max_str_digits: 4,300 digits) ----------

HUGE = "9" * 5000


def _refused_naming(code: int, out: str, *fields: str) -> None:
    assert code == 2, out[-2000:]
    assert "Traceback" not in out and "internal error" not in out, out[-2000:]
    assert HUGE not in out  # the message says how long, it does not echo 5,000 digits
    for field in fields:
        assert field in out, out[-2000:]
    assert "5,000 digits" in out, out[-2000:]
    assert "ran" not in out.split()


@pytest.mark.parametrize(
    ("where", "replaced", "field"),
    [
        (
            "- {name: N, type: INT, default: 2}",
            "- {name: N, type: INT, default: %s}",
            "parameterDefinitions[0].default",
        ),
        (
            "- {name: N, type: INT, default: 2}",
            "- {name: N, type: INT, default: 2, minValue: %s}",
            "parameterDefinitions[0].minValue",
        ),
        (
            'range: "1-{{Param.N}}"',
            "range: [1, %s]",
            "steps[0].parameterSpace.taskParameterDefinitions[0].range[1]",
        ),
        (
            "- {name: S, type: STRING, default: x}",
            "- {name: S, type: STRING, default: %s}",
            "parameterDefinitions[2].default",
        ),
    ],
    ids=["default", "minValue", "range", "not-an-INT-field"],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("command", ["check", "run"])
def test_an_integer_too_long_to_convert_in_a_template_is_refused_naming_the_field(
    tmp_path: Path, where: str, replaced: str, field: str, suffix: str, command: str
) -> None:
    """Issue 22, item 5: exit 2 naming the field, not an internal error (exit 70)."""
    import yaml

    assert where in TEMPLATE
    path = tmp_path / f"job{suffix}"
    if suffix == ".json":  # the same document, the integer written as JSON writes it
        doc = yaml.safe_load(TEMPLATE.replace(where, replaced % "123456789"))
        path.write_text(json.dumps(doc).replace("123456789", HUGE))
    else:
        path.write_text(TEMPLATE.replace(where, replaced % HUGE))
    args: list[str | Path] = [command, path]
    if command == "run":
        args += ["--store", tmp_path / "store"]
    code, out, _ = cli(*args)
    _refused_naming(code, out, field, str(path))


@pytest.mark.parametrize("form", ["NAME=VALUE", "inline-json", "yaml-file", "json-file"])
def test_an_integer_too_long_to_convert_in_a_job_parameter_is_refused_naming_it(
    tmp_path: Path, template: Path, form: str
) -> None:
    if form == "NAME=VALUE":
        arg = f"N={HUGE}"
    elif form == "inline-json":
        arg = '{"N": ' + HUGE + "}"
    else:
        params = tmp_path / ("params.yaml" if form == "yaml-file" else "params.json")
        params.write_text(f"N: {HUGE}\n" if form == "yaml-file" else '{"N": ' + HUGE + "}")
        arg = f"file://{params}"
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "-p", arg)
    _refused_naming(code, out, "N")
    if form != "NAME=VALUE":
        assert "-p/--job-param" in out


def test_an_integer_too_long_to_convert_in_an_environment_is_refused(
    tmp_path: Path, template: Path
) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(
        ENVIRONMENT.replace("environment:\n", f"parameterDefinitions:\n- {{name: E, type: INT, "
                            f"default: {HUGE}}}\nenvironment:\n", 1)
    )  # fmt: skip
    code, out, _ = cli("run", template, "--store", tmp_path / "store", "--environment", env)
    _refused_naming(code, out, "--environment", "parameterDefinitions[0].default")


def test_prepare_job_refuses_an_integer_too_long_to_convert(template: Path) -> None:
    """The adapters' path: a value given to prepare_job, as a DAG run's conf or a flow's
    parameters pass it."""
    with pytest.raises(TemplateError) as caught:
        prepare_job(template, {"N": HUGE})
    assert "job parameters: N:" in str(caught.value) and "5,000 digits" in str(caught.value)
    assert HUGE not in str(caught.value)


# --- absurd option values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-parallel", str(10**12)),
        ("--max-parallel", "0"),
        ("--keep-generations", str(10**20)),
        ("--timeout", "1e300"),
        ("--timeout", "nan"),
        ("--finally-timeout", "inf"),
    ],
)
def test_absurd_run_options_are_refused(
    tmp_path: Path, template: Path, option: str, value: str
) -> None:
    code, out, _ = cli("run", template, "--store", tmp_path / "store", option, value)
    assert code == 2, out
    assert f"argument {option}: {value!r} must be" in out
    assert "ran" not in out.split()


def test_absurd_stop_wait_and_retention_are_refused(tmp_path: Path) -> None:
    code, out, _ = cli(
        "stop", "some-run", "--mode", "Cancelled", "--wait", "1e300", "--store", tmp_path
    )
    assert code == 2 and "argument --wait: '1e300' must be" in out, out
    code, out, _ = cli("gc", "--retention-days", "1e300", "--store", tmp_path)
    assert code == 2 and "argument --retention-days: '1e300' must be" in out, out
