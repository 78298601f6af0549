"""Resume safety (Trax, seed 001): refusal codes of ``openjd-checkpoint resume``, the retry
path's fallback to the top, checkpoint writes that are refused, and concurrent resumes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import DATA, ROOT, CliProcess, checkpoint_at_least, one_step_template, run_cli

from core import CheckpointStore

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout)


def suspended_run(store: Path, template: Path, *params: str, after: str = "LONG-START") -> str:
    args = ["run", str(template), "--store", str(store), "-q"]
    for p in params:
        args += ["-p", p]
    proc = CliProcess(*args)
    proc.wait_for(after)  # (finally.yaml's Long prints it once it handles its signals)
    proc.proc.send_signal(2)  # SIGINT: Suspended
    assert proc.wait(60) == 75, proc.stderr
    runs, _ = CheckpointStore(store).list_runs()
    return runs[-1].run_id


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "finally.yaml"
    shutil.copy(DATA / "finally.yaml", path)
    return path


def refused(result: subprocess.CompletedProcess[str], code: str) -> None:
    assert result.returncode == 4, (result.returncode, result.stdout, result.stderr)
    assert f"resume refused ({code})" in result.stderr, result.stderr
    assert "LONG-START" not in result.stdout  # nothing ran


def test_unknown_run(store: Path) -> None:
    refused(cli("resume", "no-such-run", "--store", str(store)), "unknown-run")


def test_not_failed_and_already_resumed(store: Path, template: Path) -> None:
    ok = cli("run", str(template), "-p", "LongSeconds=0.1", "--store", str(store), "-q")
    assert ok.returncode == 0
    (first,) = CheckpointStore(store).list_runs()[0]
    refused(cli("resume", first.run_id, "--store", str(store)), "not-failed")

    run_id = suspended_run(store, template, "LongSeconds=4")
    resumed = cli("resume", run_id, "--store", str(store), "-q")
    assert resumed.returncode == 0, resumed.stderr
    assert '"RESUMED"' in resumed.stdout
    refused(cli("resume", run_id, "--store", str(store)), "already-resumed")


def test_different_input(store: Path, template: Path) -> None:
    run_id = suspended_run(store, template, "LongSeconds=5")
    refused(cli("resume", run_id, "-p", "LongSeconds=6", "--store", str(store)), "different-input")
    # the retry path with other parameters runs from the top and says why
    retry = cli("run", str(template), "-p", "LongSeconds=0.1", "--store", str(store), "-q")
    assert retry.returncode == 0
    assert "different-input" in retry.stderr and "running from the top" in retry.stderr
    # ... and the suspended run is still there to resume
    assert CheckpointStore(store).find_run(run_id).status.value == "interrupted"


def test_no_checkpoint(store: Path, tmp_path: Path) -> None:
    template = one_step_template(
        tmp_path / "plain.yaml",
        "plain",
        "import time; print('LONG-START', flush=True); time.sleep(30)",
    )
    run_id = suspended_run(store, template)
    refused(cli("resume", run_id, "--store", str(store)), "no-checkpoint")


def test_no_checkpoint_for_a_generation_that_is_not_stored(store: Path, template: Path) -> None:
    run_id = suspended_run(store, template, "LongSeconds=5")
    refused(cli("resume", run_id, "--generation", "99", "--store", str(store)), "no-checkpoint")
    refused(cli("resume", run_id, "--from", "Later", "--store", str(store)), "no-checkpoint")


def test_chain_changed_names_the_step_and_retry_falls_back(store: Path, template: Path) -> None:
    run_id = suspended_run(store, template, "LongSeconds=4")
    template.write_text(template.read_text().replace("print('LATER-RAN')", "print('LATER-NEW')"))
    result = cli("resume", run_id, "--store", str(store))
    refused(result, "chain-changed")
    assert "Later" in result.stderr and "Long" not in result.stderr.split("chain-changed")[1]
    retry = cli("run", str(template), "-p", "LongSeconds=4", "--store", str(store), "-q")
    assert retry.returncode == 0, retry.stderr
    assert f"not resuming run {run_id}" in retry.stderr and "chain-changed" in retry.stderr
    assert "LONG-START from 0.0" in retry.stdout and "LATER-NEW" in retry.stdout
    # the refused run is not picked by later retries, but its checkpoints stay for gc
    assert CheckpointStore(store).find_run(run_id).superseded_by is not None


def test_state_changed(store: Path, template: Path) -> None:
    run_id = suspended_run(store, template, "LongSeconds=5")
    run = CheckpointStore(store).find_run(run_id)
    tasks_dir = store / "jobs" / run.job_key / "runs" / run_id / "tasks"
    record = next(
        p for p in tasks_dir.iterdir() if p.name.endswith(".json") and ".gen-" not in p.name
    )
    data = json.loads(record.read_text())
    data["schema_version"] = 2
    record.write_text(json.dumps(data))
    refused(cli("resume", run_id, "--store", str(store)), "state-changed")
    assert record.exists()  # left in place for a version that can read it


def test_operator_resume_from_a_step_and_generation(store: Path, template: Path) -> None:
    run_id = suspended_run(store, template, "LongSeconds=3", after="LONG-START")
    result = cli("resume", run_id, "--generation", "1", "--store", str(store), "-q")
    assert result.returncode == 0, result.stderr
    assert '"RESUMED"' in result.stdout and "LATER-RAN" in result.stdout


def test_requeue_supersedes_so_a_later_retry_does_not_go_back(store: Path, template: Path) -> None:
    first = suspended_run(store, template, "LongSeconds=5")
    requeue = CliProcess(
        "run", str(template), "-p", "LongSeconds=5", "--fresh", "--store", str(store), "-q"
    )
    requeue.wait_for("LONG-START from 0.0")
    requeue.proc.send_signal(2)
    assert requeue.wait(60) == 75
    assert CheckpointStore(store).find_run(first).superseded_by is not None
    retry = cli("run", str(template), "-p", "LongSeconds=5", "--store", str(store), "-q")
    assert retry.returncode == 0
    assert f"resuming run {first}" not in retry.stderr
    assert CheckpointStore(store).find_run(first).status.value == "interrupted"


def test_refused_checkpoint_writes_keep_the_previous_generation(
    store: Path, tmp_path: Path
) -> None:
    template = tmp_path / "bad-saves.yaml"
    template.write_text(
        textwrap.dedent(
            """
            specificationVersion: jobtemplate-2023-09
            extensions: [CHECKPOINT]
            name: bad saves
            steps:
            - name: S
              script:
                actions:
                  onRun:
                    command: python3
                    args: ['{{Task.File.Saver}}']
                  onCheckpointResume:
                    command: python3
                    args: [-c, "import sys; print('RESUMED FROM ' + sys.argv[1])",
                           '{{Task.Checkpoint.State}}']
                embeddedFiles:
                - name: Saver
                  type: TEXT
                  data: |
                    import json, time
                    def save(**kw):
                        print("openjd_checkpoint_save: " + json.dumps(kw), flush=True)
                    save(state="good")
                    save(state="x" * (128 * 1024))                # over the cap
                    save(state="nul\\u0000inside")                # NUL
                    save(state="missing", file="/no/such/file")   # missing file
                    print("LONG-START", flush=True)
                    time.sleep(30)
            """
        )
    )
    proc = CliProcess("run", str(template), "--store", str(store))
    proc.wait_for("LONG-START")
    checkpoint_at_least(store, 1)  # the good save is stored
    proc.proc.send_signal(2)
    assert proc.wait(60) == 75
    for what in ("over the 131071-byte cap", "NUL character", "does not exist"):
        assert what in proc.stderr, (what, proc.stderr)
    again = cli("run", str(template), "--store", str(store), "-q")
    assert again.returncode == 0 and "RESUMED FROM good" in again.stdout


def test_two_concurrent_runs_one_resumes_one_is_refused(store: Path, template: Path) -> None:
    suspended_run(store, template, "LongSeconds=4")
    args = ("run", str(template), "-p", "LongSeconds=4", "--store", str(store), "-q")
    a, b = CliProcess(*args), CliProcess(*args)
    codes = sorted([a.wait(90), b.wait(90)])
    assert codes == [0, 4], (codes, a.stderr, b.stderr)
    loser = a if "already-resumed" in a.stderr else b
    assert "resume refused (already-resumed)" in loser.stderr
    assert "LONG-START" not in loser.stdout


LIST_PARAMETERS = """\
specificationVersion: 'jobtemplate-2023-09'
extensions: [EXPR]
name: list parameters
parameterDefinitions:
- {name: Names, type: "LIST[STRING]", default: [left, right]}
- {name: Scenes, type: "LIST[PATH]", default: [a/one.blend]}
- {name: Flags, type: "LIST[BOOL]", default: [true, false]}
steps:
- name: S
  parameterSpace:
    taskParameterDefinitions:
    - {name: Name, type: STRING, range: "{{RawParam.Names}}"}
  script:
    actions:
      onRun:
        command: python3
        args: ["{{Task.File.Work}}", "{{Task.Param.Name}}", "{{Param.Scenes[0]}}",
               "{{Param.Flags}}"]
    embeddedFiles:
    - name: Work
      type: TEXT
      data: |
        import sys, time
        print("TASK", sys.argv[1:], flush=True)
        if sys.argv[1] == "two words":  # the first task finishes, the second is interrupted
            print("LONG-START", flush=True)
            time.sleep(30)
