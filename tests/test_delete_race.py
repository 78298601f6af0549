"""Deleting a run never races a resume, and a delete killed midway leaves the run whole or gone
(issue 36, item 3; docs/decisions.md, "Deleting a run").

Every CLI is a real process of its own. On a local folder and on S3 (the S3-protocol test
server), round after round: a run is killed while its task goes on running (a renderer whose
runner died), then ``resume RUN_ID`` (or a retry, ``run``) and ``checkpoints delete RUN_ID``
start at the same instant. Either the delete refuses and the resume runs, or the delete
finishes and the resume refuses (a retry starts a new run); never both, never a run folder
without its record, and ``runs`` lists every run folder there is. A delete SIGKILLed midway
(the kill points of ``core._killpoints``) leaves the run whole and resumable, or gone to every
reader, and ``gc`` removes what is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import DATA, ROOT, CliProcess, one_step_template, run_cli

from core import (
    Attempt,
    CheckpointStore,
    RefusalCode,
    ResumeRefusedError,
    begin_attempt,
    plan_step,
    prepare_job,
)
from core.run._claim import claim_task
from core.store import this_process

pytestmark = pytest.mark.slow
COUNTER = DATA / "counter.yaml"
LOCAL_AND_S3 = pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
LEASE_SECONDS = "3"
"""The ttl of leases on S3 here: a killed runner's leases free this long after it died."""


def _folders(store: str) -> dict[str, set[str]]:
    """Every entry of every job's ``runs`` folder, with the names in it."""
    st = CheckpointStore(store, create=False)
    out: dict[str, set[str]] = {}
    for key in st.fs.list_names(st.layout.jobs_dir):
        runs_dir = st.layout.runs_dir(key)
        for name in st.fs.list_names(runs_dir):
            out[name] = set(st.fs.list_names(f"{runs_dir}/{name}"))
    return out


