"""A store whose disk is full (issue 36, item 2): a task whose end cannot be stored is never
reported succeeded. The run stops starting tasks, says the store failed, exits 3 (the store's
exit code), and once space is freed the same command runs that task again and the run ends.

The store lives on a 3 MiB tmpfs the test mounts and unmounts (skipped, saying why, where the
machine cannot mount one); the first task fills the disk from its action, as another tenant of
the disk would, so that its end is the write that fails."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli

from core import CheckpointStore
from core._records import TaskStatus

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "3m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
extensions: [CHECKPOINT]
name: full disk
parameterDefinitions:
- {name: Fill, type: STRING}
- {name: Flag, type: STRING}
steps:
- name: Work
  parameterSpace:
    taskParameterDefinitions:
    - {name: T, type: INT, range: "1-3"}
  script:
    actions:
      onRun:
        command: python3
        args:
        - -c
        - |
          import os, sys
          t = int(sys.argv[1])
          if t == 1 and os.path.exists(sys.argv[3]):
              with open(sys.argv[2], "wb") as fh:  # the disk fills up
                  try:
                      while True:
                          fh.write(b"x" * 65536)
                          fh.flush()
                  except OSError:
                      pass
          print(f"WORK-{t}-DONE", flush=True)
        - "{{Task.Param.T}}"
        - "{{Param.Fill}}"
        - "{{Param.Flag}}"
      onCheckpointResume:
        command: python3
        args: [-c, "print('unused')"]
"""


def test_a_task_whose_end_cannot_be_stored_is_not_reported_succeeded(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        store = disk / "store"
        fill, flag = disk / "filler", tmp_path / "fill-once"
        flag.touch()
        template = tmp_path / "full.yaml"
        template.write_text(TEMPLATE)
        args = (
            "run",
            template,
            "--store",
            store,
            "--max-parallel",
            "1",
            "-p",
            f"Fill={fill}",
            "-p",
            f"Flag={flag}",
        )
        first = run_cli(*args)
        err = first.stderr
        assert first.returncode == 3, (first.returncode, err)
        assert "WORK-1-DONE" in first.stdout
        assert "Work[T=1] succeeded" not in err, err
        assert "its end could not be stored" in err, err
        assert "the checkpoint store failed" in err, err
        assert "No space left" in err, err
        assert "WORK-2-DONE" not in first.stdout, first.stdout  # no more tasks started

        flag.unlink()
        fill.unlink()
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr
        assert "WORK-1-DONE" in again.stdout, again.stdout  # the task whose end was lost
        assert "WORK-2-DONE" in again.stdout and "WORK-3-DONE" in again.stdout, (err, again.stderr)
        st = CheckpointStore(store)
        run = st.list_runs()[0][-1]  # the first stored nothing to resume from: a new run
        assert run.status.value == "succeeded"
        assert all(
            r.status == TaskStatus.SUCCEEDED for r in st.read_tasks(run.job_key, run.run_id)[0]
        )
        os.sync()
