"""Run this project's own conformance data (``conformance/2023-09/``: CHECKPOINT and FINALLY)
through ``openjd-checkpoint``, interruptions and later attempts included.

The data uses the public format (``tests/conformance.py`` implements it) plus a few keys for
jobs that are interrupted and run again; ``conformance/README.md`` describes them:

- ``interrupt: {after: TEXT, mode: MODE, via: signal|stop, refused: BOOL}`` (or a list of
  them, delivered in order): once a line of the attempt's output contains TEXT, the scheduler
  requests interruption with MODE (``Suspended``, ``Cancelled``, ``CancelledRunFinally``,
  ``StoppedRunFinally``); with ``refused: true`` the scheduler must refuse the request. Our
  CLI's spelling: ``Suspended`` is SIGTERM to the CLI process (``via: stop`` sends ``stop
  --mode Suspended`` instead); the other modes are ``openjd-checkpoint stop RUN_ID --mode
  MODE`` (a refusal is its exit 4).
- ``expected.outcome``: how the attempt ends: ``Succeeded`` (exit 0), ``Failed`` (1),
  ``Suspended`` (75), ``Cancelled`` / ``Stopped`` (130, told apart by the run summary) or
  ``Refused`` (4: a resume refused, nothing ran).
- ``expected.resumeStatus``: ``{STEP: RESUMED|DISCARDED|UNKNOWN}``, the resume status the
  scheduler records for the step's resumed task (our CLI notes ``STEP: resume status X``).
- ``limits: {runSeconds: S, finallySeconds: S}``: the regular steps' and the finally steps'
  time budgets (our ``--timeout`` and ``--finally-timeout``); ``checkpointFiles: shared|managed``:
  how checkpoint files reach a resuming host (our ``--files``). Both may stand at the top or in
  an attempt of ``then``.
- ``then``: later attempts of the same job, on the same checkpoint store, in order. Each is
  ``{start: retry|resume|fresh, template, parameters, interrupt, expected, expectedError}``:
  ``retry`` submits the job again (``run``), ``resume`` resumes the previous attempt's run by
  its id (``resume RUN_ID``), ``fresh`` requeues it from the top (``run --fresh``). A
  ``template`` or ``parameters`` given there replaces the case's own.

Usage, from the repository root::

    .venv/bin/python -m tests.conformance_interrupt [-v] [--jobs N] [DIR ...]

DIRs are relative to ``conformance/2023-09`` (default: all of ``OURS_DIRS``).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make ``tests`` and ``core`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conformance import (  # noqa: E402
    _CRASH,
    CASE_TIMEOUT_SECONDS,
    FAIL,
    OURS_ROOT,
    PASS,
    PLATFORM,
    SKIP,
    CaseResult,
    _as_list,
    _python_dir,
    _subprocess_env,
    build_command,
    check_expected_error,
    check_job_output,
    default_cli,
    discover,
    format_case,
    run_job_test,
    run_template_test,
    summary_lines,
)
from tests.forked_cli import popen_cli  # noqa: E402

OURS_DIRS = [
    "CHECKPOINT/job_templates",
    "CHECKPOINT/jobs",
    "FINALLY/job_templates",
    "FINALLY/jobs",
]
"""Our extensions' folders under ``OURS_ROOT``."""

MODES = ("Suspended", "Cancelled", "CancelledRunFinally", "StoppedRunFinally")
# mode -> the outcome an interrupted attempt has unless its ``expected.outcome`` says otherwise
DEFAULT_OUTCOME = {
    "Suspended": "Suspended",
    "Cancelled": "Cancelled",
    "CancelledRunFinally": "Cancelled",
    "StoppedRunFinally": "Stopped",
}
# outcome -> our CLI's exit code
EXIT_CODE = {
    "Succeeded": 0,
    "Failed": 1,
    "Invalid": 2,
    "Refused": 4,
    "Suspended": 75,
    "Cancelled": 130,
    "Stopped": 130,
}
_RUN_STATUS = re.compile(r"^openjd-checkpoint: run (\S+) (\w+) \(", re.MULTILINE)
_RUN_ID = re.compile(r"^openjd-checkpoint: (?:run|resuming run) (\S+?):? ", re.MULTILINE)


