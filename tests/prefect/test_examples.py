"""The examples in examples/prefect/ run as documented (small parameters)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import prefect_helpers as ph
import pytest
from prefect.client.schemas.objects import StateType

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "prefect"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chunked_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENJD_CHECKPOINT_STORE", str(tmp_path / "store"))
    flow = _load("chunked_flow").chunked_frames
    assert flow.name == "chunked-frames"
    out = tmp_path / "frames"
    state = flow(
        Frames="1-12", FramesPerChunk=2, FrameSeconds=0.01, OutputDir=str(out), return_state=True
    )
    assert state.is_completed(), state
    names = sorted(r.name for r in ph.task_runs(state.state_details.flow_run_id))
    # 6 chunks of 2 frames in at most 4 task runs: 2, 2, 1 and 1 chunks
    assert names == sorted(
        [
            "Render[Frame=1-4] (2 tasks)",
            "Render[Frame=5-8] (2 tasks)",
            "Render[Frame=9-10]",
            "Render[Frame=11-12]",
        ]
    )
    assert len(list(out.iterdir())) == 12
    ph.wait_for_logs(state.state_details.flow_run_id, "rendering 12 frames")
    # more than the function allows: the flow run fails before any step runs
    refused = flow(Frames="1-20000", OutputDir=str(out), return_state=True)
    assert refused.is_failed() and "10,000" in str(refused.message)
    assert ph.task_runs(refused.state_details.flow_run_id) == []


def test_fibonacci_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENJD_CHECKPOINT_STORE", str(tmp_path / "store"))
    flow = _load("fibonacci_flow").fibonacci
    state = flow(N=10, StepSeconds=0.01, return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [task_run] = ph.task_runs(flow_run_id)
    assert task_run.name == "ResumableFibonacci" and task_run.state_type == StateType.COMPLETED
    ph.wait_for_logs(flow_run_id, "Final answer: Fibonacci number 10 is 55")
