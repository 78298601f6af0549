"""Run the public OpenJD conformance test data through ``openjd-checkpoint`` and report the rate.

The data (``conformance-tests/2023-09/`` of OpenJobDescription/openjd-specifications) is read
from ``$OPENJD_CONFORMANCE_ROOT`` or ``/work/shared/conformance/conformance-tests/2023-09``.
The format is described in that project's ``conformance-tests/README.md`` (and its later
versions): this module implements the assertion keys of ``README-newer-b.md``
(``expected.output``/``forbidden`` and their ``_posix``/``_windows`` variants, ``taskFailure``,
``expectedError``, ``outputSequence``, ``taskCount``, ``runOn``) plus the rule that a valid job
test without ``taskFailure`` must exit 0 (``README-newer-a.md``; ``lenient=True`` drops it).

Job tests (``jobs/*.test.yaml``) run the real CLI in a subprocess, one fresh temporary directory
(template, environment templates, path mapping rules, checkpoint store) per case, with the
options spelled as ``openjd run`` users write them (``--job-param``, inline JSON, ``file://``,
``--environment``/``--env`` repeated; see ``build_command``). Template fixtures
(``job_templates/*.yaml``, ``env_templates/*.yaml``) are validated by the CLI's ``check``
command in a subprocess, as ``openjd check`` users do.

Usage, from the repository root::

    .venv/bin/python -m tests.conformance [--root DIR] [--jobs N] [--lenient] [-v]
        [--cli "COMMAND PREFIX"] [DIR ...]

DIRs are relative to --root (default: every directory of ``ALL_DIRS``, which is every folder of
the data, ``proposed/`` ones included). The exit status is 1 if any case failed (``proposed/``
included: every POSIX case is expected to pass or be skipped with a reason). A CLI crash (a
Python traceback) never counts as a refusal of an ``.invalid`` fixture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

try:
    from tests.forked_cli import popen_cli
except ImportError:  # run as a script from the tests folder
    from forked_cli import popen_cli  # type: ignore[no-redef]

REPO_ROOT = Path(__file__).resolve().parent.parent
# shared/ lies beside the repository's folder (in CI too).
DEFAULT_ROOT = Path(
    os.environ.get(
        "OPENJD_CONFORMANCE_ROOT",
        Path(__file__).resolve().parents[2] / "shared/conformance/conformance-tests/2023-09",
    )
)
OURS_ROOT = REPO_ROOT / "conformance" / "2023-09"
"""This project's own data (CHECKPOINT, FINALLY), run by ``tests/conformance_interrupt.py``."""
EXTENSION_DIRS = [
    f"{ext}/{kind}"
    for ext, kinds in (
        ("EXPR", ("job_templates", "env_templates", "jobs")),
        ("WRAP_ACTIONS", ("env_templates", "jobs")),
        ("FEATURE_BUNDLE_1", ("job_templates", "env_templates", "jobs")),
        ("REDACTED_ENV_VARS", ("jobs",)),
    )
    for kind in kinds
]
"""The extensions' data (``--extensions`` runs only these)."""
MAIN_DIRS = [
    "base/job_templates",
    "base/env_templates",
    "base/jobs",
    "TASK_CHUNKING/job_templates",
    "TASK_CHUNKING/jobs",
    *EXTENSION_DIRS,
]
PROPOSED_DIRS = [
    "base/job_templates/proposed",
    "base/jobs/proposed",
    "TASK_CHUNKING/jobs/proposed",
    "EXPR/job_templates/proposed",
    "EXPR/jobs/proposed",
    "FEATURE_BUNDLE_1/jobs/proposed",
    "WRAP_ACTIONS/jobs/proposed",
]
ALL_DIRS = MAIN_DIRS + PROPOSED_DIRS
"""Every folder of the 2023-09 data (``fixture_dirs`` finds them; tests/test_conformance.py
checks that this list names each one)."""
TEMPLATE_KINDS = ("job_templates", "env_templates")
CASE_TIMEOUT_SECONDS = 60.0
PLATFORM = "windows" if os.name == "nt" else "posix"

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