def outcome_of(code: int, output: str) -> str:
    """The outcome of an attempt from our CLI's exit code (and run summary for 130)."""
    if code == 130:
        statuses = [m.group(2) for m in _RUN_STATUS.finditer(output)]
        return "Stopped" if statuses and statuses[-1] == "stopped" else "Cancelled"
    for name, value in EXIT_CODE.items():
        if value == code and name != "Stopped":
            return name
    return f"exit {code}"


class _Attempt:
    """One CLI process, its combined output collected line by line on a thread."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = popen_cli(cmd, cwd=cwd, env=env)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, text: str, deadline: float) -> bool:
        """True once a line contains ``text``; False if the process ended or time ran out."""
        seen = 0
        with self._cond:
            while True:
                if any(text in line for line in self.lines[seen:]):
                    return True
                seen = len(self.lines)
                if not self._reader.is_alive() or time.monotonic() > deadline:
                    return False
                self._cond.wait(timeout=0.1)

    def finish(self, deadline: float) -> int | None:
        """The exit code, or None if the attempt outlived ``deadline`` (then it is killed)."""
        try:
            code = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            code = None
        self._reader.join(timeout=10)
        return code


def _live_run(store: Path) -> tuple[str, str] | None:
    """(job key, run id) of the store's running run."""
    from core import CheckpointStore

    try:
        runs, _ = CheckpointStore(store).list_runs()
    except Exception:  # the store is being created by the attempt
        return None
    running = [(r.job_key, r.run_id) for r in runs if r.status.value == "running"]
    return running[-1] if running else None


