"""What a person sees of a stopped and resumed flow run: the progress artifact of each task run,
the table artifact (checkpoint history, resume status) and the timeline markdown artifact, our
INFO line on what was kept and how to resume, the one line a directly called flow ends with
after a Ctrl-C (no traceback, no warning about a runner's kill that does not apply), and
``prefect flow-run retry ID --entrypoint FILE.py:FLOW`` of that run resuming the task."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import prefect_helpers as ph
from prefect import flow, get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId
from prefect.client.schemas.objects import Artifact, StateType

from core import CheckpointStore
from core._records import AttemptSpan
from prefect_integration._artifacts import GroupProgress

REPO = Path(__file__).resolve().parents[2]
TRAINING = REPO / "examples" / "managed-files" / "training.yaml"
EPOCHS = 30
RESULT = sum(k * k for k in range(EPOCHS))  # the sum over every epoch's sample file

SCRIPT = """
import json, sys
from prefect_integration import flow_from_template

train = flow_from_template({template!r}, store={store!r}, files="managed", name={name!r})

if __name__ == "__main__":
    train(**json.loads(sys.argv[1]))
"""


def _by_type(flow_run_id: uuid.UUID, kind: str) -> list[Artifact]:
    """The flow run's artifacts of one type, oldest first."""
    found = [a for a in ph.artifacts(flow_run_id) if a.type == kind]
    return sorted(found, key=lambda a: a.created or 0)


def _data(artifact: Artifact) -> Any:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def _logs(flow_run_id: uuid.UUID) -> list[tuple[int, str]]:
    return [(log.level, log.message) for log in ph.flow_run_logs(flow_run_id)]


