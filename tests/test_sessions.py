"""Sessions as OpenJD runs them (issue 7): environments entered once per session, daemons started
by an environment shared by the step's tasks and stopped by its onExit, nothing left behind after
a Ctrl-C or a SIGKILL of the runner, and a suspend in the middle of a session."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
import time
import zipfile
from pathlib import Path

import psutil
import pytest
from conftest import DATA, CliProcess, run_cli

from core.job import plan_tasks

pytestmark = pytest.mark.slow


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def daemon_pids(directory: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in directory.glob("daemon-*")]


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if running(p)]


def test_a_job_environment_is_entered_once_per_session(tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = run_cli(
        "run", str(DATA / "sessions_job_env.yaml"), "-p", f"Log={log}",
        "--store", str(tmp_path / "store"), "--max-parallel", "2", "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines.count("enter") == 2 and lines.count("exit") == 2, lines
    tasks = [line.split() for line in lines if line.startswith("task ")]
    assert sorted(int(t[1]) for t in tasks) == list(range(1, 9))
    seen = {t[2] for t in tasks}
    assert "MISSING" not in seen and len(seen) == 2  # openjd_env from each session's onEnter
    assert lines.index("exit") > max(i for i, line in enumerate(lines) if line.startswith("task"))


def test_a_step_environment_daemon_serves_every_task_and_is_stopped(tmp_path: Path) -> None:
    d = tmp_path / "daemons"
    d.mkdir()
    done = run_cli(
        "run", str(DATA / "sessions_daemon.yaml"), "-p", f"Dir={d}",
        "--store", str(tmp_path / "store"), "--max-parallel", "1", "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [pid] = daemon_pids(d)  # one session: one daemon for the four tasks
    for frame in range(1, 5):
        assert f"rendered {frame} by daemon {pid} (request {frame})" in done.stdout
    assert done.stdout.count("DAEMON-STOPPED") == 1
    assert wait_gone([pid]) == []


def test_ctrl_c_checkpoints_and_stops_the_daemon(tmp_path: Path) -> None:
    d = tmp_path / "daemons"
    d.mkdir()
    cli = CliProcess(
        "run", str(DATA / "sessions_daemon.yaml"), "-p", f"Dir={d}", "-p", "TaskSeconds=30",
        "--store", str(tmp_path / "store"), "--max-parallel", "1", "-q",
    )  # fmt: skip
    cli.wait_for("rendered 1 by daemon")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75
    pids = daemon_pids(d)
    assert pids and wait_gone(pids) == []
    assert "DAEMON-STOPPED" in cli.stdout  # the environment exited normally


def test_a_killed_runner_leaves_no_daemon_after_the_next_run(tmp_path: Path) -> None:
    d = tmp_path / "daemons"
    d.mkdir()
    args = ["run", str(DATA / "sessions_daemon.yaml"), "-p", f"Dir={d}"]
    args += ["--store", str(tmp_path / "store"), "--max-parallel", "1", "-q"]
    cli = CliProcess(*args, "-p", "TaskSeconds=30")
    cli.wait_for("rendered 1 by daemon")
    cli.proc.send_signal(signal.SIGKILL)
    cli.wait(10)
    [pid] = daemon_pids(d)
    assert running(pid)  # unsupervised now
    again = CliProcess(*args, "-p", "TaskSeconds=30", "--timeout", "5")
    again.wait(120)  # the same job again (its tasks time out: they are not the point)
    assert "left running by a dead session" in again.stderr, again.stderr
    assert pid not in [p for p in daemon_pids(d) if running(p)]
    assert wait_gone(daemon_pids(d)) == []


def test_suspend_in_the_middle_of_a_session(tmp_path: Path) -> None:
    log = tmp_path / "log"
    args = ["run", str(DATA / "sessions_suspend.yaml"), "-p", f"Log={log}"]
    args += ["--store", str(tmp_path / "store"), "-q"]
    cli = CliProcess(*args)
    cli.wait_for("STEP 5")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75
    first = log.read_text().splitlines()
    assert first[0] == "enter" and first[1] == "task from 0"
    assert first[2].startswith("checkpoint ") and first[3] == "exit", first
    state = first[2].split()[1]
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    second = log.read_text().splitlines()[4:]
    assert second == ["enter", f"task from {state}", "done 30", "exit"], second


def _wheel(directory: Path) -> Path:
    """Build a tiny wheel with a console script (a job's bundled package)."""
    files = {
        "tinylib/__init__.py": (
            "import sys\n\ndef main():\n"
            "    print('TINYLIB processed ' + ' '.join(sys.argv[1:]), flush=True)\n"
        ),
        "tinylib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinylib\nVersion: 1.0\n",
        "tinylib-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "tinylib-1.0.dist-info/entry_points.txt": (
            "[console_scripts]\ntinylib-process = tinylib:main\n"
        ),
    }
    record = []
    path = directory / "tinylib-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
            zf.writestr(name, data)
        record.append("tinylib-1.0.dist-info/RECORD,,")
        zf.writestr("tinylib-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_a_job_environment_that_installs_a_package_runs_once_per_session(tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = run_cli(
        "run", str(DATA / "sessions_pip.yaml"), "-p", f"Wheel={_wheel(tmp_path)}",
        "-p", f"Log={log}", "--store", str(tmp_path / "store"), "--max-parallel", "1", "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert log.read_text().splitlines() == ["install"]  # four tasks, two steps, one session
    assert "TINYLIB processed init" in done.stdout
    for part in (1, 2, 3):
        assert f"TINYLIB processed part {part}" in done.stdout


FAILING_EXIT = DATA / "failing_exit.yaml"


def test_an_on_exit_that_fails_fails_the_run_and_a_retry_runs_no_task_again(
    tmp_path: Path,
) -> None:
    """As ``openjd run``: a session whose environment exit failed ends the run failed (exit 1),
    naming the action; the task keeps its success, so a retry runs nothing and succeeds."""
    template = FAILING_EXIT
    store = str(tmp_path / "store")
    first = run_cli("run", str(template), "--store", store)
    assert first.returncode == 1, first.stderr
    assert "TASK-RAN" in first.stdout and "EXIT-RAN" in first.stdout
    assert "jobEnvironments[0].script.actions.onExit failed: exited with code: 7" in first.stderr
    assert re.search(r"run \S+ failed", first.stderr), first.stderr
    again = run_cli("run", str(template), "--store", store)
    assert again.returncode == 0, again.stderr
    assert "TASK-RAN" not in again.stdout, again.stdout


@pytest.mark.parametrize(
    "hook",
    [
        "jobEnvironments[0].script.actions.onEnter",
        "environments[0].environment.script.actions.onWrapEnvEnter",
    ],
)
def test_an_environment_action_that_fails_is_reported_as_a_task_action_is(
    tmp_path: Path, hook: str
) -> None:
    """One wording for every action's exit (issue 22, item 7): a failing onEnter or
    onWrapEnvEnter prints ``exited with code: 7``, the line a task action's failure prints and
    the conformance data reads for ``taskFailure.exitCode``."""
    fail = {"command": "python3", "args": ["-c", "import sys; sys.exit(7)"]}
    ok = {"command": "python3", "args": ["-c", "print('RAN')"]}
    wrap = hook.startswith("environments")
    template = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "failing enter",
        "jobEnvironments": [
            {"name": "E", "script": {"actions": {"onEnter": ok if wrap else fail}}}
        ],
        "steps": [{"name": "S", "script": {"actions": {"onRun": ok}}}],
    }
    (tmp_path / "t.json").write_text(json.dumps(template))
    args = ["run", str(tmp_path / "t.json"), "--store", str(tmp_path / "store")]
    if wrap:
        env = {
            "specificationVersion": "environment-2023-09",
            "extensions": ["WRAP_ACTIONS", "EXPR"],
            "environment": {
                "name": "W",
                "script": {
                    "actions": {"onWrapEnvEnter": fail, "onWrapTaskRun": ok, "onWrapEnvExit": ok}
                },
            },
        }
        (tmp_path / "env.json").write_text(json.dumps(env))
        args += ["--environment", str(tmp_path / "env.json")]
    done = run_cli(*args)
    assert done.returncode == 1, done.stderr
    assert f"{hook} failed: exited with code: 7" in done.stderr, done.stderr
    assert "exited with code 7" not in done.stderr + done.stdout


