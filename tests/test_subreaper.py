"""The CLI runner as a child subreaper (core.process._reaper): what an action leaves behind (a child
that left the group, a double-forked daemon) is killed when the action ends, found among the
runner's own descendants, and reaped: no zombie is left with the runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from conftest import run_cli

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    frame = int(sys.argv[1])
    if frame == 1:
        # a child that leaves the group, and a double-forked daemon that leaves the session
        c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             start_new_session=True)
        print(f"ESCAPED {c.pid}", flush=True)
        done, say_done = os.pipe()  # end of file once the two below have done their part
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                print(f"ESCAPED {os.getpid()}", flush=True)
                os.close(say_done)
                time.sleep(300)
            os._exit(0)
        # and one that exits by itself once re-parented: a zombie unless the runner reaps it
        if os.fork() == 0:
            os.setsid()
            parent = os.getpid()
            if os.fork() == 0:
                while os.getppid() == parent:
                    time.sleep(0.01)
                os._exit(0)
            os._exit(0)
        os.close(say_done)
        os.read(done, 1)
    else:
        runner = os.getppid()
        kids = []
        for tid in os.listdir(f"/proc/{runner}/task"):
            with open(f"/proc/{runner}/task/{tid}/children") as fh:
                kids += [int(k) for k in fh.read().split()]
        def spare(pid):  # the shell that waits to become the next action (core.process._spares)
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                return fh.read().startswith(b"/bin/sh\\0-c\\0echo 0 >")
        others = [k for k in kids if k != os.getpid() and not spare(k)]
        states = []
        for k in others:
            with open(f"/proc/{k}/stat") as fh:
                states.append(fh.read().rsplit(")", 1)[1].split()[0])
        print(f"RUNNER CHILDREN {others} {states}", flush=True)
    """
)


@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_the_cli_runner_kills_and_reaps_what_an_action_left(tmp_path: Path, cgroups: str) -> None:
    # auto: each action in a cgroup of its own where the machine allows it (core.process._cgroups);
    # off: the earlier rules (process group, marker, the runner's descendants) hold alone.
    script = tmp_path / "escaper.py"
    script.write_text(SCRIPT)
    template = tmp_path / "t.yaml"
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "name: Escapes\n"
        "steps:\n"
        "- name: S\n"
        "  parameterSpace:\n"
        "    taskParameterDefinitions:\n"
        "    - {name: Frame, type: INT, range: '1-2'}\n"
        "  script:\n"
        "    actions:\n"
        f"      onRun: {{command: {sys.executable},\n"
        f"               args: ['{script}', '{{{{Task.Param.Frame}}}}']}}\n"
    )
    env = dict(os.environ, OPENJD_CHECKPOINT_CGROUPS=cgroups)
    res = run_cli(
        "run", template, "--store", tmp_path / "store", "--max-parallel", "1", "-v", env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    [line] = [ln for ln in out.splitlines() if "action containment: " in ln]
    if cgroups == "off":
        assert "no cgroups (turned off by OPENJD_CHECKPOINT_CGROUPS=off)" in line, line
        assert "marker, among the runner's descendants (child subreaper)" in line, line
    escaped = [int(line.split()[-1]) for line in out.splitlines() if "ESCAPED " in line]
    assert len(escaped) == 2, out
    # When task 2 ran, task 1's escaped processes were gone: killed and reaped (no zombie).
    assert "RUNNER CHILDREN [] []" in out, out
    for pid in escaped:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


LEADER = """
import os, subprocess, sys, time
env = dict(os.environ)
env.pop("MARKER")
# a group member that does not carry the marker, and a marked one that leaves the session
a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
b = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
while os.getsid(b.pid) != b.pid:  # it has left the session
    time.sleep(0.01)
print(a.pid, b.pid, flush=True)
"""

RUNNER = """
import os, subprocess, sys, time
from core.process._reaper import become_child_subreaper, is_subreaper, kill_action_tree
assert become_child_subreaper() and is_subreaper()
env = dict(os.environ, MARKER="m-123")
leader = subprocess.Popen([sys.executable, sys.argv[1]], env=env, start_new_session=True,
                          stdout=subprocess.PIPE)
pids = [int(p) for p in leader.stdout.readline().split()]
leader.wait()  # its children were re-parented to this subreaper as it exited
kill_action_tree(leader.pid, include_leader=False, needle=b"MARKER=m-123")
left = []
for pid in pids:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            left.append((pid, fh.read().rsplit(")", 1)[1].split()[0]))
    except FileNotFoundError:
        pass
print("LEFT", left, flush=True)
"""


def test_kill_action_tree_finds_grouped_and_marked_processes_among_descendants(
    tmp_path: Path,
) -> None:
    # In a process of its own (the flag is for the whole process): it becomes the subreaper,
    # starts an action whose leader leaves an unmarked group member and a marked setsid'd
    # process behind, and kills the tree once the leader has exited: both are gone, reaped.
    (tmp_path / "leader.py").write_text(LEADER)
    (tmp_path / "runner.py").write_text(RUNNER)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    res = subprocess.run(
        [sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "leader.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "LEFT []" in res.stdout, res.stdout + res.stderr


LONG_ACTION = """
import os, sys, time
# 200 short helpers, each double-forked: re-parented to the runner, they exit while this
# action still runs (a shell's `( cmd & )` in a loop)
gone, alive = os.pipe()  # end of file once every helper has exited
for _ in range(200):
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)
        os._exit(0)
    os.wait()
os.close(alive)
os.read(gone, 1)
runner = os.getppid()


def zombies():
    count = 0
    for tid in os.listdir(f"/proc/{runner}/task"):
        with open(f"/proc/{runner}/task/{tid}/children") as fh:
            for kid in fh.read().split():
                try:
                    with open(f"/proc/{kid}/stat") as st:
                        count += st.read().rsplit(")", 1)[1].split()[0] == "Z"
                except FileNotFoundError:
                    pass
    return count


# the runner's sweep reaps them while this action runs (every second), or never before its end
end = time.monotonic() + 30
while (left := zombies()) and time.monotonic() < end:
    time.sleep(0.1)
print(f"RUNNER ZOMBIES {left}", flush=True)
"""


def test_orphans_that_exit_during_a_long_action_are_reaped_before_it_ends(tmp_path: Path) -> None:
    # Without a sweep during the action, each helper stayed a zombie of the runner until the
    # action ended: 200 here, one per helper of an hours-long task.
    script = tmp_path / "long.py"
    script.write_text(LONG_ACTION)
    template = tmp_path / "t.yaml"
    template.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "name: Helpers\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        f"      onRun: {{command: {sys.executable}, args: ['{script}']}}\n"
    )
    res = run_cli("run", template, "--store", tmp_path / "store")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "RUNNER ZOMBIES 0" in out, out
