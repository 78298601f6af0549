"""Containment of an action's processes in a cgroup v2 of its own, killed whole.

An action's leftovers used to be told by their process group, their descent from the action's
process and the marker in their environment (``_process.MARKER_VARIABLE``). A process that
leaves the session and clears its environment (``setsid env -i CMD &``) is told by none of
them. A cgroup holds it whatever it does: a child is born in its parent's cgroup, and only a
process allowed to write the ``cgroup.procs`` of a common ancestor can leave it.

Layout, under this process's own cgroup (the ``0::`` line of ``/proc/self/cgroup``, found in the
cgroup2 mount of ``/proc/self/mountinfo``)::

    <own cgroup>/openjd-checkpoint-<pid namespace>-<pid>-<start ticks>/   one per runner process
        <marker>/                                    one per action marker: a task's action,
                                                     or an environment's onEnter and onExit

Only ``cgroup.procs``, ``cgroup.kill`` (Linux 5.14), ``cgroup.freeze`` and ``cgroup.events``
are used; no controller is enabled (cgroup v2's "no internal processes" rule then never
applies). A task action's cgroup is killed whole and removed when the action ends; an
environment's lives from its ``onEnter`` to its ``onExit`` (its daemons with it). What a
killed runner left is found by the next attempt from the recorded markers
(``kill_marker_cgroups``): the runner folders beside this one (the same service, container or
worker) are searched for the marker's cgroup. Empty cgroups of dead runners are removed by the
next runner that starts an action there.

The action is placed in its cgroup before it runs a single instruction of its own: Python's
``subprocess`` has no ``CLONE_INTO_CGROUP``, so the process starts as ``/bin/sh``, which writes
itself into the cgroup's ``cgroup.procs`` and then execs the action (about 0.4 ms).
Where the shell could not pass the environment or the program on unchanged (names that are not
shell names, ``IFS``/``OPTIND``/``PPID``, no ``PATH``, a file that is not ELF or ``#!`` with an
existing interpreter, a shell that changes the environment), a ``preexec_fn`` writes it instead:
exact, but a ``fork`` of the whole runner (milliseconds in a large process). docs/decisions.md,
"Escaped processes: a cgroup per action where the machine allows it".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core._threads import DaemonJob, start_daemon

__all__ = (
    "CGROUPS_VARIABLE",
    "Containment",
    "action_cgroup",
    "contained_here",
    "containment",
    "kill_cgroup",
    "kill_marker_cgroups",
    "release_cgroup",
    "release_cgroup_later",
    "spawn_in",
)

CGROUPS_VARIABLE = "OPENJD_CHECKPOINT_CGROUPS"
"""``auto`` (the default): contain each action in a cgroup v2 where the machine allows it;
``off``: never touch cgroups (leftovers are found by marker, as before)."""

_PREFIX = "openjd-checkpoint-"
_SH = "/bin/sh"
_HINT = "set OPENJD_CHECKPOINT_CGROUPS=off to run actions without cgroups"
_WRAPPER = (
    'echo 0 >"$0" || { echo "openjd-checkpoint: cannot move the action into its cgroup $0'
    f' ({_HINT})" >&2; exit 125; }}\n'
    'if [ "$1" = 1 ]; then PWD=$2; export PWD; else unset PWD; fi\n'
    "shift 2\n"
    'exec "$@"\n'
)
"""The exec wrapper: ``$0`` the cgroup's ``cgroup.procs``, ``$1 $2`` whether ``PWD`` was set and
its value (the shell sets its own), then the action's argv."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHELL_OWN = frozenset({"IFS", "OPTIND", "PPID"})
"""Variables the shell resets from the environment it was given (besides ``PWD``)."""


@dataclass(frozen=True)
class Containment:
    """How this process contains the actions it starts.

    Attributes:
        cgroups: True when each action runs in a cgroup of its own.
        folder: this process's runner folder (an absolute path under the cgroup2 mount), or
            None.
        launcher: ``sh`` (the exec wrapper) or ``preexec`` (a ``preexec_fn``): how an action
            is placed in its cgroup; empty without cgroups.
        detail: what is in force, or why cgroups are not, for the log line.
    """

    cgroups: bool
    folder: str | None = None
    launcher: str = ""
    detail: str = ""


class _UnavailableError(Exception):
    """Why this process cannot contain actions in cgroups (a plain sentence)."""


