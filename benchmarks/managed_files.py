"""Managed checkpoint files: the cost of committing a large file, against ``cp`` of it.

A file of SIZE MiB (default 200) is checkpointed twice by the core's capture (declared with
``openjd_checkpoint_files``, then saved), unchanged the second time, into a managed store.
Prints the time of ``cp`` of the same file (the baseline, measured in the same run), the first
commit (hash, upload, manifest, record) and the second (nothing uploaded: the file's content is
already in the store), each with its ratio to ``cp``; then the peak memory (RSS) a capture of
a file of MEMORY MiB (default 1024) adds, in a child process, to show that uploads stream.

Usage:  .venv/bin/python benchmarks/managed_files.py [SIZE_MIB [MEMORY_MIB [STORE_URL]]]
        STORE_URL: an fsspec URL (default: a local folder in a temporary directory)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import CheckpointStore  # noqa: E402
from core.files import FileCapture

CHILD = len(sys.argv) > 1 and sys.argv[1] == "--child-memory"
ARGS = sys.argv[4:] if CHILD else sys.argv[1:]
SIZE_MIB = int(ARGS[0]) if len(ARGS) > 0 else 200
MEMORY_MIB = int(ARGS[1]) if len(ARGS) > 1 else 1024
STORE_URL = ARGS[2] if len(ARGS) > 2 else None


def make_file(path: Path, mib: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(block)


def commit_once(capture: FileCapture, path: str) -> float:
    """Declare ``path``, save, and wait for the commit; seconds."""
    committed = threading.Event()
    started = time.perf_counter()
    capture.declare([path], [])
    capture.save(None, [path], [], lambda _manifest, _file: committed.set())
    capture.drain()
    if not committed.is_set():
        raise SystemExit("the save was not committed")
    return time.perf_counter() - started


def child_memory(mib: int, work: str) -> None:
    """In a child process: RSS growth (KiB) while capturing a ``mib`` MiB file."""
    big = Path(work) / "big.bin"
    make_file(big, mib)
    store = CheckpointStore(STORE_URL or str(Path(work) / "store"), files="managed")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    capture = FileCapture(store.fs, work, [], warn=print)
    commit_once(capture, str(big))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{before} {after}")


def main() -> None:
    if CHILD:
        child_memory(int(sys.argv[2]), sys.argv[3])
        return
    with tempfile.TemporaryDirectory() as work:
        big = Path(work) / "big.bin"
        make_file(big, SIZE_MIB)
        started = time.perf_counter()
        subprocess.run(["cp", str(big), str(Path(work) / "copy.bin")], check=True)
        os.sync()
        cp_seconds = time.perf_counter() - started
        os.unlink(Path(work) / "copy.bin")
        store = CheckpointStore(STORE_URL or str(Path(work) / "store"), files="managed")
        capture = FileCapture(store.fs, work, [], warn=print)
        first = commit_once(capture, str(big))
        uploaded = capture.stats.uploaded_bytes
        second = commit_once(capture, str(big))
        capture.close()
        print(f"file: {SIZE_MIB} MiB, store: {store.location}")
        print(f"cp (baseline):  {cp_seconds:7.3f} s")
        print(
            f"first commit:   {first:7.3f} s  ({first / cp_seconds:5.2f}x cp), "
            f"uploaded {uploaded:,} bytes"
        )
        print(
            f"second commit:  {second:7.3f} s  ({second / cp_seconds:5.2f}x cp), "
            f"uploaded {capture.stats.uploaded_bytes - uploaded:,} bytes"
        )
        # A fresh capture (another task) of the same unchanged file: hashed, not uploaded.
        other = FileCapture(store.fs, work, [], warn=print)
        third = commit_once(other, str(big))
        other.close()
        print(
            f"another task:   {third:7.3f} s  ({third / cp_seconds:5.2f}x cp), "
            f"uploaded {other.stats.uploaded_bytes:,} bytes (hashed, found in the store)"
        )
    with tempfile.TemporaryDirectory() as work:
        out = subprocess.run(
            [sys.executable, __file__, "--child-memory", str(MEMORY_MIB), work, *sys.argv[1:]],
            check=True,
            capture_output=True,
            text=True,
        )
        before, after = (int(x) for x in out.stdout.strip().splitlines()[-1].split())
        print(
            f"capturing a {MEMORY_MIB} MiB file: peak RSS {before / 1024:.1f} MiB before, "
            f"{after / 1024:.1f} MiB after (+{(after - before) / 1024:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