"""


def test_resume_by_id_of_a_run_with_list_parameters(store: Path, tmp_path: Path) -> None:
    """List values are kept in the run's record as JSON, so ``resume RUN_ID`` (which rebuilds
    the job from the record) reads them back, and a retry counts them as the same input."""
    template = tmp_path / "lists.yaml"
    template.write_text(LIST_PARAMETERS)
    first = CliProcess("run", str(template), "--store", str(store), "-q", "--max-parallel", "1",
                       "-p", '{"Names": ["one", "two words"]}')  # fmt: skip
    first.wait_for("LONG-START")
    first.proc.send_signal(2)  # SIGINT: Suspended
    assert first.wait(60) == 75, first.stderr
    (run,) = CheckpointStore(store).list_runs()[0]
    run_id = run.run_id
    assert json.loads(run.parameters["Names"]) == ["one", "two words"]
    assert json.loads(run.parameters["Flags"]) == [True, False]
    assert json.loads(run.parameters["Scenes"]) == [str(tmp_path / "a/one.blend")]
    proc = CliProcess("resume", run_id, "--store", str(store), "-q")
    proc.wait_for("LONG-START")
    proc.proc.send_signal(2)
    assert proc.wait(60) == 75, proc.stderr
    # Only the unfinished task runs, with the list values the run began with.
    assert f"TASK ['two words', '{tmp_path}/a/one.blend', 'true', 'false']" in proc.stdout
    assert "TASK ['one'" not in proc.stdout, proc.stdout
    # A retry with the same values (given another way) continues the same run.
    again = CliProcess("run", str(template), "--store", str(store), "-q", "--max-parallel", "1",
                       "-p", 'Names=["one", "two words"]')  # fmt: skip
    again.wait_for("LONG-START")
    again.proc.send_signal(2)
    assert again.wait(60) == 75, again.stderr
    assert f"resuming run {run_id}" in again.stderr, again.stderr


# Run in a process of its own: the CLI's main installs signal handlers and makes its process a
# child subreaper. Counts the reads of the run's record (``run.json``, through the store's file
# system) until the resumed attempt has begun, and over the whole command.
COUNT_READS = """
import json, sys
import core.cli._runner as runner
import core.fs._storefs as storefs
from core.cli._main import main