class _State:
    """What one process knows (a forked child starts afresh: it probes again)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.located = False
        self.base: str | None = None
        """This process's own cgroup's folder under the cgroup2 mount, or None."""
        self.why = ""
        self.found: Containment | None = None
        self.made: OrderedDict[str, None] = OrderedDict()
        """The names of the cgroups this process made (``action_cgroup``), the most recent
        ``MADE_KEPT``: a long-lived worker (an Airflow worker, a Prefect process) runs actions
        without end. A name dropped is only slower to reap: its processes are looked for with
        a walk over ``/proc`` (``contained_here``)."""

    def note(self, name: str) -> None:
        self.made[name] = None
        while len(self.made) > MADE_KEPT:
            self.made.popitem(last=False)


MADE_KEPT = 1024
"""How many of the cgroups it made a process remembers as its own (``_State.made``)."""


_LOCK = threading.RLock()
_STATE: list[_State] = []


def _after_fork() -> None:
    global _LOCK
    _LOCK = threading.RLock()  # another thread may have held it at the fork
    _RELEASING.clear()  # the parent's threads that were removing cgroups are not here


os.register_at_fork(after_in_child=_after_fork)


def _setting() -> str:
    value = os.environ.get(CGROUPS_VARIABLE, "").strip().lower() or "auto"
    if value not in ("auto", "off"):
        raise ValueError(
            f"${CGROUPS_VARIABLE}: {os.environ[CGROUPS_VARIABLE]!r} is not one of: auto, off"
        )
    return value


def _mine() -> _State:
    if not _STATE or _STATE[0].pid != os.getpid():
        _STATE[:] = [_State()]
    return _STATE[0]


def _base() -> str | None:
    """This process's own cgroup's folder under the cgroup2 mount, if cgroups are on and it is
    found (read once per process); None otherwise.

    Raises:
        ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
    """
    with _LOCK:
        state = _mine()
        if not state.located:
            try:
                state.base = None if _setting() == "off" else _locate()
            except _UnavailableError as exc:
                state.why = str(exc)
            state.located = True
        return state.base


def _own_cgroup() -> str:
    if not sys.platform.startswith("linux"):
        raise _UnavailableError("not Linux")
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise _UnavailableError(f"/proc/self/cgroup cannot be read ({exc.strerror})") from None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    raise _UnavailableError("no cgroup v2 hierarchy (/proc/self/cgroup has no 0:: line)")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _locate() -> str:
    own = _own_cgroup()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            mounts = fh.read().splitlines()
    except OSError as exc:
        raise _UnavailableError(f"/proc/self/mountinfo cannot be read ({exc.strerror})") from None
    read_only = ""
    for line in mounts:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 6 or tail.split()[:1] != ["cgroup2"]:
            continue
        root, point, options = _unescape(fields[3]), _unescape(fields[4]), fields[5]
        if root == "/":
            rel = own
        elif own == root:
            rel = "/"
        elif own.startswith(root + "/"):
            rel = own[len(root) :]
        else:
            continue  # a mount of another part of the hierarchy
        if "ro" in options.split(","):
            read_only = point
            continue
        folder = os.path.normpath(point + rel)
        if os.path.isdir(folder):
            return folder
    if read_only:
        raise _UnavailableError(f"the cgroup2 file system at {read_only} is mounted read-only")
    raise _UnavailableError(f"this process's cgroup {own} is in no cgroup2 mount")


def _pid_ns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _runner_dead(name: str) -> bool:
    """True for a runner folder whose process is gone (in this pid namespace: a folder of
    another namespace, or of an unknown form, is never judged)."""
    parts = name[len(_PREFIX) :].split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return False
    ns, pid, ticks = (int(p) for p in parts)
    return ns == _pid_ns() and _start_ticks(pid) != ticks


# --- the probe, once per process ----------------------------------------------------------------
def containment() -> Containment:
    """This process's containment, probed once per process (a fork probes again): a runner
    folder is made under the process's own cgroup, a process is started into a cgroup below it
    the way actions are, and killed with it. Anything failing leaves cgroups off, with why.

    Raises:
        ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
    """
    with _LOCK:
        state = _mine()
        if state.found is not None:
            return state.found
        base = _base()
        if base is None:
            if _setting() == "off":
                why = f"turned off by {CGROUPS_VARIABLE}=off"
            else:
                why = state.why
            result = Containment(False, detail=why)
        else:
            try:
                result = _probe(base)
            except _UnavailableError as exc:
                result = Containment(False, detail=str(exc))
        state.found = result
        return result


def _probe(base: str) -> Containment:
    ticks = _start_ticks(os.getpid())
    folder = os.path.join(base, f"{_PREFIX}{_pid_ns()}-{os.getpid()}-{ticks}")
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass  # this process before an exec (same pid and start time)
    except OSError as exc:
        raise _UnavailableError(f"a cgroup cannot be made in {base} ({exc.strerror})") from None
    if not os.path.exists(os.path.join(folder, "cgroup.kill")) and not os.path.exists(
        os.path.join(folder, "cgroup.freeze")
    ):
        _rmdir(folder)
        raise _UnavailableError("the kernel has neither cgroup.kill nor cgroup.freeze (< 5.2)")
    try:
        launcher = _try_start(folder)
    except _UnavailableError:
        _rmdir(folder)
        raise
    _sweep_dead(base, keep=folder)
    atexit.register(_remove_own, folder, os.getpid())
    how = "cgroup.kill" if os.path.exists(os.path.join(folder, "cgroup.kill")) else "freeze+kill"
    placed = "exec wrapper, a spare moved in ahead" if launcher == "sh" else "preexec_fn"
    detail = f"cgroup v2, a cgroup per action under {folder} ({how}, {placed})"
    return Containment(True, folder, launcher, detail)


def _try_start(folder: str) -> str:
    """Start a process into a test cgroup as actions are started; check that it landed there
    with its environment unchanged; kill it with its cgroup. Returns the launcher to use."""
    box = os.path.join(folder, "probe")
    try:
        os.mkdir(box)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _UnavailableError(f"a cgroup cannot be made in {folder} ({exc.strerror})") from None
    env = {
        "PATH": os.environ.get("PATH") or os.defpath,
        "PWD": "/nonexistent/openjd-checkpoint-probe",
        "SHLVL": "7",
        "_": "/nonexistent/probe",
        "OPENJD_CHECKPOINT_PROBE": "two words\nand a line",
    }
    argv = [_SH, "-c", "echo ready; read x"]
    wrapped = _sh_argv(argv, "/", env, os.path.join(box, "cgroup.procs"))
    launcher = "sh" if wrapped is not None else "preexec"
    try:
        with spawn_in(box, argv, "/", env, launcher=launcher) as (args, join):
            proc = subprocess.Popen(
                args,
                cwd="/",
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=join,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        _rmdir(box)
        raise _UnavailableError(f"a process cannot be started into a cgroup ({exc})") from None
    try:
        said = _first_line(proc, 5.0)
        want = f"0::{_own_cgroup().rstrip('/')}/{os.path.basename(folder)}/probe"
        try:
            with open(f"/proc/{proc.pid}/cgroup", encoding="utf-8") as fh:
                landed = want in fh.read().splitlines()
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                seen = fh.read()
        except OSError:
            landed, seen = False, b""
        if said != b"ready" or not landed:
            text = said.decode(errors="replace") or "no answer"
            raise _UnavailableError(f"a process cannot be moved into {box} ({text})")
        exact = sorted(seen.split(b"\0")[:-1]) == sorted(
            os.fsencode(f"{k}={v}") for k, v in env.items()
        )
        if launcher == "sh" and not exact:
            launcher = "preexec"  # this /bin/sh changes the environment it passes on
    finally:
        kill_cgroup(box, timeout=5.0)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc.kill()
            proc.wait(5)
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        _rmdir(box)
    if os.path.isdir(box):
        raise _UnavailableError(f"{box} could not be emptied with its processes killed")
    return launcher


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in got and time.monotonic() < end:
            if not sel.select(max(0.0, end - time.monotonic())):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            got += chunk
    return got.strip()


# --- an action's cgroup -------------------------------------------------------------------------
def action_cgroup(name: str) -> str | None:
    """The cgroup of the actions marked ``name`` (made if missing), or None without cgroups.

    Raises:
        OSError: the cgroup cannot be made (the action is not started: never uncontained).
        ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
    """
    found = containment()
    if not found.cgroups or found.folder is None:
        return None
    path = os.path.join(found.folder, name)
    with _LOCK:
        releasing = _RELEASING.get(path)
    if releasing is not None:
        releasing.join(10.0)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}; the action's cgroup {path} ({_HINT})") from None
    with _LOCK:
        _mine().note(name)
    return path


def note_made(name: str) -> None:
    """Count the cgroup ``name`` of this runner's folder as made by this process (a spare's
    cgroup renamed to it: ``core.process._spares``)."""
    with _LOCK:
        _mine().note(name)


def contained_here(name: str) -> bool:
    """True if this process made the cgroup of the actions marked ``name``: every process of
    theirs was born in it, so no walk over ``/proc`` is needed to find them."""
    with _LOCK:
        return name in _mine().made


@contextlib.contextmanager
def spawn_in(
    cgroup: str | None,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    *,
    launcher: str | None = None,
) -> Iterator[tuple[list[str], Callable[[], None] | None]]:
    """The argv and ``preexec_fn`` for ``subprocess.Popen`` that start ``argv`` inside
    ``cgroup`` before it runs (unchanged without one). Used around the ``Popen`` call.

    The exec wrapper (``/bin/sh``) is used when it passes the environment and the program on
    unchanged, else a ``preexec_fn``; if the process cannot be placed it does not run (the
    wrapper exits with 125 and says why; the ``preexec_fn`` makes ``Popen`` raise
    ``SubprocessError``)."""
    if cgroup is None:
        yield argv, None
        return
    procs = os.path.join(cgroup, "cgroup.procs")
    launcher = launcher or containment().launcher
    wrapped = _sh_argv(argv, cwd, env, procs) if launcher == "sh" else None
    if wrapped is not None:
        yield wrapped, None
        return
    fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)

    def join() -> None:  # in the child, after setsid, before exec
        os.write(fd, b"0")

    try:
        yield argv, join
    finally:
        os.close(fd)


def _sh_argv(argv: list[str], cwd: str, env: dict[str, str], procs: str) -> list[str] | None:
    """The wrapper's argv, or None when the shell would not pass ``env`` and ``argv`` on as
    ``Popen`` would (then the caller uses a ``preexec_fn``)."""
    if not argv or not os.path.exists(_SH):
        return None
    for name in env:
        if name in _SHELL_OWN or not _NAME.match(name):
            return None  # the shell drops names it cannot hold, and resets these
    if not _startable(argv[0], cwd, env):
        return None  # Popen's own error (not found, not executable) is kept
    pwd = env.get("PWD")
    return [_SH, "-c", _WRAPPER, procs, "0" if pwd is None else "1", pwd or "", *argv]


def _startable(command: str, cwd: str, env: dict[str, str]) -> bool:
    """True if ``command`` is found as ``Popen`` would find it (``PATH`` of ``env``, relative to
    ``cwd``) and is an ELF file or a ``#!`` script whose interpreter exists: the shell would run
    anything else as a shell script, where ``Popen`` raises."""
    if "/" in command:
        candidates = [command]
    elif "PATH" in env:  # without it the shell's default search path is not Popen's
        candidates = [os.path.join(d, command) for d in env["PATH"].split(os.pathsep)]
    else:
        return False
    for candidate in candidates:
        full = os.path.join(cwd, candidate)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            try:
                with open(full, "rb") as fh:
                    head = fh.read(256)
            except OSError:
                return False
            if head.startswith(b"\x7fELF"):
                return True
            if not head.startswith(b"#!"):
                return False
            # as the kernel reads it: split at spaces and tabs only ('#!/bin/sh\r' names a
            # program '/bin/sh\r', which a CRLF script does not have)
            line = head[2:].split(b"\n", 1)[0].strip(b" \t")
            if not line:
                return False
            interpreter = os.path.join(os.fsencode(cwd), re.split(rb"[ \t]", line, maxsplit=1)[0])
            return os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)
    return False


# --- killing and removing -----------------------------------------------------------------------
def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _populated(cgroup: str) -> bool:
    """True while a process of ``cgroup`` or below is alive (zombies do not count)."""
    try:
        return b"populated 1" in _read(os.path.join(cgroup, "cgroup.events"))
    except OSError:
        return False


def in_cgroup(pid: int, cgroup: str) -> bool:
    """True if process ``pid`` is in ``cgroup`` itself (not below it: one read of its
    ``cgroup.procs``, where ``_pids`` walks every cgroup below)."""
    try:
        return str(pid).encode() in _read(os.path.join(cgroup, "cgroup.procs")).split()
    except OSError:
        return False


def _pids(cgroup: str) -> list[int]:
    found: list[int] = []
    for folder, _dirs, _files in os.walk(cgroup):
        try:
            found.extend(int(p) for p in _read(os.path.join(folder, "cgroup.procs")).split())
        except (OSError, ValueError):
            continue
    return found


def kill_cgroup(cgroup: str, timeout: float = 10.0, *, use_kill: bool | None = None) -> int:
    """SIGKILL every process in ``cgroup`` and below, and wait (up to ``timeout`` seconds) until
    none is alive. Returns how many there were (0: it was empty, or is gone). With
    ``cgroup.kill`` (Linux 5.14) one write kills them all; without it (or ``use_kill=False``)
    the cgroup is frozen, each process killed, and thawed, until it is empty (no process can
    fork meanwhile)."""
    if not _populated(cgroup):
        return 0
    count = len(_pids(cgroup))
    if use_kill is None:
        use_kill = os.path.exists(os.path.join(cgroup, "cgroup.kill"))
    end = time.monotonic() + timeout
    pause = 0.0002
    try:
        if use_kill:
            _write(os.path.join(cgroup, "cgroup.kill"), b"1")
        while _populated(cgroup) and time.monotonic() < end:
            if not use_kill:
                _freeze_and_kill(cgroup)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
    except OSError:
        pass  # gone meanwhile, or not ours to kill: the marker sweep is what is left
    return count


def _freeze_and_kill(cgroup: str) -> None:
    freeze = os.path.join(cgroup, "cgroup.freeze")
    _write(freeze, b"1")
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            events = _read(os.path.join(cgroup, "cgroup.events"))
            if b"frozen 1" in events or b"populated 0" in events:
                break
            time.sleep(0.001)
        for pid in _pids(cgroup):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    finally:
        _write(freeze, b"0")  # a killed process only dies once thawed on some kernels


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


_RELEASING: dict[str, DaemonJob] = {}
"""Cgroups being removed on a background thread (``release_cgroup_later``), by path."""


def release_cgroup_later(cgroup: str) -> None:
    """``release_cgroup`` on a reused daemon thread: removing a cgroup costs the kernel most of
    a millisecond (its controllers' state goes after an RCU grace period), which need not be
    on an action's critical path. ``action_cgroup`` waits for it before it makes the same
    cgroup again (an environment's ``onExit`` runs in its ``onEnter``'s)."""

    def release() -> None:
        try:
            release_cgroup(cgroup)
        finally:
            with _LOCK:
                if _RELEASING.get(cgroup) is job:
                    del _RELEASING[cgroup]

    with _LOCK:
        job = _RELEASING[cgroup] = start_daemon(release, "openjd-cgroup-release")


def release_cgroup(cgroup: str) -> bool:
    """Remove ``cgroup`` (and cgroups an action made below it) if no process is left in it.
    Returns True if it is gone."""
    if _rmdir(cgroup):  # the common case, a cgroup with none below it: no walk of its files
        return True
    for folder, _dirs, _files in os.walk(cgroup, topdown=False):
        if folder != cgroup:
            _rmdir(folder)
    return _rmdir(cgroup)


def _runner_folders(base: str) -> list[str]:
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return [os.path.join(base, n) for n in names if n.startswith(_PREFIX)]


def kill_marker_cgroups(markers: list[str]) -> int:
    """Kill and remove the cgroups of ``markers`` in every runner folder under this process's
    own cgroup (its own and those of other runners, alive or dead), and remove runner folders
    of dead runners left empty. Returns how many processes were killed. Nothing without
    cgroups. The ``/proc`` marker scan still follows, for runners without cgroups."""
    base = _base()
    if base is None or not markers:
        return 0
    killed = 0
    folders = _runner_folders(base)
    for folder in folders:
        for marker in markers:
            path = os.path.join(folder, marker)
            if os.path.isdir(path):
                killed += kill_cgroup(path)
                release_cgroup(path)
    for folder in folders:
        if _runner_dead(os.path.basename(folder)):
            _rmdir(folder)
    return killed


def _sweep_dead(base: str, *, keep: str) -> None:
    """Remove the empty cgroups of dead runners' folders, and the folders left empty. Cgroups
    with live processes stay: they are killed by the next attempt of their run, by marker."""
    for folder in _runner_folders(base):
        if folder == keep or not _runner_dead(os.path.basename(folder)):
            continue
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                if os.path.isdir(path) and not _populated(path):
                    release_cgroup(path)
        _rmdir(folder)


def _remove_own(folder: str, pid: int) -> None:
    """At exit: remove this runner's empty cgroups and its folder (what still runs stays, for
    the next attempt to kill by marker)."""
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path):
                release_cgroup(path)
    _rmdir(folder)
