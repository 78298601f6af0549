"""What the checkpoint metrics cost per task (issue 39: at most 5 %).

Whole CLI runs of ``n`` tasks that each store one checkpoint, with the metrics exported over
OTLP/HTTP to a receiver in this process (``OTEL_EXPORTER_OTLP_ENDPOINT``) and without (no
endpoint: no meter provider, so no figure is computed), alternating, 3 pairs; the per-task cost
of each is (an n-task run - a 1-task run) / (n - 1), so the SDK's import at start-up is left
out, and the ratio is of the medians.

    .venv/bin/python benchmarks/metrics_cost.py [N]
"""

from __future__ import annotations

import http.server
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "core.cli"]

SAVING = """\
specificationVersion: 'jobtemplate-2023-09'
extensions: [CHECKPOINT]
name: Saving
parameterDefinitions:
- {name: Frames, type: INT, default: 1}
steps:
- name: Render
  parameterSpace:
    taskParameterDefinitions:
    - {name: Frame, type: INT, range: "1-{{Param.Frames}}"}
  script:
    actions:
      onRun:
        command: sh
        args: ["-c", "echo 'openjd_checkpoint_save: {\\"state\\": \\"1\\"}'"]
      onCheckpointResume: {command: "true"}
"""


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def measure(n: int, pairs: int = 3) -> tuple[float, float]:
    """Per-task seconds (metrics on, metrics off), medians of ``pairs`` alternating runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    base.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    on_env = dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tpl = Path(tmp) / "saving.yaml"
            tpl.write_text(SAVING)
            count = iter(range(100_000))

            def run(k: int, env: dict[str, str]) -> float:
                store = Path(tmp) / f"store-{next(count)}"
                cmd = [*CLI, "run", str(tpl), "-p", f"Frames={k}", "--store", str(store), "-q"]
                started = time.perf_counter()
                done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
                took = time.perf_counter() - started
                if done.returncode:
                    raise SystemExit(f"metrics cost: {cmd} exited {done.returncode}: {done.stderr}")
                return took

            ones = {"on": run(1, on_env), "off": run(1, base)}
            walls: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(pairs):
                walls["on"].append(run(n, on_env))
                walls["off"].append(run(n, base))
    finally:
        server.shutdown()
    per = {k: (statistics.median(walls[k]) - ones[k]) / (n - 1) for k in walls}
    return per["on"], per["off"]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    on, off = measure(n)
    print(f"per task with metrics exported: {on * 1000:.2f} ms; without: {off * 1000:.2f} ms")
    print(f"ratio {on / off:.3f}x (goal: at most 1.05x)")


if __name__ == "__main__":
    main()