class Script:
    """The training flow called directly by a script of its own (no runner), in its own
    session: ``name`` names the flow and its module in ``flows_dir``; its stderr is kept in
    ``proc_log_dir``. ``interrupt(ready)`` waits until ``ready()`` is true, sends SIGINT (a
    Ctrl-C) and returns the exit status; the script is killed if it outlives the test."""

    def __init__(
        self, flows_dir: Path, proc_log_dir: Path, store: CheckpointStore, name: str, params: dict
    ) -> None:
        self.module = ph.write_module(
            flows_dir,
            name.replace("-", "_"),
            SCRIPT.format(template=str(TRAINING), store=store.location, name=name),
        )
        self.stderr_path = proc_log_dir / f"{name}.stderr"
        with (
            open(self.stderr_path, "wb") as err,
            open(proc_log_dir / f"{name}.stdout", "wb") as out,
        ):
            self.proc = subprocess.Popen(
                [sys.executable, self.module.name, json.dumps(params)],
                cwd=flows_dir,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for_stderr(self, text: str, poll: float) -> None:
        self.wait_until(lambda err: text in err, poll)

    def wait_until(self, seen: Callable[[str], bool], poll: float) -> None:
        """Wait up to 60 s, while the flow's process runs, until ``seen(stderr)``."""
        deadline = time.monotonic() + 60
        while not seen(self.stderr):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.stderr
            time.sleep(poll)

    def interrupt(self, ready: Callable[[], Any]) -> int:
        try:
            ready()
            os.kill(self.proc.pid, signal.SIGINT)
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def retry(flow_run_id: uuid.UUID, entrypoint: str, cwd: Path) -> None:
    """``prefect flow-run retry ID --entrypoint FILE.py:FLOW``, run in ``cwd``, as the one line
    of a stopped direct call says; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run_id)]
        + ["--entrypoint", entrypoint],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def test_a_suspended_flow_run_shows_what_it_kept_and_its_retry_resumes(
    flows_dir: Path, proc_log_dir: Path, tmp_path: Path
) -> None:
    """A script calls the flow (no runner); Ctrl-C (SIGINT) after three checkpoints. The
    process ends with one line saying what was kept and how to resume (no traceback, no
    "would outlast the stop deadline": no runner kills a directly called flow); the task run
    is Cancelled (Stopped), not Completed; our INFO line names the kept generation; Prefect's
    own "Finished in state" line of that task run is at INFO; the progress artifact, the table
    (checkpoint history) and the timeline are there. ``prefect flow-run retry`` with the
    entrypoint the line gives resumes the task (RESUMED) and the result is right."""
    store = CheckpointStore(tmp_path / "store", files="managed")
    name = f"training-{uuid.uuid4().hex[:8]}"
    script = Script(flows_dir, proc_log_dir, store, name, {"Epochs": EPOCHS, "EpochSeconds": 0.3})
    module = script.module
    flow_run_id = ph.flow_run_of_store(store)
    code = script.interrupt(
        lambda: ph.wait_for_logs(flow_run_id, "checkpoint generation 3 stored", timeout=60)
    )
    stderr = script.stderr
    last = stderr.strip().splitlines()[-1]
    # 1. the direct call's end: one line, exit status 1 (an uncaught CancelledRun)
    assert code == 1, stderr[-3000:]
    assert "Traceback" not in stderr and "CancelledRun" not in stderr, stderr[-3000:]
    assert "would outlast the stop deadline" not in stderr, stderr[-3000:]
    assert last.startswith(f"flow run {ph.flow_run(flow_run_id).name!r} suspended: 1 task "), last
    match = re.search(rf"`prefect flow-run retry {flow_run_id} --entrypoint (\S+)`", last)
    assert match and "resume=latest" in last, last
    entrypoint = match.group(1)
    assert entrypoint == f"{module.name}:train", last

    # 2. states and log lines
    fr = ph.flow_run(flow_run_id)
    assert fr.state_type == StateType.CANCELLED and fr.state_name == "Suspended"
    [task_run] = ph.task_runs(flow_run_id)
    assert task_run.state_type == StateType.CANCELLED and task_run.state_name == "Stopped"
    [core_run] = store.list_runs()[0]
    [rec] = store.read_tasks(core_run.job_key, core_run.run_id)[0]
    assert rec.checkpoint is not None and rec.checkpoint.generation >= 3
    kept = rec.checkpoint.generation
    logs = ph.wait_for_logs(flow_run_id, "suspended: 1 task checkpointed")
    levels = {log.message: log.level for log in logs}
    ours = [m for m in levels if m.startswith("Train: suspended; ")]
    assert ours == [
        f"Train: suspended; checkpoint generation {kept} kept "
        f"({kept + 1} file(s), kept by the store); resume with `prefect flow-run retry "
        f"{flow_run_id} --entrypoint {entrypoint}` or a new flow run with resume=latest"
    ], ours
    assert levels[ours[0]] == logging.INFO
    [finished] = [m for m in levels if m.startswith("Finished in state Stopped(")]
    assert levels[finished] == logging.INFO  # Prefect's own ERROR, for a stop that was asked
    assert not [m for m, lv in levels.items() if lv >= logging.WARNING], levels

    # 3. the artifacts of the suspended run
    [progress] = _by_type(flow_run_id, "progress")
    assert progress.task_run_id == task_run.id
    assert 100 * 3 / EPOCHS <= _data(progress) < 100, _data(progress)
    assert progress.description == "Train: 0 of 1 task(s) finished; 1 suspended with a checkpoint"
    [table] = _by_type(flow_run_id, "table")
    assert table.key == f"openjd-{name}"
    [row] = _data(table)
    assert row["status"] == "suspended" and row["checkpoint generation"] == kept
    history = row["checkpoint history"].split("; ")
    assert [h.split(" at ")[0] for h in history] == [
        f"generation {g}" for g in range(kept - 2, kept + 1)
    ], history  # the store keeps three generations
    assert row["resume status"] == "" and row["bytes kept by the store"] > 0
    assert row["bytes kept by the store"] == rec.checkpoint.file_bytes
    [timeline] = _by_type(flow_run_id, "markdown")
    assert timeline.key == f"openjd-{name}-timeline"
    assert "#1 " in timeline.data and "from the top; interrupted" in timeline.data
    assert f"▲ generation {kept} at " in timeline.data

    # 4. the retry the line names, run where the script ran
    retry(flow_run_id, entrypoint, flows_dir)
    assert ph.flow_run(flow_run_id).state_type == StateType.COMPLETED
    logs = ph.wait_for_logs(flow_run_id, f"result: {RESULT}")
    messages = [log.message for log in logs]
    assert any(f"Train: resuming from checkpoint generation {kept} " in m for m in messages)
    assert any('"status": "RESUMED"' in m for m in messages)
    progress_runs = _by_type(flow_run_id, "progress")
    assert len(progress_runs) == 2 and _data(progress_runs[1]) == 100
    assert progress_runs[1].description == "Train: 1 of 1 task(s) finished; 1 succeeded"
    [row] = _data(_by_type(flow_run_id, "table")[-1])
    assert row["status"] == "succeeded" and row["attempts"] == 2
    assert row["resume status"] == "RESUMED" and row["resumed from"] == str(kept)
    assert row["work saved by resumes (s)"] > 0
    timeline = _by_type(flow_run_id, "markdown")[-1]
    assert "#2 " in timeline.data and f"resumed from {kept}, saved " in timeline.data


def test_the_progress_artifact_is_updated_at_most_once_an_interval() -> None:
    """``GroupProgress`` in a flow run, fed 100 progress values in about 2 s with a 0.5 s
    interval: a few API calls, not 100, and the artifact ends at the group's share done (two
    tasks finished earlier, one at 99 %, one never started: (2 * 100 + 99) / 4)."""

    @flow(name=f"progress-{uuid.uuid4().hex[:8]}")
    def feed() -> tuple[GroupProgress, float]:
        progress = GroupProgress("Group", ["a", "b"], done_before=2, every=0.5).start()
        began = time.monotonic()
        for i in range(100):
            progress.set("a", i)
            time.sleep(0.02)
        elapsed = time.monotonic() - began
        progress.close("stopped")
        progress.wait()
        return progress, elapsed

    progress, elapsed = feed()
    assert 2 <= progress.updates <= 2 + elapsed / 0.5 + 1, (progress.updates, elapsed)
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[progress.artifact_id]))
        )
    assert _data(artifact) == (2 * 100 + 99) / 4
    assert artifact.description == "Group: 2 of 4 task(s) finished; stopped"


def test_a_task_run_that_ends_in_its_first_interval_without_progress_makes_no_call() -> None:
    """A trivial task run (it ended before the first interval, no ``openjd_progress``) has no
    progress artifact and costs no API call; one that runs longer than the interval has one,
    at its tasks' share done, though none reported progress."""
    import core

    ended = core.TaskEvent(kind="ended", value=SimpleNamespace(outcome=core.TaskOutcome.SUCCEEDED))
    execution: Any = SimpleNamespace(spec=SimpleNamespace(task_key="a"))

    @flow(name=f"short-{uuid.uuid4().hex[:8]}")
    def run(seconds: float) -> GroupProgress:
        progress = GroupProgress("Quick", ["a", "b"], every=0.5).start()
        time.sleep(seconds)
        progress.on_event(execution, ended)  # task a succeeded
        progress.close("1 succeeded")
        progress.wait()
        return progress

    short = run(0.0)
    assert short.updates == 0 and short.artifact_id is None and short.percent() == 50
    long = run(0.8)
    assert long.updates >= 1 and long.artifact_id is not None
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[long.artifact_id]))
        )
    assert (
        _data(artifact) == 50
        and artifact.description == "Quick: 1 of 2 task(s) finished; 1 succeeded"
    )


