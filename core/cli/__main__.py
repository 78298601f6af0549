"""``python -m core.cli``: the ``openjd-checkpoint`` command (see ``core.cli``)."""

import sys

from core.cli import main

sys.exit(main())
