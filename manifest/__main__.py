"""``python -m manifest``: same as the ``manifest`` console script."""

import sys

from manifest.cli import entry

sys.exit(entry())
