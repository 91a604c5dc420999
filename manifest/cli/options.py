"""Options every verb spells the same way: ``--format``, ``--json``, ``-v``/``-q``.

One helper per convention, so a new verb gets the same spelling, help text
and defaults by calling it, and a test can walk the parser once for all verbs:

* every parser is a :class:`Parser`, so a usage error is one sentence on
  stderr and exit 2, never argparse's usage dump;
* ``--seed`` takes :func:`seed_value` (0 … 2**53-1, the largest integer a
  JSON reader keeps exact) and ``--threads``, ``--runs``, ``--step``,
  ``--fingerprint-ops`` take :func:`positive_int`, so the same bad value gets
  the same sentence from every verb;

* every verb that reports takes ``--format table|json|markdown`` (``table``
  for people, ``json`` for machines, ``markdown`` for a pull-request comment
  or a job summary) and ``--json`` as an alias of ``--format json``;
* the report goes to stdout in every format; notes and progress go to
  stderr; ``-v`` shows notes that describe the normal case on a machine
  (no NVML on a CPU box), ``-q`` silences progress and notes;
* every verb that re-runs a command reads ``--on`` and its options with
  :func:`cluster_from_args` and prints what it will run with :func:`show_plan`
  (here, below the verbs, so verify's segments and the lab borrow them without
  importing another verb, which would be an import circle).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from manifest.errors import UsageError

if TYPE_CHECKING:
    from manifest.rerun.cluster.options import ClusterOptions
    from manifest.rerun.plan import RerunPlan
    from manifest.verify.report import Drift


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


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one sentence and exit 2.

    ``describe``: a callable that builds the description when something reads it (help,
    the docs' reference), for a text generated from a table that costs an import to read:
    verify's exit statuses come from ``manifest.judge.VERDICTS`` (~13 ms to import
    here, a fifth of ``manifest --help``), which a command line that prints no help
    should not pay for.
    """

    def __init__(self, *args: Any, describe: Callable[[], str] | None = None,
                 **kwargs: Any) -> None:
        self._describe = describe
        # No prefixes: ``--thread 1`` would otherwise be taken as ``--threads 1``, and a
        # typo could pick another flag; a mistyped flag gets "did you mean" instead.
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    @property
    def description(self) -> str | None:
        return self._describe() if self._describe is not None else self._description

    @description.setter
    def description(self, text: str | None) -> None:
        self._description = text

    def error(self, message: str) -> NoReturn:
        close = self._close_flags(message)
        if close:
            raise UsageError(f"{message}{close}; see '{self.prog} --help'.")
        raise UsageError(f"{message} (see '{self.prog} --help').")

    def _close_flags(self, message: str) -> str:
        """``" (did you mean --artifact?)"`` for each unrecognised flag with a close one.

        The top parser reports a verb's leftovers, so the flags are every parser's below
        this one (``main`` builds only the verb the command line names)."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        from manifest.config import did_you_mean

        words = [w.partition("=")[0] for w in message[len(prefix):].split()
                 if w.startswith("--")]
        return did_you_mean(words, set(self._all_flags())) if words else ""

    def _all_flags(self) -> list[str]:
        flags: list[str] = []
        for action in self._actions:
            flags += [s for s in action.option_strings if s.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, Parser):
                        flags += sub._all_flags()
        return flags


def seed_value(text: str) -> int:
    """``--seed``: an integer (any base ``int(text, 0)`` reads) a JSON reader keeps exact."""
    from manifest.models import MAX_SAFE_INT

    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be an integer, not {text!r}") from None
    if not 0 <= value <= MAX_SAFE_INT:
        raise argparse.ArgumentTypeError(f"seed must be between 0 and 2**53-1, not {value}")
    return value


def positive_int(text: str) -> int:
    """A count: 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def add_rerun_options(parser: argparse.ArgumentParser, *, received: bool = True) -> None:
    """The flags every verb that re-runs a command shares (``manifest.rerun``).

    ``received``: the verb runs a manifest's recorded command (verify, explain),
    so it also takes the trust flags and ``--in-place``; the lab runs the
    command the user typed.
    """
    if received:
        parser.add_argument(
            "--signature", metavar="FILE",
            help="signature to check (default: FILE.sig, or the pack's own); a valid "
            "signature by a signer your trust policy lists stands in for --trust")
        parser.add_argument(
            "--trust", action="store_true",
            help="run the command although this machine did not seal the manifest and no "
            "trusted identity signed it (after reading the plan, which is printed first)")
        parser.add_argument("--in-place", action="store_true",
                            help="run in the current tree instead of a scratch clone")
    parser.add_argument("--network", action="store_true",
                        help="let the confined re-run reach the network")
    parser.add_argument("--require-sandbox", action="store_true",
                        help="refuse (exit 3) when the re-run cannot be confined by bubblewrap")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="re-run without confinement (the report says 'not confined')")
    cluster = parser.add_argument_group(
        "where to re-run", "run where the run ran (manifest.rerun.cluster); options also come "
        "from [tool.manifest.executors.ray|slurm|k8s] in pyproject.toml")
    from manifest.rerun.cluster.options import EXECUTORS

    cluster.add_argument("--on", choices=["local", *EXECUTORS], default="local",
                         help="the executor: this machine (default), Ray Jobs, SLURM "
                         "(submitit) or a Kubernetes Indexed Job")
    cluster.add_argument("--address", metavar="URL",
                         help="ray: the Jobs API address (credentials: RAY_ADDRESS in the "
                         "environment, never the plan)")
    cluster.add_argument("--partition", help="slurm: the partition")
    cluster.add_argument("--account", help="slurm: the account")
    cluster.add_argument("--time", type=positive_int, dest="time_min", metavar="MINUTES",
                         help="slurm: the job's time limit")
    cluster.add_argument("--image", help="k8s: the image (default: the manifest's container "
                         "digest)")
    cluster.add_argument("--namespace", help="k8s: the namespace (default: default)")
    cluster.add_argument("--timeout", type=positive_int, dest="timeout_s", metavar="SECONDS",
                         help="cancel the remote job and give no verdict after this long")
    cluster.add_argument("--fetch-outputs", action="store_true",
                         help="bring the output files back (default: their tensor tables only; "
                         "files give max |delta| and ULP numbers)")
    cluster.add_argument("--dry-run", action="store_true",
                         help="k8s: print the Job and Service YAML and run nothing (exit 0)")
    cluster.add_argument("--claim", metavar="PVC",
                         help="k8s: the PersistentVolumeClaim whose volume holds the folder "
                         "the bundle is staged in")
    cluster.add_argument("--bundle-url", metavar="URL",
                         help="k8s: upload the bundle to this object-store prefix (s3://, gs://) "
                         "for an init container to fetch (instead of --claim)")
    cluster.add_argument("--shared-path", dest="shared_paths", action="append", metavar="PATH",
                         help="data under PATH is seen at the same path by every node of the "
                         "cluster: mounted, not shipped (repeatable; data outside the "
                         "repository is otherwise bundled, up to max_data_bytes)")
    cluster.add_argument("--other-gpu", dest="other_hardware", action="store_true",
                         help="run even where the cluster has no node with the recorded GPU "
                         "model (then no numeric verdict is given across GPU models)")


