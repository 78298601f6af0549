"""Every action in a cgroup v2 of its own (core.process._cgroups), killed whole when it ends: a
process
that leaves the session and clears its environment (``setsid env -i CMD &``), told by neither
its process group nor its marker, does not outlive the action; what a SIGKILLed runner left is
killed, and its cgroups removed, by the next run. Where cgroups are off the earlier rules hold
(tests/test_subreaper.py runs its double-fork test both ways)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CliProcess, run_cli
from escaping import alive_with_argv, escapes, kill_left, template

from core.process import MARKER_VARIABLE, ActionProcess, new_marker
from core.process._cgroups import containment, in_cgroup, kill_cgroup, release_cgroup

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not containment().cgroups,
    reason="no writable cgroup v2 here: actions are contained by the earlier rules",
)


def folder_of(output: str) -> str:
    """The runner folder named by the CLI's containment line (``-v``)."""
    found = re.findall(r"action containment: cgroup v2, a cgroup per action under (\S+) ", output)
    assert len(found) == 1, output  # one line, once
    return found[0]


def test_no_process_of_an_action_outlives_a_cli_run(tmp_path: Path) -> None:
    script, argvs = escapes()
    try:
        res = run_cli("run", template(tmp_path / "t.yaml", script), "--store", tmp_path / "s", "-v")
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "ESCAPED" in out
        for argv in argvs:
            assert alive_with_argv(argv) == [], f"{argv} outlived the run"
        assert not os.path.exists(folder_of(out))  # the runner's cgroups are gone with it
    finally:
        kill_left(argvs)


def test_a_sigkilled_runners_leftovers_and_cgroups_go_with_the_next_run(tmp_path: Path) -> None:
    again = tmp_path / "again"
    script, argvs = escapes()
    script = f"[ -e {again} ] && exit 0\n{script}sleep 300\n"
    args = ["run", str(template(tmp_path / "t.yaml", script)), "--store", str(tmp_path / "s")]
    try:
        first = CliProcess(*args, "-v")
        first.wait_for("ESCAPED")
        folder = folder_of(first.stdout + first.stderr)
        first.proc.send_signal(signal.SIGKILL)
        first.wait(10)
        escaped: list[int] = []
        for argv in argvs:  # unsupervised now, in the dead runner's cgroup
            escaped += alive_with_argv(argv)
            assert escaped, argv
        # the action's cgroup: the one that holds them (a spare's may be there too, until its
        # shell, whose runner is gone, has ended: core.process._spares)
        [box] = [n for n in os.listdir(folder) if set(escaped) & set(_procs(folder, n))]
        again.write_text("")
        res = run_cli(*args)  # the same job again: its first attempt kills what the dead one left
        assert res.returncode == 0, res.stdout + res.stderr
        assert "left running by a dead runner" in res.stderr, res.stderr
        for argv in argvs:
            assert alive_with_argv(argv) == [], f"{argv} outlived the next run"
        assert not os.path.exists(os.path.join(folder, box))
        assert not os.path.exists(folder)  # the dead runner's folder, left empty, went too
    finally:
        kill_left(argvs)