def test_an_on_exit_that_fails_in_a_schedulers_session_fails_the_attempt(tmp_path: Path) -> None:
    """The adapters' path (``run_tasks`` in a task instance or task run, then
    ``finish_attempt`` in the last teardown): the task succeeds, the attempt ends Failed."""
    from core import (
        CheckpointStore,
        begin_attempt,
        finish_attempt,
        plan_step,
        prepare_job,
        run_tasks,
    )

    template = FAILING_EXIT
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(template)
    attempt = begin_attempt(st, job, external_key="dag/run-1")
    notes: list[str] = []
    [result] = run_tasks(st, job, attempt.run_id, plan_step(st, job, attempt.run_id, "S"),
                         on_note=notes.append)  # fmt: skip
    assert result.outcome.value == "succeeded"
    assert any("onExit failed: exited with code: 7" in n for n in notes), notes
    outcome = finish_attempt(st, job, attempt.run_id)
    assert outcome.status.value == "failed"
    assert "onExit failed: exited with code: 7" in outcome.condition.message


def test_a_step_environment_whose_on_exit_fails_is_named_as_such(tmp_path: Path) -> None:
    """As under openjd run the session cannot go on, so the next step's task does not run; its
    message says that the step left behind failed to exit, not that the task failed."""
    template = tmp_path / "stepenv.yaml"
    template.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\n"
        "name: step env exit\n"
        "steps:\n"
        "- name: S\n"
        "  stepEnvironments:\n"
        "  - name: SE\n"
        "    script:\n"
        "      actions:\n"
        "        onExit: {command: python3, args: [-c, 'import sys; sys.exit(5)']}\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, \"print('S-RAN')\"]}\n"
        "- name: After\n"
        "  dependencies: [{dependsOn: S}]\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, \"print('AFTER-RAN')\"]}\n"
    )
    done = run_cli("run", str(template), "--store", str(tmp_path / "store"), "--max-parallel", "1")
    assert done.returncode == 1, done.stderr
    assert "S-RAN" in done.stdout and "AFTER-RAN" not in done.stdout
    assert (
        "not run: as the session left step 'S', steps[0].stepEnvironments[0].script.actions."
        "onExit failed: exited with code: 5" in done.stderr
    ), done.stderr


