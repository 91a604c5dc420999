"""Recorded strings, made safe to show: every renderer under ``manifest/cli`` goes through here.

A manifest is data from someone else. Shown raw, its strings act on the
terminal instead of being read: ``\\r`` or ESC sequences can overwrite the
command ``verify`` displays before running it (``python train.py\\rrm -rf ~``
shows as the harmless half), a bidi override reorders it, and rich reads
``[...]`` as markup (``data.classes=[cat,dog]`` printed as ``data.classes=``,
``paths=[/data/a]`` raised MarkupError: 78 of 87 crashes in a 15,000-call
mutation fuzz). So:

* :func:`printable` escapes C0/C1 control characters, DEL, the Unicode
  bidi and zero-width format characters and line separators as ``\\r``,
  ``\\e``, ``\\u202e`` (in such a string backslashes are doubled too);
* :func:`markup` additionally escapes rich markup, for strings that go into
  a rich ``print`` or table cell;
* :func:`shell_join` renders an argv the way bash would read it back: an
  argument with such a character is written in ANSI-C quoting (``$'a\\rb'``,
  backslashes doubled), so what is shown is exactly what will run;
* :func:`json_text` writes a JSON report with those characters as ``\\uXXXX``;
* :func:`make_console` gives a rich console that reports a closed pipe as
  :class:`BrokenPipeError`, which the CLI ends quietly with status 0.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

    from manifest.verify.report import Drift

def printable(text: object) -> str:
    """``text`` with control, format and line-separator characters shown as escapes.

    The escaping itself is ``manifest.trust.escape_text`` (one rule
    for the plan verify shows and every report); ``str.isprintable`` (C speed)
    skips the common case of nothing to escape, and leaves a string with no
    such character exactly as recorded (backslashes too). Where the exact
    bytes matter, the argv, :func:`shell_join` is unambiguous.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # also: printable(shell_join(argv)) is shell_join(argv)
        return s
    from manifest.trust import escape_text

    return escape_text(s)


def markup(text: object) -> str:
    """``text`` for a rich print or table cell: escaped as :func:`printable`, markup inert."""
    from rich.markup import escape

    return escape(printable(text))


def shell_quote(arg: str) -> str:
    """One argument as bash reads it back: ``$'…'`` when it holds a character to escape."""
    if arg.isprintable():
        return shlex.quote(arg)
    return "$'" + printable(arg).replace("'", "\\'") + "'"


def shell_join(argv: list[str]) -> str:
    """An argv as one line that cannot disguise itself (see the module docstring)."""
    return " ".join(shell_quote(a) for a in argv)


def json_text(doc: object, *, indent: int | None = 2) -> str:
    """``json.dumps`` for a report on stdout, with no character that acts on a terminal
    (``manifest.export.safe_json``: the same rule as the exports)."""
    from manifest.export import safe_json

    return safe_json(doc, indent=indent)


def make_console(file: TextIO | None = None, *, soft_wrap: bool = True) -> Console:
    """A rich console on ``file`` (stdout by default) for the CLI's reports."""
    from rich.console import Console

    class _PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1; the CLI ends a closed pipe with 0, like git.
            self.quiet = True
            raise BrokenPipeError

    return _PipeAwareConsole(file=file or sys.stdout, highlight=False, soft_wrap=soft_wrap)


def plain_trust(reason: str | None) -> str:
    """Why a recorded command was allowed to run, in words a new user reads without the
    security page (the report's JSON keeps the short code: ``sealed here`` …)."""
    if reason is None:
        return "-"
    if reason == "sealed here":
        return ("this manifest was written on this machine by manifest, so its command is "
                "one you ran yourself")
    if reason == "--trust":
        return "you passed --trust after seeing the command"
    if reason.startswith("signed by "):
        return f"it is {reason}, a signer your trust policy accepts"
    return reason


def plain_confinement(text: str | None) -> str:
    """How a re-run was confined, in words: what it could and could not touch."""
    if text is None:
        return "-"
    if text.startswith("bubblewrap: "):
        words = (text.removeprefix("bubblewrap: ")
                 .replace("system read-only", "it could not change the system")
                 .replace("only the scratch tree writable",
                          "it could write only in a scratch copy of your repository")
                 .replace("your tree writable (in place)", "it could write in your tree")
                 .replace("private /tmp", "it had a /tmp of its own")
                 .replace("no network", "it had no network")
                 .replace("network allowed (--network)", "it could reach the network "
                          "(--network)"))
        return f"in a sandbox (bubblewrap): {words}"
    if text.startswith("not confined (") and text.endswith(")"):
        why = text.removeprefix("not confined (")[:-1]
        return (f"without a sandbox ({why}): it could read and write whatever you can")
    return text


def folded_drift(drift: Iterable[Drift], *, verbose: bool = False) -> list[tuple[str, str]]:
    """(impact, sentence) per drift line the verify report prints, packages the run never
    imported folded into one line at the place of the first (installing three extras
    between capture and verify gives 42 such lines, which would bury the evidence).

    ``verbose`` keeps every line. The JSON report always lists each one.
    """
    lines: list[tuple[str, str]] = []
    quiet: dict[str, int] = {}
    at: int | None = None
    for d in drift:
        if not verbose and d.impact == "benign" and d.path.startswith("env.packages["):
            quiet[d.change] = quiet.get(d.change, 0) + 1
            at = len(lines) if at is None else at
            continue
        lines.append((d.impact, d.reason))
    if at is not None:
        lines.insert(at, ("benign", _packages_sentence(quiet)))
    return lines


def _packages_sentence(counts: dict[str, int]) -> str:
    """``9 packages installed since, 1 at another version; none imported by the run``."""
    parts = [f"{counts[kind]} {what}" for kind, what in (
        ("added", "installed since"), ("removed", "removed since"),
        ("changed", "at another version")) if counts.get(kind)]
    count, rest = parts[0].split(" ", 1)
    total = sum(counts.values())
    parts[0] = f"{count} {'package' if count == '1' else 'packages'} {rest}"
    none = "not imported by the run" if total == 1 else "none imported by the run"
    return f"{', '.join(parts)}; {none} (--verbose lists them)"