def _runs_json(store: str) -> dict:
    listed = run_cli("runs", "--json", "--store", store, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def _assert_whole_or_gone(store: str) -> None:
    """No run folder without its record, none being deleted, and ``runs`` lists them all."""
    folders = _folders(store)
    for name, names in folders.items():
        assert not name.startswith("."), (name, sorted(folders))
        assert "run.json" in names, f"run folder {name} has no run.json: {sorted(names)}"
    doc = _runs_json(store)
    assert {r["run_id"] for r in doc["runs"]} == set(folders), (doc, sorted(folders))
    assert doc["warnings"] == [], doc["warnings"]


def _killed_run(store: str, lock: Path, steps: int) -> tuple[str, int]:
    """A run of the counter killed (SIGKILL) once its task stored a checkpoint: its task
    process goes on running. Returns the run id and that process's pid."""
    first = CliProcess(
        "run", str(COUNTER), "--store", store, "-q", "--fresh", "-p", f"N={steps}",
        "-p", "StepSeconds=0.1", "-p", f"LockFile={lock}",
    )  # fmt: skip
    st = CheckpointStore(store)
    end = time.monotonic() + 60
    found: tuple[str, int] | None = None
    while found is None and time.monotonic() < end:
        for run in st.list_runs()[0]:
            if run.status.value != "running":
                continue
            for t in st.read_tasks(run.job_key, run.run_id)[0]:
                if t.checkpoint is not None and t.process is not None and t.process.pid:
                    found = (run.run_id, t.process.pid)
        time.sleep(0.05)
    assert found is not None, f"the task never stored a checkpoint:\n{first.stderr}"
    first.proc.send_signal(signal.SIGKILL)
    first.wait(30)
    return found


def _leases_free(store: str, run_id: str) -> None:
    """Wait until the killed runner's leases (run and task) are free: at once on a local
    folder, after their ttl on S3."""
    st = CheckpointStore(store)
    run = st.find_run(run_id)
    assert run is not None
    [task] = st.read_tasks(run.job_key, run_id)[0]
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if not st.lease_held(run) and not st.task_lease_held(
            run.job_key, run_id, task.step, task.task_key
        ):
            return
        time.sleep(0.2)
    raise AssertionError("the killed runner's leases never freed")


@contextlib.contextmanager
def _busy_task(store_url: str, tmp_path: Path, key: str) -> Iterator[Attempt]:
    """A scheduler's run (no run lease) whose one task runs in a worker process holding its
    lease (``tests/run_worker.py``), until the block ends (then the worker is killed)."""
    template = one_step_template(
        tmp_path / "t.yaml", "busy", "import time; print('BUSY', flush=True); time.sleep(60)"
    )
    job = prepare_job(template)
    st = CheckpointStore(store_url)
    attempt = begin_attempt(st, job, external_key=key)
    [spec] = plan_step(st, job, attempt.run_id, "S")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "run_worker.py"), store_url, attempt.job_key,
         attempt.run_id, json.dumps(spec.to_dict())],
        stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        for line in worker.stdout:  # the task runs, holding its lease
            if "BUSY" in line:
                break
        yield attempt
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(
    ("store_url", "how", "rounds"),
    [("local", "resume", 20), ("local", "retry", 8), ("s3", "resume", 10), ("s3", "retry", 5)],
    indirect=["store_url"],
)
def test_a_delete_and_a_resume_started_at_once_exclude_each_other(
    store_url: str, how: str, rounds: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENJD_CHECKPOINT_LEASE_SECONDS", LEASE_SECONDS)
    steps = 30 if store_url.startswith("/") else 80  # the task outlives the wait on S3
    outcomes: list[str] = []
    for n in range(rounds):
        lock = tmp_path / f"lock-{n}"
        run_id, pid = _killed_run(store_url, lock, steps)
        _leases_free(store_url, run_id)
        assert _alive(pid), "the killed run's task should still be running"
        again = (
            ["resume", run_id, "--store", store_url, "-q"]
            if how == "resume"
            else ["run", str(COUNTER), "--store", store_url, "-q", "-p", f"N={steps}",
                  "-p", "StepSeconds=0.1", "-p", f"LockFile={lock}"]
        )  # fmt: skip
        delete = ["checkpoints", "delete", run_id, "--store", store_url]
        if n % 2:
            deleter, resumer = CliProcess(*delete), CliProcess(*again)
        else:
            resumer, deleter = CliProcess(*again), CliProcess(*delete)
        deleted, resumed = deleter.wait(120), resumer.wait(180)
        said = f"round {n}:\ndelete {deleted}: {deleter.stdout}{deleter.stderr}\n{how} {resumed}: "
        said += resumer.stdout[-2000:] + resumer.stderr
        assert "COUNTER-CONCURRENT" not in resumer.stdout, said  # never two copies of the task
        if deleted == 0:
            assert f"deleted run {run_id}" in deleter.stdout, said
            if how == "resume":
                assert resumed == 4 and "resume refused (unknown-run)" in resumer.stderr, said
                assert "COUNTER-START" not in resumer.stdout, said
            else:  # a retry that found no run to continue: a new one, from the top
                assert resumed == 0 and "COUNTER-START pid=" in resumer.stdout, said
                assert f"resuming run {run_id}" not in resumer.stderr, said
                assert "from=0" in resumer.stdout, said
            assert run_id not in _folders(store_url), said
            outcomes.append("deleted")
        else:
            assert deleted == 4, said
            assert f"run {run_id} is running (process " in deleter.stderr, said
            assert "stop it first" in deleter.stderr, said
            assert resumed == 0 and f"resuming run {run_id}" in resumer.stderr, said
            assert "COUNTER-DONE" in resumer.stdout, said
            outcomes.append("refused")
        assert not _alive(pid), said  # the killed run's task was stopped, by one or the other
        _assert_whole_or_gone(store_url)
    gc = run_cli("gc", "--grace-seconds", "0", "--store", store_url, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert "finished deleting" not in gc.stdout and "no run record" not in gc.stdout, gc.stdout
    _assert_whole_or_gone(store_url)
    print(f"{how} on {store_url}: {outcomes}")


MANY = textwrap.dedent(
    """\
    specificationVersion: 'jobtemplate-2023-09'
    extensions: [CHECKPOINT]
    name: many records
    parameterDefinitions:
    - {name: FailIf, type: STRING}
    steps:
    - name: Many
      parameterSpace:
        taskParameterDefinitions:
        - {name: I, type: INT, range: "1-12"}
      script:
        actions:
          onRun: {command: python3, args: ["{{Task.File.Save}}"]}
        embeddedFiles:
        - name: Save
          type: TEXT
          data: |
            import time
            for g in range(3):
                print('openjd_checkpoint_save: {"state": "%d"}' % g, flush=True)
                time.sleep(0.05)
    - name: Last
      dependencies: [{dependsOn: Many}]
      script:
        actions:
          onRun: {command: python3, args: ["{{Task.File.Check}}", "{{Param.FailIf}}"]}
        embeddedFiles:
        - name: Check
          type: TEXT
          data: |
            import os, sys
            sys.exit(1 if os.path.exists(sys.argv[1]) else 0)
    """
)
"""12 tasks of 3 checkpoint generations each (a run folder of about 75 files), then a step
that fails while the file ``FailIf`` names exists: the run keeps its records."""


def _failed_run(store: str, tmp_path: Path) -> tuple[str, Path, Path]:
    template = tmp_path / "many.yaml"
    template.write_text(MANY)
    fail = tmp_path / "fail"
    fail.touch()
    ran = run_cli("run", template, "-p", f"FailIf={fail}", "--store", store, "-q", timeout=180)
    assert ran.returncode == 1, ran.stderr
    [run] = CheckpointStore(store).list_runs()[0]
    return run.run_id, template, fail


def _gc_until_finished(store: str, run_id: str) -> str:
    """``gc`` until it finished the delete (on S3 the killed deleter's lease frees after its
    ttl)."""
    end = time.monotonic() + 60
    while True:
        gc = run_cli("gc", "--store", store, timeout=120)
        assert gc.returncode == 0, gc.stderr
        if f"finished deleting run {run_id}" in gc.stdout or time.monotonic() > end:
            return gc.stdout
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("store_url", "kill_at"),
    [
        ("local", "delete.marking"),
        ("local", "delete.marked"),
        ("local", "delete.removing@10"),
        ("s3", "delete.marked"),
        ("s3", "delete.removing@1"),
    ],
    indirect=["store_url"],
)
def test_a_delete_killed_midway_leaves_the_run_whole_or_gone_and_gc_removes_the_rest(
    store_url: str, kill_at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before its mark the run is whole: listed, and it resumes. Killed after (with
    some of its files removed or none) it is gone to every reader, and ``gc`` finishes the
    delete. (On S3 a deleter killed before its mark holds the job's lock for 30 s: the
    local folder shows that case.)"""
    monkeypatch.setenv("OPENJD_CHECKPOINT_LEASE_SECONDS", LEASE_SECONDS)
    run_id, _template, fail = _failed_run(store_url, tmp_path)
    before = _folders(store_url)[run_id]
    killed = run_cli(
        "checkpoints", "delete", run_id, "--store", store_url,
        env=dict(os.environ, OPENJD_CHECKPOINT_KILL_AT=kill_at), timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stdout, killed.stderr)
    if kill_at == "delete.marking":
        assert _folders(store_url)[run_id] == before
        _assert_whole_or_gone(store_url)
        fail.unlink()
        resumed = run_cli("resume", run_id, "--store", store_url, "-q", timeout=180)
        assert resumed.returncode == 0, resumed.stderr
        assert f"resuming run {run_id}" in resumed.stderr
        return
    doc = _runs_json(store_url)
    assert doc["runs"] == []
    assert any(f"run {run_id} is being deleted" in w for w in doc["warnings"]), doc
    refused = run_cli("resume", run_id, "--store", store_url, "-q", timeout=60)
    assert refused.returncode == 4, refused.stderr
    assert f"run {run_id} is being deleted" in refused.stderr, refused.stderr
    assert "it can no longer be resumed" in refused.stderr
    gc = _gc_until_finished(store_url, run_id)
    assert f"finished deleting run {run_id}, whose delete was interrupted" in gc, gc
    assert _folders(store_url) == {}
    assert _runs_json(store_url) == {**doc, "runs": [], "warnings": []}


@pytest.mark.parametrize(
    ("store_url", "kill_at"),
    [("local", "delete.marked"), ("local", "delete.removing@10"), ("s3", "delete.removing@1")],
    indirect=["store_url"],
)
def test_deleting_again_a_run_whose_delete_was_killed_finishes_that_delete(
    store_url: str, kill_at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpoints delete`` of a run whose delete was killed after its mark finishes it
    (once no live process holds a lease of it: on S3 the killed deleter's after its ttl),
    rather than leaving it to ``gc``; a run that was never there is still "no run"."""
    monkeypatch.setenv("OPENJD_CHECKPOINT_LEASE_SECONDS", LEASE_SECONDS)
    run_id, _template, _fail = _failed_run(store_url, tmp_path)
    killed = run_cli(
        "checkpoints", "delete", run_id, "--store", store_url,
        env=dict(os.environ, OPENJD_CHECKPOINT_KILL_AT=kill_at), timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    end = time.monotonic() + 60
    while True:
        again = run_cli("checkpoints", "delete", run_id, "--store", store_url, timeout=120)
        if again.returncode != 4 or time.monotonic() > end:
            break
        assert "is being deleted by a live process" in again.stderr, again.stderr
        time.sleep(0.5)
    assert again.returncode == 0, (again.returncode, again.stderr)
    assert f"finished deleting run {run_id}, whose delete was interrupted" in again.stdout
    assert _folders(store_url) == {}
    gone = run_cli("checkpoints", "delete", run_id, "--store", store_url, timeout=60)
    assert gone.returncode == 2 and f"no run {run_id!r}" in gone.stderr, gone.stderr


@LOCAL_AND_S3
def test_gc_removes_a_run_folder_a_killed_delete_left_without_its_record(
    store_url: str, tmp_path: Path
) -> None:
    """What a delete of an earlier version killed midway left (its folder removed in no
    order: ``run.json`` gone, task records still there) is removed by ``gc`` once its files
    are older than the grace period; a run whose record was set aside as unreadable is kept
    for a person, as decided."""
    template = one_step_template(
        tmp_path / "t.yaml",
        "half",
        'print(\'openjd_checkpoint_save: {"state": "1"}\', flush=True); exit(1)',
    )
    for _ in range(2):
        ran = run_cli("run", template, "--store", store_url, "-q", "--fresh", timeout=60)
        assert ran.returncode == 1, ran.stderr
    st = CheckpointStore(store_url)
    half, damaged = (r.run_id for r in st.list_runs()[0])
    job_key = st.find_run(half).job_key
    st.fs.remove_file(st.layout.run_path(job_key, half))
    st.fs.replace_file(st.layout.run_path(job_key, damaged), b"{torn", durable=True)
    young = run_cli("gc", "--store", store_url, timeout=60)
    assert young.returncode == 0 and "no run record" not in young.stdout, young.stdout
    assert half in _folders(store_url)
    gc = run_cli("gc", "--grace-seconds", "0", "--store", store_url, timeout=60)
    assert gc.returncode == 0, gc.stderr
    assert f"removed the folder of run {half}, which had no run record" in gc.stdout, gc.stdout
    folders = _folders(store_url)
    assert half not in folders
    assert any(n.startswith("run.json.unreadable-") for n in folders[damaged]), folders


@LOCAL_AND_S3
def test_a_run_whose_record_was_set_aside_is_named_by_runs_and_removed_by_delete(
    store_url: str, tmp_path: Path
) -> None:
    """A run whose ``run.json`` was unreadable is set aside (here by ``gc``), not listed, and
    kept by ``gc`` for a person: ``runs`` names it with the command that removes it, and
    ``checkpoints delete`` removes it with its checkpoints. A second delete finds no run."""
    template = one_step_template(
        tmp_path / "t.yaml",
        "torn",
        'print(\'openjd_checkpoint_save: {"state": "1"}\', flush=True); exit(1)',
    )
    ran = run_cli("run", template, "--store", store_url, "-q", timeout=60)
    assert ran.returncode == 1, ran.stderr
    st = CheckpointStore(store_url)
    [run] = st.list_runs()[0]
    st.fs.replace_file(st.layout.run_path(run.job_key, run.run_id), b"{torn", durable=True)
    gc = run_cli("gc", "--grace-seconds", "0", "--store", store_url, timeout=60)
    assert gc.returncode == 0, gc.stderr
    assert "unreadable" in gc.stderr, gc.stderr  # set aside, and kept for a person
    assert "kept 0, and 1 whose record was unreadable" in gc.stdout, gc.stdout
    assert f"run {run.run_id}: its run record was unreadable and is kept as " in gc.stderr
    names = _folders(store_url)[run.run_id]
    assert "run.json" not in names and "tasks" in names, names
    # The command as the user started it (not on the PATH: .venv/bin/openjd-checkpoint)
    script = str(Path(sys.executable).parent / "openjd-checkpoint")
    listed = subprocess.run(
        [script, "runs", "--json", "--store", store_url], capture_output=True, text=True
    )
    said = f"run {run.run_id}: its run record was unreadable and is kept as "
    [warning] = [w for w in json.loads(listed.stdout)["warnings"] if w.startswith(said)]
    for reader in (("checkpoints", "show"), ("logs",), ("resume",)):  # not "no run"
        read = run_cli(*reader, run.run_id, "--store", store_url, timeout=60)
        assert read.returncode in (2, 4) and said in read.stderr, (reader, read.stderr)
    command = shlex.split(warning.split(" '", 1)[1].rsplit("' deletes it", 1)[0])
    assert command[:4] == [script, "checkpoints", "delete", run.run_id], command
    # pasted as the warning says it (the program as started, its --store), from elsewhere
    deleted = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted run {run.run_id}, whose run record was unreadable" in deleted.stdout
    assert run.run_id not in _folders(store_url)
    assert "unreadable" not in run_cli("runs", "--store", store_url, timeout=60).stderr
    again = run_cli("checkpoints", "delete", run.run_id, "--store", store_url, timeout=60)
    assert again.returncode == 2 and "no run" in again.stderr, again.stderr


def test_runs_lists_every_readable_run_beside_a_job_folder_it_cannot_list(
    tmp_path: Path,
) -> None:
    """A job folder whose ``runs`` is a link (or a file named like a job key) is warned of;
    the look for runs whose record was set aside skips it too, and the other runs are
    listed (exit 0)."""
    store_url = str(tmp_path / "store")
    template = one_step_template(tmp_path / "t.yaml", "fine", "print('fine')")
    assert run_cli("run", template, "--store", store_url, "-q", timeout=60).returncode == 0
    st = CheckpointStore(store_url)
    [run] = st.list_runs()[0]
    jobs = Path(st.layout.jobs_dir)
    (tmp_path / "outside").mkdir()
    (jobs / "aaaaaaaaaaaaaaaa").mkdir()
    (jobs / "aaaaaaaaaaaaaaaa" / "runs").symlink_to(tmp_path / "outside")
    (jobs / "0123456789abcdef").write_text("")
    listed = run_cli("runs", "--json", "--store", store_url, timeout=60)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [r["run_id"] for r in doc["runs"]] == [run.run_id], doc
    assert any("symbolic link" in w for w in doc["warnings"]), doc["warnings"]


def test_the_newest_set_aside_record_is_named_by_its_time_not_its_length(
    tmp_path: Path,
) -> None:
    """Of ``run.json.unreadable-1796649999-1`` and ``run.json.unreadable-1796650000`` the
    second is the newer (``RunRemoval.kept_records``, oldest first)."""
    st = CheckpointStore(str(tmp_path / "store"))
    folder = Path(st.layout.run_dir("0123456789abcdef", "20261207-130530-27ca5f"))
    folder.mkdir(parents=True)
    for name in ("run.json.unreadable-1796650000", "run.json.unreadable-1796649999-1"):
        (folder / name).write_text("{")
    kept = st.removal.kept_records("0123456789abcdef", "20261207-130530-27ca5f")
    assert kept == ["run.json.unreadable-1796649999-1", "run.json.unreadable-1796650000"]


def test_deleting_a_torn_run_sets_its_record_aside_and_refuses_while_a_task_runs(
    tmp_path: Path,
) -> None:
    """``checkpoints delete`` of a run whose ``run.json`` is torn and was never set aside
    sets it aside and deletes the run in one go; while a task of the run holds its lease, it
    refuses (exit 4), naming the task, and removes nothing."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    with _busy_task(store_url, tmp_path, "dag/torn") as attempt:
        run_json = st.layout.run_path(attempt.job_key, attempt.run_id)
        st.fs.replace_file(run_json, b"{torn", durable=True)
        refused = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url)
        assert refused.returncode == 4, (refused.returncode, refused.stderr)
        assert f"run {attempt.run_id} is running (task S " in refused.stderr, refused.stderr
        names = _folders(store_url)[attempt.run_id]
        assert any(n.startswith("run.json.unreadable-") for n in names), names
        assert "tasks" in names, names
    deleted = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url)
    assert deleted.returncode == 0, deleted.stderr
    assert attempt.run_id not in _folders(store_url)


@LOCAL_AND_S3
def test_delete_refuses_while_a_task_of_the_run_runs_naming_it(
    store_url: str, tmp_path: Path
) -> None:
    """A scheduler's run holds no run lease; a task running in a worker holds its own: the
    delete refuses, naming the task and its process, and the run stays whole."""
    with _busy_task(store_url, tmp_path, "dag/busy") as attempt:
        refused = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url)
        assert refused.returncode == 4, (refused.returncode, refused.stderr)
        assert f"run {attempt.run_id} is running (task S " in refused.stderr, refused.stderr
        assert "on host " in refused.stderr and "stop it first" in refused.stderr
        assert "run.json" in _folders(store_url)[attempt.run_id]


@LOCAL_AND_S3
def test_a_task_claimed_while_its_run_is_marked_for_deletion_does_not_start(
    store_url: str, tmp_path: Path
) -> None:
    """The claim's side of the delete's second look: with the task's lease taken, a run marked
    as being deleted starts none of its tasks; unmarked (the delete refused), it does."""
    template = one_step_template(tmp_path / "t.yaml", "claimed", "print('RAN')")
    job = prepare_job(template)
    st = CheckpointStore(store_url)
    attempt = begin_attempt(st, job, external_key="dag/claimed")
    [spec] = plan_step(st, job, attempt.run_id, "S")
    where = st.removal.mark(job.job_key, attempt.run_id, this_process())
    assert where is not None
    with pytest.raises(ResumeRefusedError) as info:
        claim_task(st, job, attempt.run_id, spec)
    assert info.value.code == RefusalCode.UNKNOWN_RUN
    assert "is being deleted" in str(info.value)
    st.removal.unmark(job.job_key, attempt.run_id, where)
    lease, _record = claim_task(st, job, attempt.run_id, spec)
    lease.release()


def test_a_delete_whose_set_aside_record_was_written_again_meanwhile_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delete_named_run`` set a torn ``run.json`` aside, and before it got the job's lock the
    run was written again (a concurrent writer): nothing is deleted, the caller hears why
    (``StoreError``, exit 3 in the CLI), and the run stays whole."""
    from core import StoreError
    from core.local import delete_named_run

    st = CheckpointStore(str(tmp_path / "store"))
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "written-again", "pass"), {})
    attempt = begin_attempt(st, job, external_key="dag/written-again")
    run = st.read_run(job.job_key, attempt.run_id)
    run_json = st.layout.run_path(job.job_key, attempt.run_id)
    st.fs.replace_file(run_json, b"{torn", durable=True)
    find_run = st.find_run

    def set_aside_then_written_again(run_id: str):  # noqa: ANN202
        try:
            return find_run(run_id)
        finally:
            st.write_run(run)

    monkeypatch.setattr(st, "find_run", set_aside_then_written_again)
    warnings: list[str] = []
    with pytest.raises(StoreError, match="its unreadable run record is still in place"):
        delete_named_run(st, attempt.run_id, warn=warnings.append)
    assert len(warnings) == 1 and "unreadable" in warnings[0], warnings
    names = _folders(str(tmp_path / "store"))[attempt.run_id]
    assert "run.json" in names and any(n.startswith("run.json.unreadable-") for n in names)
    assert st.read_run(job.job_key, attempt.run_id) is not None


def test_a_name_in_the_store_with_an_escape_sequence_reaches_no_terminal(tmp_path: Path) -> None:
    """A kept record named ``run.json.unreadable-9<ESC>]0;PWNED<BEL>`` (a hostile trial): ``runs``
    and ``checkpoints delete`` print it with its control characters escaped (``\\x1b``)."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    run_id = "20261207-130530-27ca5f"
    folder = Path(st.layout.run_dir("0123456789abcdef", run_id))
    folder.mkdir(parents=True)
    (folder / "run.json.unreadable-9\x1b]0;PWNED\x07").write_text("{")
    listed = run_cli("runs", "--store", store_url, timeout=60)
    deleted = run_cli("checkpoints", "delete", run_id, "--store", store_url, timeout=60)
    assert deleted.returncode == 0, deleted.stderr
    for said in (listed.stdout, listed.stderr, deleted.stdout, deleted.stderr):
        assert "\x1b" not in said and "\x07" not in said, said
    assert "run.json.unreadable-9\\x1b]0;PWNED\\x07" in listed.stderr, listed.stderr
    assert "run.json.unreadable-9\\x1b]0;PWNED\\x07" in deleted.stdout, deleted.stdout
    assert run_id not in _folders(store_url)


def test_a_run_another_delete_removed_meanwhile_is_no_run_not_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deletes of one run: the second found the run, then waited for the job's lock while
    the first removed it. It says "no run" (``delete_named_run`` returns None: exit 2), not
    "refused" (exit 4), which says a live process holds the run (a hostile trial)."""
    from core.local import delete_named_run, delete_run

    st = CheckpointStore(str(tmp_path / "store"))
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "twice", "pass"), {})
    attempt = begin_attempt(st, job, external_key="dag/deleted-twice")
    found = st.find_run(attempt.run_id)  # what the second delete read first
    assert found is not None
    delete_run(st, found)  # the first delete
    monkeypatch.setattr(st, "find_run", lambda run_id: found)
    assert delete_named_run(st, attempt.run_id) is None


