"""Run one doc block (``doc_blocks.Block``) as a person would paste it into bash: in the
repository's root, with ``set -e``, in a session of its own, whose processes (servers the block
started with ``&``) are all killed when it ends. ``ports`` maps the doc's default ports to free
loopback ones, so that a test never takes a port a person's own servers use."""

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


def run_block(
    block: Block,
    *,
    venv: Path,
    env: dict[str, str] | None = None,
    ports: dict[int, int] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """The block's exit status and output (stdout and stderr together)."""
    script = block.text
    for default, port in (ports or {}).items():
        script = script.replace(str(default), str(port))
    full = dict(os.environ if env is None else env)
    full["PATH"] = f"{venv / 'bin'}:{full.get('PATH', '')}"
    full["VIRTUAL_ENV"] = str(venv)
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


def _kill_session(sid: int) -> None:
    """Kill every process of the block's session (what it left running in the background)."""
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid:
                os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
