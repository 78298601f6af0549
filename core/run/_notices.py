"""Interruption notices: checkpoint before the host goes away.

Spot and preemptible machines are taken back with a short notice, announced by the instance
metadata service long before any signal. A ``NoticeWatcher`` polls the sources it is given from
background threads and calls ``on_notice`` with a ``Notice`` when one announces the end of the
host. The runner (``JobRunner``, ``run_tasks``) then stops its running tasks as the
``Suspended`` termination mode does (``checkpointCancelation``), with the announced time as
the stop deadline (docs/decisions.md, "Interruption notices").

Sources (``parse_notice_sources``), each optional, several at once:

- ``aws[:BASE_URL]``: EC2 spot ``instance-action`` through IMDSv2 (a session token from
  ``PUT /latest/api/token``, then ``GET`` with ``X-aws-ec2-metadata-token``). A rebalance
  recommendation is only noted (it is asked for every sixth poll);
  ``aws-rebalance[:BASE_URL]`` makes it a notice too (asked for on every poll).
- ``gcp[:BASE_URL]``: ``instance/preempted`` (``Metadata-Flavor: Google``), waited on with
  ``wait_for_change``.
- ``azure[:BASE_URL]``: Scheduled Events ``Preempt`` and ``Terminate`` (``Metadata: true``),
  acknowledged (``StartRequests``) once the checkpoints are stored.
- ``file:PATH``: a file that appears at PATH (its text may give the deadline); one already
  there when the run starts counts only once it is written again.
- ``signal:NAME``: a signal to this process (``USR2``, ``SIGUSR1``, ...).

The metadata base URL defaults to the real link-local address. Polling is cheap: at most one
request per source every ``poll_seconds`` (default 5 s), doubling up to
``MAX_BACKOFF_SECONDS`` while the service is absent, which is said once, never per poll.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core._errors import seconds_in_range

__all__ = (
    "DEFAULT_POLL_SECONDS",
    "NOTICES_ENV",
    "NOTICE_POLL_ENV",
    "Notice",
    "NoticeSource",
    "NoticeWatcher",
    "parse_notice_sources",
    "parse_poll_seconds",
)

NOTICES_ENV = "OPENJD_CHECKPOINT_INTERRUPTION_NOTICES"
"""The environment variable that chooses the sources when no option does."""
NOTICE_POLL_ENV = "OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS"
"""The environment variable for ``poll_seconds``."""

METADATA_URL = "http://169.254.169.254"
"""The link-local instance metadata address of AWS, Google Cloud and Azure."""
DEFAULT_POLL_SECONDS = 5.0
"""At most one request per source this often, in seconds (AWS suggests every 5 s)."""
MIN_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 3600.0
MAX_BACKOFF_SECONDS = 300.0
"""The longest wait between two requests to a metadata service that is absent, in seconds."""
HTTP_TIMEOUT_SECONDS = 2.0
"""How long one request to a metadata service may take, in seconds."""
DEFAULT_NOTICE_SECONDS = {"gcp": 30.0, "azure": 30.0}
"""The notice a provider gives when it announces no time (Google Cloud never does; an Azure
``Preempt`` without ``NotBefore``), in seconds: the documented minimum."""
MIN_NOTICE_SECONDS = 2.0
"""The least time a notice leaves the tasks to checkpoint, in seconds: a deadline nearer than
this, or already past (a notice read late), becomes this far from when the notice was seen."""
MAX_NOTICE_SECONDS = 3660 * 86400.0
"""A deadline further than this from when the notice was seen (ten years, in seconds) is not
taken as a time (milliseconds, a garbled value): the notice stands, without a deadline."""
REFUSED_SIGNALS = {"SIGINT", "SIGTERM", "SIGKILL", "SIGSTOP"}
"""Signals a ``signal:`` source may not take: SIGINT and SIGTERM already suspend a CLI run, and
SIGKILL and SIGSTOP cannot be caught."""


@dataclass(frozen=True)
class Notice:
    """An announced end of the host.

    Attributes:
        source: the source's name (``aws``, ``gcp``, ``azure``, ``file``, ``signal``).
        kind: ``interruption``, or ``rebalance`` (an AWS rebalance recommendation).
        detail: what the source said, for people.
        deadline: when the host goes away, in seconds since the epoch, or None (not announced).
        received_at: when the notice was seen, in seconds since the epoch.
        event_id: the Azure event to acknowledge, else None.
    """

    source: str
    kind: str
    detail: str
    deadline: float | None
    received_at: float = field(default_factory=time.time)
    event_id: str | None = None

    def __post_init__(self) -> None:
        # A deadline is the source's word, not ours: one that is no time at all (NaN, 1e300,
        # milliseconds read as seconds) is dropped, and one already past (a late notice) leaves
        # the tasks MIN_NOTICE_SECONDS to checkpoint, with the detail saying so.
        deadline, detail = self.deadline, self.detail
        if deadline is not None:
            lo, hi = self.received_at - 86400.0, self.received_at + MAX_NOTICE_SECONDS
            if not (isinstance(deadline, (int, float)) and math.isfinite(deadline)) or not (
                lo <= deadline <= hi
            ):
                detail += (
                    f"; its deadline {str(deadline)[:40]!s} is not a time within ten years: ignored"
                )
                deadline = None
            elif deadline < self.received_at + MIN_NOTICE_SECONDS:
                detail += (
                    f"; its deadline was {self.received_at - deadline:.1f} s ago or too near: "
                    f"the tasks get {MIN_NOTICE_SECONDS:g} s to checkpoint"
                )
                deadline = self.received_at + MIN_NOTICE_SECONDS
        object.__setattr__(self, "deadline", deadline)
        object.__setattr__(self, "detail", detail)

    def describe(self) -> str:
        """One line for people: source, detail, deadline and how far away it is."""
        text = f"{self.source}: {self.detail}"
        if self.deadline is not None:
            when = datetime.fromtimestamp(self.deadline).astimezone().isoformat(timespec="seconds")
            text += f" (deadline {when}, in {self.deadline - self.received_at:.1f} s)"
        else:
            text += " (no deadline announced)"
        return text

    def to_record(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "detail": self.detail,
            "deadline": self.deadline,
            "received_at": self.received_at,
        }


class _AbsentError(Exception):
    """The source's service cannot be reached (or does not exist here)."""


