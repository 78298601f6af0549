"""core.process._spares: an action becomes a shell already in a cgroup of its own (no cgroup
move on its critical path), exactly as the exec wrapper would have started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.process import ActionProcess
from core.process import _spares as spares
from core.process._cgroups import containment

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or containment().launcher != "sh",
    reason="actions are not contained in cgroups by the exec wrapper here",
)

ROOT = Path(__file__).resolve().parent.parent


def _spare(timeout: float = 10.0) -> tuple[str, spares._Spare]:
    """A marker that names a reserved spare (a reservation that finds none makes one)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = spares.reserve_spare()
        if got is not None:
            return got[0], spares._mine().reserved[got[0]]
        time.sleep(0.01)
    raise AssertionError("no spare became ready")


def _run(
    argv: list[str], cwd: str, env: dict[str, str], marker: str
) -> tuple[ActionProcess, int, bytes]:
    lines: list = []
    proc = ActionProcess(argv, cwd=cwd, env=env, on_lines=lines.extend, marker=marker)
    proc.start()
    rc = proc.finish()
    return proc, rc, b"\n".join(line.data for line in lines)


def test_an_action_becomes_the_ready_spare_with_exactly_its_environment(tmp_path: Path) -> None:
    marker, spare = _spare()
    env = {"PATH": os.environ["PATH"], "ODD": "it's\n  $HOME `x` \\", "PWD": "/somewhere"}
    env["LC_ALL"] = "C.UTF-8"  # else python adds LC_CTYPE (PEP 538)
    probe = (
        "import os, sys; print(sorted(os.environ.items())); print(os.getcwd());"
        "print(repr(sys.stdin.read())); print(open('/proc/self/cgroup').read().splitlines()[-1])"
    )
    proc, rc, out = _run([sys.executable, "-c", probe], str(tmp_path), env, marker)
    assert proc.pid == spare.proc.pid  # the spare became the action
    text = out.decode()
    # the shell's own OLDPWD and PPID are not passed
    assert text.splitlines()[0] == repr(sorted(env.items()))
    assert text.splitlines()[-3:-1] == [str(tmp_path), "''"]  # its folder; stdin /dev/null
    assert text.splitlines()[-1].endswith("/" + marker)  # its cgroup is named by its marker
    assert rc == 0
    gone = os.path.join(containment().folder or "", marker)
    end = time.monotonic() + 5  # removed on a background thread once the action has ended
    while os.path.exists(gone) and time.monotonic() < end:
        time.sleep(0.01)
    assert not os.path.exists(gone)


def test_no_pwd_in_the_environment_is_passed_as_none(tmp_path: Path) -> None:
    marker, spare = _spare()
    env = {"PATH": os.environ["PATH"]}
    proc, rc, out = _run(["/usr/bin/env"], str(tmp_path), env, marker)
    assert proc.pid == spare.proc.pid
    assert rc == 0 and out.decode().splitlines() == [f"PATH={env['PATH']}"]


def test_an_exit_code_and_a_signal_are_the_action_s(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    _, rc, _ = _run(["/bin/sh", "-c", "exit 7"], str(tmp_path), env, _spare()[0])
    assert rc == 7
    _, rc, _ = _run(["/bin/sh", "-c", "kill -9 $$"], str(tmp_path), env, _spare()[0])
    assert rc == -signal.SIGKILL


def test_an_environment_the_shell_cannot_hold_starts_as_before(tmp_path: Path) -> None:
    marker, spare = _spare()
    env = {"PATH": os.environ["PATH"], "NOT-A-SHELL-NAME": "1"}
    probe = [
        sys.executable,
        "-c",
        "import os; print(os.environ['NOT-A-SHELL-NAME'])\n"
        "print(open('/proc/self/cgroup').read().splitlines()[-1])",
    ]
    proc, rc, out = _run(probe, str(tmp_path), env, marker)
    assert proc.pid != spare.proc.pid and rc == 0
    assert out.startswith(b"1\n") and out.endswith(b"/" + marker.encode())
    assert spare.proc.poll() is not None  # killed, its cgroup made again for the action


def test_a_spare_killed_from_outside_is_not_taken(tmp_path: Path) -> None:
    marker, spare = _spare()
    os.kill(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait(5)
    proc, rc, out = _run(["/bin/echo", "hi"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, marker)
    assert proc.pid != spare.proc.pid and rc == 0 and out == b"hi"


def test_the_spare_is_gone_with_its_cgroup_when_the_runner_exits(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from core.process import ActionProcess, new_marker
        from core.process import _spares
        p = ActionProcess(["/bin/true"], cwd="/", env={{"PATH": "/usr/bin:/bin"}},
                          on_lines=lambda lines: None, marker=new_marker())
        p.start(); p.finish()
        end = time.monotonic() + 10
        while time.monotonic() < end:
            got = _spares.reserve_spare()  # one reserved, one more made meanwhile
            if got is not None:
                s = _spares._mine().reserved[got[0]]
                print(s.proc.pid, s.cgroup, flush=True)
                break
            time.sleep(0.01)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pid, cgroup = done.stdout.split()
    end = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not os.path.exists(cgroup)