CONFLICTING_CASES = {
    "EXPR/jobs/2.12--list-path-param-mapping-posix.test.yaml": (
        "contradicts 2.12--list-path-default-absolute-posix.invalid (an absolute LIST[PATH] "
        "default element must be refused, 2.12 with 2.2); we follow the .invalid case "
        "(openjd run 0.8 passes this one and fails that one)"
    ),
    "EXPR/jobs/2.12--list-path-param-runtime.test.yaml": (
        "expects RawParam of a LIST[PATH] default unjoined, contradicting "
        "2.12--list-path-default-item-allowed-values-checked-after-join.invalid (default "
        "elements are joined with the template's folder, as PATH defaults are, 2.2); we follow "
        "the .invalid case (openjd run 0.8 passes this one and fails that one)"
    ),
}
"""Fixtures that two others contradict, or that contradict a decision of ours: skipped with the
reason (docs/decisions.md, "Extensions")."""

# A line of task output as our CLI prints it: "[<Step>] text" or "[<Step>[<k=v, ...>]] text".
_TASK_PREFIX = re.compile(r"^\[([^\[\]\n]+?)(\[[^\n]*?\])?\] ", re.MULTILINE)
# The run summary on stderr: "openjd-checkpoint: run <id> <status> (2 succeeded, 1 failed)".
_RUN_SUMMARY = re.compile(r"^openjd-checkpoint: run \S+ \w+ \(([^)\n]*)\)$", re.MULTILINE)
# A process exit code as conforming CLIs print it ("Process exited with code: 42"), the only
# form the data's README reads ("the first non-zero `exited with code: <N>` line").
_EXIT_CODE = re.compile(r"exited with code: (-?\d+)")
# An uncaught exception in the CLI itself (task output is prefixed, so cannot match this).
_CRASH = re.compile(r"^Traceback \(most recent call last\):$", re.MULTILINE)


@dataclass
class CaseResult:
    """The verdict on one fixture.

    Attributes:
        name: the fixture's path relative to the suite root (``base/jobs/x.test.yaml``).
        group: the directory it was found in (``base/jobs``, ``TASK_CHUNKING/jobs/proposed``).
        status: ``PASS``, ``FAIL`` or ``SKIP``.
        reason: a short explanation (why it failed or was skipped).
        exit_code: the CLI's exit code (None for in-process validation and skips).
        output: the combined stdout+stderr of the CLI.
        seconds: wall time of the case.
        command: the CLI command line (shell-quoted, relative to the case's directory).
    """

    name: str
    group: str
    status: str
    reason: str = ""
    exit_code: int | None = None
    output: str = ""
    seconds: float = 0.0
    command: str = ""

    @property
    def proposed(self) -> bool:
        return self.group.endswith("/proposed")


# --- fixture discovery ---------------------------------------------------------------------------


def fixture_kind(group: str) -> str:
    """``job_templates``, ``env_templates`` or ``jobs``: the folder's own name, or for a
    ``proposed/`` folder its parent's."""
    path = Path(group)
    return path.parent.name if path.name == "proposed" else path.name


def discover(root: Path, dirs: Sequence[str]) -> list[tuple[str, Path]]:
    """(group, file) for every fixture in ``dirs`` (non-recursive, like the reference runner)."""
    found: list[tuple[str, Path]] = []
    for d in dirs:
        folder = root / d
        pattern = "*.yaml" if fixture_kind(d) in TEMPLATE_KINDS else "*.test.yaml"
        found.extend((d, f) for f in sorted(folder.glob(pattern)) if f.is_file())
    return found


def fixture_dirs(root: Path) -> list[str]:
    """Every folder under ``root`` that holds fixtures (``*.yaml``), relative to it."""
    return sorted(
        d.relative_to(root).as_posix()
        for d in root.rglob("*")
        if d.is_dir() and any(f.is_file() for f in d.glob("*.yaml"))
    )


# --- assertions ------------------------------------------------------------------------------


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def check_expected_error(spec: Any, output: str) -> str | None:
    """``expectedError`` (a string, or ``contains``/``anyOf``): None if it holds, else why not."""
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = {"contains": spec}
    if not isinstance(spec, dict):
        return f"unreadable expectedError {spec!r}"
    missing = [s for s in _as_list(spec.get("contains")) if str(s) not in output]
    if missing:
        return f"expectedError: missing {missing[0]!r}"
    any_of = [str(s) for s in _as_list(spec.get("anyOf"))]
    if any_of and not any(s in output for s in any_of):
        return f"expectedError: none of {any_of!r}"
    return None


