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

from core import CheckpointStore, TaskOutcome, begin_attempt, load_template, prepare_job, run_tasks
from core.job import plan_tasks
from core.process import ActionProcess, release_marker
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


def test_the_working_directory_is_chdir_s_relative_and_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    env = {"PATH": "/usr/bin:/bin"}
    marker, spare = _spare()
    # chdir follows the link, then goes to its target's parent; a logical 'cd' would not
    proc, rc, out = _run(["/bin/pwd", "-P"], str(tmp_path / "link" / ".."), env, marker)
    assert proc.pid == spare.proc.pid
    assert (rc, out) == (0, str(tmp_path / "real").encode())
    monkeypatch.chdir(tmp_path)
    marker, spare = _spare()
    proc, rc, out = _run(["/bin/pwd", "-P"], "real", env, marker)  # relative to this process's
    assert proc.pid == spare.proc.pid
    assert (rc, out) == (0, str(tmp_path / "real").encode())


@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        (["/bin/echo", "a\0b"], {"PATH": "/bin"}, ValueError),
        (["/bin/echo"], {"PATH": "/bin", "X": "a\0b"}, ValueError),
        (["/bin/echo"], {"PATH": "/bin", "X": "a" * 200_000}, OSError),  # E2BIG
    ],
    ids=["nul-in-an-argument", "nul-in-a-value", "a-value-over-the-kernel-limit"],
)
def test_what_popen_refuses_is_refused_as_before_not_altered_by_the_shell(
    tmp_path: Path, argv: list[str], env: dict[str, str], error: type[Exception]
) -> None:
    marker, spare = _spare()
    proc = ActionProcess(argv, cwd=str(tmp_path), env=env, on_lines=lambda _: None, marker=marker)
    with pytest.raises(error):  # the shell would drop the NUL, or start and exit 126
        proc.start()
    assert spare.proc.wait(5) is not None  # the spare was killed, not left waiting


def test_a_released_marker_s_untaken_spare_is_killed_with_its_cgroup() -> None:
    marker, spare = _spare()
    release_marker(marker)
    assert spare.proc.poll() is not None
    assert not os.path.exists(spare.cgroup)
    assert marker not in spares._mine().reserved
    release_marker(marker)  # again, or for a marker whose spare was taken: nothing


GROUP = """
specificationVersion: 'jobtemplate-2023-09'
name: spares
steps:
- name: S
  parameterSpace:
    taskParameterDefinitions:
    - {name: F, type: INT, range: "1-2"}
  stepEnvironments:
  - name: Broken
    script:
      actions:
        onEnter: {command: /bin/false}
  script:
    actions:
      onRun: {command: /bin/true}
"""


def test_a_long_lived_runner_keeps_no_spare_for_tasks_whose_action_never_started(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.yaml").write_text(GROUP)
    store = CheckpointStore(tmp_path / "store")
    before = set(spares._mine().reserved)
    for i in range(3):  # as a Prefect worker runs task runs, one group after another
        job = prepare_job(load_template(str(tmp_path / "job.yaml")), {})
        run_id = begin_attempt(store, job, external_key=f"group-{i}").run_id
        results = run_tasks(store, job, run_id, plan_tasks(job, "S"))
        assert {r.outcome for r in results} == {TaskOutcome.FAILED}  # onEnter failed
    kept = [s for n, s in spares._mine().reserved.items() if n not in before]
    live = [s for s in kept if s.proc.poll() is None]
    assert live == []  # without release_marker: two more shells (and cgroups) per group


def test_a_spare_being_made_as_the_runner_exits_is_not_left_behind() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from core.process import ActionProcess, new_marker
        from core.process._cgroups import containment
        p = ActionProcess(["/bin/true"], cwd="/", env={{"PATH": "/usr/bin:/bin"}},
                          on_lines=lambda lines: None, marker=new_marker())
        p.start(); p.finish()
        print(containment().folder, flush=True)
        new_marker()  # takes the ready spare; the next is being made as this process exits
        """
    )
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        folder = done.stdout.strip()
        # at exit: the spares killed, then this runner's folder removed with its empty cgroups
        assert not os.path.exists(folder), os.listdir(folder)


ONE = """
specificationVersion: 'jobtemplate-2023-09'
name: spare-record
steps:
- name: S
  script:
    actions:
      onRun: {command: /bin/sh, args: ['-c', 'echo $$ > "$0"', 'PIDFILE']}
"""


def test_a_task_whose_action_becomes_a_spare_is_named_with_its_pid_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record names the action's process before it starts, pid included, when it becomes a
    spare (``core.process.marked_spare``): one record write where there were two (the marker
    with pid 0, then the pid), and a runner killed in between leaves the pid to check."""
    pidfile = tmp_path / "pid"
    (tmp_path / "job.yaml").write_text(ONE.replace("PIDFILE", str(pidfile)))
    marker, _ = _spare()
    release_marker(marker)  # the spares being made again: wait for one ready
    end = time.monotonic() + 10
    while not spares._mine().ready and time.monotonic() < end:
        time.sleep(0.01)
    assert spares._mine().ready, "no spare became ready"
    store = CheckpointStore(tmp_path / "store")
    named: list[int] = []  # the pid of each write of the task's record that names a process
    real = store.write_task

    def write_task(record, **kwargs) -> None:  # noqa: ANN001
        if record.process is not None:
            named.append(record.process.pid)
        real(record, **kwargs)

    monkeypatch.setattr(store, "write_task", write_task)
    job = prepare_job(load_template(str(tmp_path / "job.yaml")), {})
    run_id = begin_attempt(store, job, external_key="spare-record").run_id
    [result] = run_tasks(store, job, run_id, plan_tasks(job, "S"))
    assert result.outcome == TaskOutcome.SUCCEEDED, result
    action_pid = int(pidfile.read_text())
    assert named == [action_pid], named  # before: [0, action_pid]
