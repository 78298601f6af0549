"""A spare action process, already in a cgroup of its own, for the next action to become.

Moving a process into a cgroup (a write to ``cgroup.procs``) takes the kernel's
``cgroup_threadgroup_rwsem`` for writing, which waits for an RCU grace period unless another
move came just before: 0.06 ms for moves back to back, 10-15 ms for moves 20 ms apart (as
Prefect task runs and Airflow task instances come), on the critical path of every action
(``benchmarks/prefect_integration_costs.py`` prints both). Python's ``subprocess`` has no
``CLONE_INTO_CGROUP`` (nor does glibc's ``posix_spawn`` before 2.39, which added
``posix_spawnattr_setcgroup_np``), so the move cannot be skipped; it can be made early.

A spare is ``/bin/sh`` started with an empty environment, its output on a pipe that becomes the
action's, which moves itself into a cgroup of this runner's folder named as a marker
(``new_marker``'s random hex: cgroup v2 does not rename cgroups, and an action's cgroup is found
by its marker) and then sources its standard input. ``reserve_spare`` hands out the name of a
spare that is in its cgroup as the next marker; ``take_spare`` then writes the action marked so
to that spare's standard input as shell commands: go to the working directory, set the
environment exactly (the exec wrapper's ``PWD`` rule, ``core.process._cgroups``), then ``exec``
the program with its arguments, standard input ``/dev/null``. It is taken only where the exec
wrapper itself would be used (the same checks: ``_sh_argv``); else the spare is killed and the
action starts as before. Two spares are kept ready per runner process (``KEPT_READY``), made
again in the background after each reservation. A reserved spare no action took is killed when its
marker is released (``drop_spare``: its task ended, its environment exited); the rest at exit,
with one still being made then.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass

from core._threads import start_daemon
from core.process._cgroups import (
    _SH,
    _sh_argv,
    containment,
    in_cgroup,
    kill_cgroup,
    note_made,
    release_cgroup,
)

__all__ = ("KEPT_READY", "drop_spare", "reserve_spare", "reserved_pid", "take_spare")

KEPT_READY = 2
"""Spares kept ready (or being made) per runner process: with two, the one made after a
reservation has two actions' time to move itself in (an action that finds none ready pays for
its own move, 10-15 ms where moves come tens of ms apart)."""

_SCRIPT = 'echo 0 >"$0" || exit 125\n. /dev/stdin\n'
"""The spare: ``$0`` its cgroup's ``cgroup.procs``; then the action (nothing, and an exit 0,
when the runner closes the pipe without one)."""


@dataclass
class _Spare:
    proc: subprocess.Popen[bytes]
    cgroup: str
    made: float
    """``time.monotonic()`` before it was started."""


class _Spares:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.ready: list[_Spare] = []
        self.reserved: dict[str, _Spare] = {}
        self.making = False
        self.not_making = threading.Event()
        """Set while no spare is being made (``_close`` waits for one being made)."""
        self.not_making.set()
        self.closed = False
        """True from exit on (``_close``): a spare made then is killed at once."""
        self.at_exit = False


_STATE: list[_Spares] = []


def _mine() -> _Spares:
    if not _STATE or _STATE[0].pid != os.getpid():  # a forked child has none of the parent's
        _STATE[:] = [_Spares()]
    return _STATE[0]


def reserve_spare() -> tuple[str, float] | None:
    """The name of a spare that is in its cgroup (its cgroup's name, to be the next action's
    marker) and how many seconds ago it was started; None when none is ready (one is then made
    in the background). A reserved spare is used by ``take_spare`` with that name, or killed at
    exit.

    Raises:
        ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
    """
    found = containment()
    if not found.cgroups or found.folder is None or found.launcher != "sh":
        return None
    state = _mine()
    spare = None
    with state.lock:
        waiting: list[_Spare] = []
        while state.ready and spare is None:
            candidate = state.ready.pop(0)  # the oldest first: the likeliest to be in
            if candidate.proc.poll() is not None:
                _drop(candidate)
            elif in_cgroup(candidate.proc.pid, candidate.cgroup):  # it moved itself in
                spare = candidate
            else:  # still moving itself in: kept for a later action
                waiting.append(candidate)
        state.ready[:0] = waiting
        if spare is not None:
            state.reserved[os.path.basename(spare.cgroup)] = spare
        if len(state.ready) < KEPT_READY and not state.making and not state.closed:
            if not state.at_exit:
                state.at_exit = True
                atexit.register(_close, state)  # before the first is made: it may be at exit
            state.making = True
            state.not_making.clear()
            folder = found.folder
            start_daemon(lambda: _make(folder, state), "openjd-spare")
    if spare is None:
        return None
    return os.path.basename(spare.cgroup), time.monotonic() - spare.made


def reserved_pid(name: str) -> int | None:
    """The pid of the spare reserved as ``name`` (``reserve_spare``) while it waits for its
    action: the pid that action will have (the spare ``exec``s it, in a session of its own);
    None when none is reserved as ``name`` or it has exited."""
    state = _mine()
    with state.lock:
        spare = state.reserved.get(name)
    if spare is None or spare.proc.poll() is not None:
        return None
    return spare.proc.pid


def take_spare(
    name: str, argv: list[str], cwd: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str] | None:
    """Start ``argv`` (in ``cwd``, with exactly ``env``) as the spare reserved as ``name``
    (``reserve_spare``): the ``Popen`` (standard output and error on ``stdout``, merged; a
    session of its own; standard input ``/dev/null``) and its cgroup's path. None when no spare
    was reserved as ``name``, or the action cannot be started as one (that spare is then killed
    and its cgroup removed): start it as before."""
    state = _mine()
    with state.lock:
        spare = state.reserved.pop(name, None)
    if spare is None:
        return None
    if not os.path.isdir(cwd) or not _passable(argv, env) or _sh_argv(argv, cwd, env, "") is None:
        _drop(spare)
        return None
    assert spare.proc.stdin is not None
    try:
        spare.proc.stdin.write(_request(argv, cwd, env))
        spare.proc.stdin.close()
    except OSError:  # it died meanwhile: killed from outside
        _drop(spare)
        return None
    return spare.proc, spare.cgroup


def drop_spare(name: str) -> None:
    """No action will become the spare reserved as ``name`` (``reserve_spare``): its actions
    are over, or never started. That spare, if no action took it, is killed and its cgroup
    removed; nothing else is done. Without this a long-lived runner would keep one shell (and
    one cgroup) per marker whose action never started (an ``onEnter`` that failed, a stop
    before the task's action) until it exits."""
    state = _mine()
    with state.lock:
        spare = state.reserved.pop(name, None)
    if spare is not None:
        _drop(spare)


_MAX_ARG_STRLEN = 32 * 4096
"""Linux's limit on one argument or ``NAME=value`` string of an ``execve``, in bytes."""


def _passable(argv: list[str], env: dict[str, str]) -> bool:
    """True if ``Popen`` would pass ``argv`` and ``env`` to ``execve`` as they are: no NUL
    (``Popen`` raises ValueError; the shell would drop it) and well within the kernel's size
    limits (``Popen`` raises ``E2BIG``; the shell would start and fail with 126). Else the
    action starts as before, and fails as before."""
    texts = [*argv, *(f"{k}={v}" for k, v in env.items())]
    if texts and all(isinstance(t, str) for t in texts):  # a bound without encoding them
        if any("\0" in t for t in texts):
            return False
        longest = max(len(t) for t in texts)  # a character is at most 4 bytes encoded
        if 4 * longest < _MAX_ARG_STRLEN and sum(4 * len(t) + 9 for t in texts) < _arg_max():
            return True
    strings = [os.fsencode(a) for a in argv]
    strings += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    if any(b"\0" in s or len(s) >= _MAX_ARG_STRLEN for s in strings):
        return False
    total = sum(len(s) + 1 + 8 for s in strings)  # the string, its NUL, its pointer
    return total < _arg_max()


def _arg_max() -> int:
    """Half the kernel's limit on an ``execve``'s arguments and environment, in bytes."""
    return os.sysconf("SC_ARG_MAX") // 2


def _request(argv: list[str], cwd: str, env: dict[str, str]) -> bytes:
    """The shell commands that make the spare the action (see the module docstring). ``cwd``
    as ``chdir`` takes it: relative to this process's folder (the spare's is ``/``), and
    ``..`` after a symbolic link is the link target's parent (``cd -P``)."""
    where = cwd if os.path.isabs(cwd) else os.path.join(os.getcwd(), cwd)  # not normalised
    lines = [f"cd -P -- {shlex.quote(where)} || exit 125", "unset OLDPWD"]  # cd sets it
    pwd = env.get("PWD")
    lines.append("unset PWD" if pwd is None else f"PWD={shlex.quote(pwd)}; export PWD")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items() if k != "PWD"]
    lines.append("exec </dev/null " + " ".join(shlex.quote(a) for a in argv))
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _make(folder: str, state: _Spares) -> None:
    """Start spares (on a background thread) until ``KEPT_READY`` are ready: each its cgroup,
    its shell, which moves itself in."""
    while _make_one(folder, state):
        pass


