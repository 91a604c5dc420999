"""The command line: argument parsing (``main``) and every terminal renderer.

Only this package prints or exits. ``app`` builds the parser and maps every
failure to an exit status; the verbs live by what they do (``verbs_record``:
capture, show, schema, hash; ``verbs_check``: diff, verify, gate;
``verbs_study``: explain, lab; ``verbs_travel``: pack, sign, attest,
export), and each parses its arguments, calls the library and renders what
comes back (``render`` for capture, show and verify; ``render_diff``,
``render_gate``, ``render_explain``, ``render_lab``, ``render_markdown``).
``options`` and ``files`` hold what every verb spells or reads the same way.
"""

from manifest.cli.app import entry, main

__all__ = ["entry", "main"]
