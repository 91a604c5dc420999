"""The command line: argument parsing (``main``) and every terminal renderer.

Only this package prints or exits. Each verb parses its arguments, calls the
library (``manifest.capture``, ``manifest.verify``, ``manifest.diff``,
``manifest.gate``, ``manifest.data``) and renders what comes back
(``render`` for capture, show and verify; ``render_diff``; ``render_gate``).
"""

from manifest.cli.app import main

__all__ = ["main"]
