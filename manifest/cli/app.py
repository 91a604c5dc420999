"""Command-line interface: builds the parser and maps every failure to an exit status.

stdout carries only the requested document or report; messages go to stderr.
Exit status (all verbs): 0 success, 1 check failed, 2 bad usage or input,
3 no verdict; verify and diff 4 equivalent. Heavy modules are imported inside each verb.

This module is the thin top: ``build_parser`` registers every verb in the order
``manifest --help`` lists them, and ``main`` runs one and turns what escapes it into
one sentence on stderr: a :class:`ManifestError` its own exit status, an ``OSError`` 2,
an optional library's failed import 2 with the line that installs its extra
(``manifest.errors.EXTRA_OF_MODULE``), anything else 3 with ``MANIFEST_DEBUG=1`` for
the traceback; never a traceback by default. The verbs live by what they do:
``verbs_record`` (capture, show, schema, hash), ``verbs_check`` (diff, verify, gate),
``verbs_study`` (explain, lab), ``verbs_travel`` (pack, sign, attest, export) and
``verbs_nodes`` (merge).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from manifest import __version__
from manifest.cli import (
    verbs_check,
    verbs_env,
    verbs_nodes,
    verbs_record,
    verbs_study,
    verbs_travel,
)
from manifest.cli.options import Parser
from manifest.cli.startup import keep_pydantic_plugins_out, pause_collector, resume_collector
from manifest.errors import (
    EXIT_BAD_INPUT,
    EXIT_EQUIVALENT,
    EXIT_NO_VERDICT,
    ManifestError,
    UsageError,
)

_VERBS: list[tuple[str, Callable[[argparse._SubParsersAction[Parser]], None]]] = [
    ("capture", verbs_record.register_capture), ("show", verbs_record.register_show),
    ("schema", verbs_record.register_schema), ("verify", verbs_check.register_verify),
    ("hash", verbs_record.register_hash), ("merge", verbs_nodes.register_merge),
    ("diff", verbs_check.register_diff),
    ("gate", verbs_check.register_gate), ("explain", verbs_study.register_explain),
    ("pack", verbs_travel.register_pack), ("sign", verbs_travel.register_sign),
    ("attest", verbs_travel.register_attest), ("lab", verbs_study.register_lab),
    ("export", verbs_travel.register_export), ("env", verbs_env.register_env),
]
"""Every verb's name and ``register_*``, in the order ``manifest --help`` lists them."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``manifest`` parser: every verb, or only the one ``argv`` names.

    Building them all costs ~10 ms (argparse makes a formatter and looks
    up translations for each of ~110 arguments), a tenth of ``manifest hash``
    on a small file; a command line that starts with a verb needs only that
    verb's parser. Anything else (``--help``, no verb, an unknown word) gets
    them all, so the listing and the error name every verb.
    """
    parser = Parser(
        prog="manifest",
        description="Record PyTorch training runs as canonical manifests and prove they reproduce.",
        epilog="Exit status: 0 ok, 1 check failed, 2 bad usage or input, 3 no verdict, "
        f"{EXIT_EQUIVALENT} equivalent (verify, diff: the same run up to rounding).",
    )
    parser.add_argument("--version", action="version", version=f"manifest {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    wanted = argv[0] if argv and argv[0] in dict(_VERBS) else None
    for name, register in _VERBS:
        if wanted is None or name == wanted:
            register(sub)
    return parser


def unknown_verb(word: str) -> str:
    """The sentence for a word that is no verb: the nearest verb when one is close
    (``verfy`` → verify), else the list."""
    import difflib

    from manifest.cli.text import printable

    names = [name for name, _ in _VERBS]
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"'{printable(word)}' is not a manifest verb; did you mean {close[0]}?"
    return (f"'{printable(word)}' is not a manifest verb; the verbs are {', '.join(names)} "
            "(see 'manifest --help').")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def entry() -> int:
    """The ``manifest`` console script and ``python -m manifest``: the process is ours, so
    the collector may pause for the imports (``manifest.cli.startup``); ``main`` called
    from another program, even with ``argv=None``, never freezes that program's objects."""
    pause_collector()
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb: ``argv`` (default ``sys.argv[1:]``) → exit status."""
    keep_pydantic_plugins_out()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args: argparse.Namespace | None = None
    try:
        if argv and not argv[0].startswith("-") and argv[0] not in dict(_VERBS):
            raise UsageError(unknown_verb(argv[0]))
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        if args.verb != "capture":  # capture resumes it once its modules are in
            resume_collector()
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except ManifestError as exc:
        from manifest.cli.text import printable
        from manifest.redact import redact_urls

        # Messages quote recorded strings: never let one act on the terminal, and a URL
        # (a --data URL as typed, an endpoint) shows no userinfo or signature.
        sys.stderr.write(f"manifest: {printable(redact_urls(exc.diagnostics()))}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("manifest: interrupted.\n")
        return 130
    except BrokenPipeError:
        # The reader went away (``manifest show run.json | head -1``): like git,
        # end quietly. stdout is pointed at /dev/null so the interpreter's own
        # flush at exit does not fail a second time.
        _silence_stdout()
        return 0
    except OSError as exc:  # a file or device failed us where no probe expected it
        where = f" ({exc.filename})" if exc.filename else ""
        from manifest.redact import redact_urls

        sys.stderr.write(redact_urls(f"manifest: {exc.strerror or exc}{where}.\n"))
        return EXIT_BAD_INPUT
    except Exception as exc:
        if isinstance(exc, ImportError):  # an optional library absent: its install line
            from manifest.errors import missing_extra

            verb = getattr(args, "verb", None)
            absent = missing_extra(exc, what=f"manifest {verb}" if verb else None)
            if absent is not None:
                sys.stderr.write(f"manifest: {absent.diagnostics()}\n")
                return absent.exit_code
        if os.environ.get("MANIFEST_DEBUG"):
            raise
        from manifest.redact import redact_urls

        sys.stderr.write(redact_urls(
            f"manifest: internal error ({type(exc).__name__}: {exc}); no verdict. "
            "Re-run with MANIFEST_DEBUG=1 for the traceback and report it.\n"))
        return EXIT_NO_VERDICT
    except BaseException as exc:  # after Exception: only what is not an Exception
        from manifest.errors import Terminated

        if isinstance(exc, Terminated):  # SIGTERM/SIGHUP: scratch removed, exit like the signal
            sys.stderr.write("manifest: terminated.\n")
            return 128 + exc.signum
        raise
    finally:
        resume_collector()
