"""Task output kept with the run: every task attempt's output lines (stdout and stderr, which
share one pipe, so in the order written), each with the time it was read, gzip-compressed in
the run's ``logs`` folder of the store, capped in size with a note when cut.

Writing is buffered: lines are compressed in memory as they come and the log file is rewritten
at most about once a second (by one flusher thread) and when the task's action ends, so the
per-line cost is a compressor call, never a store write or an fsync.

A log file is one gzip stream of lines: the first a JSON header (``step``, ``task``, ``attempt``,
``started_at``), then ``<seconds since the epoch>\\t<text>`` per output line, and a last
``#cut <bytes> <lines>`` line when the cap dropped some. A stream read before it was finished
(``logs --follow``) decompresses up to its last flush.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core import CheckpointStore, StoreError, TaskEventKind
from core.local import MAX_RECORD_BYTES

__all__ = ("DEFAULT_MAX_LOG_BYTES", "LogEntry", "LogFile", "LogKeeper", "read_run_logs")

DEFAULT_MAX_LOG_BYTES = 16 * 1024 * 1024
"""The most output, in bytes before compression, kept per task attempt; the rest is counted
and a note says how much was cut."""

MAX_LOG_BYTES_VARIABLE = "OPENJD_CHECKPOINT_MAX_LOG_BYTES"
"""An environment variable that sets the cap in place of ``DEFAULT_MAX_LOG_BYTES`` (bytes)."""


def max_log_bytes() -> int:
    """The cap on output kept per task attempt, in bytes: ``$OPENJD_CHECKPOINT_MAX_LOG_BYTES``
    if it is a whole number of at least 0, else ``DEFAULT_MAX_LOG_BYTES``."""
    try:
        value = int(os.environ.get(MAX_LOG_BYTES_VARIABLE, ""))
    except ValueError:
        return DEFAULT_MAX_LOG_BYTES
    return value if value >= 0 else DEFAULT_MAX_LOG_BYTES


FLUSH_SECONDS = 1.0
"""How often, in seconds, a running task's log is written to the store."""


class _Writer:
    """One task attempt's log, compressed in memory and rewritten whole on each flush."""

    def __init__(self, store: CheckpointStore, job_key: str, run_id: str, name: str,
                 header: dict[str, Any], max_bytes: int) -> None:  # fmt: skip
        self.store, self.job_key, self.run_id, self.name = store, job_key, run_id, name
        self._comp = zlib.compressobj(6, zlib.DEFLATED, 31)
        self._out = bytearray(self._comp.compress(json.dumps(header).encode() + b"\n"))
        self._max = max_bytes
        self._size = 0
        self._cut_bytes = 0
        self._cut_lines = 0
        self._dirty = True
        self._closed = False
        self._lock = threading.Lock()

    def add(self, now: float, lines: list[str]) -> None:
        parts = []
        with self._lock:
            if self._closed:
                return
            for line in lines:
                data = line.encode("utf-8", "replace")
                if self._cut_lines or self._size + len(data) > self._max:
                    self._cut_bytes += len(data) + 1
                    self._cut_lines += 1
                    continue
                self._size += len(data) + 1
                parts.append(b"%.3f\t%s\n" % (now, data))
            if parts:
                self._out += self._comp.compress(b"".join(parts))
            self._dirty = True

    def flush(self, *, final: bool = False) -> None:
        with self._lock:
            if self._closed or not (self._dirty or final):
                return
            comp = self._comp.copy()  # the live one stays open for more lines
            tail = b""
            if self._cut_lines:
                tail = comp.compress(b"#cut %d %d\n" % (self._cut_bytes, self._cut_lines))
            body = (
                bytes(self._out) + tail + comp.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)
            )
            self._dirty = False
            if final:
                self._closed = True
        try:
            self.store.logs.write_log(self.job_key, self.run_id, self.name, body)
        except StoreError:
            pass  # a log is a convenience: the run goes on without it