def _make_one(folder: str, state: _Spares) -> bool:
    """Start one spare; True if another is wanted (``state.making`` is then still set)."""
    name = uuid.uuid4().hex  # as new_marker's
    cgroup = os.path.join(folder, name)
    made = time.monotonic()
    try:
        os.mkdir(cgroup)
        note_made(name)
        proc = subprocess.Popen(
            [_SH, "-c", _SCRIPT, os.path.join(cgroup, "cgroup.procs")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={},
            cwd="/",
            start_new_session=True,
            restore_signals=True,
            close_fds=True,
        )
    except OSError:
        release_cgroup(cgroup)
        with state.lock:
            state.making = False
            state.not_making.set()
        return False
    spare = _Spare(proc, cgroup, made)
    with state.lock:
        closed = state.closed
        if not closed:
            state.ready.append(spare)
            if len(state.ready) < KEPT_READY:
                return True
            state.making = False
            state.not_making.set()
    if closed:  # made while this process exits (_close waits for it): not left behind
        _drop(spare)
        state.not_making.set()
    return False


def _drop(spare: _Spare) -> None:
    """Kill a spare no action took (it may not be in its cgroup yet), and remove its cgroup."""
    where = spare.cgroup
    with contextlib.suppress(OSError):
        spare.proc.kill()  # not reaped yet: the pid is still its own
    kill_cgroup(where, timeout=2.0)
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        spare.proc.wait(2.0)
    for pipe in (spare.proc.stdin, spare.proc.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    release_cgroup(where)


def _close(state: _Spares) -> None:
    """At exit: kill the spares still waiting (their cgroups go with them)."""
    if os.getpid() != state.pid:
        return
    with state.lock:
        state.closed = True
        spares, state.ready = state.ready + list(state.reserved.values()), []
        state.reserved = {}
    for spare in spares:
        _drop(spare)
    state.not_making.wait(5.0)  # one being made on a worker thread: it kills itself (_make)
