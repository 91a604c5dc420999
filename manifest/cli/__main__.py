"""``python -m manifest.cli``: same as the ``manifest`` console script."""

import sys

from manifest.cli import main

sys.exit(main())
