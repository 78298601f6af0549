"""An action that leaves processes behind in every way a process can escape its action, and how
a test finds them afterwards (by a unique argv, in ``/proc``): tests/test_containment.py and
tests/prefect/test_flows.py."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path


def escapes() -> tuple[str, list[str]]:
    """A bash script that leaves four sleeps behind in four ways and prints ``ESCAPED``, and
    their argvs (unique to this call)."""
    tag = random.randrange(10**6)
    argvs = [f"sleep 600.{tag}{i}" for i in range(1, 5)]
    script = (
        f"setsid env -i {argvs[0]} &\n"  # a new session, no marker: no rule but a cgroup finds it
        f"( ( {argvs[1]} & ) & )\n"  # a double fork: re-parented away from the action
        f"( setsid sh -c '{argvs[2]} &' & )\n"  # both
        f"( setsid env -i {argvs[3]} & )\n"  # all three: not even the action's descendant
        f"{wait_for_argvs(argvs)}\n"
        "echo ESCAPED\n"
    )
    return script, argvs


def wait_for_argvs(argvs: list[str], timeout: float = 30) -> str:
    """A shell command that waits (at most ``timeout`` seconds) until a process runs with
    each command line of ``argvs`` (``pgrep -x -f``: the whole command line)."""
    checks = " && ".join(f"pgrep -x -f '{a}' >/dev/null" for a in argvs)
    tries = int(timeout / 0.02)
    return f"for _ in $(seq {tries}); do {checks} && break; sleep 0.02; done"


def template(path: Path, script: str, name: str = "Escapes") -> Path:
    """A job template whose one task runs ``script`` with bash (an embedded file)."""
    lines = "".join(f"        {line}\n" for line in script.splitlines())
    path.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        f"name: {name}\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun: {command: bash, args: ['{{Task.File.Run}}']}\n"
        "    embeddedFiles:\n"
        "    - name: Run\n"
        "      type: TEXT\n"
        "      data: |\n"
        f"{lines}"
    )
    return path


def alive_with_argv(argv: str) -> list[int]:
    """Pids of live processes (zombies aside) whose command line is ``argv``."""
    want = argv.encode().replace(b" ", b"\0") + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if fh.read() != want:
                    continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rindex(b")") + 2 :][:1] not in (b"Z", b"X"):
                found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def kill_left(argvs: list[str]) -> None:
    """A failing test's survivors, by pid (never by name)."""
    for argv in argvs:
        for pid in alive_with_argv(argv):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