def test_the_table_and_timeline_of_a_record_with_times_that_are_not_times() -> None:
    """A task record damaged by hand (NaN and infinite times, markdown in its label and host):
    the table and the timeline artifact show what they can and say what they left out, instead
    of no artifact at all (a warning "no artifact: timestamp out of range"), and the label and
    host stay text."""
    import core
    from prefect_integration._artifacts import RunView

    now = time.time()
    rec = core.TaskRecord(
        job_key="0" * 16,
        run_id="r",
        step="S",
        task_key="{}",
        parameters={},
        checkpoint=core.CheckpointData(generation=3, saved_at=now, attempt=1),
        history=[
            AttemptSpan(attempt=1, started_at=float("nan")),
            AttemptSpan(attempt=2, started_at=now - 9, ended_at=now, outcome="x", host="h```\n# b"),
        ],
    )  # as read from a record whose JSON holds NaN (Python's json reads it)
    rec.step = "S](javascript:x) **<b>"
    gens = [core.CheckpointData(generation=2, saved_at=float("inf"), attempt=1), rec.checkpoint]
    timeline = core.report.task_timeline(rec, [g for g in gens if g is not None])
    view = RunView(
        records=(rec,), timelines=(timeline,), summaries=(core.report.summarize_task(rec),)
    )
    [row] = view.rows()
    assert row["checkpoint history"].startswith("generation 3 at ")
    text = view.markdown("heading")
    assert "- the record's history[0] (attempt 1): started_at nan is not a time" in text
    assert "- checkpoint generation 2: saved_at inf is not a time" in text
    assert "#2 " in text and "#1 " not in text
    assert "**S\\]\\(javascript:x\\) \\*\\*\\<b\\>**: " in text  # literal, not a link
    assert "\n````\n#2 " in text and text.count("\n````") == 2  # the host's ``` ends nothing