def check_sequences(chains: Any, output: str, key: str) -> str | None:
    """``outputSequence``: a flat list is one chain, a list of lists is independent chains."""
    if not chains:
        return None
    if all(isinstance(c, list) for c in chains):
        chain_list = chains
    else:
        chain_list = [chains]
    for chain in chain_list:
        pos = 0
        for i, entry in enumerate(chain):
            found = output.find(str(entry), pos)
            if found < 0:
                where = "missing" if str(entry) not in output else "out of order"
                return f"{key}: {entry!r} (entry {i + 1} of {len(chain)}) {where}"
            pos = found + len(str(entry))
    return None


def count_task_runs(output: str) -> tuple[int | None, int]:
    """(task runs from the CLI's run summary line or None, distinct ``[task]`` output prefixes).

    The summary line counts every task execution; the prefixes miss tasks that printed nothing.
    """
    summary: int | None = None
    m = _RUN_SUMMARY.search(output)
    if m:
        summary = sum(int(n) for n in re.findall(r"(\d+) \w+", m.group(1)))
    prefixes = {mm.group(0) for mm in _TASK_PREFIX.finditer(output)}
    return summary, len(prefixes)


def first_nonzero_exit_code(output: str) -> int | None:
    for m in _EXIT_CODE.finditer(output):
        code = int(m.group(1))
        if code != 0:
            return code
    return None


def check_job_output(test: dict[str, Any], output: str, exit_code: int, *, lenient: bool) -> str:
    """Every assertion of a valid (non-``.invalid``) job test; '' if all hold."""
    expected = test.get("expected") or {}
    if not isinstance(expected, dict):
        return "unreadable 'expected' block"
    failure = expected.get("taskFailure")
    if failure is not None:
        if exit_code == 0:
            return "taskFailure: the run succeeded (exit 0)"
        want = failure.get("exitCode") if isinstance(failure, dict) else None
        if want is not None:
            got = first_nonzero_exit_code(output)
            if got is None:
                return f"taskFailure: no 'exited with code' line in the output (want {want})"
            if got != int(want):
                return f"taskFailure: first non-zero exit code is {got}, want {want}"
    elif exit_code != 0 and not lenient:
        return f"exit code {exit_code} (a valid test without taskFailure must exit 0)"
    for entry in _as_list(expected.get("output")) + _as_list(expected.get(f"output_{PLATFORM}")):
        if isinstance(entry, dict):  # {anyOf: [...]}: implementations phrase it differently
            any_of = [str(s) for s in _as_list(entry.get("anyOf"))]
            if any_of and not any(s in output for s in any_of):
                return f"missing output: none of {any_of!r}"
            missing = [str(s) for s in _as_list(entry.get("contains")) if str(s) not in output]
            if missing:
                return f"missing output {missing[0]!r}"
        elif str(entry) not in output:
            return f"missing output {str(entry)!r}"
    for entry in _as_list(expected.get("forbidden")) + _as_list(
        expected.get(f"forbidden_{PLATFORM}")
    ):
        strings = (
            [str(s) for v in entry.values() for s in _as_list(v)]
            if isinstance(entry, dict)
            else [str(entry)]
        )
        for line in strings:
            if line in output:
                return f"forbidden output {line!r}"
    for key in ("outputSequence", f"outputSequence_{PLATFORM}"):
        problem = check_sequences(expected.get(key), output, key)
        if problem:
            return problem
    want_count = expected.get("taskCount")
    if want_count is not None:
        summary, prefixes = count_task_runs(output)
        got = summary if summary is not None else prefixes
        if got != int(want_count):
            return (
                f"taskCount: {got} task runs, want {want_count} "
                f"(summary line: {summary}, distinct output prefixes: {prefixes})"
            )
    return ""


# --- running one job test ------------------------------------------------------------------------


def _python_dir(scratch: Path) -> str:
    """A directory whose ``python``/``python3`` is ``sys.executable`` (the tests call
    ``python``): the executable's own directory if it has them, else a directory of links."""
    own = Path(sys.executable).parent
    if (own / "python").exists() and (own / "python3").exists():
        return str(own)
    shim = scratch / "python-shim"
    shim.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = shim / name
        if not link.exists():
            link.symlink_to(sys.executable)
    return str(shim)


