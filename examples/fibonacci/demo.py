"""The README's main job: run the fast Fibonacci example, interrupt it, resume it.

1. ``openjd-checkpoint run fibonacci-fast.yaml`` starts; a few steps in, it gets SIGINT (what
   Ctrl-C sends). The task receives SIGUSR1 (its checkpointCancelation), saves
   ``n,v0,v1`` and exits; the CLI stores the checkpoint and exits 75.
2. The same command again resumes: ``onCheckpointResume`` runs with the saved state and the
   task reports RESUMED, then prints the final answer, which is checked here.

Uses a fresh store in a temporary directory (the embedded local-directory store), so it leaves
nothing behind. Exits non-zero if anything is not as described.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "fibonacci-fast.yaml"
N = 40
STOP_AT = 5
"""The step at which the first run is interrupted (the task prints one line a step)."""


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def main() -> int:
    exe = Path(sys.executable).with_name("openjd-checkpoint")
    with tempfile.TemporaryDirectory(prefix="openjd-checkpoint-demo-") as store:
        cmd = [str(exe), "run", str(TEMPLATE), "-p", f"N={N}", "--store", store]
        print(f"$ {' '.join(cmd)}    # interrupted with SIGINT at step {STOP_AT}", flush=True)
        first = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        assert first.stdout is not None
        for line in first.stdout:  # shown as it comes; Ctrl-C once the task is under way
            sys.stdout.write(line)
            if f"Fibonacci number {STOP_AT} is" in line:
                first.send_signal(signal.SIGINT)
        code = first.wait(timeout=60)
        print(f"--> first run exited {code} (75: interrupted; a rerun resumes what was kept)\n")
        if code != 75:
            print("demo: expected exit code 75", file=sys.stderr)
            return 1
        print(f"$ {' '.join(cmd)}    # the same command resumes", flush=True)
        second = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        output = []
        assert second.stdout is not None
        for line in second.stdout:  # shown as it comes, task output and notes in order
            sys.stdout.write(line)
            output.append(line)
        code = second.wait(timeout=120)
        text = "".join(output)
        expected = f"Final answer: Fibonacci number {N} is {fib(N)}"
        if code != 0 or expected not in text:
            print(f"demo: expected exit 0 and {expected!r}", file=sys.stderr)
            return 1
        if '"RESUMED"' not in text:
            print("demo: the second run did not resume from the checkpoint", file=sys.stderr)
            return 1
        print(f"\n--> resumed from the checkpoint and finished: {expected}")
        print(
            "--> the demo's store was a temporary folder and is removed now; to look around "
            "(runs, checkpoints list, logs), run the command above with a --store of your own"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