class LogKeeper:
    """Keeps the output of every task attempt of a run in the store.

    Use ``wrap_output``/``wrap_event`` around a ``JobRunner``'s ``on_output``/``on_event``
    callbacks, and ``close()`` once the run has ended (it writes what is left).

    Args:
        store: the run's store.
        max_bytes: the most output kept per task attempt, in bytes before compression (default:
            ``max_log_bytes()``).
    """

    def __init__(self, store: CheckpointStore, *, max_bytes: int | None = None) -> None:
        self._store = store
        self._max = max_log_bytes() if max_bytes is None else max_bytes
        self._writers: dict[int, _Writer] = {}
        self._names: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="openjd-logs", daemon=True)
        self._thread.start()

    def _writer(self, ex: Any) -> _Writer:
        key = id(ex)
        with self._lock:
            w = self._writers.get(key)
            if w is None:
                label = ex.spec.describe()
                digest = hashlib.sha256(f"{ex.spec.step_name}\0{label}".encode()).hexdigest()[:24]
                stem = f"{digest}.{int(ex.attempt)}"
                n = self._names.get(stem, 0) + 1
                self._names[stem] = n
                header = {"step": ex.spec.step_name, "task": label, "attempt": int(ex.attempt),
                          "started_at": round(time.time(), 3)}  # fmt: skip
                original = ex.spec.whole_label
                if original != label:  # the rest of an interrupted chunk: the task it is of
                    header["of"] = original
                w = _Writer(self._store, ex.job.job_key, ex.run_id, f"{stem}.{n}.log.gz",
                            header, self._max)  # fmt: skip
                self._writers[key] = w
            return w

    def wrap_output(
        self, inner: Callable[[Any, list[str]], None]
    ) -> Callable[[Any, list[str]], None]:
        def on_output(ex: Any, lines: list[str]) -> None:
            self._writer(ex).add(time.time(), lines)
            inner(ex, lines)

        return on_output

    def wrap_event(self, inner: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def on_event(ex: Any, event: Any) -> None:
            if event.kind == TaskEventKind.ACTION_ENDED:
                with self._lock:
                    w = self._writers.pop(id(ex), None)
                if w is not None:
                    w.flush(final=True)
            inner(ex, event)

        return on_event

    def _flusher(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            with self._lock:
                writers = list(self._writers.values())
            for w in writers:
                w.flush()

    def close(self) -> None:
        """Write every log still open, finished; stop the flusher thread."""
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            writers = list(self._writers.values())
            self._writers.clear()
        for w in writers:
            w.flush(final=True)


@dataclass
class LogEntry:
    """One kept output line: ``at`` seconds since the epoch; ``text`` without its newline."""

    at: float
    step: str
    task: str
    attempt: int
    text: str


@dataclass
class LogFile:
    """One task attempt's log as read back: its header, lines, and what the cap cut."""

    name: str
    step: str
    task: str
    attempt: int
    started_at: float
    of: str | None = None
    """For the rest of an interrupted chunk, the label of the chunk it is part of."""
    entries: list[LogEntry] = field(default_factory=list)
    cut_bytes: int = 0
    cut_lines: int = 0


class _DamagedLogError(Exception):
    """A log file that is not one of ours: not gzip, or no header line."""


def _parse(name: str, raw: bytes) -> LogFile | None:
    """The log in ``raw``; None while it holds no whole line yet (being written).

    Raises:
        _DamagedLogError: not a gzip stream, or its first line is not a log header."""
    try:
        text = zlib.decompressobj(31).decompress(raw)
    except zlib.error as exc:
        raise _DamagedLogError(f"not a gzip stream ({exc})") from None
    lines = text.split(b"\n")
    if text.endswith(b"\n"):
        lines.pop()
    else:
        lines = lines[:-1]  # a partial last line: wait for the next flush
    if not lines:
        return None
    try:
        head = json.loads(lines[0])
        log = LogFile(name, str(head["step"]), str(head["task"]), int(head["attempt"]),
                      float(head.get("started_at", 0.0)),
                      str(head["of"]) if head.get("of") else None)  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise _DamagedLogError("its first line is not a log header") from None
    for line in lines[1:]:
        if line.startswith(b"#cut "):
            parts = line.split()
            try:
                log.cut_bytes, log.cut_lines = int(parts[1]), int(parts[2])
            except (ValueError, IndexError):
                pass  # a damaged count: the lines are still worth showing
            continue
        stamp, _, data = line.partition(b"\t")
        try:
            at = float(stamp)
        except ValueError:
            continue
        log.entries.append(LogEntry(at, log.step, log.task, log.attempt,
                                    data.decode("utf-8", "replace")))  # fmt: skip
    return log


def read_run_logs(
    store: CheckpointStore, job_key: str, run_id: str, warnings: list[str] | None = None
) -> list[LogFile]:
    """Every readable log of the run, in the order their task attempts started; a log that
    is damaged (not gzip, no header, not a regular file, too large) is left out, with a line
    naming it appended to ``warnings``.

    Raises:
        StoreError: the run's logs cannot be listed or read."""
    out = []
    for name in store.logs.list_logs(job_key, run_id):
        raw = store.logs.read_log(job_key, run_id, name)
        if raw is None:
            if warnings is not None:  # listed a moment ago: not a file, or too large
                warnings.append(
                    f"log {name} of run {run_id} is not a regular file of at most "
                    f"{MAX_RECORD_BYTES:,} bytes; left out"
                )
            continue
        try:
            log = _parse(name, raw)
        except _DamagedLogError as exc:
            if warnings is not None:
                warnings.append(f"log {name} of run {run_id} is damaged: {exc}; left out")
            continue
        if log is not None:
            out.append(log)
    out.sort(key=lambda lg: (lg.started_at, lg.name))
    return out
