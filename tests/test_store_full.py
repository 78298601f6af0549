"""A store whose disk is full (issue 36, item 2): a task whose end cannot be stored is never
reported succeeded. The run stops starting tasks, says the store failed, exits 3 (the store's
exit code), and once space is freed the same command runs that task again and the run ends.

The store lives on a 3 MiB tmpfs the test mounts and unmounts (skipped, saying why, where the
machine cannot mount one); the first task fills the disk from its action, as another tenant of
the disk would. A record rewritten into a spare file needs no new space (``core.fs._replace``),
so the first task's end may still be stored; the first write that needs a new file fails, and
that task (whichever it is) is the one whose end is not stored. The task after it may have
started while that end was being written (issue 38: the end write is off the critical path,
docs/decisions.md); it is suspended, or its end is stored or not as the disk allows, and is
reported succeeded only if stored; no task after it starts."""

from __future__ import annotations

import contextlib
import os
import re
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
    - {name: T, type: INT, range: "1-4"}
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
        lost = sorted(int(n) for n in re.findall(r"Work\[T=(\d)\] not stored: ran to its end", err))
        assert lost, err
        t = lost[0]  # the first task whose end needed new space
        # with --max-parallel 1, at most the task after it started while its end was written
        assert set(lost) <= {t, t + 1}, err
        assert f"Work[T={t}] succeeded" not in err, err
        assert "its end could not be stored" in err, err
        assert "the checkpoint store failed" in err, err
        assert "No space left" in err, err
        for later in range(t + 2, 5):  # no more tasks started
            assert f"WORK-{later}-DONE" not in first.stdout, first.stdout
        said_done = {int(n) for n in re.findall(r"Work\[T=(\d)\] succeeded", err)}
        assert set(range(1, t)) <= said_done <= set(range(1, t)) | {t + 1} - set(lost), err
        st = CheckpointStore(store)  # every task said to have succeeded is stored so
        (run,) = st.list_runs()[0]
        stored = {
            int(r.parameters["T"]["value"])
            for r in st.read_tasks(run.job_key, run.run_id)[0]
            if r.status == TaskStatus.SUCCEEDED
        }
        assert stored == said_done, (stored, err)

        flag.unlink()
        fill.unlink()
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr
        assert f"WORK-{t}-DONE" in again.stdout, again.stdout  # the task whose end was lost
        for task in set(range(2, 5)) - said_done:  # every task not stored runs again
            assert f"WORK-{task}-DONE" in again.stdout, (err, again.stderr)
        st = CheckpointStore(store)
        run = st.list_runs()[0][-1]  # the first stored nothing to resume from: a new run
        assert run.status.value == "succeeded"
        assert all(
            r.status == TaskStatus.SUCCEEDED for r in st.read_tasks(run.job_key, run.run_id)[0]
        )
        os.sync()