def test_a_damaged_copy_of_a_run_under_another_job_hides_no_readable_run(tmp_path: Path) -> None:
    """``jobs/0000000000000000/runs/R/run.json`` holding ``{`` beside the readable run R of
    another job (a hostile trial: the delete removed the damaged copy and said "deleted run R",
    by the jobs' listing order): the readable run is found, and deleted; the damaged copy is
    then named as set aside, and a second delete removes it."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "copied", "pass"), {})
    attempt = begin_attempt(st, job, external_key="dag/copied")
    for key in ("0000000000000000", "ffffffffffffffff"):  # listed before and after the run's
        copy = Path(st.layout.run_dir(key, attempt.run_id))
        copy.mkdir(parents=True)
        (copy / "run.json").write_text("{")
    found = st.find_run(attempt.run_id)
    assert found is not None and found.job_key == job.job_key
    deleted = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url, timeout=60)
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted run {attempt.run_id} and its checkpoints" in deleted.stdout
    assert not Path(st.layout.run_dir(job.job_key, attempt.run_id)).exists()
    for _ in range(2):  # each damaged copy, set aside, is removed by a delete of its own
        again = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url, timeout=60)
        assert again.returncode == 0, again.stderr
        assert "whose run record was unreadable" in again.stdout, again.stdout
    last = run_cli("checkpoints", "delete", attempt.run_id, "--store", store_url, timeout=60)
    assert last.returncode == 2 and "no run" in last.stderr, last.stderr


@pytest.mark.parametrize("removed", ["one", "all but the lease"])
def test_a_second_delete_refuses_while_a_live_delete_is_removing_the_run(
    removed: str, tmp_path: Path
) -> None:
    """A delete stopped (SIGSTOP) after some of the run's files are removed, or all but its
    own lease file, is alive: a second delete refuses (exit 4, "being deleted by a live
    process"), rather than "finish" a delete it takes for killed (a hostile trial: the
    deleter's lease file went with the others), and the first, woken, ends its delete."""
    store_url = str(tmp_path / "store")
    run_id, _template, _fail = _failed_run(store_url, tmp_path)
    files = [
        name
        for _folder, _dirs, names in os.walk(tmp_path / "store")
        for name in names
        if _folder.endswith(run_id) or f"{run_id}/" in _folder
    ]
    count = 1 if removed == "one" else len(files) - 1  # every file but lease.lock
    assert "lease.lock" in files and count >= 1, files
    env = dict(os.environ, OPENJD_CHECKPOINT_KILL_AT=f"delete.removing@{count}:stop")
    first = subprocess.Popen(
        [sys.executable, "-m", "core.cli", "checkpoints", "delete", run_id, "--store", store_url],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        proc = psutil.Process(first.pid)
        end = time.monotonic() + 60
        while proc.status() != psutil.STATUS_STOPPED:
            assert first.poll() is None and time.monotonic() < end, first.communicate()
            time.sleep(0.05)
        second = run_cli("checkpoints", "delete", run_id, "--store", store_url, timeout=60)
        assert second.returncode == 4, (second.returncode, second.stdout, second.stderr)
        assert "is being deleted by a live process" in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, (first.returncode, err)
    assert f"deleted run {run_id} and its checkpoints" in out
    assert _folders(store_url) == {}


def test_a_local_run_marked_deleting_in_its_record_is_finished_by_delete_and_gc(
    tmp_path: Path,
) -> None:
    """A local store copied from S3 while a delete ran there: the run's ``run.json`` holds
    the S3 mark (``deleting``). Every reader says it is being deleted, so ``checkpoints
    delete`` and ``gc`` must finish it (a hostile trial: both left it forever)."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "copied", "pass"), {})
    ids = [begin_attempt(st, job, external_key=f"dag/{n}").run_id for n in ("a", "b")]
    for run_id in ids:
        path = Path(st.layout.run_path(job.job_key, run_id))
        doc = json.loads(path.read_text())
        doc["deleting"] = {"pid": 1, "host": "h", "pgid": 1, "start_time": 0}
        path.write_text(json.dumps(doc))
    deleted = run_cli("checkpoints", "delete", ids[0], "--store", store_url, timeout=60)
    assert deleted.returncode == 0, deleted.stderr
    assert f"finished deleting run {ids[0]}, whose delete was interrupted" in deleted.stdout
    gc = run_cli("gc", "--store", store_url, timeout=60)
    assert gc.returncode == 0, gc.stderr
    assert f"finished deleting run {ids[1]}, whose delete was interrupted" in gc.stdout
    assert _folders(store_url) == {}


def test_one_marked_run_gc_cannot_remove_keeps_no_other_run(tmp_path: Path) -> None:
    """A ``.deleting-<run>-<ns>`` entry that is a link (the store refuses to follow it) is
    named in a warning and left; ``gc`` goes on and removes the runs past retention (a
    hostile trial: gc exited 3 and removed none)."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "stray", "pass"), {})
    old = begin_attempt(st, job, external_key="dag/old").run_id
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    runs_dir = Path(st.layout.runs_dir(job.job_key))
    stray = "20261207-130530-27ca5f"
    (runs_dir / f".deleting-{stray}-1").symlink_to(outside)
    gc = run_cli("gc", "--retention-days", "0", "--store", store_url, timeout=60)
    assert gc.returncode == 0, (gc.returncode, gc.stderr)
    assert f"openjd-checkpoint: warning: run {stray}: its interrupted delete was not " in gc.stderr
    assert f"removed run {old}" in gc.stdout, gc.stdout
    assert (outside / "keep").read_text() == "mine"
    assert (runs_dir / f".deleting-{stray}-1").is_symlink()


@pytest.mark.parametrize("mark", ['"yes"', "true", "[1]", '{"pid": 1}'])
def test_a_record_that_only_looks_marked_for_deletion_is_kept_by_gc(
    mark: str, tmp_path: Path
) -> None:
    """``"deleting": "yes"`` (not a process) makes the run record unreadable, not marked: gc
    sets it aside and keeps the run for a person, as any unreadable record (a hostile trial:
    gc 'finished deleting' it)."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "looks-marked", "pass"), {})
    run_id = begin_attempt(st, job, external_key="dag/looks").run_id
    path = Path(st.layout.run_path(job.job_key, run_id))
    doc = json.loads(path.read_text())
    doc["deleting"] = json.loads(mark)
    path.write_text(json.dumps(doc))
    gc = run_cli("gc", "--store", store_url, timeout=60)
    assert gc.returncode == 0, gc.stderr
    assert "finished deleting" not in gc.stdout, gc.stdout
    assert "1 whose record was unreadable" in gc.stdout, gc.stdout
    assert run_id in _folders(store_url)


def test_a_run_folder_gc_cannot_read_keeps_it_from_no_interrupted_delete(tmp_path: Path) -> None:
    """A run-id-named link under ``runs/`` (the store refuses to follow it) does not stop gc
    before it finishes the interrupted deletes of that job (a hostile trial: gc exited 3 with
    the ``.deleting-`` folder left)."""
    store_url = str(tmp_path / "store")
    st = CheckpointStore(store_url)
    job = prepare_job(one_step_template(tmp_path / "t.yaml", "linked", "pass"), {})
    begin_attempt(st, job, external_key="dag/linked")
    runs_dir = Path(st.layout.runs_dir(job.job_key))
    (tmp_path / "outside").mkdir()
    (runs_dir / "20261207-130530-27ca5f").symlink_to(tmp_path / "outside")
    stale = runs_dir / ".deleting-20261207-130531-27ca5e-777"
    (stale / "tasks").mkdir(parents=True)
    (stale / "tasks" / "x.json").write_text("{}")
    gc = run_cli("gc", "--grace-seconds", "0", "--store", store_url, timeout=60)
    assert not stale.exists(), (gc.returncode, gc.stdout, gc.stderr)
    assert "finished deleting run 20261207-130531-27ca5e" in gc.stdout, gc.stdout
    assert (tmp_path / "outside").is_dir()


def test_reading_commands_escape_control_characters_from_the_store(tmp_path: Path) -> None:
    """A job parameter value with an escape sequence (``-p Tag=$'x\\e]0;PWNED\\a'``) is shown
    by ``runs`` and ``checkpoints show`` with it escaped, and so is gc's line for the run it
    removes (a hostile trial: raw on stdout)."""
    template = tmp_path / "t.yaml"
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "name: tagged\n"
        "parameterDefinitions:\n"
        "- {name: Tag, type: STRING}\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: python3, args: ['-c', 'exit(1)']}\n"
    )
    store_url = str(tmp_path / "store")
    tag = "Tag=x\x1b]0;PWNED\x07"
    assert run_cli("run", template, "-p", tag, "--store", store_url, "-q").returncode == 1
    [run] = CheckpointStore(store_url).list_runs()[0]
    said = [
        run_cli("runs", "--store", store_url, timeout=60),
        run_cli("checkpoints", "show", run.run_id, "--store", store_url, timeout=60),
        run_cli("gc", "--retention-days", "0", "--store", store_url, timeout=60),
    ]
    for out in said:
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout + out.stderr
    assert "x\\x1b]0;PWNED\\x07" in said[0].stdout, said[0].stdout
    assert f"removed run {run.run_id}" in said[2].stdout, said[2].stdout
