"""A test HTTP server on 127.0.0.1 that plays the instance metadata services of AWS (IMDSv2,
with session tokens), Google Cloud (``instance/preempted``, with ``wait_for_change``) and Azure
(Scheduled Events, with their acknowledgement). Used by the core, Airflow and Prefect tests of
interruption notices; never the real link-local addresses."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

AZURE_VM = "vm-under-test"


class MetadataServer:
    """Starts on a free port; ``trigger(provider, seconds)`` announces the end of the host in
    ``seconds``. ``requests`` lists (method, path) of every request; ``acks`` the Azure event
    ids acknowledged; ``tokens`` the IMDSv2 tokens issued."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.acks: list[str] = []
        self.tokens: list[str] = []
        self.rejected: list[str] = []  # requests refused for a missing header or token
        self.aws_deadline: float | None = None
        self.aws_rebalance = False
        self.once = False  # answer a notice to one request only (the host was then replaced)
        self.gcp_preempted = False
        self.azure_events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._etag = 1
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def trigger(self, provider: str, seconds: float = 120.0, *, once: bool = False) -> float:
        """Announce the host's end ``seconds`` from now (AWS and Azure give the time; Google
        Cloud gives none). Returns the announced deadline (whole seconds, as the services
        write it). ``once``: only the first request that sees it gets it (AWS, GCP), as if
        the host had been replaced after it, so a framework's retry runs undisturbed."""
        deadline = float(int(time.time() + seconds))
        with self._cond:
            self.once = once
            if provider == "aws":
                self.aws_deadline = deadline
            elif provider == "gcp":
                self.gcp_preempted = True
                self._etag += 1
            elif provider == "azure":
                self.azure_events.append(
                    {
                        "EventId": f"event-{len(self.azure_events) + 1}",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": [AZURE_VM],
                        "EventStatus": "Scheduled",
                        "NotBefore": formatdate(deadline, usegmt=True),
                        "Description": "spot eviction",
                        "EventSource": "Platform",
                        "DurationInSeconds": -1,
                    }
                )
            else:
                raise ValueError(provider)
            self._cond.notify_all()
        return deadline

    # -- requests
    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.requests.append((method, parts.path))
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        path = parts.path
        if path.startswith("/latest/"):
            self._aws(h, method, path)
        elif path.startswith("/computeMetadata/"):
            self._gcp(h, path, query)
        elif path.startswith("/metadata/"):
            self._azure(h, method, path, body)
        else:
            self._send(h, 404, b"not found")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, body: bytes, **headers: str) -> None:
        h.send_response(code)
        h.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            h.send_header(key.replace("_", "-"), value)
        h.end_headers()
        h.wfile.write(body)

    def _aws(self, h: BaseHTTPRequestHandler, method: str, path: str) -> None:
        if path == "/latest/api/token":
            if method != "PUT" or not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                self.rejected.append(f"{method} {path}")
                self._send(h, 400, b"bad token request")
                return
            token = f"token-{len(self.tokens) + 1}"
            self.tokens.append(token)
            self._send(h, 200, token.encode())
            return
        if h.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
            self.rejected.append(f"{method} {path}")
            self._send(h, 401, b"")
            return
        if path == "/latest/meta-data/spot/instance-action" and self.aws_deadline is not None:
            when = datetime.fromtimestamp(self.aws_deadline, timezone.utc)
            doc = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
            if self.once:
                self.aws_deadline = None
            self._send(h, 200, json.dumps(doc).encode())
        elif path == "/latest/meta-data/events/recommendations/rebalance" and self.aws_rebalance:
            doc = {"noticeTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
            self._send(h, 200, json.dumps(doc).encode())
        else:
            self._send(h, 404, b"")

    def _gcp(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, str]) -> None:
        if h.headers.get("Metadata-Flavor") != "Google":
            self.rejected.append(f"GET {path}")
            self._send(h, 403, b"Missing Metadata-Flavor:Google header.")
            return
        if path != "/computeMetadata/v1/instance/preempted":
            self._send(h, 404, b"")
            return
        if query.get("wait_for_change") == "true":
            end = time.monotonic() + float(query.get("timeout_sec", "60"))
            with self._cond:
                while query.get("last_etag") == str(self._etag) and time.monotonic() < end:
                    self._cond.wait(end - time.monotonic())
        value = b"TRUE" if self.gcp_preempted else b"FALSE"
        if self.gcp_preempted and self.once:
            self.gcp_preempted = False
        self._send(h, 200, value, ETag=str(self._etag))

    def _azure(self, h: BaseHTTPRequestHandler, method: str, path: str, body: bytes) -> None:
        if h.headers.get("Metadata") != "true":
            self.rejected.append(f"{method} {path}")
            self._send(h, 400, b'{"error": "Bad request. Required metadata header not specified"}')
            return
        if path == "/metadata/instance/compute/name":
            self._send(h, 200, AZURE_VM.encode())
        elif path == "/metadata/scheduledevents" and method == "GET":
            doc = {"DocumentIncarnation": len(self.azure_events), "Events": self.azure_events}
            self._send(h, 200, json.dumps(doc).encode())
        elif path == "/metadata/scheduledevents" and method == "POST":
            for item in json.loads(body).get("StartRequests", []):
                self.acks.append(item["EventId"])
            self._send(h, 200, b"")
        else:
            self._send(h, 404, b"")


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
