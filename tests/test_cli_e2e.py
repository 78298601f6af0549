"""End-to-end tests of ``openjd-checkpoint run``: real subprocesses, real signals, real store."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import DATA, EXAMPLES, ROOT, CliProcess, run_cli

from core import CheckpointStore
from core._records import TaskStatus

pytestmark = pytest.mark.slow


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def only_run(store: Path | str):
    runs, warnings = CheckpointStore(store).list_runs()
    assert not warnings
    assert len(runs) == 1, runs
    tasks, warnings = CheckpointStore(store).read_tasks(runs[0].job_key, runs[0].run_id)
    assert not warnings
    return runs[0], tasks


def test_seed_fibonacci_interrupted_by_sigterm_then_resumed(store: Path) -> None:
    """The seed's template unchanged: SIGTERM -> SIGUSR1 to the task -> checkpoint -> exit 75;
    the same command again runs onCheckpointResume and finishes with the right answer."""
    n = 3
    template = EXAMPLES / "fibonacci" / "fibonacci.yaml"
    args = ("run", str(template), "-p", f"N={n}", "--store", str(store))
    first = CliProcess(*args)
    # the task computes a step every 5 s: two steps are done (its SIGUSR1 handler is set
    # before the first)
    first.wait_for("Fibonacci number 1 is", stream="out")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 75, first.stderr
    # The seed's task saves only from its SIGUSR1 handler (periodic saves are minutes apart),
    # so a stored checkpoint proves the task received SIGUSR1.
    run, tasks = only_run(store)
    assert run.status.value == "interrupted"
    (task,) = tasks
    assert task.status == TaskStatus.INTERRUPTED
    assert task.checkpoint is not None
    assert re.fullmatch(r"\d+,\d+,\d+", task.checkpoint.state or ""), task.checkpoint
    saved_n, v0, v1 = (int(x) for x in task.checkpoint.state.split(","))
    assert (v0, v1) == (fib(saved_n), fib(saved_n + 1))
    # as it was started: python -m core.cli (no openjd-checkpoint need be on the PATH)
    assert f"to resume: {shlex.join([sys.executable, '-m', 'core.cli'])} resume " in first.stderr

    second = run_cli(*args, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert '"RESUMED"' in second.stdout
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in second.stdout
    steps = re.findall(r"Fibonacci number (\d+) is", first.stdout + second.stdout)
    assert len(steps) <= n + 1, steps
    assert [int(s) for s in re.findall(r"Fibonacci number (\d+) is \d+$", second.stdout, re.M)][
        0
    ] == saved_n
    # A completed run deletes its checkpoints; its run record stays as a tombstone.
    (done,) = CheckpointStore(store).list_runs()[0]
    assert done.status.value == "succeeded" and done.attempt == 2
    assert CheckpointStore(store).read_tasks(done.job_key, done.run_id) == ([], [])


def test_chunked_step_interrupted_mid_chunk_runs_only_unfinished_frames(
    store: Path | str, tmp_path: Path
) -> None:
    template = EXAMPLES / "chunked-frames" / "chunked-frames.yaml"
    args = (
        "run", str(template), "--store", str(store), "-q",
        "-p", "Frames=1-8", "-p", "FramesPerChunk=8", "-p", "FrameSeconds=0.3",
        "-p", f"OutputDir={tmp_path / 'out'}",
    )  # fmt: skip
    first = CliProcess(*args)
    first.wait_for('openjd_task_complete: {"Frame": 3}')
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 75, first.stderr
    done = {int(f) for f in re.findall(r'openjd_task_complete: \{"Frame": (\d+)\}', first.stdout)}
    assert {1, 2, 3} <= done and len(done) < 8
    _run, (task,) = only_run(store)
    assert set(task.completed_frames) == done

    second = run_cli(*args, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    chunks = re.findall(r"CHUNK (\S+)", second.stdout)
    remaining = sorted(set(range(1, 9)) - done)
    assert chunks == [
        f"{remaining[0]}-{remaining[-1]}" if len(remaining) > 1 else str(remaining[0])
    ]
    rendered = {int(f) for f in re.findall(r"rendered frame (\d+)", second.stdout)}
    assert rendered == set(remaining)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"frame-{i:04d}.txt" for i in range(1, 9)
    ]


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_fibonacci_on_an_s3_store_interrupted_then_resumed(store_url: str) -> None:
    """The demo's Fibonacci template with ``--store s3://…`` (a moto server): SIGTERM makes the
    task checkpoint, the run is interrupted (exit 75), and the same command resumes it."""
    n = 20
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    args = ("run", str(template), "-p", f"N={n}", "-p", "StepSeconds=0.1", "--store", store_url)
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 1 stored", stream="err")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 75, first.stderr
    # as it was started: python -m core.cli (no openjd-checkpoint need be on the PATH)
    assert f"to resume: {shlex.join([sys.executable, '-m', 'core.cli'])} resume " in first.stderr
    assert store_url in first.stderr
    run, (task,) = only_run(store_url)
    assert run.status.value == "interrupted" and task.status == TaskStatus.INTERRUPTED
    assert task.checkpoint is not None
    saved_n, v0, v1 = (int(x) for x in task.checkpoint.state.split(","))
    assert (v0, v1) == (fib(saved_n), fib(saved_n + 1)) and saved_n < n

    second = run_cli(*args, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert '"RESUMED"' in second.stdout
    assert f"Fibonacci number {n} is {fib(n)}" in second.stdout
    (done,) = CheckpointStore(store_url).list_runs()[0]
    assert done.status.value == "succeeded" and done.attempt == 2
    assert CheckpointStore(store_url).read_tasks(done.job_key, done.run_id) == ([], [])


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_chunked_step_on_an_s3_store_resumes_only_unfinished_frames(
    store_url: str, tmp_path: Path
) -> None:
    test_chunked_step_interrupted_mid_chunk_runs_only_unfinished_frames(store_url, tmp_path)


def test_cli_killed_with_sigkill_resumes_from_last_periodic_checkpoint(
    store: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = ("run", str(DATA / "orphan.yaml"), "-p", f"Dir={work}", "--store", str(store))
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 3 stored", stream="err")
    first.proc.send_signal(signal.SIGKILL)
    first.wait(30)
    orphan_pid = int((work / "pids.txt").read_text().split()[0])
    assert psutil.pid_exists(orphan_pid), "the test needs the task to outlive its runner"
    # the orphan goes on after the runner died: its next save finds the pipe broken, and it
    # writes to /dev/null from then on (its saves reach nobody)
    end = time.monotonic() + 30
    while os.readlink(f"/proc/{orphan_pid}/fd/1") != os.devnull:
        assert time.monotonic() < end, "the orphan never saved again after its runner died"
        time.sleep(0.02)
    _run, (task,) = only_run(store)
    assert task.checkpoint is not None
    last_state = int(task.checkpoint.state)
    assert last_state >= 3

    second = run_cli(*args, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "PREVIOUS_ALIVE 0" in second.stdout  # never two copies of one task
    assert f"RESUMED FROM {last_state}" in second.stdout
    assert "stopped process" in second.stderr
    assert not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == "zombie"


def test_checkpoints_list_show_delete(store: Path) -> None:
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    args = ("run", str(template), "-p", "N=200", "--store", str(store))
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 1 stored", stream="err")
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 75
    run, _ = only_run(store)
    listing = run_cli("checkpoints", "--store", str(store), "list")
    assert run.run_id in listing.stdout and "ResumableFibonacci" in listing.stdout
    runs = run_cli("runs", "--store", str(store))
    assert run.run_id in runs.stdout and "suspended" in runs.stdout
    for where in (("--store", str(store), "runs"), ("--store", str(store), "checkpoints", "list")):
        before = run_cli(*where)
        assert before.returncode == 0 and run.run_id in before.stdout, before.stderr
    shown = run_cli("checkpoints", "--store", str(store), "show", run.run_id, "--json")
    data = json.loads(shown.stdout)
    assert data["tasks"][0]["checkpoint"]["state"].count(",") == 2
    assert data["tasks"][0]["generations"]
    gone = run_cli("checkpoints", "--store", str(store), "delete", run.run_id)
    assert gone.returncode == 0
    assert CheckpointStore(store).list_runs()[0] == []
    missing = run_cli("checkpoints", "--store", str(store), "show", "nope")
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_fresh_runs_from_the_top(store: Path) -> None:
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    args = ("run", str(template), "-p", "N=200", "--store", str(store))
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 1 stored", stream="err")
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 75
    second = run_cli(
        "run",
        str(template),
        "-p",
        "N=3",
        "-p",
        "StepSeconds=0.01",
        "--store",
        str(store),
        timeout=60,
    )
    assert second.returncode == 0 and "RESUMED" not in second.stdout  # other parameters
    third = run_cli(*args, "--fresh", "-p", "StepSeconds=0.001", timeout=60)
    assert third.returncode == 0, third.stderr
    assert "RESUMED" not in third.stdout and "Fibonacci number 0 is 0" in third.stdout


@pytest.mark.parametrize("damage", ["emptied", "truncated"])
def test_a_damaged_run_record_makes_the_retry_say_why_it_starts_over(
    store: Path, damage: str
) -> None:
    """Issue 22, item 3: the run record holds the template hash and the job parameter values,
    which the task records and generations do not (docs/decisions.md, "A damaged run
    record"): the retry cannot verify them, so it does not resume; it says so on stderr,
    naming the damaged file, runs from the top, and keeps the old run's generations."""
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    args = ("run", str(template), "--store", str(store), "-p", "N=60",
            "-p", "StepSeconds=0.05", "-p", "CheckpointSeconds=0.1")  # fmt: skip
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 3 stored")
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 75, first.stderr
    run, (task,) = only_run(store)
    run_dir = store / "jobs" / run.job_key / "runs" / run.run_id
    generations = sorted(p.name for p in (run_dir / "tasks").glob("*.gen-*.json"))
    assert len(generations) >= 2, generations
    record = run_dir / "run.json"
    body = record.read_bytes()
    record.write_bytes(b"" if damage == "emptied" else body[: len(body) // 2])

    second = run_cli(*args, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert '"RESUMED"' not in second.stdout  # from the top
    assert str(record) in second.stderr, second.stderr
    assert f"run {run.run_id} is not resumed" in second.stderr, second.stderr
    assert "a retry runs from the top" in second.stderr
    assert "cannot be verified" in second.stderr, second.stderr
    # the old run's generations and task record are kept, and so is the damaged record
    assert sorted(p.name for p in (run_dir / "tasks").glob("*.gen-*.json")) == generations
    assert [p.read_bytes() for p in run_dir.glob("run.json.unreadable-*")] == [
        b"" if damage == "emptied" else body[: len(body) // 2]
    ]


def test_bad_template_and_parameters_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("specificationVersion: jobtemplate-2023-09\nname: x\nsteps: []\n")
    r = run_cli("run", str(bad), cwd=ROOT)
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "steps" in r.stderr
    r = run_cli("run", str(EXAMPLES / "fibonacci" / "fibonacci.yaml"), "-p", "N=abc", cwd=ROOT)
    assert r.returncode == 2 and "N" in r.stderr
    r = run_cli("run", str(EXAMPLES / "fibonacci" / "fibonacci.yaml"), "-p", "Nope=1", cwd=ROOT)
    assert r.returncode == 2 and "Nope" in r.stderr
    # a value quoted in the refusal reaches the terminal with its control characters escaped
    # (an escape sequence could set the terminal's title, or hide the rest of the line)
    value = "\x1b[31mRED\x1b]0;title\x07"
    r = run_cli("run", str(EXAMPLES / "fibonacci" / "fibonacci.yaml"), "-p", f"N={value}")
    assert r.returncode == 2, r.stderr
    assert "\\x1b[31mRED\\x1b]0;title\\x07" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("damage", "stop"),
    [("truncated", "suspended"), ("emptied", "suspended"), ("truncated", "killed")],
)
def test_a_damaged_task_record_resumes_from_its_checkpoint_generation(
    store: Path, damage: str, stop: str
) -> None:
    """A task record damaged while the run was suspended or after its runner was killed (a
    torn copy, a full disk, a stray edit) is kept aside and rebuilt from the task's newest
    checkpoint generation, and the resume says so (after a kill, the first read of the records
    is the orphan reaping's): it goes on from that checkpoint, not from the top, and the
    answer is right."""
    template = EXAMPLES / "fibonacci" / "fibonacci-fast.yaml"
    n = 60
    args = ("run", str(template), "--store", str(store), "-p", f"N={n}",
            "-p", "StepSeconds=0.05", "-p", "CheckpointSeconds=0.1")  # fmt: skip
    first = CliProcess(*args)
    first.wait_for("checkpoint generation 3 stored")
    if stop == "killed":
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait(60) == -signal.SIGKILL
    else:
        first.proc.send_signal(signal.SIGINT)
        assert first.wait(60) == 75, first.stderr
    run, (task,) = only_run(store)
    saved = task.checkpoint
    assert saved is not None
    [path] = [
        p
        for p in (store / "jobs" / run.job_key / "runs" / run.run_id / "tasks").iterdir()
        if p.suffix == ".json" and ".gen-" not in p.name
    ]
    body = path.read_bytes()
    path.write_bytes(body[: len(body) // 2] if damage == "truncated" else b"")
    # killed between a generation file's write and the record's, the newest generation is one on
    newest = max(int(p.name.split(".gen-")[1][:6]) for p in path.parent.glob("*.gen-*.json"))
    assert newest in (saved.generation, saved.generation + 1)

    # the rebuilt record holds the newest generation's state (one on from the record's when
    # the kill came between the generation file's write and the record's)
    [generation] = path.parent.glob(f"{path.stem}.gen-{newest:06d}*.json")
    resumed_at = int(json.loads(generation.read_text())["state"].split(",")[0])
    second = run_cli("resume", run.run_id, "--store", str(store), cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "unreadable" in second.stderr and str(path) in second.stderr
    assert f"rebuilt from its checkpoint generation {newest}" in second.stderr
    assert "runs from the top" not in second.stderr
    assert '"RESUMED"' in second.stdout
    assert f"Final answer: Fibonacci number {n} is {fib(n)}" in second.stdout
    first_step = re.search(r"Fibonacci number (\d+) is \d+$", second.stdout, re.M)
    assert first_step is not None and int(first_step.group(1)) == resumed_at
    # the damaged copy is kept aside, untouched
    aside = [p for p in path.parent.iterdir() if ".unreadable-" in p.name]
    assert [p.read_bytes() for p in aside] == [
        body[: len(body) // 2] if damage == "truncated" else b""
    ]


def test_a_task_record_that_cannot_be_set_aside_is_not_run_over(tmp_path: Path) -> None:
    """A damaged task record for which every ``.unreadable-<time>`` name is taken stays where
    it is: the retry resumes the run but does not start that task (it would write its record
    over the damaged one), and says why (a hostile trial: the task ran from the top over it)."""
    from core import CheckpointStore

    template = tmp_path / "t.yaml"  # three tasks, each failing with a checkpoint: resumed
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "extensions: [CHECKPOINT]\n"
        "name: kept-in-place\n"
        "steps:\n"
        "- name: S\n"
        "  parameterSpace:\n"
        "    taskParameterDefinitions:\n"
        "    - {name: I, type: INT, range: '1-3'}\n"
        "  script:\n"
        "    actions:\n"
        "      onRun:\n"
        "        command: python3\n"
        '        args: [\'-c\', \'print("openjd_checkpoint_save: {\\"state\\": \\"1\\"}", '
        "flush=True); exit(1)']\n"
    )
    store_url = str(tmp_path / "store")
    assert run_cli("run", template, "--store", store_url, "-q", timeout=60).returncode == 1
    st = CheckpointStore(store_url)
    [run] = st.list_runs()[0]
    record = next(
        p
        for p in (tmp_path / "store").glob(f"jobs/*/runs/{run.run_id}/tasks/*.json")
        if ".gen-" not in p.name
    )
    damaged = record.read_text()[:-1] + ', "status": "succeeded"}'
    record.write_text(damaged)
    now = int(time.time())
    for stamp in range(now, now + 20):
        for n in range(100):
            (record.parent / (f"{record.name}.unreadable-{stamp}" + (f"-{n}" if n else ""))).touch()
    again = run_cli("run", template, "--store", store_url, timeout=60)
    assert again.returncode == 1, (again.returncode, again.stderr)  # the run resumed, failed
    assert "could not be set aside" in again.stderr and "left in place" in again.stderr
    assert "; that task is not started" in again.stderr, again.stderr
    assert "runs from the top" not in again.stderr, again.stderr
    assert record.read_text() == damaged
