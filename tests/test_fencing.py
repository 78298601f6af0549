"""Fencing on S3 (issue 36, item 1): a runner stalled past its lease (SIGSTOP, with its task)
while a runner of another host takes the run over writes nothing once it wakes (SIGCONT): not
a checkpoint generation, not its task's record, not the run's outcome. It says so in one line
and exits 4; the generations the new holder stored are never lost, and the run ends as the new
holder ends it.

Two real CLI runners in processes of their own (host ids ``host-a`` and ``host-b``) on the
S3-protocol test server, with 3 s leases (``$OPENJD_CHECKPOINT_LEASE_SECONDS``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import cli_cmd

from core import CheckpointStore, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

LEASE_SECONDS = 3

# Counts on from its checkpoint, saving every 0.25 s; a resume says RESUMED. It takes about 15 s
# from the top, so that the other runner has work left when it takes over.
TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: fenced
steps:
- name: Count
  script:
    embeddedFiles:
    - name: Count
      type: TEXT
      data: |
        import json, sys, time
        start = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 0
        if len(sys.argv) > 1:
            print('openjd_checkpoint_resume_status: {"status": "RESUMED"}', flush=True)
        for i in range(start + 1, 61):
            time.sleep(0.25)
            print("openjd_checkpoint_save: " + json.dumps({"state": str(i)}), flush=True)
        print("COUNT-DONE", flush=True)
    actions:
      onRun:
        command: python3
        args: ["{{Task.File.Count}}"]
        checkpointCancelation: {mode: NOTIFY_THEN_TERMINATE, notifyPeriodInSeconds: 5}
      onCheckpointResume:
        command: python3
        args: ["{{Task.File.Count}}", "{{Task.Checkpoint.State}}"]
        checkpointCancelation: {mode: NOTIFY_THEN_TERMINATE, notifyPeriodInSeconds: 5}
"""


