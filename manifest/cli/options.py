"""Options every verb spells the same way: ``--format``, ``--json``, ``-v``/``-q``.

One helper per convention, so a new verb gets the same spelling, help text
and defaults by calling it, and a test can walk the parser once for all verbs:

* every verb that reports takes ``--format table|json|markdown`` (``table``
  for people, ``json`` for machines, ``markdown`` for a pull-request comment
  or a job summary) and ``--json`` as an alias of ``--format json``;
* the report goes to stdout in every format; notes and progress go to
  stderr; ``-v`` shows notes that describe the normal case on a machine
  (no NVML on a CPU box), ``-q`` silences progress and notes.
"""

from __future__ import annotations

import argparse
from enum import StrEnum


class ReportFormat(StrEnum):
    """How a verb prints its report on stdout (exhaustive)."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"


ALL_FORMATS: tuple[ReportFormat, ...] = tuple(ReportFormat)


def add_format_option(
    parser: argparse.ArgumentParser,
    *,
    what: str = "the report",
    formats: tuple[ReportFormat, ...] = ALL_FORMATS,
    default: ReportFormat = ReportFormat.TABLE,
) -> None:
    """Add ``--format`` and its alias ``--json`` (``args.format`` is a :class:`ReportFormat`)."""
    group = parser.add_mutually_exclusive_group()
    names = "|".join(f.value for f in formats)
    group.add_argument(
        "--format", type=ReportFormat, choices=formats, default=default, metavar=names,
        help=f"how to print {what} on stdout: table (for people), json (for machines), "
        f"markdown (for a pull request or job summary); default {default.value}")
    if ReportFormat.JSON in formats:
        group.add_argument("--json", dest="format", action="store_const",
                           const=ReportFormat.JSON, help="same as --format json")


def add_verbosity_options(parser: argparse.ArgumentParser, *, quiet_help: str | None = None
                          ) -> None:
    """Add ``-v``/``--verbose`` and ``-q``/``--quiet`` (mutually exclusive)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true",
                       help="also print notes that describe the normal case (no GPU driver "
                       "on a CPU machine …) on stderr")
    group.add_argument("-q", "--quiet", action="store_true",
                       help=quiet_help or "no progress output and no notes on stderr")
