"""An S3-protocol server for the tests: moto's server mode on 127.0.0.1, one per test session.

``running_s3_server()`` starts moto's server (``moto.server.main``, run by this file as a script
so that S3 object writes are one at a time, see ``serve``) at a free port, waits until it answers,
makes the bucket ``openjd-test`` and points every S3 client at it through the environment, so
that subprocesses (the CLI, ``tests/run_worker.py``, Airflow and Prefect workers) inherit it:

- ``FSSPEC_S3_ENDPOINT_URL`` (fsspec reads ``FSSPEC_<PROTOCOL>_<KWARG>`` when it is imported, so
  this process's fsspec configuration is set too);
- fake ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION=us-east-1``, and
  no profile or session token of the developer's;
- ``NO_PROXY`` for 127.0.0.1.

The previous environment comes back when the server stops. Each test takes a store of its own
below the bucket (``S3Server.new_store()``: ``s3://openjd-test/<unique prefix>``). The server
belongs to the session, not to a test: it runs without the environment markers by which the
Prefect and Airflow fixtures find the processes a test left behind (``OPENJD_*_SESSION``,
``OPENJD_*_STACK``, ``OPENJD_*_MARKER``).

The fixtures ``s3_server`` (session) and ``s3_store`` are in ``tests/conftest.py``; folders with
a conftest of their own (``tests/airflow``, ``tests/prefect``) see them too, and may ``import
s3server`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

BUCKET = "openjd-test"
"""The bucket every test store lives in (bucket names are DNS names of 3 or more characters)."""

ACCESS_KEY = "openjd-test-access-key"
SECRET_KEY = "openjd-test-secret-key-not-a-real-one"
START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """A running moto server (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def env(self) -> dict[str, str]:
        """The variables that point an S3 client at this server."""
        no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
        return {
            "FSSPEC_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }

    def new_store(self, name: str = "store") -> str:
        """A fresh store URL: ``s3://openjd-test/<name>-<unique>``."""
        return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}"

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def _put(url: str) -> None:
    request = urllib.request.Request(url, method="PUT", data=b"")
    with urllib.request.urlopen(request, timeout=10):
        pass


@contextlib.contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start a moto server with the bucket ``openjd-test`` and set the environment (see the
    module docstring); stop it and restore the environment at the end."""
    import fsspec.config

    log = Path(tempfile.mkdtemp(prefix="openjd-s3-test-")) / "moto.log"
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("OPENJD_") and k.endswith(("_SESSION", "_STACK", "_MARKER")))
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "127.0.0.1", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    server = S3Server(proc, port, log)
    saved = {k: os.environ.get(k) for k in [*server.env, "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
    saved_conf = dict(fsspec.config.conf.get("s3", {}))
    try:
        end = time.monotonic() + START_TIMEOUT
        while not _answers(server.endpoint + "/"):
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"moto server did not start:\n{server.tail()}")
            time.sleep(0.05)
        _put(f"{server.endpoint}/{BUCKET}")
        os.environ.pop("AWS_PROFILE", None)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.update(server.env)
        fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = server.endpoint
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        fsspec.config.conf["s3"] = saved_conf
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def serve(host: str, port: int) -> None:
    """``python -m moto.server -H HOST -p PORT``, with S3 object writes and deletes one at a
    time. moto 5.2 checks ``If-Match`` / ``If-None-Match`` and then writes, unlocked, and its
    server runs each request on a thread of its own, so two conditional writes at once could
    both pass the check (not seen in practice, but the lease race tests must not rest on
    luck). S3 itself decides each conditional write atomically, and the store relies on that."""
    import threading

    from moto.s3.responses import S3Response
    from moto.server import main

    one_at_a_time = threading.Lock()
    for name in ("put_object", "delete_object"):
        original = getattr(S3Response, name)

        def locked(self, *args, _original=original, **kwargs):  # noqa: ANN001, ANN202
            with one_at_a_time:
                return _original(self, *args, **kwargs)

        setattr(S3Response, name, locked)
    main(["-H", host, "-p", str(port)])


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
