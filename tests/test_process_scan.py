"""The one-pass /proc scan behind killing an action's process tree."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import psutil
from escaping import alive_with_argv, kill_left, wait_for_argvs

from core.process import MARKER_VARIABLE, new_marker
from core.process._process import _descendants, _scan_proc, kill_process_group


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _wait_own_session(pid: int, timeout: float = 10.0) -> None:
    """Wait until process ``pid`` has left its parent's session (``os.setsid()``)."""
    end = time.monotonic() + timeout
    while os.getsid(pid) != pid:
        assert time.monotonic() < end, f"process {pid} never called setsid"
        time.sleep(0.01)


def test_a_new_marker_finds_a_process_that_left_the_group() -> None:
    marker = new_marker()
    code = "import os, time; os.setsid(); time.sleep(60)"
    env = dict(os.environ, **{MARKER_VARIABLE: marker})
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        _wait_own_session(proc.pid)
        assert _scan_proc(marker=marker) == [proc.pid]
        assert _scan_proc(marker=new_marker()) == []
    finally:
        proc.kill()
        proc.wait()


def test_kill_process_group_kills_descendants_found_in_the_same_pass() -> None:
    # The leader starts a grandchild that leaves the group (setsid) and carries no marker:
    # only the parent links found in the scan lead to it.
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); "
        "time.sleep(60)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    _wait_own_session(grandchild)  # it left the group
    kill_process_group(leader.pid, timeout=5)
    leader.wait(5)
    assert _wait_gone(grandchild)


def test_descendants_skip_processes_older_than_their_parent() -> None:
    # pid 10 (started at 100) has child 11 (at 150); 12 names 10 as parent but started
    # before it (the parent pid was reused): not a descendant.
    parents = {10: (1, 100), 11: (10, 150), 12: (10, 50), 13: (11, 160), 14: (2, 170)}
    assert sorted(_descendants(10, parents)) == [11, 13]
    assert _descendants(99, parents) == []


RUN_ONE_ACTION = """
import sys
from core.process._process import MARKER_VARIABLE, ActionProcess, action_containment, new_marker
marker = new_marker()
proc = ActionProcess(["bash", "-c", sys.argv[1]], cwd="/", env={"PATH": "/usr/bin:/bin",
                     MARKER_VARIABLE: marker}, on_lines=lambda lines: None, marker=marker)
proc.start()
print(proc.finish(), action_containment())
"""


def test_without_cgroups_the_walk_over_proc_kills_what_left_the_group() -> None:
    # OPENJD_CHECKPOINT_CGROUPS=off, in a process that is no subreaper (an Airflow task, a
    # Prefect worker): the earlier rules alone find a setsid child and double forks.
    tag = random.randrange(10**6)
    argvs = [f"sleep 600.{tag}{i}" for i in range(1, 4)]
    script = f"setsid {argvs[0]} & ( ( {argvs[1]} & ) & ); ( setsid sh -c '{argvs[2]} &' & )"
    env = dict(os.environ, OPENJD_CHECKPOINT_CGROUPS="off")
    try:
        res = subprocess.run(
            [sys.executable, "-c", RUN_ONE_ACTION, script + "; " + wait_for_argvs(argvs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("0 action containment: no cgroups (turned off by "), res.stdout
        assert "marker, in a walk over /proc" in res.stdout, res.stdout
        assert [a for a in argvs if alive_with_argv(a)] == []
    finally:
        kill_left(argvs)