def test_ctrl_c_while_a_direct_flow_run_begins_ends_it_with_one_line(
    flows_dir: Path, proc_log_dir: Path, tmp_path: Path
) -> None:
    """Ctrl-C as soon as the core run exists (its first log line), before a task runs: the
    process ends with the one line (it was a KeyboardInterrupt traceback, the core run left
    recorded as running and the flow run Crashed), the core run is suspended, and the retry
    the line's flow run takes runs the job to its result."""
    store = CheckpointStore(tmp_path / "store", files="managed")
    name = f"begin-{uuid.uuid4().hex[:8]}"
    script = Script(flows_dir, proc_log_dir, store, name, {"Epochs": 3, "EpochSeconds": 0.1})
    module = script.module
    code = script.interrupt(lambda: script.wait_for_stderr(" - core run ", poll=0.002))
    stderr = script.stderr
    assert code == 1 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"flow run '[\w-]+' suspended: no task finished", last), last
    [core_run] = store.list_runs()[0]
    assert core_run.status.value == "interrupted"
    [flow_run_id] = {uuid.UUID(core_run.external_key or "")}
    assert ph.flow_run(flow_run_id).state_name == "Suspended"
    retry(flow_run_id, f"{module.name}:train", flows_dir)
    ph.wait_for_logs(flow_run_id, f"result: {sum(k * k for k in range(3))}")


def test_ctrl_c_as_a_direct_flow_runs_last_task_ends_leaves_its_outcome(
    flows_dir: Path, proc_log_dir: Path, tmp_path: Path
) -> None:
    """Ctrl-C the moment the last checkpoint of the job's one task is stored (the task ends
    right after): if the task still ran, the run is suspended with the one line; if it had
    ended, the run's outcome stands (it was a flow run Crashed 'aborted by a termination
    signal', exit status -15, with the job done and its records deleted)."""
    store = CheckpointStore(tmp_path / "store", files="managed")
    name = f"end-{uuid.uuid4().hex[:8]}"
    script = Script(flows_dir, proc_log_dir, store, name, {"Epochs": 3, "EpochSeconds": 0.1})

    def last_save_stored(err: str) -> bool:  # a save made while one is still being stored
        parts = err.split("openjd_checkpoint_save:")  # supersedes it: count the saves, not
        return len(parts) > 3 and "stored" in parts[3]  # the generations (3 under load, or 2)

    code = script.interrupt(lambda: script.wait_until(last_save_stored, poll=0.001))
    stderr = script.stderr
    assert "Crash" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    [core_run] = store.list_runs()[0]
    fr = ph.flow_run(uuid.UUID(core_run.external_key or ""))
    if core_run.status.value == "succeeded":
        assert code == 0 and fr.state_type == StateType.COMPLETED, stderr[-3000:]
        assert "the signal came once every task had ended: nothing to stop" in stderr
    else:
        assert code == 1 and fr.state_name == "Suspended", stderr[-3000:]
        assert " suspended: 1 task checkpointed; " in stderr.strip().splitlines()[-1]


def test_the_resume_hint_names_a_retry_only_as_a_command_that_works() -> None:
    """How to resume a stopped flow run: from a deployment, ``prefect flow-run retry ID``;
    called directly, with ``--entrypoint`` and the flow's real file and name; when neither is
    known (a flow that is not a name at the top of its file, or not known whether it is from a
    deployment), a new flow run with ``resume=latest``, never a placeholder (it printed
    ``--entrypoint FILE.py:FLOW``)."""
    from prefect_integration._report import resume_hint

    new_run = "a new flow run with resume=latest"
    assert (
        resume_hint("ID", deployment=True)
        == f"resume with `prefect flow-run retry ID` or {new_run}"
    )
    assert resume_hint("ID", entrypoint="flows.py:render") == (
        f"resume with `prefect flow-run retry ID --entrypoint flows.py:render` or {new_run}"
    )
    nameless = resume_hint("ID")
    assert nameless.startswith(f"resume with {new_run} (") and "is not a name" in nameless
    unknown = resume_hint("ID", deployment=None)
    assert unknown.startswith(f"resume with {new_run} (or, if the flow run is from a deployment")
    assert resume_hint(None) == f"resume with {new_run}"
    for hint in (nameless, unknown):
        assert "FILE.py" not in hint and "--entrypoint" not in hint, hint