def _iso_time(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time (``2017-09-18T08:22:00Z``).

    Raises:
        ValueError: not such a time.
    """
    stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return stamp.timestamp()


class NoticeSource:
    """One place a notice may come from. Subclasses implement ``poll``.

    Attributes:
        name: how the configuration names it (``aws``, ``gcp``, ...).
        where: the configuration it came from, for messages.
    """

    name = "source"
    interval_bound = True
    """False when ``poll`` itself waits (a long poll): the watcher then adds no wait of its
    own after an answer, only after an absent service."""

    def __init__(self, *, where: str = "") -> None:
        self.where = where

    def describe(self) -> str:
        return self.name

    def start(self) -> str | None:
        """Called once, from the thread that starts the watcher, before the first ``poll``.
        Returns a note for people, or None."""
        return None

    def poll(self, wait: float) -> Notice | None:
        """Look once; ``wait`` is the poll interval (a long poll may wait that long).

        Raises:
            _AbsentError: the service cannot be reached.
        """
        raise NotImplementedError

    def acknowledge(self, notice: Notice) -> str | None:
        """Tell the provider the checkpoints are stored. Returns a note, or None."""
        return None

    def close(self) -> None:
        """Undo ``start``."""


class _HttpSource(NoticeSource):
    def __init__(self, base_url: str, *, where: str = "") -> None:
        super().__init__(where=where)
        self.base_url = base_url.rstrip("/")

    def describe(self) -> str:
        return f"{self.name} ({self.base_url})"

    def _request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        *,
        body: bytes | None = None,
        timeout: float = HTTP_TIMEOUT_SECONDS,
        absent_codes: tuple[int, ...] = (),
    ) -> tuple[int, bytes, dict[str, str]]:
        """One request. Returns status, body and headers (any status but those in
        ``absent_codes``, which raise ``_AbsentError`` like an unreachable service does)."""
        import http.client
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.base_url + path, data=body, method=method)
        for key, value in headers.items():
            req.add_header(key, value)
        try:
            with _opener().open(req, timeout=timeout) as resp:
                status, data, head = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            status, data, head = exc.code, exc.read(), dict(exc.headers or {})
        except (OSError, http.client.HTTPException) as exc:  # refused, timed out, reset
            raise _AbsentError(str(exc)) from None
        if status in absent_codes or status >= 500:
            raise _AbsentError(f"HTTP {status}")
        return status, data, head


@functools.lru_cache(maxsize=1)
def _opener() -> Any:
    """The opener of every metadata request: no proxy (a metadata service is link-local, and a
    proxy from the environment must not see it). Made, and ``urllib.request`` imported, at the
    first request: the import took 14 ms of every CLI start, which needs no notice source."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class AwsSource(_HttpSource):
    """EC2 spot ``instance-action`` (and the rebalance recommendation) through IMDSv2."""

    name = "aws"
    TOKEN_TTL_SECONDS = 21600

    def __init__(self, base_url: str = METADATA_URL, *, rebalance: bool = False, where: str = ""):
        super().__init__(base_url, where=where)
        self.rebalance = rebalance
        self._token: str | None = None
        self._token_until = 0.0
        self._rebalance_seen = False
        self._polls = 0
        if rebalance:
            self.name = "aws-rebalance"

    def _get_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_until:
            return self._token
        status, data, _ = self._request(
            "PUT",
            "/latest/api/token",
            {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_SECONDS)},
            absent_codes=(403, 404, 405),
        )
        if status != 200 or not data:
            raise _AbsentError(f"no IMDSv2 token (HTTP {status})")
        self._token = data.decode("ascii", "replace").strip()
        self._token_until = time.monotonic() + self.TOKEN_TTL_SECONDS - 60
        return self._token

    def _get(self, path: str) -> tuple[int, bytes]:
        status, data, _ = self._request(
            "GET", path, {"X-aws-ec2-metadata-token": self._get_token()}
        )
        if status == 401:  # the token expired early: once more with a new one
            self._token = None
            status, data, _ = self._request(
                "GET", path, {"X-aws-ec2-metadata-token": self._get_token()}
            )
        return status, data

    def poll(self, wait: float) -> Notice | None:
        status, data = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            try:
                doc = json.loads(data)
                action = str(doc.get("action", "terminate"))
                deadline: float | None = _iso_time(str(doc["time"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                action, deadline = "terminate", None
            return Notice("aws", "interruption", f"spot instance-action {action}", deadline)
        self._polls += 1
        if self._rebalance_seen or (not self.rebalance and self._polls % 6 != 1):
            return None  # noted only: asked every sixth poll, so a poll is one request
        status, data = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            self._rebalance_seen = True
            try:
                when = str(json.loads(data).get("noticeTime", ""))
            except (ValueError, AttributeError):
                when = ""
            return Notice("aws", "rebalance", f"rebalance recommendation {when}".strip(), None)
        return None


class GcpSource(_HttpSource):
    """Google Cloud ``instance/preempted``, waited on with ``wait_for_change``."""

    name = "gcp"
    interval_bound = False
    PATH = "/computeMetadata/v1/instance/preempted"

    def __init__(self, base_url: str = METADATA_URL, *, where: str = "") -> None:
        super().__init__(base_url, where=where)
        self._etag: str | None = None

    def poll(self, wait: float) -> Notice | None:
        path, timeout = self.PATH, HTTP_TIMEOUT_SECONDS
        if self._etag is not None:
            secs = max(1, int(wait))
            path += f"?wait_for_change=true&timeout_sec={secs}&last_etag={self._etag}"
            timeout += secs
        started = time.monotonic()
        status, data, head = self._request(
            "GET", path, {"Metadata-Flavor": "Google"}, timeout=timeout, absent_codes=(403, 404)
        )
        if status != 200:
            raise _AbsentError(f"HTTP {status}")
        self._etag = head.get("ETag") or head.get("etag") or self._etag
        if data.strip().upper() == b"TRUE":
            return Notice(
                "gcp",
                "interruption",
                "instance preempted",
                time.time() + DEFAULT_NOTICE_SECONDS["gcp"],
            )
        # A server that answers at once (no ETag support) must not be polled in a busy loop.
        left = wait - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        return None


class AzureSource(_HttpSource):
    """Azure Scheduled Events: ``Preempt`` and ``Terminate``, acknowledged once stored."""

    name = "azure"
    API = "api-version=2020-07-01"
    HEADERS = {"Metadata": "true"}
    KINDS = ("Preempt", "Terminate")

    def __init__(self, base_url: str = METADATA_URL, *, where: str = "") -> None:
        super().__init__(base_url, where=where)
        self._vm_name: str | None = None
        self._seen: set[str] = set()

    def _find_vm_name(self) -> None:
        """This VM's name, to tell its events from other machines' (once, on the first poll
        that reaches the service: on the source's thread, never the caller's)."""
        status, data, _ = self._request(
            "GET",
            "/metadata/instance/compute/name?api-version=2021-02-01&format=text",
            self.HEADERS,
        )
        self._vm_name = data.decode("utf-8", "replace").strip() if status == 200 else ""

    def poll(self, wait: float) -> Notice | None:
        if self._vm_name is None:
            self._find_vm_name()
        status, data, _ = self._request(
            "GET", f"/metadata/scheduledevents?{self.API}", self.HEADERS, absent_codes=(404,)
        )
        if status != 200:
            raise _AbsentError(f"HTTP {status}")
        try:
            events = json.loads(data).get("Events") or []
        except (ValueError, AttributeError):
            return None
        for event in events:
            if not isinstance(event, dict) or event.get("EventType") not in self.KINDS:
                continue
            resources = event.get("Resources") or []
            if self._vm_name and resources and self._vm_name not in resources:
                continue  # another machine's event
            event_id = str(event.get("EventId", ""))
            if event_id in self._seen:
                continue
            self._seen.add(event_id)
            deadline: float | None = None
            not_before = str(event.get("NotBefore") or "")
            if not_before:
                try:
                    import email.utils

                    deadline = email.utils.parsedate_to_datetime(not_before).timestamp()
                except (TypeError, ValueError):
                    deadline = None
            if deadline is None:
                deadline = time.time() + DEFAULT_NOTICE_SECONDS["azure"]
            return Notice(
                "azure",
                "interruption",
                f"scheduled event {event.get('EventType')} {event_id}",
                deadline,
                event_id=event_id,
            )
        return None

    def acknowledge(self, notice: Notice) -> str | None:
        if not notice.event_id:
            return None
        body = json.dumps({"StartRequests": [{"EventId": notice.event_id}]}).encode()
        try:
            status, _, _ = self._request(
                "POST",
                f"/metadata/scheduledevents?{self.API}",
                {**self.HEADERS, "Content-Type": "application/json"},
                body=body,
            )
        except _AbsentError as exc:
            return f"warning: azure: event {notice.event_id} not acknowledged: {exc}"
        if status >= 300:
            return f"warning: azure: event {notice.event_id} not acknowledged: HTTP {status}"
        return f"azure: acknowledged scheduled event {notice.event_id}"


class FileSource(NoticeSource):
    """A file that appears at a path. Its text, if any, may give the deadline: seconds since
    the epoch, an ISO 8601 time with a zone, or JSON ``{"deadline": either}``."""

    name = "file"

    def __init__(self, path: str, *, where: str = "") -> None:
        super().__init__(where=where)
        self.path = Path(path)
        self._stale: int | None = None

    def describe(self) -> str:
        return f"file ({self.path})"

    def _mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def start(self) -> str | None:
        """A file already there when the watcher starts is left over from an earlier notice
        (a reused machine): it counts only once it changes, or goes and comes back."""
        self._stale = self._mtime()
        if self._stale is None:
            return None
        return (
            f"interruption notices: the notice file {self.path} was there before these tasks "
            "started (an earlier notice, or a reused machine); ignored until it is written again"
        )

    def poll(self, wait: float) -> Notice | None:
        mtime = self._mtime()
        if mtime is None or mtime == self._stale:
            if mtime is None:
                self._stale = None
            return None
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")[:4096].strip()
        except OSError:
            return None  # gone again, or unreadable: the next poll sees it
        return Notice("file", "interruption", f"notice file {self.path}", _file_deadline(text))


def _file_deadline(text: str) -> float | None:
    if not text:
        return None
    value: Any = text
    if text.startswith("{"):
        try:
            value = json.loads(text).get("deadline")
        except (ValueError, AttributeError):
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer past any float: no time (Notice drops it)
            return math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except (ValueError, OverflowError):
            pass
        try:
            return _iso_time(value)
        except ValueError:
            return None
    return None


class SignalSource(NoticeSource):
    """A signal to this process. Its handler is installed by ``start`` (or ``install``), which
    must run in the main thread; the previous handler comes back on ``close``."""

    name = "signal"
    interval_bound = False

    def __init__(self, signame: str, *, where: str = "") -> None:
        super().__init__(where=where)
        name = signame.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        sig = signal.Signals.__members__.get(name)
        if sig is None or name in REFUSED_SIGNALS:
            allowed = "USR1, USR2, HUP, QUIT, ALRM, WINCH, PWR, XCPU"
            raise ValueError(
                f"{where}: signal:{signame}: "
                + (
                    f"{name} may not be used (SIGINT and SIGTERM already suspend the run; "
                    "SIGKILL and SIGSTOP cannot be caught)"
                    if sig is not None
                    else "not a signal name"
                )
                + f"; use one of {allowed}"
            )
        self.signal = sig
        self._fired = threading.Event()
        self._previous: Any = None
        self._installed = False

    def describe(self) -> str:
        return f"signal ({self.signal.name})"

    def install(self) -> None:
        """Install the handler (main thread only).

        Raises:
            ValueError: not called from the main thread.
        """
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(
                f"{self.where}: signal:{self.signal.name}: a signal handler can only be "
                "installed from the main thread of the process"
            )
        self._previous = signal.signal(self.signal, self._handler)
        self._installed = True

    def _handler(self, _signum: int, _frame: Any) -> None:
        self._fired.set()

    def start(self) -> str | None:
        self.install()
        return None

    def poll(self, wait: float) -> Notice | None:
        if self._fired.wait(wait):
            return Notice("signal", "interruption", f"{self.signal.name} received", None)
        return None

    def close(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(self.signal, self._previous or signal.SIG_DFL)
            self._installed = False


def parse_poll_seconds(text: str | float | None, *, where: str) -> float:
    """The poll interval from an option, a setting or an environment variable.

    Raises:
        ValueError: not a number from ``MIN_POLL_SECONDS`` to ``MAX_POLL_SECONDS``, naming
            ``where``.
    """
    if text is None or text == "":
        return DEFAULT_POLL_SECONDS
    return seconds_in_range(text, where=where, low=MIN_POLL_SECONDS, high=MAX_POLL_SECONDS)


_NAMES = "aws, aws-rebalance, gcp, azure, file:PATH, signal:NAME"


def parse_notice_sources(text: str | Sequence[str] | None, *, where: str) -> list[NoticeSource]:
    """The sources a setting names: ``aws,gcp,azure,file:/path,signal:USR2``, each provider
    optionally with its base URL (``aws:http://127.0.0.1:8080``). Empty or None: no source.

    Raises:
        ValueError: an unknown source, a missing or bad argument, a source named twice; the
            message names ``where`` (the option, setting or variable it came from).
    """
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    sources: list[NoticeSource] = []
    seen: set[str] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        name, _, arg = item.partition(":")
        name = name.strip().lower()
        if name in seen and name not in ("file", "signal"):
            raise ValueError(f"{where}: {name!r} is named twice")
        seen.add(name)
        if name in ("aws", "aws-rebalance", "gcp", "azure"):
            url = arg.strip() or METADATA_URL
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    f"{where}: {item!r}: the base URL must be http:// or https:// and a host "
                    "(aws:http://169.254.169.254)"
                )
            try:
                parts.port  # noqa: B018 (raises ValueError for a port that is no number)
            except ValueError:
                raise ValueError(
                    f"{where}: {item!r}: the base URL's port is not a number"
                ) from None
            if name == "gcp":
                sources.append(GcpSource(url, where=where))
            elif name == "azure":
                sources.append(AzureSource(url, where=where))
            else:
                sources.append(AwsSource(url, rebalance=name == "aws-rebalance", where=where))
        elif name == "file":
            if not arg.strip():
                raise ValueError(f"{where}: {item!r}: file needs a path (file:/path/to/notice)")
            key = "file:" + os.path.abspath(arg.strip())
            if key in seen:
                raise ValueError(f"{where}: {item!r} is named twice")
            seen.add(key)
            sources.append(FileSource(arg.strip(), where=where))
        elif name == "signal":
            if not arg.strip():
                raise ValueError(f"{where}: {item!r}: signal needs a name (signal:USR2)")
            signal_source = SignalSource(arg.strip(), where=where)
            key = f"signal:{int(signal_source.signal)}"
            if key in seen:
                raise ValueError(f"{where}: {item!r} is named twice")
            seen.add(key)
            sources.append(signal_source)
        else:
            raise ValueError(f"{where}: unknown interruption notice source {item!r} ({_NAMES})")
    if "aws" in seen and "aws-rebalance" in seen:
        raise ValueError(f"{where}: name aws or aws-rebalance, not both")
    return sources


class NoticeWatcher:
    """Polls notice sources, one background thread each, and reports every notice once.

    Args:
        sources: from ``parse_notice_sources``.
        on_notice: called with each ``Notice`` of kind ``interruption`` (and ``rebalance``
            from ``aws-rebalance``), on the source's thread.
        on_note: lines a person should see: a service absent (once per source), a rebalance
            recommendation not acted on.
        poll_seconds: at most one request per source this often; doubled after each failed
            request, up to ``MAX_BACKOFF_SECONDS``.
    """

    def __init__(
        self,
        sources: Sequence[NoticeSource],
        on_notice: Callable[[Notice], None],
        *,
        on_note: Callable[[str], None] | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
    ) -> None:
        self.sources = list(sources)
        self._on_notice = on_notice
        self._on_note = on_note
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.notices: list[tuple[NoticeSource, Notice]] = []
        self.polls = 0
        """Requests (polls) made so far, all sources together."""

    def _note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    def start(self) -> NoticeWatcher:
        """Start the sources (a ``signal:`` source must be installed from the main thread
        first, or this must be called there) and their threads."""
        for source in self.sources:
            note = source.start()
            if note:
                self._note(note)
        for source in self.sources:
            thread = threading.Thread(
                target=self._loop, args=(source,), name=f"openjd-notice-{source.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return self

    @property
    def first(self) -> Notice | None:
        """The first notice acted on, or None."""
        with self._lock:
            return self.notices[0][1] if self.notices else None

    def _loop(self, source: NoticeSource) -> None:
        failures = 0
        said = False  # absent: said once per watcher, even when the service comes and goes
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.polls += 1
                notice = source.poll(self.poll_seconds)
            except _AbsentError as exc:
                if not said:
                    said = True
                    self._note(
                        f"interruption notices: {source.describe()} not reachable ({exc}); "
                        f"asking again with back-off, up to every {MAX_BACKOFF_SECONDS:.0f} s"
                    )
                failures += 1
                wait = min(MAX_BACKOFF_SECONDS, self.poll_seconds * 2 ** min(failures, 16))
                if self._stop.wait(wait):
                    return
                continue
            except Exception as exc:  # a bug in a source must not end the run
                self._note(f"warning: interruption notices: {source.describe()}: {exc!r}")
                if self._stop.wait(MAX_BACKOFF_SECONDS):
                    return
                continue
            failures = 0
            if self._stop.is_set():
                return
            if notice is not None:
                if notice.kind == "rebalance" and not getattr(source, "rebalance", False):
                    self._note(
                        f"interruption notices: aws: {notice.detail}: not acted on (name "
                        "'aws-rebalance' to checkpoint and suspend on it)"
                    )
                else:
                    with self._lock:
                        self.notices.append((source, notice))
                    self._on_notice(notice)
                    if not isinstance(source, AzureSource):
                        return  # one notice per source is enough
            if source.interval_bound:
                if self._stop.wait(self.poll_seconds):
                    return

    def acknowledge(self) -> list[str]:
        """Acknowledge every notice acted on (Azure: ``StartRequests``), once the checkpoints
        are stored. Returns notes for people."""
        with self._lock:
            notices = list(self.notices)
        notes = []
        for source, notice in notices:
            note = source.acknowledge(notice)
            if note:
                notes.append(note)
        return notes

    def close(self) -> None:
        """Stop polling; returns at once (the threads are daemons: one in a request ends when
        it is answered, and reports nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()  # threads see it before they report anything; none is waited for
        for source in self.sources:
            source.close()


def checkpoint_timing(notice: Notice, ended_at: float) -> str:
    """The log line that says how long the checkpoints took against the notice's deadline."""
    took = ended_at - notice.received_at
    text = (
        f"interruption notice ({notice.source}): tasks asked to checkpoint and stopped in "
        f"{took:.1f} s"
    )
    if notice.deadline is None:
        return text + " (no deadline announced)"
    given = notice.deadline - notice.received_at
    margin = notice.deadline - ended_at
    return text + f" of the {given:.1f} s the notice gave ({margin:.1f} s to spare)"
