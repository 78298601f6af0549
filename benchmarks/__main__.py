"""``python -m benchmarks``: every benchmark in one command (see ``run_all.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all import main  # noqa: E402

main()
