"""``python -m core.cli``: the ``openjd-checkpoint`` command (see ``core.cli``)."""

import sys

from . import main

sys.exit(main())