def test_a_session_record_is_kept_while_an_environment_is_entered_only(tmp_path: Path) -> None:
    """The store keeps a session's record (for a dead session's daemons to be killed) once the
    session entered an environment; a session that enters none writes none, and neither is
    left after the session ends."""
    from core import CheckpointStore, begin_attempt, prepare_job, run_tasks

    bare = tmp_path / "bare.yaml"
    bare.write_text(
        "specificationVersion: 'jobtemplate-2023-09'\n"
        "name: no environment\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: [-c, 'pass']}\n"
    )
    seen: dict[str, list[int]] = {}
    for name, template, params in (
        ("bare", bare, {}),
        ("with env", DATA / "sessions_job_env.yaml", {"Log": str(tmp_path / "log")}),
    ):
        store = CheckpointStore(tmp_path / f"store-{len(seen)}")
        job = prepare_job(template, params)
        attempt = begin_attempt(store, job, external_key=name)
        specs = plan_tasks(job, job.step_order()[0])[:1]
        counts: list[int] = []

        def on_event(ex, event, store=store, attempt=attempt, counts=counts) -> None:
            if event.kind == "action_started" and ".onRun" in str(event.value):
                counts.append(len(store.sessions.list(attempt.job_key, attempt.run_id)))

        [result] = run_tasks(store, job, attempt.run_id, specs, on_event=on_event)
        assert result.outcome.value == "succeeded", result.message
        counts.append(len(store.sessions.list(attempt.job_key, attempt.run_id)))
        seen[name] = counts
    assert seen == {"bare": [0, 0], "with env": [1, 0]}