def _subprocess_env(python_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OPENJD_CHECKPOINT_STORE", None)
    env["PATH"] = python_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def default_cli() -> list[str]:
    """The CLI under test: this interpreter running ``core.cli``."""
    return [sys.executable, "-m", "core.cli"]


def spelling(name: str, kinds: int) -> int:
    """Which of ``kinds`` spellings a case uses: fixed per case, spread over the cases (so the
    suite exercises each way ``openjd run`` users write an option)."""
    return zlib.crc32(name.encode("utf-8")) % kinds


def build_command(
    test: dict[str, Any], workdir: Path, cli: Sequence[str] | None = None, name: str = ""
) -> list[str]:
    """Write the test's template, environments and path mapping rules into ``workdir`` and
    return the CLI command that runs it, spelled as ``openjd run`` users write it:

    - job parameters: ``--job-param NAME=VALUE`` each, one inline JSON object
      (``--job-param '{"N": 5}'``), or ``--job-param file://params.yaml`` (by ``spelling``);
    - environment templates: ``--environment FILE`` and ``--env FILE``, repeated, in order;
    - path mapping rules: inline JSON, ``file://rules.json`` or ``file://rules.yaml``.
    """
    template = workdir / "template.yaml"
    template.write_text(yaml.safe_dump(test["template"], sort_keys=False), encoding="utf-8")
    cmd = [*(cli or default_cli()), "run", str(template)]
    cmd += ["--store", str(workdir / "store"), "-q"]
    params = test.get("parameters") or {}
    if params:
        form = spelling(name, 3)
        if form == 0:  # NAME=VALUE; a LIST[...] value is given as JSON (EXPR 2.12)
            for key, value in params.items():
                if isinstance(value, (list, dict)):
                    value = json.dumps(value)
                cmd += ["--job-param", f"{key}={value}"]
        elif form == 1:
            cmd += ["--job-param", json.dumps(params)]
        else:
            path = workdir / "params.yaml"
            path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
            cmd += ["--job-param", f"file://{path}"]
    for i, env_tmpl in enumerate(test.get("environments") or []):
        path = workdir / f"env-{i}.yaml"
        path.write_text(yaml.safe_dump(env_tmpl, sort_keys=False), encoding="utf-8")
        cmd += ["--environment" if i % 2 == 0 else "--env", str(path)]
    rules = test.get("pathMapping")
    if rules:
        doc = {"version": "pathmapping-1.0", "path_mapping_rules": rules}
        form = spelling(name, 3)
        if form == 0:
            cmd += ["--path-mapping-rules", json.dumps(doc)]
        elif form == 1:
            path = workdir / "path-mapping.json"
            path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
            cmd += ["--path-mapping-rules", f"file://{path}"]
        else:
            path = workdir / "path-mapping.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            cmd += ["--path-mapping-rules", f"file://{path}"]
    return cmd


def _run_cli(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str]:
    """Run the CLI (``tests/forked_cli.py``: forked from a server that imported it once, when it
    is ours); (exit code or None on timeout, combined output in order)."""
    proc = popen_cli(cmd, cwd=cwd, env=env)
    try:
        out, _ = proc.communicate(timeout=CASE_TIMEOUT_SECONDS)
        return proc.returncode, out.decode("utf-8", errors="replace")
    except subprocess.TimeoutExpired:
        # SIGTERM lets the CLI stop its tasks (their own process groups); then kill.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return None, out.decode("utf-8", errors="replace")


def run_job_test(
    path: Path,
    group: str,
    name: str,
    scratch: Path,
    *,
    lenient: bool = False,
    cli: Sequence[str] | None = None,
) -> CaseResult:
    started = time.monotonic()
    result = CaseResult(name=name, group=group, status=FAIL)
    try:
        test = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        result.reason = f"unreadable fixture: {exc}"
        return result
    if not isinstance(test, dict) or "template" not in test:
        result.reason = "fixture has no 'template'"
        return result
    if name in CONFLICTING_CASES:
        result.status, result.reason = SKIP, CONFLICTING_CASES[name]
        return result
    run_on = _as_list(test.get("runOn"))
    if run_on and PLATFORM not in run_on:
        result.status, result.reason = SKIP, f"runOn {run_on}"
        return result
    invalid = ".invalid." in path.name
    with tempfile.TemporaryDirectory(prefix="case-", dir=scratch) as tmp:
        workdir = Path(tmp)
        cmd = build_command(test, workdir, cli, name)
        code, output = _run_cli(cmd, workdir, _subprocess_env(_python_dir(scratch)))
    result.exit_code, result.output = code, output
    result.command = shlex.join(cmd).replace(str(workdir) + os.sep, "")
    result.seconds = time.monotonic() - started
    if code is None:
        result.reason = f"timed out after {CASE_TIMEOUT_SECONDS:g} s"
        return result
    crash = _CRASH.search(output)
    if crash:  # a crash is neither a refusal nor a run
        last = [ln for ln in output[crash.end() :].splitlines() if ln and not ln[0].isspace()]
        result.reason = f"CLI crashed (exit {code}): {last[0] if last else 'traceback'}"
        return result
    if invalid:
        if code == 0:
            result.reason = "accepted and ran (exit 0); must be refused"
            return result
        problem = check_expected_error(test.get("expectedError"), output)
        if problem:
            result.reason = problem
            return result
        result.status = PASS
        result.reason = (
            f"refused at job creation (exit {code})"
            if code == 2
            else f"refused at run time (exit {code})"
        )
        if test.get("expected"):
            result.reason += "; its 'expected' block is not enforced for .invalid"
        return result
    problem = check_job_output(test, output, code, lenient=lenient)
    if problem:
        result.reason = problem
        return result
    result.status, result.reason = PASS, f"exit {code}"
    return result


# --- template validation ----------------------------------------------------------------------


def leading_directive(text: str) -> Any:
    """``expectedError`` from the contiguous ``#`` comment block at the top of a fixture."""
    block: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        block.append(line[1:][1:] if line.startswith("# ") else line[1:])
    if not any(re.match(r"\s*expectedError\s*:", b) for b in block):
        return None
    start = next(i for i, b in enumerate(block) if re.match(r"\s*expectedError\s*:", b))
    chunk = [block[start]] + [b for b in block[start + 1 :] if b.startswith((" ", "\t"))]
    try:
        data = yaml.safe_load("\n".join(chunk))
    except yaml.YAMLError:
        return None
    return data.get("expectedError") if isinstance(data, dict) else None


def run_template_test(
    path: Path, group: str, name: str, scratch: Path, *, cli: Sequence[str] | None = None
) -> CaseResult:
    """Validate a fixture as ``openjd check`` users do: the CLI's ``check`` command in a
    subprocess (which validates an environment template as one, by its specificationVersion).
    Exit 0 is acceptance, exit 2 a refusal; anything else, or a traceback, fails the case."""
    started = time.monotonic()
    invalid = ".invalid." in path.name
    result = CaseResult(name=name, group=group, status=FAIL)
    if name in CONFLICTING_CASES:
        result.status, result.reason = SKIP, CONFLICTING_CASES[name]
        return result
    cmd = [*(cli or default_cli()), "check", str(path)]
    result.command = shlex.join(cmd)
    code, output = _run_cli(cmd, scratch, _subprocess_env(_python_dir(scratch)))
    result.exit_code, result.output = code, output
    result.seconds = time.monotonic() - started
    if code is None:
        result.reason = f"timed out after {CASE_TIMEOUT_SECONDS:g} s"
        return result
    if _CRASH.search(output) or code not in (0, 2):
        result.reason = f"check crashed (exit {code}): {_first_line(output)}"
        return result
    # the message without the "openjd-checkpoint: <file>: " prefix
    error = output.replace(f"{path.resolve()}: ", "").replace(f"{path}: ", "")
    if invalid and code == 0:
        result.reason = "accepted; must be refused"
    elif not invalid and code != 0:
        result.reason = "refused: " + _first_line(error)
    elif invalid:
        problem = check_expected_error(leading_directive(path.read_text(encoding="utf-8")), error)
        if problem:
            result.reason = problem
        else:
            result.status, result.reason = PASS, "refused: " + _first_line(error)
    else:
        result.status, result.reason = PASS, "accepted"
    return result


def _first_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = " | ".join(lines[:2]) if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- the suite ----------------------------------------------------------------------------------


def run_suite(
    root: Path,
    dirs: list[str],
    *,
    workers: int = 2,
    lenient: bool = False,
    cli: Sequence[str] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run every fixture of ``dirs`` (relative to ``root``, e.g. ``base/jobs``); results in
    discovery order.

    Args:
        workers: cases run at once.
        lenient: do not require exit 0 from valid job tests without ``taskFailure``.
        cli: the command prefix of the CLI under test (default: ``python -m core.cli``).
        on_result: called as each case ends (from a worker thread).
    """
    root = Path(root)
    cases = discover(root, dirs)
    with tempfile.TemporaryDirectory(prefix="openjd-conformance-") as scratch_name:
        scratch = Path(scratch_name)

        def one(case: tuple[str, Path]) -> CaseResult:
            group, path = case
            name = path.relative_to(root).as_posix()
            try:
                if fixture_kind(group) in TEMPLATE_KINDS:
                    res = run_template_test(path, group, name, scratch, cli=cli)
                else:
                    res = run_job_test(path, group, name, scratch, lenient=lenient, cli=cli)
            except Exception as exc:  # a harness bug must not hide the other cases
                res = CaseResult(name, group, FAIL, f"harness error {type(exc).__name__}: {exc}")
            if on_result is not None:
                on_result(res)
            return res

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(one, cases))


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def run(self) -> int:
        return self.passed + self.failed

    @property
    def rate(self) -> float:
        return self.passed / self.run if self.run else 1.0

    def line(self, label: str) -> str:
        text = f"{label}: {self.passed}/{self.run} passed ({100 * self.rate:.1f}%)"
        return text + (f", {self.skipped} skipped" if self.skipped else "")


def tally(results: Iterable[CaseResult]) -> Tally:
    t = Tally()
    for r in results:
        if r.status == PASS:
            t.passed += 1
        elif r.status == FAIL:
            t.failed += 1
        else:
            t.skipped += 1
    return t


def format_case(r: CaseResult) -> str:
    return f"{r.status} {r.name}" + (f" -- {r.reason}" if r.reason else "")


def summary_lines(results: list[CaseResult]) -> list[str]:
    """Per-directory rates, then the total over the non-proposed directories and the proposed."""
    groups: list[str] = []
    for r in results:
        if r.group not in groups:
            groups.append(r.group)
    lines = [tally(r for r in results if r.group == g).line(g) for g in groups]
    main = [r for r in results if not r.proposed]
    proposed = [r for r in results if r.proposed]
    if main:
        lines.append(tally(main).line("Total (excluding proposed/)"))
    if proposed:
        lines.append(tally(proposed).line("Proposed (reported separately)"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance",
        description="Run the OpenJD conformance test data through openjd-checkpoint.",
    )
    parser.add_argument("dirs", nargs="*", help=f"directories under --root (default: {ALL_DIRS})")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the 2023-09 directory")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument(
        "--lenient", action="store_true", help="do not require exit 0 from valid job tests"
    )
    parser.add_argument(
        "--cli", help="the CLI command prefix to test (default: python -m core.cli)"
    )
    parser.add_argument(
        "--extensions", action="store_true", help=f"run the extensions' data: {EXTENSION_DIRS}"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print failures' output")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"conformance data not found: {args.root}", file=sys.stderr)
        return 2
    cli = shlex.split(args.cli) if args.cli else None
    if cli and os.sep in cli[0] and Path(cli[0]).exists():  # cases run in their own directory
        cli[0] = os.path.abspath(cli[0])  # not resolve(): keep a venv's python link
    results = run_suite(
        args.root,
        args.dirs or (EXTENSION_DIRS if args.extensions else ALL_DIRS),
        workers=args.jobs,
        lenient=args.lenient,
        cli=cli,
    )
    for r in results:
        print(format_case(r))
        if args.verbose and r.status == FAIL and r.command:
            print("    $ " + r.command)
        if args.verbose and r.status == FAIL and r.output:
            print("    | " + r.output.rstrip().replace("\n", "\n    | "))
    print()
    for line in summary_lines(results):
        print(line)
    return 0 if all(r.status != FAIL for r in results) else 1


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: make ``core`` importable
        sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
