"""What ``openjd-checkpoint run`` reports when a run ends: exit codes as the task's own, finally
steps named ``finally[j]``, no task record left ``running``. Real subprocesses, a real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from core import CheckpointStore

pytestmark = pytest.mark.slow


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def step(name: str, command: str, args: list[str], **action: object) -> dict:
    return {
        "name": name,
        "script": {"actions": {"onRun": {"command": command, "args": args, **action}}},
    }


def test_a_finally_step_that_cannot_start_is_named_finally_and_has_no_exit_code(
    tmp_path: Path,
) -> None:
    tmpl = write(
        tmp_path / "fin.json",
        {
            "specificationVersion": "jobtemplate-2023-09",
            "extensions": ["FINALLY"],
            "name": "fin",
            "steps": [step("Work", "python3", ["-c", "print('ok')"])],
            "finally": [step("Cleanup", str(tmp_path / "no-such-program"), ["x"])],
        },
    )
    proc = run_cli("run", str(tmpl), "--store", str(tmp_path / "store"))
    assert proc.returncode == 1, proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if "Cleanup" in ln and "failed" in ln]
    assert failed, proc.stderr
    assert "finally[0].script.actions.onRun: cannot start" in proc.stderr
    assert "steps[1]" not in proc.stderr
    assert "exited with code" not in failed[0]


def test_a_task_that_exits_0_after_its_timeout_is_reported_with_its_own_code(
    tmp_path: Path,
) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('waiting', flush=True)\n"
        "time.sleep(120)\n"
    )
    tmpl = write(
        tmp_path / "t.json",
        {
            "specificationVersion": "jobtemplate-2023-09",
            "name": "late",
            "steps": [
                step(
                    "Slow",
                    "python3",
                    ["-c", code],
                    timeout=1,
                    cancelation={"mode": "NOTIFY_THEN_TERMINATE", "notifyPeriodInSeconds": 30},
                )
            ],
        },
    )
    store = tmp_path / "store"
    proc = run_cli("run", str(tmpl), "--store", str(store))
    assert proc.returncode == 1, proc.stderr
    assert "timed out after 1 s" in proc.stderr
    assert "exited with code: 1" not in proc.stderr
    assert "exited with code: 0" in proc.stderr
    runs, _ = CheckpointStore(store).list_runs()
    for run in runs:
        tasks, _ = CheckpointStore(store).read_tasks(run.job_key, run.run_id)
        assert all(t.status.value != "running" for t in tasks), tasks
