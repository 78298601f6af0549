"""One action's process: start it in its own session, read its output, signal and kill its tree.

openjd-sessions' ``LoggingSubprocess`` is the behavioural reference (own process session, output
read on a thread, SIGKILL of the whole group to terminate). What it lacks, and this adds: a chosen
notify signal sent to the whole process group (a worker behind ``bash -c`` gets it), output read as
bytes at pipe speed and split into whole lines only (stdout and stderr on separate pipes, so
interleaved writes never make a fragment), a line cap with an explicit refusal instead of
splitting, and a kill that also reaches descendants that left the process group.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from ._messages import DEFAULT_MAX_LINE_BYTES

__all__ = (
    "MARKER_VARIABLE",
    "ActionProcess",
    "OutputLine",
    "ProcessIdentity",
    "kill_process_group",
    "processes_with_marker",
)

_READ_SIZE = 256 * 1024


@dataclass(slots=True)
class OutputLine:
    """One whole line of an action's output.

    Attributes:
        number: 1-based, counted over stdout and stderr together in the order read.
        stream: ``"stdout"`` or ``"stderr"``.
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
        self._reader: threading.Thread | None = None
        self._exited = threading.Event()
        self._returncode: int | None = None
        self._line_no = 0
        self._consumer_failed = False
        self.identity: ProcessIdentity | None = None

    def start(self) -> ProcessIdentity:
        self._popen = subprocess.Popen(
            self._argv,
            cwd=self._cwd,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            restore_signals=True,
            close_fds=True,
        )
        pid = self._popen.pid
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            started = time.time()
        self.identity = ProcessIdentity(pid=pid, pgid=pid, start_time=started)
        self._reader = threading.Thread(target=self._read, name=f"openjd-output-{pid}", daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, name=f"openjd-wait-{pid}", daemon=True).start()
        return self.identity

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

    def finish(self, reader_grace: float = 2.0) -> int:
        """After the main process exited: kill what is left of its tree, drain the output.

        Returns the main process's exit code (negative: killed by that signal).
        """
        self._exited.wait()
        self.kill_tree()
        if self._reader is not None:
            self._reader.join(reader_grace)
            if self._reader.is_alive():
                # A process outside our reach still holds the pipe: stop reading it.
                self._close_pipes()
                self._reader.join(reader_grace)
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
        kill_process_group(
            self._popen.pid, include_leader=not self._exited.is_set(), marker=self._marker
        )

    # --- internals ---------------------------------------------------------------------------
    def _wait(self) -> None:
        assert self._popen is not None
        self._returncode = self._popen.wait()
        self._exited.set()

    def _close_pipes(self) -> None:
        assert self._popen is not None
        for pipe in (self._popen.stdout, self._popen.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout and self._popen.stderr
        sel = selectors.DefaultSelector()
        buffers: dict[int, bytearray] = {}
        dropping: dict[int, int] = {}
        names: dict[int, str] = {}
        for pipe, name in ((self._popen.stdout, "stdout"), (self._popen.stderr, "stderr")):
            fd = pipe.fileno()
            sel.register(fd, selectors.EVENT_READ)
            buffers[fd] = bytearray()
            dropping[fd] = -1
            names[fd] = name
        open_fds = set(buffers)
        try:
            while open_fds:
                try:
                    ready = sel.select(timeout=0.5)
                except (OSError, ValueError):
                    break
                for key, _ in ready:
                    fd = int(key.fd)
                    try:
                        chunk = os.read(fd, _READ_SIZE)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(fd)
                        open_fds.discard(fd)
                        batch: list[OutputLine] = []
                        self._flush_tail(fd, names[fd], buffers, dropping, batch)
                        if batch:
                            self._deliver(batch)
                        continue
                    batch = self._split(fd, names[fd], chunk, buffers, dropping)
                    if batch:
                        self._deliver(batch)
        finally:
            sel.close()

    def _deliver(self, batch: list[OutputLine]) -> None:
        """Hand lines on; a failing consumer (a closed stdout, say) must not stop the reading,
        or the task would block on a full pipe and its checkpoint messages would be lost."""
        try:
            self._on_lines(batch)
        except Exception as exc:  # reported once, then reading goes on
            if not self._consumer_failed:
                self._consumer_failed = True
                import sys

                err = sys.__stderr__
                try:
                    if err is not None:
                        err.write(f"openjd-checkpoint: output consumer failed: {exc!r}\n")
                except (OSError, ValueError):
                    pass

    def _next(self) -> int:
        self._line_no += 1
        return self._line_no

    def _split(
        self,
        fd: int,
        name: str,
        chunk: bytes,
        buffers: dict[int, bytearray],
        dropping: dict[int, int],
    ) -> list[OutputLine]:
        parts = chunk.split(b"\n")
        rest = parts.pop()
        out: list[OutputLine] = []
        if parts:
            first = parts[0]
            buf = buffers[fd]
            if dropping[fd] >= 0:
                out.append(OutputLine(self._next(), name, b"", True, dropping[fd] + len(first)))
                dropping[fd] = -1
            elif buf:
                buf += first
                out.append(self._make(name, bytes(buf)))
                buf.clear()
            else:
                out.append(self._make(name, first))
            make = self._make
            out.extend([make(name, piece) for piece in parts[1:]])
        if rest:
            if dropping[fd] >= 0:
                dropping[fd] += len(rest)
            else:
                buf = buffers[fd]
                buf += rest
                if len(buf) > self._max:
                    dropping[fd] = len(buf)
                    buf.clear()
        return out

    def _make(self, name: str, line: bytes) -> OutputLine:
        if len(line) > self._max:
            return OutputLine(self._next(), name, b"", True, len(line))
        if line.endswith(b"\r"):
            line = line[:-1]
        return OutputLine(self._next(), name, line, False, len(line))

    def _flush_tail(
        self,
        fd: int,
        name: str,
        buffers: dict[int, bytearray],
        dropping: dict[int, int],
        out: list[OutputLine],
    ) -> None:
        if dropping[fd] >= 0:
            out.append(OutputLine(self._next(), name, b"", True, dropping[fd]))
            dropping[fd] = -1
        elif buffers[fd]:
            out.append(self._make(name, bytes(buffers[fd])))
            buffers[fd].clear()


MARKER_VARIABLE = "OPENJD_CHECKPOINT_SESSION"
"""Set in every action's environment to a value unique to the task's session. Descendants
inherit it, so the task's processes are found even after they left the process group or were
reparented (``setsid``, double fork), and never confused with a process that reused a pid."""


def processes_with_marker(marker: str) -> list[psutil.Process]:
    """Processes of this user whose environment holds ``OPENJD_CHECKPOINT_SESSION=marker``."""
    found: list[psutil.Process] = []
    me = os.getpid()
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(proc)
        except OSError:
            continue
    return found


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
    victims: list[psutil.Process] = []
    try:
        leader = psutil.Process(pid)
        victims = leader.children(recursive=True)
        if include_leader:
            victims.append(leader)
    except psutil.Error:
        pass
    # Members of the group that are no longer our descendants (reparented to init).
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pid and proc not in victims:
                victims.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error, OSError):
            continue
    if marker is not None:
        for proc in processes_with_marker(marker):
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
