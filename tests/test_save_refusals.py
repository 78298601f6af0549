"""Saves that carry nothing, and saves of a template that cannot resume (issue 36, items 4 and 7).

- ``openjd_checkpoint_save: {"state": null}`` and ``{}`` after a save of state ``5`` change
  nothing, with a warning each: the retry resumes from ``5`` (docs/extensions/CHECKPOINT.md
  2.3).
- A job template that does not declare CHECKPOINT stores none of its tasks' saves and captures
  no file in a managed store; suspended, it says it is not resumable (once per task) rather
  than "checkpointed; run again to continue".
- A step of a CHECKPOINT template without ``onCheckpointResume`` stores its saves, and says
  once per task that a resume does not use them."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import CliProcess, run_cli

from core import CheckpointStore

pytestmark = pytest.mark.slow

EMPTY_SAVES = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: empty saves
steps:
- name: S
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import sys
          print('openjd_checkpoint_save: {"state": "5"}', flush=True)
          print('openjd_checkpoint_save: {"state": null}', flush=True)
          print('openjd_checkpoint_save: {}', flush=True)
          sys.exit(1)
      onCheckpointResume:
        command: python3
        args: [-c, "print('RESUMED-FROM-' + '{{Task.Checkpoint.State}}', flush=True)"]
"""


def _records(store: Path):
    st = CheckpointStore(store)
    [run] = st.list_runs()[0]
    return st.read_tasks(run.job_key, run.run_id)[0]


def test_a_save_without_state_or_file_changes_nothing_and_says_so(
    tmp_path: Path, store: Path
) -> None:
    template = tmp_path / "empty.yaml"
    template.write_text(EMPTY_SAVES)
    first = run_cli("run", template, "--store", store, "-v")
    assert first.returncode == 1, first.stderr
    assert "'state' is null" in first.stderr, first.stderr
    assert "carries no state, no file" in first.stderr, first.stderr
    [rec] = _records(store)
    assert rec.checkpoint is not None
    assert (rec.checkpoint.generation, rec.checkpoint.state) == (1, "5")
    again = run_cli("run", template, "--store", store)
    assert again.returncode == 0, again.stderr
    assert "RESUMED-FROM-5" in again.stdout, again.stdout


NOT_RESUMABLE = """\
specificationVersion: jobtemplate-2023-09
name: not resumable
steps:
- name: Work
  parameterSpace:
    taskParameterDefinitions:
    - {name: T, type: INT, range: [1, 2]}
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import json, os, time
          path = os.path.join(os.getcwd(), "state.bin")
          for i in range(1, 1000):
              with open(path, "wb") as fh:
                  fh.write(os.urandom(4096))
              print("openjd_checkpoint_files: " + json.dumps({"files": [path]}), flush=True)
              print("openjd_checkpoint_save: " + json.dumps({"state": str(i)}), flush=True)
              print("SAVED", i, flush=True)
              time.sleep(0.1)
"""


def test_a_template_without_checkpoint_stores_no_save_and_says_it_is_not_resumable(
    tmp_path: Path, store: Path
) -> None:
    template = tmp_path / "plain.yaml"
    template.write_text(NOT_RESUMABLE)
    run = CliProcess(
        "run", str(template), "--store", str(store), "--files", "managed", "--max-parallel", "2"
    )
    run.wait_for("SAVED 3")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(60) == 75, run.stderr
    err = run.stderr
    assert err.count("not resumable: the job template does not declare the CHECKPOINT") == 2, err
    assert "checkpointed" not in err, err
    assert "run again to continue" not in err, err
    assert "running it again starts from the top" in err, err
    records = _records(store)
    assert len(records) == 2
    assert all(r.checkpoint is None and not r.pending_files for r in records), records
    blobs = [p for p in (store / "blobs").rglob("*") if p.is_file()]
    assert blobs == [], blobs


NO_RESUME_ACTION = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: no resume action
steps:
- name: Loop
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import sys, time
          print("STARTED-FROM-THE-TOP", flush=True)
          for i in range(1, 4):
              print('openjd_checkpoint_save: {"state": "%d"}' % i, flush=True)
              time.sleep(0.05)
          sys.exit(1)
"""


def test_a_save_of_a_step_without_onCheckpointResume_is_stored_and_says_a_resume_ignores_it(
    tmp_path: Path, store: Path
) -> None:
    """A CHECKPOINT template whose step has no ``onCheckpointResume`` stores its saves (an
    author adding the action later finds them: docs/decisions.md), but says once per task that
    a resume does not use them, instead of reporting a checkpoint kept without a word (the
    retry runs ``onRun`` from its start)."""
    template = tmp_path / "no-resume.yaml"
    template.write_text(NO_RESUME_ACTION)
    first = run_cli("run", template, "--store", store)
    assert first.returncode == 1, first.stderr
    said = "stored, but this step has no onCheckpointResume: a resume runs onRun from its start"
    assert first.stderr.count(said) == 1, first.stderr
    [rec] = _records(store)
    assert rec.checkpoint is not None and rec.checkpoint.state == "3"
    again = run_cli("run", template, "--store", store)
    assert again.returncode == 1, again.stderr
    assert "STARTED-FROM-THE-TOP" in again.stdout, again.stdout
    assert again.stderr.count(said) == 1, again.stderr


# A first save whose file takes a while to store (256 MiB, sparse), then ``{}`` once the runner
# has read the first (the bytes of the action's stdout pipe it has not read yet: FIONREAD).
EMPTY_WHILE_STORING = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: empty save while the first is stored
steps:
- name: S
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import fcntl, os, struct, sys, termios, time
          big = os.path.join(os.getcwd(), "big.bin")
          with open(big, "wb") as fh:
              fh.truncate(256 << 20)
          print('openjd_checkpoint_save: {"state": "5", "file": "%s"}' % big, flush=True)
          def unread():
              return struct.unpack("i", fcntl.ioctl(1, termios.FIONREAD, b"0000"))[0]
          while unread():
              time.sleep(0.001)
          print('openjd_checkpoint_save: {}', flush=True)
          while unread():
              time.sleep(0.001)
          sys.exit(1)
      onCheckpointResume:
        command: python3
        args: [-c, "print('RESUMED-FROM-' + '{{Task.Checkpoint.State}}', flush=True)"]
"""


def test_an_empty_save_after_one_still_being_stored_changes_nothing(
    tmp_path: Path, store: Path
) -> None:
    """With managed files a save is committed once its files are in the store, on the capture
    thread; ``{}`` read meanwhile was taken for a task's first save (the record held no
    checkpoint yet) and superseded state ``5`` with nothing: the retry resumed with an empty
    state. It is refused as after a stored save."""
    template = tmp_path / "empty.yaml"
    template.write_text(EMPTY_WHILE_STORING)
    first = run_cli("run", template, "--store", store, "--files", "managed")
    assert first.returncode == 1, first.stderr
    assert "carries no state, no file" in first.stderr, first.stderr
    [rec] = _records(store)
    assert rec.checkpoint is not None and rec.checkpoint.state == "5", rec.checkpoint
    again = run_cli("run", template, "--store", store, "--files", "managed")
    assert again.returncode == 0, again.stderr
    assert "RESUMED-FROM-5" in again.stdout, again.stdout
