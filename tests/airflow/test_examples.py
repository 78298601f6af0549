"""The example DAG files in examples/airflow/, as a user drops them into a dags folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import airflow_helpers as ah

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "airflow"


def install_examples(dag_tester: ah.DagTester) -> Path:
    """Copy the examples (templates dereferenced, as ``cp examples/airflow/*`` does)."""
    folder = dag_tester.dags_folder / "examples"
    folder.mkdir(exist_ok=True)
    for path in EXAMPLES.iterdir():
        shutil.copyfile(path.resolve(), folder / path.name)
    return folder


def test_fibonacci_example_runs_with_the_configured_store(
    dag_tester: ah.DagTester, tmp_path: Path, monkeypatch, capfd
) -> None:
    store = tmp_path / "configured-store"
    monkeypatch.setenv("AIRFLOW__OPENJD_CHECKPOINT__STORE", str(store))
    folder = install_examples(dag_tester)
    result = dag_tester.run(folder / "openjd_fibonacci.py", run_conf={"N": 12, "StepSeconds": 0.01})

    assert result.state == "success", result.states()
    assert "Final answer: Fibonacci number 12 is 144" in capfd.readouterr().out
    [run] = [json.loads(p.read_text()) for p in store.glob("jobs/*/runs/*/run.json")]
    assert run["status"] == "succeeded"


def test_example_dag_files_parse_fast(dag_tester: ah.DagTester) -> None:
    """A DAG file imports in well under a second of CPU once Airflow is imported (no job
    creation, no expansion, no database). CPU seconds, not wall: on a loaded machine the wall
    clock measures the other processes."""
    folder = install_examples(dag_tester)
    code = (
        "import time, runpy, airflow.sdk, core.job._template, openjd.model\n"
        "t = time.process_time()\n"
        f"for name in ('openjd_fibonacci.py', 'openjd_chunked_frames.py'):\n"
        f"    runpy.run_path({str(folder)!r} + '/' + name)\n"
        "print(time.process_time() - t)\n"
    )
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    seconds = float(out.stdout.strip().splitlines()[-1])
    ah.TIMINGS["two example DAG files parsed (after imports), CPU"] = seconds
    ah.TIMINGS["example parse subprocess, imports included"] = time.monotonic() - started
    assert seconds < 1.0
    dags = dag_tester.load(folder / "openjd_chunked_frames.py")
    dag = dags["openjd_chunked_frames"]
    assert set(dag.task_dict) == {"openjd_begin", "plan_Render", "Render", "openjd_finish"}
    assert dag.params.get_param("FramesPerChunk").value == 10