def request_interruption(
    attempt: _Attempt,
    interrupt: dict[str, Any],
    cli: Sequence[str],
    store: Path,
    cwd: Path,
    env: dict[str, str],
    deadline: float,
    *,
    stop_with_cli: bool = False,
) -> str | None:
    """Deliver ``interrupt`` to the running attempt; None if that went as the case says
    (accepted, or refused when ``refused`` is set), else why not."""
    from core import CheckpointStore

    mode = interrupt["mode"]
    if mode == "Suspended" and interrupt["via"] == "signal":
        attempt.proc.send_signal(signal.SIGTERM)
        return None
    live = None
    while live is None and time.monotonic() < deadline:
        live = _live_run(store)
        if live is None:
            time.sleep(0.1)
    if live is None:
        return "no running run in the store to stop"
    job_key, run_id = live
    if not stop_with_cli:
        # What `openjd-checkpoint stop` calls, made in-process: starting a CLI costs seconds on a
        # loaded machine, and a case's task must still be running when the request lands.
        from core import RunError, request_termination

        try:
            request_termination(CheckpointStore(store), job_key, run_id, mode)
            code, why = 0, ""
        except RunError as exc:
            code, why = 4, str(exc)
    else:
        asked = subprocess.run(
            [*cli, "stop", run_id, "--mode", mode, "--store", str(store)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        code, why = asked.returncode, asked.stderr.strip()
    if interrupt["refused"]:
        if code != 4:
            return f"stop --mode {mode} exited {code}; it must be refused (exit 4)"
        return None
    if code != 0:
        return f"stop --mode {mode} exited {code}: {why}"
    return None


def check_attempt(
    step: dict[str, Any], output: str, code: int, interrupt: dict[str, Any] | None
) -> str:
    """Every assertion of one attempt; '' if all hold."""
    expected = step.get("expected") or {}
    if not isinstance(expected, dict):
        return "unreadable 'expected' block"
    want = expected.get("outcome")
    if want is None and expected.get("taskFailure") is None:
        want = DEFAULT_OUTCOME[interrupt["mode"]] if interrupt else "Succeeded"
    if want is not None:
        if want not in EXIT_CODE:
            return f"unknown outcome {want!r}"
        got = outcome_of(code, output)
        if got != want:
            return f"outcome {got}, want {want}"
    problem = check_job_output({"expected": expected}, output, code, lenient=True)
    if problem:
        return problem
    problem = check_expected_error(step.get("expectedError"), output)
    if problem:
        return problem
    for task, status in (expected.get("resumeStatus") or {}).items():
        pattern = (
            rf"^openjd-checkpoint: {re.escape(str(task))}(?:\[[^\n]*\])?: "
            rf"resume status {re.escape(str(status))}$"
        )
        if not re.search(pattern, output, re.MULTILINE):
            return f"resumeStatus: no '{task}: resume status {status}' note"
    return ""


def scheduler_options(test: dict[str, Any]) -> list[str]:
    """Our CLI's options for the case's ``limits`` and ``checkpointFiles``."""
    opts: list[str] = []
    limits = test.get("limits") or {}
    if "runSeconds" in limits:
        opts += ["--timeout", str(limits["runSeconds"])]
    if "finallySeconds" in limits:
        opts += ["--finally-timeout", str(limits["finallySeconds"])]
    if test.get("checkpointFiles"):
        opts += ["--files", str(test["checkpointFiles"])]
    return opts


def _interrupt_specs(raw: Any) -> list[dict[str, Any]]:
    """The attempt's interruption requests, in order (``interrupt`` is one or a list)."""
    specs = []
    for item in _as_list(raw):
        if not isinstance(item, dict) or "after" not in item or item.get("mode") not in MODES:
            raise ValueError(f"unreadable interrupt {item!r} (needs 'after' and a mode of {MODES})")
        via = item.get("via", "signal" if item["mode"] == "Suspended" else "stop")
        if via not in ("signal", "stop") or (via == "signal" and item["mode"] != "Suspended"):
            raise ValueError(f"interrupt: 'via: {via}' cannot deliver {item['mode']}")
        specs.append(
            {
                "after": str(item["after"]),
                "mode": item["mode"],
                "via": via,
                "refused": bool(item.get("refused", False)),
            }
        )
    return specs


def run_interrupt_test(
    path: Path,
    group: str,
    name: str,
    scratch: Path,
    *,
    cli: Sequence[str] | None = None,
    stop_with_cli: bool = False,
) -> CaseResult:
    """A job test of ``conformance/``: its first attempt, then each of ``then``."""
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
    run_on = _as_list(test.get("runOn"))
    if run_on and PLATFORM not in run_on:
        result.status, result.reason = SKIP, f"runOn {run_on}"
        return result
    stop_with_cli = stop_with_cli or cli is not None  # another CLI: its own store, its own stop
    cli = list(cli or default_cli())
    env = _subprocess_env(_python_dir(scratch))
    steps = [test, *(_as_list(test.get("then")))]
    outputs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="case-", dir=scratch) as tmp:
        workdir = Path(tmp)
        store = workdir / "store"
        run_id: str | None = None
        for i, step in enumerate(steps):
            label = f"attempt {i + 1}"
            try:
                interrupts = _interrupt_specs(step.get("interrupt"))
            except ValueError as exc:
                result.reason = f"{label}: {exc}"
                return result
            start = step.get("start", "submit" if i == 0 else "retry")
            spec = dict(test)
            for key in ("template", "parameters", "limits", "checkpointFiles"):
                if key in step:
                    spec[key] = step[key]
            # Every note the scheduler prints is part of what a case checks (resume statuses,
            # decisions): the attempts run without -q, whose output keeps only what needs a person.
            cmd = [c for c in build_command(spec, workdir, cli) if c != "-q"]
            if start == "fresh":
                cmd.append("--fresh")
            elif start == "resume":
                target = step.get("runId", run_id)
                if target is None:
                    result.reason = f"{label}: no run id from the previous attempt to resume"
                    return result
                cmd = [*cli, "resume", str(target), "--store", str(store)]
                if "template" in step:
                    cmd += ["--template", str(workdir / "template.yaml")]
                for pname, value in (step.get("parameters") or {}).items():
                    cmd += ["-p", f"{pname}={value}"]
            elif start not in ("submit", "retry"):
                result.reason = f"{label}: unknown start {start!r}"
                return result
            cmd += scheduler_options(spec)
            deadline = time.monotonic() + CASE_TIMEOUT_SECONDS
            attempt = _Attempt(cmd, workdir, env)
            for interrupt in interrupts:
                problem = None
                if not attempt.wait_for(interrupt["after"], deadline):
                    problem = f"{interrupt['after']!r} never appeared"
                else:
                    problem = request_interruption(
                        attempt,
                        interrupt,
                        cli,
                        store,
                        workdir,
                        env,
                        deadline,
                        stop_with_cli=stop_with_cli,
                    )
                if problem:
                    attempt.finish(deadline)
                    result.output = "\n".join([*outputs, attempt.output])
                    result.reason = f"{label}: {problem}"
                    return result
            accepted = [x for x in interrupts if not x["refused"]]
            interrupt = accepted[-1] if accepted else None  # the most forceful wins
            code = attempt.finish(deadline)
            output = attempt.output
            outputs.append(f"--- {label} ({shlex.join(cmd[len(cli) :])}) exit {code}\n{output}")
            result.output, result.exit_code = "\n".join(outputs), code
            if code is None:
                result.reason = f"{label}: timed out after {CASE_TIMEOUT_SECONDS:g} s"
                return result
            if _CRASH.search(output):
                result.reason = f"{label}: CLI crashed (exit {code})"
                return result
            problem = check_attempt(step, output, code, interrupt)
            if problem:
                result.reason = f"{label}: {problem}"
                return result
            ids = _RUN_ID.findall(output)
            run_id = ids[-1] if ids else run_id
    result.seconds = time.monotonic() - started
    result.status = PASS
    result.reason = f"{len(steps)} attempt(s)"
    return result


def run_ours(
    dirs: Sequence[str] | None = None,
    *,
    root: Path = OURS_ROOT,
    workers: int = 2,
    cli: Sequence[str] | None = None,
    stop_with_cli: bool = False,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Every fixture of ``dirs`` under ``root``: templates validated by the CLI's ``check``,
    ``.invalid`` job tests as the public harness runs them, the other job tests with
    interruptions (run without ``-q``: the notes are part of what they check)."""
    cases = discover(root, list(dirs or OURS_DIRS))
    with tempfile.TemporaryDirectory(prefix="openjd-conformance-ours-") as scratch_name:
        scratch = Path(scratch_name)

        def one(case: tuple[str, Path]) -> CaseResult:
            group, path = case
            name = path.relative_to(root).as_posix()
            try:
                if Path(group).name in ("job_templates", "env_templates"):
                    res = run_template_test(path, group, name, scratch, cli=cli)
                elif ".invalid." in path.name:
                    res = run_job_test(path, group, name, scratch, cli=cli)
                else:
                    res = run_interrupt_test(
                        path, group, name, scratch, cli=cli, stop_with_cli=stop_with_cli
                    )
            except Exception as exc:  # a harness bug must not hide the other cases
                res = CaseResult(name, group, FAIL, f"harness error {type(exc).__name__}: {exc}")
            if on_result is not None:
                on_result(res)
            return res

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(one, cases))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance_interrupt",
        description="Run conformance/2023-09 (CHECKPOINT, FINALLY) through openjd-checkpoint.",
    )
    parser.add_argument("dirs", nargs="*", help=f"directories under --root (default: {OURS_DIRS})")
    parser.add_argument("--root", type=Path, default=OURS_ROOT, help="the 2023-09 directory")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--cli", help="the CLI command prefix (default: python -m core.cli)")
    parser.add_argument(
        "--stop-with-cli",
        action="store_true",
        help="send stop requests with 'openjd-checkpoint stop' (default: the same call, made "
        "in-process, which lands seconds sooner on a loaded machine; always so with --cli)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print failures' output")
    args = parser.parse_args(argv)
    cli = shlex.split(args.cli) if args.cli else None
    if cli and os.sep in cli[0] and Path(cli[0]).exists():
        cli[0] = os.path.abspath(cli[0])
    results = run_ours(
        args.dirs or OURS_DIRS,
        root=args.root,
        workers=args.jobs,
        cli=cli,
        stop_with_cli=args.stop_with_cli,
    )
    for r in results:
        print(format_case(r))
        if args.verbose and r.status == FAIL and r.output:
            print("    | " + r.output.rstrip().replace("\n", "\n    | "))
    print()
    for line in summary_lines(results):
        print(line)
    return 0 if all(r.status != FAIL for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
