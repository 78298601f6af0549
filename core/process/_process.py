"""One action's process: start it in its own session, read its output, signal and kill its tree.

openjd-sessions' ``LoggingSubprocess`` is the behavioural reference (own process session, stderr
merged into stdout on one pipe, output read on a thread, SIGKILL of the whole group to terminate).
What it lacks, and this adds: a chosen notify signal sent to the whole process group (a worker
behind ``bash -c`` gets it), output read as bytes at pipe speed and split into whole lines only, a
line cap with an explicit refusal instead of splitting, and a kill that also reaches descendants
that left the process group.

stdout and stderr share one pipe, as in openjd-sessions, so the output reads in the order the
process wrote it (a ``set -x`` trace before the command's output, a traceback after the prints
before it). The kernel keeps each ``write()`` to a pipe whole (at least up to ``PIPE_BUF``, 4096
bytes, when several processes write at once), so a message line written in one write is never
split or mixed with other output. What one pipe cannot tell apart is a line written in pieces: a
partial line on one stream followed by a write on the other makes one line of the two (see
docs/decisions.md, "stdout and stderr share one pipe").
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from core._host import host_id
from core._messages import DEFAULT_MAX_LINE_BYTES
from core._threads import DaemonJob, start_daemon
from core.process._cgroups import (
    action_cgroup,
    contained_here,
    containment,
    kill_cgroup,
    kill_marker_cgroups,
    release_cgroup,
    release_cgroup_later,
    spawn_in,
)
from core.process._reaper import is_subreaper, kill_action_tree, reap_dead_children, start_sweeper
from core.process._spares import drop_spare, reserve_spare, reserved_pid, take_spare

if TYPE_CHECKING:
    from core._records import ProcessInfo

__all__ = (
    "MARKER_VARIABLE",
    "ActionProcess",
    "OutputLine",
    "ProcessIdentity",
    "action_containment",
    "kill_marked",
    "kill_process_group",
    "kill_recorded_process",
    "marked_spare",
    "new_marker",
    "processes_with_marker",
    "recorded_name",
)

_LEADERS: set[int] = set()
"""Pids of started action processes whose ``Popen`` has not reaped them yet: a subreaper's
sweep (core.process._reaper) reaps every other zombie child, never these."""
_LEADERS_LOCK = threading.RLock()

_READ_SIZE = 256 * 1024
_STREAM = "stdout"
"""The ``stream`` of every line: stderr is merged into stdout."""


@dataclass(slots=True)
class OutputLine:
    """One whole line of an action's output.

    Attributes:
        number: 1-based, counted over the action's output in the order written.
        stream: always ``"stdout"``: stderr is merged into stdout on one pipe, so the two cannot
            be told apart (kept so that consumers of the two-pipe reader still work).
        data: the line's bytes without the newline (and without a trailing carriage return);
            empty when ``oversized``.
        oversized: the line was longer than the cap; its bytes were dropped.
        size: the line's length in bytes (for an oversized line, how many were dropped).
    """

    number: int
    stream: str
    data: bytes
    oversized: bool = False
    size: int = 0


@dataclass(frozen=True)
class ProcessIdentity:
    """Enough to find a process again from another process: pid, process group and start time
    (seconds since the epoch, from psutil) so that a reused pid is not mistaken for it."""

    pid: int
    pgid: int
    start_time: float

    def is_alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.start_time) < 0.01
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


class ActionProcess:
    """A started action process and its output reader.

    Args:
        argv: the command and its arguments (already resolved).
        cwd: working directory.
        env: the complete environment of the process.
        on_lines: called on the reader thread with each batch of whole lines, in order.
        max_line_bytes: the line cap, in bytes.

    Raises:
        OSError: from ``start()`` when the command cannot be started (not found, not executable).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: dict[str, str],
        on_lines: Callable[[list[OutputLine]], None],
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        marker: str | None = None,
    ) -> None:
        self._argv = list(argv)
        self._marker = marker
        self._cwd = cwd
        self._env = env
        self._on_lines = on_lines
        self._max = max_line_bytes
        self._popen: subprocess.Popen[bytes] | None = None
        self._reader: DaemonJob | None = None
        self._exited = threading.Event()
        self._returncode: int | None = None
        self._line_no = 0
        self._buf = bytearray()
        self._dropping = -1  # bytes of an oversized line dropped so far, or -1
        self._consumer_failed = False
        self._stop_reading = threading.Event()
        self.identity: ProcessIdentity | None = None
        self._pidfd = -1
        self._cgroup: str | None = None
        """The action's cgroup (core.process._cgroups), or None where actions are not contained."""

    def start(self) -> ProcessIdentity:
        """Start the process (in its cgroup where the machine allows it) and its output reader.

        Raises:
            OSError: it cannot be started, or its cgroup cannot be made or joined.
            ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
        """
        action_containment()  # the one log line, at the first action of this process
        name = self._marker or f"action-{uuid.uuid4().hex}"
        with _LEADERS_LOCK:  # registered before a sweep could see it exit
            spare = take_spare(name, self._argv, self._cwd, self._env)
            if spare is not None:  # a process already in a cgroup of its own becomes it
                self._popen, self._cgroup = spare
                _LEADERS.add(self._popen.pid)
        if spare is None:
            self._cgroup = action_cgroup(name)
            self._spawn()
        assert self._popen is not None
        pid = self._popen.pid
        if (
            is_subreaper()
        ):  # orphans re-parented here that exit during the action (core.process._reaper)
            start_sweeper(_live_leaders, _LEADERS_LOCK)
        self.identity = _leader_identity(pid)
        # One thread reads the output and sees the exit (a pidfd beside the pipe, Linux 5.3);
        # without pidfds a second thread waits for the exit.
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = -1
        self._reader = start_daemon(self._read, f"openjd-output-{pid}")  # a reused thread
        if self._pidfd < 0:
            threading.Thread(target=self._wait, name=f"openjd-wait-{pid}", daemon=True).start()
        return self.identity

    def _spawn(self) -> None:
        """Start the action as a new process, placed in its cgroup by the exec wrapper or a
        ``preexec_fn`` (``spawn_in``). OSError: as ``start``."""
        try:
            with (
                _LEADERS_LOCK,  # registered before a sweep could see it exit (core.process._reaper)
                spawn_in(self._cgroup, self._argv, self._cwd, self._env) as (argv, join),
            ):
                self._popen = subprocess.Popen(
                    argv,
                    cwd=self._cwd,
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    restore_signals=True,
                    close_fds=True,
                    preexec_fn=join,
                )
                _LEADERS.add(self._popen.pid)
        except subprocess.SubprocessError as exc:  # the preexec_fn could not join the cgroup
            if self._cgroup is not None:
                release_cgroup(self._cgroup)
            raise OSError(f"cannot move it into its cgroup {self._cgroup} ({exc})") from None
        except OSError:
            if self._cgroup is not None:
                release_cgroup(self._cgroup)
            raise

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def wait_exit(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the main process to exit; True if it has."""
        return self._exited.wait(timeout)

    def finish(self, reader_grace: float = 2.0, *, kill_leftovers: bool = True) -> int:
        """After the main process exited: kill what is left of its tree, drain the output.

        Returns the main process's exit code (negative: killed by that signal).
        ``kill_leftovers=False`` leaves what the action started running (an environment's
        ``onEnter`` that starts a daemon); its output is then read only as long as it writes
        to the action's pipe within ``reader_grace``.
        """
        self._exited.wait()
        if kill_leftovers:
            self.kill_tree()
        if self._reader is not None:
            self._reader.join(reader_grace)
            if self._reader.is_alive():
                # A process outside our reach still holds the pipe: stop reading it.
                self._stop_reading.set()
                self._reader.join(reader_grace)
        if self._cgroup is not None:  # removed once empty; an onEnter's daemons keep theirs
            release_cgroup_later(self._cgroup)
        assert self._returncode is not None
        return self._returncode

    def notify(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the action's whole process group (no error if it is gone)."""
        if self._popen is None:
            return
        try:
            os.killpg(self._popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True while any process of the action's process group still runs (zombies aside)."""
        if self._popen is None:
            return False
        pgid = self._popen.pid
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if (
                    proc.pid != pgid
                    and os.getpgid(proc.pid) == pgid
                    and proc.info["status"] != psutil.STATUS_ZOMBIE
                ):
                    return True
            except (OSError, psutil.Error):
                continue
        return False

    def kill_tree(self) -> None:
        """SIGKILL the process group and every descendant (even ones that left the group),
        then wait until none is left running."""
        if self._popen is None:
            return
        if self._cgroup is not None:  # everything the action started, wherever it went
            kill_cgroup(self._cgroup)
            if is_subreaper():  # the killed orphans were re-parented here: no zombie stays
                reap_dead_children(_live_leaders, _LEADERS_LOCK, also_spare=self._popen.pid)
            return
        if is_subreaper():  # what left the group is still a descendant: no walk over /proc
            needle = None if self._marker is None else f"{MARKER_VARIABLE}={self._marker}"
            kill_action_tree(
                self._popen.pid,
                include_leader=not self._exited.is_set(),
                needle=None if needle is None else needle.encode(),
                spare=_live_leaders,
                lock=_LEADERS_LOCK,
            )
            return
        kill_process_group(
            self._popen.pid, include_leader=not self._exited.is_set(), marker=self._marker
        )

    # --- internals ---------------------------------------------------------------------------
    def _wait(self) -> None:
        assert self._popen is not None
        try:
            self._returncode = self._popen.wait()
        finally:
            with _LEADERS_LOCK:
                _LEADERS.discard(self._popen.pid)
            self._exited.set()

    def _read(self) -> None:
        """Read the merged output until every writer closed it (or ``_stop_reading`` is set),
        and hand it on in batches of whole lines."""
        assert self._popen is not None and self._popen.stdout is not None
        pipe = self._popen.stdout
        fd = pipe.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        pidfd = self._pidfd
        if pidfd >= 0:
            sel.register(pidfd, selectors.EVENT_READ)
        read = os.read
        try:
            while not self._stop_reading.is_set():
                try:
                    ready = sel.select(timeout=0.25)
                except (OSError, ValueError):
                    break
                if not ready:
                    continue
                if pidfd >= 0 and any(key.fd == pidfd for key, _ in ready):
                    sel.unregister(pidfd)
                    os.close(pidfd)
                    pidfd = self._pidfd = -1
                    self._wait()  # it has exited: the wait returns at once
                    if len(ready) == 1:
                        continue
                try:
                    chunk = read(fd, _READ_SIZE)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                batch = self._split(chunk)
                if batch:
                    self._deliver(batch)
            else:
                # Asked to stop while something still holds the pipe: take what is already in
                # it (without waiting for more), then the last line even without its newline.
                for _ in range(64):
                    if not sel.select(timeout=0):
                        break
                    try:
                        chunk = read(fd, _READ_SIZE)
                    except OSError:
                        break
                    if not chunk:
                        break
                    batch = self._split(chunk)
                    if batch:
                        self._deliver(batch)
            tail = self._flush_tail()
            if tail:
                self._deliver(tail)
        finally:
            sel.close()
            try:
                pipe.close()
            except OSError:
                pass
        if pidfd >= 0:  # the pipe closed before the process exited: wait for it here
            os.close(pidfd)
            self._pidfd = -1
            self._wait()

    def _deliver(self, batch: list[OutputLine]) -> None:
        """Hand lines on; a failing consumer (a closed stdout, say) must not stop the reading,
        or the task would block on a full pipe and its checkpoint messages would be lost."""
        try:
            self._on_lines(batch)
        except Exception as exc:  # reported once, then reading goes on
            if not self._consumer_failed:
                self._consumer_failed = True
                err = sys.__stderr__
                try:
                    if err is not None:
                        err.write(f"openjd-checkpoint: output consumer failed: {exc!r}\n")
                except (OSError, ValueError):
                    pass

    def _split(self, chunk: bytes) -> list[OutputLine]:
        """The whole lines that ``chunk`` completes; a trailing partial line waits in the buffer
        (or, past the cap, is counted and dropped)."""
        parts = chunk.split(b"\n")
        rest = parts.pop()
        out: list[OutputLine] = []
        if parts:
            first = parts[0]
            if self._dropping >= 0:
                self._line_no += 1
                out.append(
                    OutputLine(self._line_no, _STREAM, b"", True, self._dropping + len(first))
                )
                self._dropping = -1
            elif self._buf:
                self._buf += first
                out.append(self._make(bytes(self._buf)))
                self._buf.clear()
            else:
                out.append(self._make(first))
            if len(parts) > 1:
                if len(chunk) <= self._max and b"\r" not in chunk:
                    # The common case: no line can be over the cap, none ends in CR.
                    n = self._line_no
                    out.extend(
                        [
                            OutputLine(i, _STREAM, piece, False, len(piece))
                            for i, piece in enumerate(parts[1:], n + 1)
                        ]
                    )
                    self._line_no = n + len(parts) - 1
                else:
                    make = self._make
                    out.extend([make(piece) for piece in parts[1:]])
        if rest:
            if self._dropping >= 0:
                self._dropping += len(rest)
            else:
                self._buf += rest
                if len(self._buf) > self._max:
                    self._dropping = len(self._buf)
                    self._buf.clear()
        return out

    def _make(self, line: bytes) -> OutputLine:
        self._line_no += 1
        if len(line) > self._max:
            return OutputLine(self._line_no, _STREAM, b"", True, len(line))
        if line.endswith(b"\r"):
            line = line[:-1]
        return OutputLine(self._line_no, _STREAM, line, False, len(line))

    def _flush_tail(self) -> list[OutputLine]:
        """The last line, when the output ended without a newline."""
        if self._dropping >= 0:
            self._line_no += 1
            size, self._dropping = self._dropping, -1
            return [OutputLine(self._line_no, _STREAM, b"", True, size)]
        if self._buf:
            line = self._make(bytes(self._buf))
            self._buf.clear()
            return [line]
        return []


MARKER_VARIABLE = "OPENJD_CHECKPOINT_SESSION"
"""Set in every action's environment to a value unique to the task's session. Descendants
inherit it, so the task's processes are found even after they left the process group or were
reparented (``setsid``, double fork), and never confused with a process that reused a pid."""


_MARKER_BIRTHS: OrderedDict[str, int] = OrderedDict()
"""Markers made by ``new_marker`` in this process (the most recent ``_MARKER_BIRTHS_KEPT``), and
the boot-relative clock tick a little before each was made."""

_MARKER_BIRTHS_LOCK = threading.Lock()

_MARKER_BIRTHS_KEPT = 1024

_MARKER_BIRTH_MARGIN_SECONDS = 2.0
"""How much earlier than a marker's making a process may have started and still be checked for
it (slack for clock rounding; a process cannot carry a marker made after it started)."""


_BOOT_TIME: list[float] = []


def _create_time(pid: int) -> float:
    """psutil's ``Process.create_time`` of ``pid`` (seconds since the epoch, the same formula:
    boot time plus ``/proc/PID/stat``'s start time in clock ticks), with the boot time read
    once per process where psutil reads ``/proc/stat`` on every call; ``time.time()`` if the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        if not _BOOT_TIME:
            _BOOT_TIME.append(psutil.boot_time())
        return _BOOT_TIME[0] + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        try:
            return psutil.Process(pid).create_time()
        except psutil.Error:
            return time.time()


_LOG = logging.getLogger("core.process._process")
_ANNOUNCED: set[int] = set()
"""The pids of processes that logged their containment line (a fork logs its own)."""


def action_containment() -> str:
    """One line saying how the actions this process starts are contained, logged (INFO, logger
    ``core.process._process``) the first time a process asks: each action in a cgroup v2 of its own,
    killed whole (``core.process._cgroups``), or why not, and what finds the leftovers then (their
    process group and marker among the CLI runner's descendants, a child subreaper; else a walk
    over ``/proc``). docs/decisions.md, "Escaped processes".

    Raises:
        ValueError: ``$OPENJD_CHECKPOINT_CGROUPS`` is neither ``auto`` nor ``off``.
    """
    found = containment()
    if found.cgroups:
        line = f"action containment: {found.detail}"
    else:
        where = (
            "among the runner's descendants (child subreaper)"
            if is_subreaper()
            else "in a walk over /proc"
        )
        line = (
            f"action containment: no cgroups ({found.detail}); leftovers are found by process "
            f"group, descent and marker, {where}"
        )
    if os.getpid() not in _ANNOUNCED:
        _ANNOUNCED.add(os.getpid())
        _LOG.info("%s", line)
    return line


def _live_leaders() -> set[int]:
    with _LEADERS_LOCK:
        return set(_LEADERS)


def _boot_ticks() -> int:
    """Now, in the unit of ``/proc/PID/stat``'s ``starttime``: clock ticks since boot."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def new_marker() -> str:
    """A fresh value for ``MARKER_VARIABLE``. Its making time is remembered so that a scan for
    it reads the environment only of processes started since: a process that existed before a
    marker was made cannot carry it (its environment was fixed when it started, and the marker
    is a random value it could not have known). Where a spare action process is ready
    (``core.process._spares``), the marker is the name of its cgroup, and its making time the
    spare's: the action marked so becomes that spare (``ActionProcess.start``)."""
    spare = reserve_spare()  # the name of a process already in a cgroup of that name
    marker, age = spare if spare is not None else (uuid.uuid4().hex, 0.0)
    margin = int((_MARKER_BIRTH_MARGIN_SECONDS + age) * os.sysconf("SC_CLK_TCK"))
    with _MARKER_BIRTHS_LOCK:
        _MARKER_BIRTHS[marker] = _boot_ticks() - margin
        while len(_MARKER_BIRTHS) > _MARKER_BIRTHS_KEPT:
            _MARKER_BIRTHS.popitem(last=False)
    return marker


def marked_spare(marker: str) -> ProcessIdentity | None:
    """The identity the next action marked ``marker`` will have if it becomes the spare
    reserved for that marker (``new_marker``; ``ActionProcess.start`` hands it the action):
    recorded before the action starts, a task's record names its process in one write
    (``ActionProcessNames.starting``). None when no spare is reserved as ``marker``; the
    action may still start otherwise (the spare died, or cannot take it), and then has
    another identity."""
    pid = reserved_pid(marker)
    return None if pid is None else _leader_identity(pid)


def _leader_identity(pid: int) -> ProcessIdentity:
    """The identity of an action's process ``pid``, the leader of a session of its own: one
    formula for both ``ActionProcess.start`` and ``marked_spare``, whose results a task's
    record compares (``ActionProcessNames.started``)."""
    return ProcessIdentity(pid=pid, pgid=pid, start_time=_create_time(pid))


def release_marker(marker: str) -> None:
    """No more actions will be started with ``marker`` (``new_marker``): the spare action
    process reserved for it (``core.process._spares``), if no action became it, is killed and
    its cgroup removed. Call it when a task ends and when an environment has exited."""
    drop_spare(marker)


def _scan_proc(
    *,
    pgid: int | None = None,
    marker: str | None = None,
    parents: dict[int, tuple[int, int]] | None = None,
) -> list[int]:
    """Pids of this user's processes (but this one) in process group ``pgid`` or whose
    environment holds ``OPENJD_CHECKPOINT_SESSION=marker``: one pass over ``/proc`` with plain
    reads (psutil's ``process_iter`` costs about ten times as much, and this runs after every
    action). For a marker made by ``new_marker`` in this process, only processes started since
    have their environment read (reading every process's environment dominated the scan).
    ``parents``, if given, is filled in the same pass with each process's parent pid and start
    time (clock ticks since boot), to find descendants without another pass."""
    me = os.getpid()
    needle = f"{MARKER_VARIABLE}={marker}".encode() if marker is not None else None
    born: int | None = None
    if marker is not None:
        with _MARKER_BIRTHS_LOCK:
            born = _MARKER_BIRTHS.get(marker)
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:  # pragma: no cover - not Linux
        return found
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        try:
            if pgid is not None or born is not None or parents is not None:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    stat = fh.read()
                # pid (comm) state ppid pgrp ... starttime (22nd): comm may hold spaces and
                # parentheses
                fields = stat[stat.rindex(b")") + 2 :].split()
                if parents is not None:
                    parents[pid] = (int(fields[1]), int(fields[19]))
                if pgid is not None and int(fields[2]) == pgid:
                    found.append(pid)
                    continue
                if born is not None and int(fields[19]) < born:
                    continue  # started before the marker existed: it cannot carry it
            if needle is not None:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def _processes(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def _descendants(root: int, parents: dict[int, tuple[int, int]]) -> list[int]:
    """The pids descending from ``root`` in ``parents`` (pid: parent pid, start time), started no
    earlier than it (as psutil's ``children``: a reused parent pid adopts no older process)."""
    if root not in parents:
        return []
    start = parents[root][1]
    children: dict[int, list[int]] = {}
    for pid, (ppid, started) in parents.items():
        if started >= start:
            children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in found or pid == root:
            continue
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def processes_with_marker(marker: str) -> list[psutil.Process]:
    """Processes of this user whose environment holds ``OPENJD_CHECKPOINT_SESSION=marker``."""
    return _processes(_scan_proc(marker=marker))


def kill_process_group(
    pid: int,
    *,
    include_leader: bool = True,
    timeout: float = 10.0,
    marker: str | None = None,
) -> None:
    """SIGKILL process group ``pid`` and every descendant of ``pid``; wait until all are gone.

    Descendants are found with psutil before the kill, so a child that called ``setsid`` (and so
    left the group) is killed too. Processes that were reparented away before this call cannot be
    found and are not.
    """
    # One pass over /proc: members of the group (even those no longer our descendants,
    # reparented to init), processes that carry the session's marker (they left the group:
    # setsid, double fork), and every process's parent, for the leader's descendants.
    parents: dict[int, tuple[int, int]] = {}
    marked = _scan_proc(pgid=pid, marker=marker, parents=parents)
    victims = _processes(_descendants(pid, parents))
    if include_leader:
        try:
            victims.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for proc in _processes(marked):
        if proc not in victims and (include_leader or proc.pid != pid):
            victims.append(proc)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass
    # Our own children are reaped by their Popen (a psutil wait would steal the exit status).
    me = os.getpid()
    others = []
    for proc in victims:
        try:
            if proc.ppid() != me:
                others.append(proc)
        except psutil.Error:
            continue
    _gone, alive = psutil.wait_procs(others, timeout=timeout)
    for proc in alive:  # pragma: no cover - a process in uninterruptible sleep
        try:
            proc.kill()
        except psutil.Error:
            pass


def kill_marked(markers: list[str]) -> int:
    """SIGKILL every process of this machine that carries one of ``markers`` in its
    environment, and every process in their cgroups (``core.process._cgroups``: also those that
    cleared their environment); wait for them. Returns how many were killed. A marker whose
    cgroup this process made needs no walk over ``/proc``: all its processes were in it."""
    killed = kill_marker_cgroups(markers)
    victims = [p for m in markers if not contained_here(m) for p in processes_with_marker(m)]
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=10)
    return killed + len(victims)


def recorded_name(info: ProcessInfo) -> str:
    """A recorded task process in a note: ``process PID``, or for a record written before the
    process started (pid 0, ``ActionProcessNames.starting``) the processes of its marker."""
    return f"process {info.pid}" if info.pid else "the processes of its marker"


def kill_recorded_process(info: ProcessInfo) -> bool:
    """Kill a task's processes recorded by an earlier runner, if they still run on this host.

    Processes are found by the task's ``OPENJD_CHECKPOINT_SESSION`` marker, which only they
    carry, and by the cgroup named after it (``core.process._cgroups``), which holds also those that
    cleared their environment; so a process that reused a recorded pid is never touched. (A
    record without a marker only has its leader killed, and only when the leader's start time
    matches.) Returns True if something was killed. Used before a task starts again: never two
    copies of one task.
    """
    if info.host != host_id():
        return False
    ident = ProcessIdentity(pid=info.pid, pgid=info.pgid, start_time=info.start_time)
    leader_alive = info.start_time >= psutil.boot_time() and ident.is_alive()
    in_cgroup = kill_marker_cgroups([info.marker]) if info.marker else 0
    if leader_alive and (not in_cgroup or ident.is_alive()):
        try:
            own_group = os.getpgid(info.pid) == info.pgid == info.pid
        except OSError:
            own_group = False
        if own_group and info.marker:
            kill_process_group(info.pgid, marker=info.marker)
        else:  # an edited or old record: never signal a group it does not lead
            try:
                psutil.Process(info.pid).kill()
            except psutil.Error:
                pass
    killed = kill_marked([info.marker]) if info.marker else 0
    return leader_alive or killed > 0 or in_cgroup > 0
