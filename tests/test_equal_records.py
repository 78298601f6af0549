"""Equal records (issue 24), the CLI's part: the scenario of ``tests/equal_records.py`` on the
``openjd-checkpoint`` command. The notice suspends the run (exit 75); running it again resumes
``Work[I=2]``, the termination request cancels it, ``Cleanup`` runs. Its records are the golden
file the Airflow and Prefect tests compare theirs with (``OPENJD_REGEN_EQUAL_RECORDS=1``
writes it anew)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, CliProcess
from equal_records import JOB, Conductor, assert_equal_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


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
