"""Equal records (issue 24), the CLI's part: the scenario of ``tests/equal_records.py`` on the
``openjd-checkpoint`` command. The notice suspends the run (exit 75); running it again resumes
``Work[I=2]``, the termination request cancels it, ``Cleanup`` runs. Its records are the golden
file the Airflow and Prefect tests compare theirs with, through ``expected_for_adapter``
(checked here on the golden file itself); ``OPENJD_REGEN_EQUAL_RECORDS=1`` writes it anew."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, CliProcess
from equal_records import GOLDEN, JOB, Conductor, assert_equal_records, expected_for_adapter


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_cli_records_equal_the_golden_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    notice = tmp_path / "notice"
    args = (
        "run", str(JOB), "--store", str(store), "-q", "--max-parallel", "2",
        "--interruption-notices", f"file:{notice}", "--notice-poll-seconds", "0.1",
    )  # fmt: skip
    conductor = Conductor(store, notice, sessions=2).start()
    first = CliProcess(*args, cwd=ROOT)
    assert first.wait(90) == 75, first.stderr
    assert conductor.noticed.is_set()
    second = CliProcess(*args, cwd=ROOT)
    code = second.wait(90)
    conductor.join()
    assert code != 0, second.stderr
    assert "CLEANUP status=" in second.stdout, second.stdout
    assert_equal_records(store, tmp_path, "cli")


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every scalar of a JSON value by its path (``[0].run.attempt``)."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _leaves(item, f"{path}.{key}").items()
        }
    if isinstance(value, list):
        return {
            k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{path}[{i}]").items()
        }
    return {path: value}


def test_expected_for_adapter_changes_exactly_the_two_decided_differences() -> None:
    golden = json.loads(GOLDEN.read_text())
    kept = copy.deepcopy(golden)
    want = expected_for_adapter(golden)
    assert golden == kept, "expected_for_adapter changed its argument"
    assert want != golden
    # (B) and the attempts of (A) in the environment failures: the golden's three, all in
    # attempt 1, and one more, the finally unit's own session
    failure = {
        "attempt": 1,
        "message": "jobEnvironments[0].script.actions.onExit failed: exited with code: 1",
    }
    assert [f["attempt"] for f in golden[0]["run"]["environment_failures"]] == [1, 1, 2]
    assert want[0]["run"]["environment_failures"] == [failure] * 4
    # (A): the CLI's Suspended request is gone, the termination request is attempt 1's
    assert [(r["mode"], r["attempt"]) for r in golden[0]["stop_requests"]] == [
        ("Suspended", 1),
        ("CancelledRunFinally", 2),
    ]
    assert want[0]["stop_requests"] == [{**golden[0]["stop_requests"][1], "attempt": 1}]
    # (A): the run attempts of the resume, 2 -> 1, and nothing else of the records
    rest = {"environment_failures", "stop_requests"}

    def others(records: list[dict[str, Any]]) -> dict[str, Any]:
        (entry,) = copy.deepcopy(records)
        for key in rest:
            entry["run"].pop(key, None)
            entry.pop(key, None)
        return _leaves(entry)

    before, after = others(golden), others(want)
    assert before.keys() == after.keys()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert changed == {
        ".run.attempt": (2, 1),
        ".tasks[0].record.run_attempt": (2, 1),  # Cleanup
        ".tasks[2].record.run_attempt": (2, 1),  # Work[I=2]
        ".tasks[2].record.checkpoint.attempt": (2, 1),
        ".tasks[2].generations[2].attempt": (2, 1),  # 2-resumed
    }
    assert after[".tasks[2].record.attempt"] == 2  # the task's own tries are not run attempts
