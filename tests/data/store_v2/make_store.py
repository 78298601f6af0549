"""Make the fixture store ``tests/data/store_v2/store``: what the product wrote before issue 25
changed which writes are durable and how checkpoint files are hashed (commit ``46321e8``: sha256
blobs, every record write fsynced), kept so that every later version is tested against
it (``tests/test_store_upgrade.py``: it must read every record, resume every run, and ``gc`` must
delete none of its live files).

It holds, in one local store:

- ``state``: the counter (``templates/state.yaml``, N=40) suspended with a state-only
  checkpoint (the last three generations) after step 13;
- ``frames``: a chunk of six frames (``templates/frames.yaml``) suspended with frames 1-3
  reported finished;
- ``training``: the managed-files example (``templates/training.yaml``, ``--files managed``,
  Epochs=12) suspended after epoch 4 with its model file and sample outputs in the store;
- ``finished``: the same example run to success with Epochs=2: its checkpoints deleted, its
  early-outputs index and their blobs kept.

Run it with the code of that commit from the repository root, then commit the result::

    .venv/bin/python tests/data/store_v2/make_store.py

It is not run by the tests; the store is deliberately frozen.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STORE = HERE / "store"
CLI = [sys.executable, "-m", "core.cli"]
HOLD = Path("/tmp/openjd-checkpoint-store-v1.hold")  # frames.yaml's default HoldFile


def _run(args: list[str], *, stop_when=None, files: str = "shared") -> str:
    env = dict(os.environ, OPENJD_CHECKPOINT_FILES=files, PYTHONUNBUFFERED="1")
    env.pop("OPENJD_CHECKPOINT_STORE", None)
    proc = subprocess.Popen(
        [*CLI, *args, "--store", str(STORE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if stop_when is not None and stop_when(line):
            proc.send_signal(signal.SIGINT)  # Ctrl-C: suspend
            stop_when = None
    proc.wait(60)
    out = "".join(lines)
    print(f"$ openjd-checkpoint {' '.join(args)}  -> exit {proc.returncode}")
    return out


def main() -> None:
    if STORE.exists():
        shutil.rmtree(STORE)
    _run(
        ["run", str(TEMPLATES / "state.yaml"), "-p", "N=40", "-p", "StepSeconds=0.05"],
        stop_when=lambda line: "COUNTER-STEP 12" in line,
    )
    HOLD.touch()
    try:
        _run(["run", str(TEMPLATES / "frames.yaml")], stop_when=lambda line: "FRAME 3" in line)
    finally:
        HOLD.unlink()
    _run(
        ["run", str(TEMPLATES / "training.yaml"), "-p", "Epochs=12", "-p", "EpochSeconds=0.1"],
        stop_when=lambda line: "epoch 4/12 done" in line,
        files="managed",
    )
    _run(
        ["run", str(TEMPLATES / "training.yaml"), "-p", "Epochs=2", "-p", "EpochSeconds=0.1"],
        files="managed",
    )
    time.sleep(1)  # let the last lease files go
    listing = sorted(str(p.relative_to(STORE)) for p in STORE.rglob("*") if p.is_file())
    print(json.dumps(listing, indent=1))


if __name__ == "__main__":
    main()