def _procs(folder: str, name: str) -> list[int]:
    try:
        return [int(p) for p in Path(folder, name, "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _start(argv: list[str], env: dict[str, str], cwd: str) -> tuple[ActionProcess, list[bytes]]:
    lines: list[bytes] = []
    marker = new_marker()
    proc = ActionProcess(
        argv,
        cwd=cwd,
        env=dict(env, **{MARKER_VARIABLE: marker}),
        on_lines=lambda batch: lines.extend(line.data for line in batch),
        marker=marker,
    )
    proc.start()
    return proc, lines


@pytest.mark.parametrize(
    "extra",
    [
        {"PWD": "/a/stale/dir"},  # kept as given, not the shell's own
        {},  # no PWD: none is added
        {"BASH_FUNC_f%%": "() { echo f; }", "IFS": ":"},  # names a shell would drop or reset
    ],
    ids=["pwd", "no-pwd", "shell-names"],
)
def test_an_action_starts_in_its_cgroup_with_its_environment_unchanged(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    env = {"PATH": os.environ["PATH"], "ODD": "two words\nand a line", **extra}
    code = (
        "import os, sys\n"
        "print(open('/proc/self/cgroup').read().splitlines()[-1])\n"
        "print(repr(sorted(open('/proc/self/environ', 'rb').read().split(b'\\0')[:-1])))\n"
    )
    proc, lines = _start([sys.executable, "-c", code], env, str(tmp_path))
    assert proc.finish() == 0, lines
    found = containment()
    assert found.folder is not None
    marker = proc._env[MARKER_VARIABLE]
    cgroup_line = lines[0].decode()
    assert cgroup_line.endswith(f"/{os.path.basename(found.folder)}/{marker}"), cgroup_line
    given = {**env, MARKER_VARIABLE: marker}
    want = sorted(os.fsencode(f"{k}={v}") for k, v in given.items())
    assert lines[1].decode() == repr(want)
    gone = os.path.join(found.folder, marker)  # removed after the action, on another thread
    end = time.monotonic() + 5
    while os.path.exists(gone) and time.monotonic() < end:
        time.sleep(0.01)
    assert not os.path.exists(gone)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, FileNotFoundError),  # no such program
        ("echo no interpreter line\n", OSError),  # ENOEXEC: a shell would run it, Popen does not
        ("#!/bin/sh\r\necho a CRLF line\n", FileNotFoundError),  # no interpreter '/bin/sh\r'
    ],
    ids=["missing", "no-shebang", "crlf-shebang"],
)
def test_an_action_that_cannot_start_fails_as_popen_does(
    tmp_path: Path, content: str | None, error: type[OSError]
) -> None:
    program = tmp_path / "program"
    if content is not None:
        program.write_text(content)
        program.chmod(0o755)
    with pytest.raises(error) as raised:
        _start([str(program)], {"PATH": os.environ["PATH"]}, str(tmp_path))
    with pytest.raises(error) as popen:
        subprocess.Popen([str(program)], cwd=str(tmp_path))
    assert raised.value.errno == popen.value.errno


def test_a_cgroup_is_emptied_by_freezing_where_cgroup_kill_is_missing(tmp_path: Path) -> None:
    # Linux 5.2 to 5.13 have cgroup.freeze but no cgroup.kill: freeze, kill each, thaw.
    script, argvs = escapes()
    run = tmp_path / "run.sh"
    run.write_text(script + "sleep 300\n")
    proc, lines = _start(["bash", str(run)], {"PATH": os.environ["PATH"]}, str(tmp_path))
    try:
        end = time.monotonic() + 30
        while b"ESCAPED" not in lines and time.monotonic() < end:
            time.sleep(0.02)
        assert all(alive_with_argv(a) for a in argvs)
        box = proc._cgroup
        assert box is not None
        assert kill_cgroup(box, timeout=10, use_kill=False) >= 6  # bash, 5 sleeps
        assert [a for a in argvs if alive_with_argv(a)] == []
        assert proc.finish(kill_leftovers=False) == -signal.SIGKILL
        assert release_cgroup(box)
    finally:
        kill_left(argvs)
        proc.kill_tree()


def test_a_cgroup_with_one_made_below_it_is_released_whole_and_membership_is_its_own(
    tmp_path: Path,
) -> None:
    folder = containment().folder
    assert folder is not None
    box = os.path.join(folder, f"test-{os.getpid()}-{time.monotonic_ns()}")
    inner = os.path.join(box, "inner")
    os.makedirs(inner)
    proc = subprocess.Popen(
        ["sh", "-c", 'echo 0 >"$0" && exec sleep 30', os.path.join(inner, "cgroup.procs")]
    )
    try:
        end = time.monotonic() + 10
        while not in_cgroup(proc.pid, inner) and time.monotonic() < end:
            time.sleep(0.01)
        assert in_cgroup(proc.pid, inner)
        assert not in_cgroup(proc.pid, box)  # below it is not in it
        assert not release_cgroup(box)  # a process is left: kept
        assert os.path.isdir(inner)
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 10
    while not release_cgroup(box) and time.monotonic() < end:  # emptied once it is reaped
        time.sleep(0.01)
    assert not os.path.exists(box)  # the one below it went first
    assert not in_cgroup(proc.pid, box)  # a cgroup that is gone holds nothing
