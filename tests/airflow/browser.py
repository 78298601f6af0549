"""A headless Chromium driven through the DevTools protocol (CDP), for the UI page test.

No browser download and no driver: Debian's ``/usr/bin/chromium`` (CI installs it, ``.ci/run``)
is started with ``--remote-debugging-port=0`` in a temporary profile; the port it picked is read
from the profile's ``DevToolsActivePort`` file, and each page is a CDP session over a websocket
(the ``websockets`` package, which Airflow's dependencies bring: fastapi-cli ->
uvicorn[standard]).

- ``Chromium``: ``start()``, ``new_page()``, ``close()``. ``close()`` kills the browser and every
  process it started (its own session and process group, plus the tree seen before), removes
  the temporary profile, and reports what it had to kill in ``leftovers``.
- ``Page``: ``call(method, params)`` (one CDP command), ``navigate``, ``evaluate`` (a JavaScript
  expression's value), ``wait_for`` (poll an expression until it is truthy), ``set_cookie``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path("/usr/bin/chromium")

FLAGS = (
    "--headless",
    "--no-sandbox",  # as root in a container: no user namespaces for the sandbox
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
)


class CDPError(RuntimeError):
    pass


class Page:
    """One page target, through its own websocket."""

    def __init__(self, ws_url: str, *, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._exit = ExitStack()  # connect() is a context manager (websockets >= 17)
        self.ws: ClientConnection = self._exit.enter_context(
            connect(ws_url, max_size=None, open_timeout=timeout, proxy=None, compression=None)
        )
        self.events: list[dict[str, Any]] = []  # the last events seen, for failure messages

    def close(self) -> None:
        self._exit.close()

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 0) -> Any:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to CDP {method} in {timeout or self.timeout} s")
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("id") == msg_id:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events = [*self.events[-49:], message]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise), as JSON."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"JavaScript error in {expression[:200]!r}: {text}")
        return result["result"].get("value")

    def navigate(self, url: str, *, timeout: float = 60.0) -> None:
        """Open ``url`` and wait until its document has loaded (its scripts have started)."""
        result = self.call("Page.navigate", {"url": url}, timeout=timeout)
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")
        self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            timeout=timeout,
            what=f"{url} to load",
        )

    def wait_for(
        self,
        expression: str,
        *,
        timeout: float,
        what: str = "",
        interval: float = 0.25,
        check: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Evaluate ``expression`` until it (or ``check`` of its value) is truthy; return it.

        On timeout the error shows the last value, so a failure tells what the page showed.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if check(value) if check is not None else value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"timed out after {timeout:.0f} s waiting for {what or expression}; "
                    f"last value: {value!r}"
                )
            time.sleep(interval)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        """A cookie for ``url``'s host (host-only, path /), as a login would leave it."""
        result = self.call(
            "Network.setCookie",
            {"url": url, "name": name, "value": value, "path": "/", "httpOnly": True},
        )
        if result.get("success") is False:
            raise CDPError(f"Network.setCookie {name} for {url} refused")

    def clear_cookies(self) -> None:
        self.call("Network.clearBrowserCookies")


class Chromium:
    """A headless Chromium in a temporary profile; ``close()`` always leaves nothing behind."""

    def __init__(self, executable: Path = CHROMIUM) -> None:
        self.executable = executable
        self.root = Path(tempfile.mkdtemp(prefix="openjd-chromium-"))
        self.profile = self.root / "profile"
        self.log_path = self.root / "chromium.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.pages: list[Page] = []
        self.leftovers: list[str] = []
        self._seen: dict[int, psutil.Process] = {}

    def start(self, *, timeout: float = 90.0) -> Chromium:
        self.profile.mkdir()
        args = [
            str(self.executable),
            *FLAGS,
            f"--user-data-dir={self.profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: close() kills all of it
            )
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            lines = active.read_text().splitlines() if active.is_file() else []
            if len(lines) >= 2 and lines[0].isdigit():
                self.port = int(lines[0])
                break
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.executable} exited {self.proc.returncode} while starting: "
                    f"{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no {active} after {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.1)
        self._remember_processes()
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def new_page(self) -> Page:
        """A new tab (``about:blank``), through the browser's ``Target.createTarget``."""
        assert self.port is not None, "start() first"
        browser_path = (self.profile / "DevToolsActivePort").read_text().splitlines()[1]
        browser = Page(f"ws://127.0.0.1:{self.port}{browser_path}")
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})
        finally:
            browser.close()
        page = Page(f"ws://127.0.0.1:{self.port}/devtools/page/{target['targetId']}")
        self.pages.append(page)
        self._remember_processes()
        return page

    def _remember_processes(self) -> None:
        if self.proc is None:
            return
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self._seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def processes(self) -> list[psutil.Process]:
        """The browser's live processes: its tree, its process group, any seen before, and any
        that names the temporary profile (the crash handler, were it to leave the group)."""
        self._remember_processes()
        found = dict(self._seen)
        if self.proc is not None:
            for p in psutil.process_iter(["pid"]):
                try:
                    if os.getpgid(p.pid) == self.proc.pid or str(self.root) in " ".join(
                        p.cmdline()
                    ):
                        found.setdefault(p.pid, p)
                except (ProcessLookupError, psutil.Error):
                    continue
        alive = []
        for p in found.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        return alive

    def close(self) -> None:
        """Kill every process of the browser, wait for them, remove the temporary profile."""
        for page in self.pages:
            try:
                page.close()
            except Exception:  # noqa: BLE001  (the browser may be gone already)
                pass
        self.pages = []
        if self.proc is not None:
            procs = self.processes()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.leftovers.append(f"browser {self.proc.pid} not reaped after SIGKILL")
            psutil.wait_procs(procs, timeout=10)
            self.leftovers.extend(f"{p.pid} still alive after SIGKILL" for p in self.processes())
        shutil.rmtree(self.root, ignore_errors=True)