class Runner:
    """``openjd-checkpoint run`` in a process (and session) of its own, as host ``host``."""

    def __init__(self, template: Path, store: str, host: str) -> None:
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            OPENJD_CHECKPOINT_HOST_ID=host,
            OPENJD_CHECKPOINT_LEASE_SECONDS=str(LEASE_SECONDS),
        )
        self.proc = subprocess.Popen(
            cli_cmd("run", str(template), "--store", store, "--max-parallel", "1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.err: list[str] = []
        self.out: list[str] = []
        for stream, sink in ((self.proc.stderr, self.err), (self.proc.stdout, self.out)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream, sink: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            sink.append(raw.decode("utf-8", "replace"))

    def text(self) -> str:
        return "".join(self.err) + "".join(self.out)

    def kill(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def _task(store: str):
    """The one task record of the one run in ``store`` (None if there is none yet)."""
    st = CheckpointStore(store)
    runs = st.list_runs()[0]
    if not runs:
        return None, None
    records = st.read_tasks(runs[0].job_key, runs[0].run_id)[0]
    return runs[0], (records[0] if records else None)


def _wait(what: str, check, timeout: float = 60.0, *runners: Runner):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if any(r.proc.poll() is not None for r in runners):
            break
        time.sleep(0.1)
    raise AssertionError(
        f"timed out waiting for {what}:\n" + "\n---\n".join(r.text() for r in runners)
    )


def _signal(runner: Runner, task_pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the runner and to its task's process group (a session of its own)."""
    os.kill(runner.proc.pid, sig)
    os.killpg(task_pgid, sig)


def _task_pgid(store: str) -> int:
    _run, rec = _task(store)
    return rec.process.pgid if rec is not None and rec.process is not None else 0


def _generation(store: str) -> tuple[int, str | None]:
    _run, rec = _task(store)
    if rec is None or rec.checkpoint is None:
        return 0, None
    return rec.checkpoint.generation, rec.host


def _stalled_then_taken_over(tmp_path: Path, s3_store: str) -> tuple[Runner, Runner, int, int]:
    """H1 runs until it stored generation 4, is stopped with its task past its lease, and H2
    takes the run over and stores generations of its own; returns (H1, H2, H1's last
    generation, H1's task's process group)."""
    template = tmp_path / "fenced.yaml"
    template.write_text(TEMPLATE)
    h1 = Runner(template, s3_store, "host-a")
    _wait("host-a's generation 4", lambda: _generation(s3_store)[0] >= 4, 60, h1)
    pgid = _wait("host-a's task process recorded", lambda: _task_pgid(s3_store), 30, h1)
    _signal(h1, pgid, signal.SIGSTOP)
    stalled_at = _generation(s3_store)[0]
    run, _rec = _task(s3_store)
    st = CheckpointStore(s3_store, lease_seconds=LEASE_SECONDS)
    _wait("host-a's run lease to expire", lambda: not st.lease_held(run), 30)
    h2 = Runner(template, s3_store, "host-b")
    _wait(
        "host-b's own generations",
        lambda: (
            _generation(s3_store) >= (stalled_at + 3, "host-b")
            and _generation(s3_store)[1] == "host-b"
        ),
        90,
        h1,
        h2,
    )
    return h1, h2, stalled_at, pgid


def _after_wake(h1: Runner, mark: int) -> str:
    """What H1 printed after it was woken (lines from index ``mark`` of its stderr on)."""
    return "".join(h1.err[mark:])


def test_a_stalled_holder_woken_writes_nothing_and_the_new_holder_keeps_its_generations(
    tmp_path: Path, s3_store: str
) -> None:
    h1, h2 = None, None
    try:
        h1, h2, stalled_at, pgid = _stalled_then_taken_over(tmp_path, s3_store)
        seen = [_generation(s3_store)[0]]
        mark = len(h1.err)
        _signal(h1, pgid, signal.SIGCONT)
        # H1 ends within a bound, while H2 goes on; the record's generation never goes back
        # and stays H2's.
        end = time.monotonic() + 60
        while h1.proc.poll() is None and time.monotonic() < end:
            gen, host = _generation(s3_store)
            if gen:
                assert gen >= seen[-1], (gen, seen, _after_wake(h1, mark))
                assert host == "host-b", (gen, host, _after_wake(h1, mark))
                seen.append(gen)
            time.sleep(0.05)
        assert h1.proc.wait(5) == 4, h1.text()
        woke = _after_wake(h1, mark)
        # (a line of a generation stored before the stop may be printed after it)
        told = [int(n) for n in re.findall(r"generation (\d+) stored", woke)]
        assert all(n <= stalled_at for n in told), (stalled_at, woke)
        lost_lines = [line for line in woke.splitlines() if "lost the" in line and "lease" in line]
        assert len(lost_lines) == 1, woke
        assert h2.proc.wait(120) == 0, h2.text()
        assert "RESUMED" in "".join(h2.out)
        run, _rec = _task(s3_store)
        assert run is not None and run.status == RunStatus.SUCCEEDED, run
        # The run ended with what H2 stored last: its newest generations, by host-b and H2's
        # attempt (the run's second), none older than any generation seen stored meanwhile.
        kept = run.model_dump(mode="json").get("kept") or {}
        [task] = kept["tasks"]
        assert task["host"] == "host-b", kept
        kept_generations = [c["generation"] for c in task["checkpoints"]]
        assert kept_generations and min(kept_generations) >= max(seen), (kept, seen)
        assert task["checkpoints"][-1]["attempt"] == 2, kept
        assert stalled_at < max(seen)
    finally:
        for r in (h1, h2):
            if r is not None and r.proc.poll() is None:
                r.kill()


def test_a_stalled_holder_woken_after_the_new_holder_finished_leaves_the_run_succeeded(
    tmp_path: Path, s3_store: str
) -> None:
    h1, h2 = None, None
    try:
        h1, h2, stalled_at, pgid = _stalled_then_taken_over(tmp_path, s3_store)
        assert h2.proc.wait(120) == 0, h2.text()
        run, _ = _task(s3_store)
        assert run is not None and run.status == RunStatus.SUCCEEDED
        mark = len(h1.err)
        _signal(h1, pgid, signal.SIGCONT)
        assert h1.proc.wait(60) == 4, h1.text()
        woke = _after_wake(h1, mark)
        told = [int(n) for n in re.findall(r"generation (\d+) stored", woke)]
        assert all(n <= stalled_at for n in told), (stalled_at, woke)
        run, _ = _task(s3_store)
        assert run is not None and run.status == RunStatus.SUCCEEDED, (run, woke)
    finally:
        for r in (h1, h2):
            if r is not None and r.proc.poll() is None:
                r.kill()


# Two tasks one after the other: T=1 at once, T=2 for a while (it says where it runs).
BETWEEN = """\
specificationVersion: jobtemplate-2023-09
name: between tasks
steps:
- name: M
  parameterSpace:
    taskParameterDefinitions:
    - {name: T, type: INT, range: "1-2"}
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import os, sys, time
          print(f"T{sys.argv[1]}-RAN", flush=True)
          time.sleep(6 if sys.argv[1] == "2" else 0)
        - "{{Task.Param.T}}"
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize(
    "stall", ["task.ended-recorded@1", "task.claiming@2", "task.claimed@2"], ids=str
)
def test_a_holder_stalled_between_two_tasks_starts_no_task_once_woken(
    tmp_path: Path, s3_store: str, monkeypatch: pytest.MonkeyPatch, stall: str
) -> None:
    """H1 stalls (``OPENJD_CHECKPOINT_KILL_AT=...:stop``) past its lease just after it stored
    T=1's end, or about to claim T=2 (its run lease just found held), or with T=2's lease just
    taken; H2 takes the run over and runs T=2. Woken, H1 must not claim T=2 (nor wait for its
    lease, held by H2), nor start it: it lost the run, so it starts nothing, says so in one
    line and exits 4. Before, its loop went on to claim the next task before its lease
    watcher noticed the loss: it waited for T=2's lease, or took it and started T=2 where H2
    had not yet (found by CI, where the run lease was looked at before a stall that came from
    T=1's end in another thread). At ``task.ended-recorded@1`` the next task's claim and start
    run beside that end write (issue 38): H1 may have taken T=2 before it stalled, and then
    stores nothing of it once woken."""
    template = tmp_path / "between.yaml"
    template.write_text(BETWEEN)
    h1 = h2 = None
    try:
        monkeypatch.setenv("OPENJD_CHECKPOINT_KILL_AT", f"{stall}:stop")
        h1 = Runner(template, s3_store, "host-a")
        monkeypatch.delenv("OPENJD_CHECKPOINT_KILL_AT")
        _wait("host-a stalled after T=1", lambda: _state(h1.proc.pid) == "T", 60, h1)
        run = _wait("the run", lambda: _task(s3_store)[0], 30)
        st = CheckpointStore(s3_store, lease_seconds=LEASE_SECONDS)
        _wait("host-a's run lease to expire", lambda: not st.lease_held(run), 30)
        h2 = Runner(template, s3_store, "host-b")
        _wait("host-b running T=2", lambda: "T2-RAN" in "".join(h2.out), 60, h2)
        mark = len(h1.err)
        os.kill(h1.proc.pid, signal.SIGCONT)
        assert h1.proc.wait(30) == 4, h1.text()
        woke = _after_wake(h1, mark)
        if stall == "task.ended-recorded@1":
            # T=1's end is stored beside the claim and start of T=2 (issue 38): H1 may have
            # claimed or started T=2 before it stalled; woken, it stores nothing of it
            assert "M[T=2] succeeded" not in woke, woke
            if "M[T=2]" in woke:
                assert "M[T=2] not stored" in woke, woke
        else:
            assert "M[T=2]" not in woke, woke
            assert "T2-RAN" not in "".join(h1.out), h1.text()
        lost_lines = [line for line in woke.splitlines() if "lost the" in line and "lease" in line]
        assert len(lost_lines) == 1, woke
        assert h2.proc.wait(60) == 0, h2.text()
        run, _ = _task(s3_store)
        assert run is not None
        if run.superseded_by is not None:
            # H1 stalled before T=1's end was stored (that write runs beside the claim of T=2:
            # issue 38), so H2 found nothing to resume and ran a new run, which must have ended
            # succeeded; otherwise it took this run over and ended it
            assert "stored no checkpoint and no finished task" in h2.text(), h2.text()
            run = CheckpointStore(s3_store).read_run(run.job_key, run.superseded_by)
        assert run is not None and run.status == RunStatus.SUCCEEDED, run
    finally:
        for r in (h1, h2):
            if r is not None and r.proc.poll() is None:
                r.kill()
