"""The CLI started in a forked process instead of a new interpreter: ``python -m core.cli`` without
its start-up.

Starting ``python -m core.cli`` costs about 1.5 s of imports (openjd-model, openjd-sessions,
pydantic, fsspec; ``python -X importtime -m core.cli check T`` shows them), more than most
conformance cases take to run. A *fork server* imports ``core.cli`` once; each CLI "process" is
then a fork of it that sets up what a new interpreter would have (its own session, as
``start_new_session=True`` gives; standard input from ``/dev/null``; standard output and error on
the caller's pipe; the working directory, environment and ``sys.argv`` of the command) and
runs ``core.cli.main(argv)`` at the top level of the child, which then exits through the
interpreter's normal shutdown (threads joined, ``atexit`` run) with main's exit code. So each
case still goes through the CLI's argument parsing, its output, signals and exit code, in a real
process of its own whose task processes are its descendants.

The server is a single-threaded subprocess of the caller (forking a multi-threaded process is
unsafe); requests and the output pipe's write end reach it over a Unix socket
(``socket.send_fds``), and it reports each child's pid and, later, its wait status.

Usage::

    with ForkServer() as server:
        proc = server.popen(["run", "t.yaml", "--store", "s"], cwd=..., env=...)
        out = proc.stdout.read()   # stdout and stderr, in order, until every writer closed
        code = proc.wait(timeout=60)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
CLI_ENTRY = REPO_ROOT / "core" / "cli" / "__main__.py"
"""What ``sys.argv[0]`` is under ``python -m core.cli``."""


# --- the server (its own process) ---------------------------------------------------------------


def _read_message(conn: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One request: a 4-byte length, then JSON; the child's standard input, output and error
    ride with the first bytes."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    if not head:
        return None, []
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            return None, fds
        head += more
    size = int.from_bytes(head, "big")
    body = b""
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            return None, fds
        body += more
    return json.loads(body), fds


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _serve(conn: socket.socket) -> dict[str, Any] | None:
    """The server's loop. Returns in a forked child (with its request), or None at the end."""
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pid -> request id
    while True:
        for _key, _ in sel.select(timeout=0.02):
            request, fds = _read_message(conn)
            if request is None:  # the caller closed: wait for the children still running
                for fd in fds:
                    os.close(fd)
                while True:
                    try:
                        pid, status = os.waitpid(-1, 0)
                    except ChildProcessError:
                        return None
                    children.pop(pid, None)
                    try:
                        _send(conn, {"pid": pid, "status": status})
                    except OSError:
                        pass
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sel.close()
                conn.close()
                _become(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            children[pid] = request["id"]
            _send(conn, {"id": request["id"], "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.pop(pid, None)
            _send(conn, {"pid": pid, "status": status})


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the child: what a new ``python -m core.cli`` process started by ``subprocess.Popen``
    with these standard streams (and ``start_new_session`` when asked) would have."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # fsspec reads FSSPEC_* variables when it is imported: read them again for this environment
    import fsspec.config

    fsspec.config.conf.clear()
    fsspec.config.set_conf_files(fsspec.config.conf_dir, fsspec.config.conf)
    fsspec.config.set_conf_env(fsspec.config.conf)
    sys.argv = [str(CLI_ENTRY), *request["argv"]]
    sys.path[0] = request["cwd"]  # ``python -m`` puts the starting folder first


def _server_main() -> None:
    sys.path[0] = str(REPO_ROOT)  # ``-c`` put '' (the working folder, which children change)
    import core.cli
    import core.cli._main  # noqa: F401  (what ``core.cli.main`` imports: every child is spared it)

    gc.freeze()  # what was imported stays shared with the children (no copy, no collection)
    conn = socket.socket(fileno=int(sys.argv[1]))
    request = _serve(conn)
    if request is None:
        return
    # the child: run the CLI at the top level, as ``python -m core.cli`` does
    sys.exit(core.cli.main(request["argv"]))


# --- the caller's side --------------------------------------------------------------------------


class ForkedProcess:
    """A CLI process of the fork server: the parts of ``subprocess.Popen`` the tests use.

    ``stdout`` (and ``stderr`` when it is not merged into stdout, ``stdin`` when it is a pipe)
    are binary pipes; ``returncode`` is as Popen's (negative: the signal that ended it)."""

    def __init__(self, server: ForkServer, args: list[str]) -> None:
        self.args = args
        self.stdin: IO[bytes] | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.pid = 0
        self.returncode: int | None = None
        self._server = server
        self._readers: list[tuple[threading.Thread, list[bytes]]] = []

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        with self._server._cond:
            while self.returncode is None:
                if not self._server._alive:
                    raise RuntimeError("the CLI fork server ended")
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                self._server._cond.wait(left if left is not None else 1.0)
            return self.returncode

    def send_signal(self, signum: int) -> None:
        """As ``Popen.send_signal``: nothing once it has ended, also when the server reaps it
        between the check and the signal (CI saw ``ProcessLookupError`` there)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes | None, bytes | None]:
        """Its output and error (each until every writer closed it) and its exit, within
        ``timeout`` seconds, as ``Popen.communicate``; raises ``subprocess.TimeoutExpired`` (what
        was read so far is kept, and a later call goes on reading)."""
        if not self._readers:
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            for stream in (self.stdout, self.stderr):
                chunks: list[bytes] = []
                thread = threading.Thread(target=_drain, args=(stream, chunks), daemon=True)
                if stream is not None:
                    thread.start()
                self._readers.append((thread, chunks))
        end = None if timeout is None else time.monotonic() + timeout
        for thread, _ in self._readers:
            if thread.ident is not None:
                thread.join(None if end is None else max(0.0, end - time.monotonic()))
                if thread.is_alive():
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if end is None else max(0.01, end - time.monotonic()))
        out, err = (
            b"".join(chunks) if t.ident is not None else None for t, chunks in self._readers
        )
        return out, err


def _drain(stream: IO[bytes] | None, chunks: list[bytes]) -> None:
    assert stream is not None
    while True:
        data = stream.read1(65536)  # type: ignore[attr-defined]
        if not data:
            break
        chunks.append(data)


class ForkServer:
    """A fork server of the CLI (see the module's docstring); thread-safe."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO_ROOT) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-u",
                "-c",
                "import tests.forked_cli as f; f._server_main()",
                str(theirs.fileno()),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            cwd=str(REPO_ROOT),
            env=env,
        )
        theirs.close()
        self._conn = ours
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._next_id = 0
        self._pids: dict[int, int] = {}  # request id -> pid
        self._procs: dict[int, ForkedProcess] = {}  # pid -> process
        self._early_status: dict[int, int] = {}
        self._alive = True
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    def popen(
        self,
        argv: list[str],
        *,
        cwd: str | Path,
        env: dict[str, str],
        stdin: int = subprocess.DEVNULL,
        stderr: int = subprocess.STDOUT,
        start_new_session: bool = True,
    ) -> ForkedProcess:
        """Start ``python -m core.cli ARGV`` (as a fork), in ``cwd`` with exactly ``env``;
        stdout is a pipe, ``stdin`` is ``subprocess.DEVNULL`` or ``PIPE``, ``stderr`` is
        ``subprocess.STDOUT`` or ``PIPE``."""
        proc = ForkedProcess(self, [sys.executable, "-m", "core.cli", *argv])
        theirs: list[int] = []
        try:
            if stdin == subprocess.PIPE:
                read_fd, write_fd = os.pipe()
                proc.stdin = os.fdopen(write_fd, "wb")
                theirs.append(read_fd)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY))
            read_fd, write_fd = os.pipe()
            proc.stdout = os.fdopen(read_fd, "rb")
            theirs.append(write_fd)
            if stderr == subprocess.PIPE:
                read_fd, write_fd = os.pipe()
                proc.stderr = os.fdopen(read_fd, "rb")
                theirs.append(write_fd)
            else:
                theirs.append(write_fd)
            request = {"argv": list(argv), "cwd": str(cwd), "env": env}
            request["new_session"] = start_new_session
            with self._send_lock:
                self._next_id += 1
                rid = request["id"] = self._next_id
                body = json.dumps(request).encode()
                socket.send_fds(self._conn, [len(body).to_bytes(4, "big")], theirs)
                self._conn.sendall(body)
        finally:
            for fd in set(theirs):
                os.close(fd)
        with self._cond:
            while rid not in self._pids:
                if not self._alive:
                    raise RuntimeError("the CLI fork server ended")
                self._cond.wait(1.0)
            proc.pid = self._pids.pop(rid)
            self._procs[proc.pid] = proc
            if proc.pid in self._early_status:
                self._set_status(proc, self._early_status.pop(proc.pid))
        return proc

    def _set_status(self, proc: ForkedProcess, status: int) -> None:
        proc.returncode = os.waitstatus_to_exitcode(status)
        self._procs.pop(proc.pid, None)

    def _read(self) -> None:
        stream = self._conn.makefile("rb")
        try:
            for line in stream:
                message = json.loads(line)
                with self._cond:
                    if "status" in message:
                        proc = self._procs.get(message["pid"])
                        if proc is None:
                            self._early_status[message["pid"]] = message["status"]
                        else:
                            self._set_status(proc, message["status"])
                    else:
                        self._pids[message["id"]] = message["pid"]
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._alive = False
                self._cond.notify_all()

    def close(self) -> None:
        try:
            self._conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._conn.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> ForkServer:
    """One fork server for this process (started on first use, ended at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared._alive:
            import atexit

            _shared = ForkServer()
            atexit.register(_shared.close)
        return _shared


def popen_cli(
    cmd: list[str], *, cwd: str | Path, env: dict[str, str]
) -> subprocess.Popen[bytes] | ForkedProcess:
    """Start ``cmd`` with stdout and stderr on one pipe, stdin from ``/dev/null``, in a session of
    its own: through the shared fork server when it is ``python -m core.cli ...`` with this
    interpreter (set ``OPENJD_TEST_NO_FORK_SERVER=1`` to start a new interpreter each time), else
    as a subprocess (another CLI under test, as ``--cli`` gives)."""
    if cmd[:3] == [sys.executable, "-m", "core.cli"] and not os.environ.get(
        "OPENJD_TEST_NO_FORK_SERVER"
    ):
        return shared_server().popen(cmd[3:], cwd=cwd, env=env)
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def run_cli(
    args: list[str],
    *,
    cwd: str | Path,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, core.cli, *args], capture_output=True, text=True, ...)``,
    forked from the shared server (``OPENJD_TEST_NO_FORK_SERVER=1``: a new interpreter). On
    timeout the CLI is killed and ``subprocess.TimeoutExpired`` raised, as ``run`` does."""
    env = dict(os.environ) if env is None else env
    cmd = [sys.executable, "-m", "core.cli", *args]
    if os.environ.get("OPENJD_TEST_NO_FORK_SERVER"):
        return subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input
        )
    proc = shared_server().popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=False,
    )
    try:
        out, err = proc.communicate(input.encode() if input is not None else None, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(
        cmd,
        proc.returncode or 0,
        (out or b"").decode("utf-8", "replace"),
        (err or b"").decode("utf-8", "replace"),
    )