reads = {"begun": None, "all": 0}
read_bytes = storefs.StoreFS.read_bytes
def counted(self, path, **kwargs):
    if path.endswith("/" + sys.argv[1] + "/run.json"):
        reads["all"] += 1
    return read_bytes(self, path, **kwargs)
storefs.StoreFS.read_bytes = counted
begin_attempt = runner.begin_attempt
def begin(*args, **kwargs):
    attempt = begin_attempt(*args, **kwargs)
    reads["begun"] = reads["all"]
    return attempt
runner.begin_attempt = begin
code = main(["resume", sys.argv[1], "--store", sys.argv[2], "-q"])
print(json.dumps(reads))
sys.exit(code)
"""


def test_resume_reads_the_run_record_once_before_its_attempt(store: Path, tmp_path: Path) -> None:
    """``resume RUN`` reads the run's record once to rebuild the job, once in the job's run
    list under its lock (every decision of ``begin_attempt`` looks at that list) and once to
    rewrite it under its lock: 3 reads until its attempt has begun (there were 6), and none
    when the attempt starts its steps (it keeps the record it wrote)."""
    marker = tmp_path / "ok"
    template = one_step_template(
        tmp_path / "once.yaml",
        "once",
        "import json, os, sys; print('openjd_checkpoint_save: ' + json.dumps({'state': '1'}),"
        f" flush=True); sys.exit(0 if os.path.exists({str(marker)!r}) else 1)",
    )
    assert cli("run", str(template), "--store", str(store), "-q").returncode == 1
    (run,) = CheckpointStore(store).list_runs()[0]
    marker.touch()
    resumed = subprocess.run(
        [sys.executable, "-c", COUNT_READS, run.run_id, str(store)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    reads = json.loads(resumed.stdout.splitlines()[-1])
    # then: the file data flow of the task's capture, entering the finally phase, finishing
    # the attempt, and the report's outcome
    assert reads == {"begun": 3, "all": 7}, reads
