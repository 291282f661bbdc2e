"""``python -m kwinspect``: the same command as the ``kwinspect`` script."""

import sys

from kwinspect.cli import main

sys.exit(main())
