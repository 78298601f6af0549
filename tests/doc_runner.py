"""Run one doc block (``doc_blocks.Block``) as a person would paste it into bash: in the
repository's root, with ``set -e``, in a session of its own, whose processes (servers the block
started with ``&``) are all killed when it ends. ``ports`` maps the doc's default ports to free
loopback ones, so that a test never takes a port a person's own servers use.

``Shell`` is one bash that several blocks are pasted into one after the other, as a person
types them into one terminal: a later block can use what an earlier one started (``kill %1``
stops the first background job of an earlier block)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil
from doc_blocks import ROOT, Block


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(block: Block, ports: dict[int, int] | None) -> str:
    script = block.text
    for default, port in (ports or {}).items():
        script = script.replace(str(default), str(port))
    return script


def _environ(venv: Path, env: dict[str, str] | None) -> dict[str, str]:
    full = dict(os.environ if env is None else env)
    full["PATH"] = f"{venv / 'bin'}:{full.get('PATH', '')}"
    full["VIRTUAL_ENV"] = str(venv)
    return full


def run_block(
    block: Block,
    *,
    venv: Path,
    env: dict[str, str] | None = None,
    ports: dict[int, int] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """The block's exit status and output (stdout and stderr together)."""
    script = _script(block, ports)
    full = _environ(venv, env)
    with tempfile.TemporaryFile(mode="w+") as log:  # not a pipe: background jobs keep it open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=ROOT,
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -9
        finally:
            _kill_session(proc.pid)
            proc.wait()
        log.seek(0)
        out = log.read()
    if code == -9:
        out += f"\n(timed out after {timeout} s)"
    return subprocess.CompletedProcess(proc.args, code, out)


class Shell:
    """One ``bash -e`` in the repository's root, in a session of its own, reading the blocks
    ``send`` gives it from its standard input (as a terminal would), its output in ``log``."""

    def __init__(
        self,
        *,
        venv: Path,
        log: Path,
        env: dict[str, str] | None = None,
        ports: dict[int, int] | None = None,
    ) -> None:
        self.ports = ports
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            ["bash", "-e"],
            cwd=ROOT,
            env=_environ(venv, env),
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def send(self, block: Block) -> None:
        """Paste the block (its ports replaced); it runs once the shell has read it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(_script(block, self.ports) + "\n")
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def exit(self, timeout: float) -> int:
        """End the input and wait for the shell to exit: its status, -9 if it did not in time
        (then it is killed, with whatever it left running)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        """Kill the shell and every process of its session."""
        _kill_session(self.proc.pid)
        self.proc.wait()
        self._out.close()


def _kill_session(sid: int) -> None:
    """Kill every process of the block's session (what it left running in the background)."""
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid:
                os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
