"""The one step loop (``core.StepWalk``): steps of a phase in dependency order, and which are
blocked (the run is stopping, a dependency did not succeed, a regular step failed), as the CLI's
runner and the Prefect flow walk them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core import CheckpointStore, RunPhase, StepWalk, prepare_job
from core.cli._runner import JobRunner
from core.job._template import parse_template


def _step(name: str, code: str = "print('ok')", after: tuple[str, ...] = ()) -> dict[str, Any]:
    step: dict[str, Any] = {
        "name": name,
        "script": {"actions": {"onRun": {"command": "python3", "args": ["-c", code]}}},
    }
    if after:
        step["dependencies"] = [{"dependsOn": d} for d in after]
    return step


def _job(fail: str = "") -> Any:
    """Regular: Prepare; Render after it; Other on its own; Assemble after Render.
    Finally: Collect; Publish after Collect; Notify on its own. ``fail``: a step that exits 1."""

    def code(name: str) -> str:
        return "import sys; sys.exit(1)" if name == fail else f"print('{name.upper()}-RAN')"

    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["FINALLY"],
        "name": "Walk",
        "steps": [
            _step("Prepare", code("Prepare")),
            _step("Render", code("Render"), ("Prepare",)),
            _step("Other", code("Other")),
            _step("Assemble", code("Assemble"), ("Render",)),
        ],
        "finally": [
            _step("Publish", code("Publish"), ("Collect",)),
            _step("Collect", code("Collect")),
            _step("Notify", code("Notify")),
        ],
    }
    return prepare_job(parse_template(doc))


def _walk(walk: StepWalk, outcomes: dict[str, bool]) -> list[tuple[str, str | None]]:
    """Walk every turn, ending each step that may start as ``outcomes`` says (default ok)."""
    seen = []
    for turn in walk:
        seen.append((turn.step, turn.blocked))
        if turn.blocked is None:
            walk.ended(turn.step, outcomes.get(turn.step, True))
    return seen


def test_steps_come_in_dependency_order_with_their_dependencies() -> None:
    job = _job()
    regular = list(StepWalk(job, RunPhase.REGULAR))
    assert [(t.step, t.dependencies) for t in regular] == [
        ("Prepare", ()),
        ("Render", ("Prepare",)),
        ("Other", ()),
        ("Assemble", ("Render",)),
    ]
    assert all(t.blocked is None for t in regular)  # nothing ended: nothing blocked
    finally_ = [t.step for t in StepWalk(job, RunPhase.FINALLY)]
    assert finally_ == ["Collect", "Publish", "Notify"]  # Publish after the step it waits for
    with pytest.raises(ValueError):
        StepWalk(job, RunPhase.ENDED)


def test_a_finally_step_whose_dependency_failed_is_blocked_and_the_others_run() -> None:
    walk = StepWalk(_job(), RunPhase.FINALLY)
    assert _walk(walk, {"Collect": False}) == [
        ("Collect", None),
        ("Publish", "its dependency Collect did not succeed"),
        ("Notify", None),  # a failed finally step blocks only what depends on it
    ]
    assert walk.ok == {"Collect": False, "Publish": False, "Notify": True}
    assert walk.failed is None


def test_a_failed_regular_step_blocks_every_regular_step_after_it() -> None:
    walk = StepWalk(_job(), RunPhase.REGULAR)
    assert _walk(walk, {"Render": False}) == [
        ("Prepare", None),
        ("Render", None),
        ("Other", "step Render failed"),  # independent of Render, blocked all the same
        ("Assemble", "step Render failed"),
    ]
    assert walk.failed == "Render"


def test_a_blocked_step_blocks_what_depends_on_it() -> None:
    job = _job()
    walk = StepWalk(job, RunPhase.FINALLY)
    turns = iter(walk)
    collect = next(turns)
    walk.ended(collect.step, False)
    assert next(turns).blocked is not None  # Publish
    assert walk.ok["Publish"] is False  # counted as not ok for the steps after it


def test_once_the_run_is_stopping_no_step_starts_and_a_stopped_step_is_no_failure() -> None:
    stopping = [False]
    walk = StepWalk(_job(), RunPhase.REGULAR, stopping=lambda: stopping[0])
    turns = iter(walk)
    prepare = next(turns)
    assert prepare.blocked is None
    stopping[0] = True  # the step ended not ok because the run was stopped
    walk.ended(prepare.step, False)
    assert walk.failed is None
    assert [(t.step, t.blocked) for t in turns] == [
        ("Render", "the run is stopping"),
        ("Other", "the run is stopping"),
        ("Assemble", "the run is stopping"),
    ]


def test_the_cli_runner_skips_a_finally_step_whose_dependency_failed(tmp_path: Path) -> None:
    """Through ``JobRunner`` (real task processes): Collect fails, so Publish is skipped and
    Notify runs; the regular steps all ran."""
    lines: list[str] = []
    runner = JobRunner(
        _job(fail="Collect"),
        store=CheckpointStore(tmp_path / "store"),
        on_output=lambda ex, out: lines.extend(out),
        working_root=str(tmp_path / "work"),
    )
    result = runner.run()
    text = "\n".join(lines)
    for name in ("PREPARE", "RENDER", "OTHER", "ASSEMBLE", "NOTIFY"):
        assert f"{name}-RAN" in text, text
    assert "PUBLISH-RAN" not in text
    assert result.finally_ran and "Publish" in result.skipped, result.skipped