def cluster_from_args(args: argparse.Namespace) -> ClusterOptions | None:
    """``--on`` and its options (flags over ``[tool.manifest.executors.NAME]``); None: here.
    A missing client library is one sentence naming its extra (exit 2)."""
    on = getattr(args, "on", "local")
    if on == "local":
        return None
    from manifest.config import load_config
    from manifest.rerun.cluster.options import cluster_options, missing_extra

    problem = missing_extra(on)
    if problem is not None:
        raise UsageError(problem)
    table = load_config(Path.cwd())[0].get("executors", {})
    flags = {name: getattr(args, name, None) for name in cluster_flag_names()}
    verb = getattr(args, "verb", "verify")
    if flags.get("dry_run") and (verb != "verify" or getattr(args, "segments", None)
                                 or getattr(args, "at", None)):
        raise UsageError(f"--dry-run prints the one Job a verify would submit; {verb} "
                         + ("with --segments or --at " if verb == "verify" else "")
                         + "submits several runs: run it without --dry-run.")
    from dataclasses import replace

    # the executor's progress (submitted, queued, data shipped), on stderr as it happens
    return replace(cluster_options(on, flags, table), note=cluster_note)


def cluster_note(sentence: str) -> None:
    """One progress sentence of a cluster executor, on stderr."""
    import sys

    from manifest.cli.text import printable

    sys.stderr.write(f"manifest: {printable(sentence)}\n")
    sys.stderr.flush()


def cluster_flag_names() -> list[str]:
    """Every cluster option that has a flag (each executor's and the common ones)."""
    from manifest.rerun.cluster.options import REGISTRY, ClusterOptions

    names = dict.fromkeys(ClusterOptions.FLAGS)
    for row in REGISTRY.values():
        names.update(dict.fromkeys(row.options.FLAGS))
    return list(names)


def show_plan(plan: RerunPlan, drift: Sequence[Drift] = ()) -> None:
    """What a verb would run, every string escaped, before it runs or refuses (stderr);
    with the environment drift verify found, so it is read before the decision to run."""
    from manifest.cli.render import render_plan

    render_plan(plan, drift=drift)
