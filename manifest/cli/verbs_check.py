"""Verbs that give a verdict on runs: diff, verify, gate.

Each returns a report whose verdict becomes the exit status (0 the same or
pass, 1 a difference that can change the bits or a failed check, 3 no
verdict); the report goes to stdout in the ``--format`` asked for and
progress to stderr. ``show_plan`` prints what verify will run, every string
escaped, before it runs or refuses. ``manifest diff`` stays light: it imports
no torch, numpy, git or NVML (a test checks), and turns the cyclic garbage
collector off for its one short pass (about 20% of its time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.cli.files import read_manifest_file, signature_check, unpacked, write_output
from manifest.cli.options import (
    Parser,
    ReportFormat,
    add_format_option,
    add_rerun_options,
    positive_int,
)
from manifest.cli.options import cluster_from_args as cluster_from_args  # re-exported
from manifest.cli.options import show_plan as show_plan  # re-exported
from manifest.cli.text import plain_confinement, plain_trust
from manifest.errors import UsageError
from manifest.judge import OutputsOutcome, Verdict

if TYPE_CHECKING:
    from manifest.diff.result import ManifestDiff
    from manifest.explain.pipeline import ExplainReport
    from manifest.models import Manifest
    from manifest.rerun.environment import RebuildOptions
    from manifest.rerun.plan import RerunOptions


def register_diff(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "diff",
        help="what differs between two manifests, and whether it can change the bits",
        description="Compare two manifests section by section; label each difference 'bits' "
        "(can change the weights) or 'benign' (cannot), with the reason.",
        epilog="Exit status: 0 no 'bits' difference, 1 a 'bits' difference, 2 bad input.",
    )
    p.add_argument("a", metavar="A.json", help="first manifest ('-' for stdin)")
    p.add_argument("b", metavar="B.json", help="second manifest ('-' for stdin)")
    add_format_option(p, what="the differences")
    p.add_argument("--only", choices=["bits", "benign"], help="list only these differences")
    p.add_argument("--all", action="store_true", help="do not fold long runs of similar rows")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every environment row: each CUDA library of a torch build, "
                   "and why each fact was not recorded")
    p.set_defaults(func=_cmd_diff)


def _cmd_diff(args: argparse.Namespace) -> int:
    if args.a == "-" and args.b == "-":
        raise UsageError("only one of the two manifests can be read from stdin ('-').")
    # A short-lived process that builds tens of thousands of acyclic objects:
    # the cyclic collector would only re-scan them (about 20% of the run).
    import gc

    was_on = gc.isenabled()
    gc.disable()
    try:
        return _diff(args)
    finally:  # a main([...]) inside another program gets its collector back
        if was_on:
            gc.enable()


def _diff(args: argparse.Namespace) -> int:
    from manifest.diff.engine import diff_manifests, load_for_diff, outputs_root
    from manifest.diff.rules import Impact

    raw_a, raw_b = read_manifest_file(args.a), read_manifest_file(args.b)
    a = load_for_diff(unpacked(raw_a), name=args.a)
    b = load_for_diff(unpacked(raw_b), name=args.b)
    # A signature that came with an input (its pack's, FILE.sig) must cover it: else exit 2.
    from dataclasses import replace

    from manifest.travel.sign import input_signature

    signed = {side: input_signature(name, raw, cwd=Path.cwd())
              for side, name, raw in (("a", args.a, raw_a), ("b", args.b, raw_b))}
    roots = (outputs_root(args.a), outputs_root(args.b))  # where each side's outputs lie
    result = replace(diff_manifests(a, b, roots), a_signature=signed["a"],
                     b_signature=signed["b"])
    for name, found in ((args.a, signed["a"]), (args.b, signed["b"])):
        if found is not None:
            from manifest.cli.text import printable

            sys.stderr.write(f"manifest: {printable(name)}: {printable(found.describe())}.\n")
    only = None if args.only is None else Impact(args.only)
    if args.format is ReportFormat.JSON:
        from manifest.cli.render_diff import diff_json_bytes

        write_output(diff_json_bytes(result, a_file=args.a, b_file=args.b, only=only), None)
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_markdown import diff_markdown, trail_between

        write_output(diff_markdown(result, a_file=args.a, b_file=args.b, only=only,
                                   trail=trail_between(a, b, "a vs b"),
                                   code_lines=_code_lines(a, b, args, result)).encode(), None)
    else:
        from manifest.cli.render_diff import render_diff

        code = _code_lines(a, b, args, result)
        no_gpu = not any(p.devices for m in (a, b) for p in m.determinism.processes)
        render_diff(result, a_file=args.a, b_file=args.b, only=only, fold=not args.all,
                    code=code, verbose=args.verbose, no_gpu=no_gpu)
    return result.exit_code


def _code_lines(a: Manifest, b: Manifest, args: argparse.Namespace,
                result: ManifestDiff) -> list[str]:
    """What changed in the code (``manifest.nodes.patches.code_report``), for the report."""
    from manifest.nodes.patches import code_report, repository_of

    return code_report(a, b, (repository_of(args.a), repository_of(args.b)),
                       outputs_identical=result.outputs == OutputsOutcome.IDENTICAL,
                       only_code=all(d.section == "code" for d in result.bits))


def register_verify(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "verify", help="re-run a recorded training and compare its outputs bit for bit",
        describe=_verify_description)
    p.add_argument("file", help="manifest file or pack ('-' for stdin)")
    p.add_argument("--strict", action="store_true",
                   help="refuse to re-run when the environment or data drifted in a way "
                   "that can change bits")
    add_rerun_options(p)
    p.add_argument("--no-rerun", action="store_true",
                   help="check integrity, drift and data only")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="override the recorded thread count (expect differences)")
    from manifest.numeric.defaults import DEFAULT_RUNS

    p.add_argument("--envelope", type=positive_int, nargs="?", const=DEFAULT_RUNS, default=0,
                   metavar="N",
                   help="where the outputs differ by rounding only, measure the noise "
                   "envelope here (N one-ULP runs with fresh seeds, default "
                   f"{DEFAULT_RUNS}, and one under another thread count) and judge "
                   "'equivalent' against it, not against the manifest's")
    p.add_argument("--emulate", choices=("tf32", "bf16"), default=None,
                   help="re-run with that matmul precision emulated on CPU (TF32 tensor "
                   "cores, bf16 autocast), standing in for another device: judged against "
                   "the run's envelope at that precision (capture --envelope N --precision)")
    p.add_argument("--layout", metavar="NxP", default=None,
                   help="re-run a torchrun run here on N nodes x P processes per node (the "
                   "report says whether that layout is the same, equivalent or changed)")
    add_environment_options(p)
    p.add_argument("--outputs", metavar="DIR", default=None,
                   help="where the run's recorded output files are, for a run received "
                   "without them (a pack made without --with-outputs): each is looked for at "
                   "its recorded path under DIR, then by its file name, and used only if its "
                   "digest (or every tensor) is the recorded one")
    p.add_argument("--keep", action="store_true", help="keep the scratch tree")
    p.add_argument("--no-cache", action="store_true", help="re-read every data file")
    p.add_argument("--explain", action="store_true",
                   help="when the outputs differ, explain where (see 'manifest explain')")
    add_format_option(p)
    quiet = p.add_mutually_exclusive_group()
    quiet.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    quiet.add_argument("-v", "--verbose", action="store_true",
                       help="list each package installed, removed or upgraded since the "
                       "capture that the run never imported (one summary line otherwise)")
    from manifest.cli.verbs_segments import add_segment_options

    add_segment_options(p)
    p.set_defaults(func=_cmd_verify)


def _verify_description() -> str:
    """Verify's help text, its exit statuses read from ``VERDICTS`` (never typed here)."""
    from manifest.errors import EXIT_BAD_INPUT
    from manifest.judge import verb_verdicts

    by_code: dict[int, list[str]] = {EXIT_BAD_INPUT: ["bad input"]}
    for name, code, _ in verb_verdicts()["verify"]:
        by_code.setdefault(code, []).append(name)
    exits = ", ".join(f"{code} {' or '.join(names)}" for code, names in sorted(by_code.items()))
    return ("Check a manifest's integrity, environment drift and data; re-run its command in a "
            "scratch clone under the recorded seeds and flags; compare the outputs tensor by "
            f"tensor. Exit {exits}.")


def _cmd_verify(args: argparse.Namespace) -> int:
    from manifest.cli.render import render_command, render_dry_run, render_verify
    from manifest.verify.pipeline import verify_run
    from manifest.verify.report import VerifyOptions

    data = read_manifest_file(args.file)
    signer = trusted_signer(args, data)
    from manifest.cli.verbs_segments import run_segments, wants_segments

    if wants_segments(args):  # a long run: replay stretches (manifest.verify.segments)
        if args.env == "run" or args.outputs:
            raise UsageError("--env run and --outputs apply to a whole re-run; --segments and "
                             "--at replay stretches in this machine's environment.")
        return run_segments(args, data, signer)
    options = VerifyOptions(strict=args.strict, trust=args.trust, in_place=args.in_place,
                            no_rerun=args.no_rerun, threads=args.threads, keep=args.keep,
                            no_cache=args.no_cache, quiet=args.quiet, network=args.network,
                            sandbox=not args.no_sandbox, require_sandbox=args.require_sandbox,
                            signer=signer, cluster=cluster_from_args(args), layout=args.layout,
                            envelope=args.envelope, emulate=args.emulate,
                            outputs=_outputs_dir(args.outputs, args.no_rerun),
                            rebuild=rebuild_options(args, on_cluster=True))
    if options.emulate and (options.envelope or options.cluster is not None):
        raise UsageError("--emulate is judged against the run's envelope at that precision "
                         "(capture --envelope N --precision P) on this machine; it cannot "
                         "be combined with --envelope or --on.")
    if options.envelope and options.cluster is not None:
        raise UsageError("--envelope measures the noise envelope on this machine; it cannot "
                         "be combined with --on.")
    dry = options.cluster is not None and options.cluster.prints_only
    report = verify_run(data, file=args.file, cwd=Path.cwd(), options=options,
                        announce=render_dry_run if dry else render_command, show_plan=show_plan,
                        note=None if args.quiet else progress)
    if dry and report.job is not None and report.job.get("printed"):
        return _print_dry_run(report.job["printed"], as_json=args.format is ReportFormat.JSON)
    if report.rerun_exit_code is not None and report.confinement and not args.quiet:
        sys.stderr.write(f"manifest: the re-run ran {plain_confinement(report.confinement)}; "
                         f"it was allowed to run because {plain_trust(report.trust)}.\n")
        for note in report.notes:
            sys.stderr.write(f"manifest: note: {note}.\n")
    explained = None
    if args.explain and report.verdict == Verdict.DIFFERS:
        explained = _explain_after_verify(args, data, signer, report.first_divergent_step)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        doc = report.to_json()
        if explained is not None:
            doc["explain"] = explained.to_json()
        sys.stdout.write(json_text(doc) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_markdown import verify_markdown, verify_trail

        sys.stdout.write(verify_markdown(report, trail=verify_trail(report, unpacked(data))))
        if explained is not None:
            from manifest.cli.render_explain import explain_markdown

            sys.stdout.write("\n" + explain_markdown(explained))
    else:
        render_verify(report, verbose=args.verbose)
        if explained is not None:
            from manifest.cli.render_explain import render_explain

            render_explain(explained)
    return report.exit_code


def _print_dry_run(printed: dict[str, Any], *, as_json: bool) -> int:
    """``--on k8s --dry-run``: the objects the executor rendered on stdout, and the sentence
    that says nothing ran and where the bundle is staged on stderr (exit 0)."""
    from manifest.cli.text import printable
    from manifest.redact import redact_urls
    from manifest.rerun.cluster.k8s import printed as objects_text

    sys.stdout.write(objects_text(list(printed["objects"]), as_json=as_json))
    sys.stderr.write(f"manifest: {printable(redact_urls(str(printed['message'])))}\n")
    return 0


def progress(sentence: str) -> None:
    """Progress the user sees before anything trains (stderr): a rebuilt environment's proof."""
    from manifest.cli.text import printable

    sys.stderr.write(f"manifest: {printable(sentence)}\n")


def add_environment_options(p: argparse.ArgumentParser) -> None:
    """``--env here|run`` and where a rebuild may fetch from (verify, explain, gate, lab)."""
    p.add_argument("--env", choices=("here", "run"), default="here",
                   help="the Python environment the re-run uses: 'here' (this machine's, the "
                   "default; the report says how many of the run's distributions differ) or "
                   "'run' (the run's own, rebuilt by uv from the recorded distributions, "
                   "proven file by file before anything trains, cached; with --on, on each "
                   "node; needs the rebuild extra: pip install 'torch-manifest[rebuild]')")
    p.add_argument("--find-links", metavar="DIR", action="append", default=[],
                   help="with --env run: a folder of wheels to rebuild from (repeatable; with "
                   "--on, at the same path on the nodes); the sources the manifest records "
                   "are used only when it is trusted")
    p.add_argument("--index-url", metavar="URL", action="append", default=[],
                   help="with --env run: a simple index (PEP 503) to rebuild from "
                   "(repeatable); this machine's pip and uv configuration is never used")


def rebuild_options(args: argparse.Namespace, *, on_cluster: bool = False
                    ) -> RebuildOptions | None:
    """``--env run``'s options, or None (this machine's environment). ``on_cluster``: the
    verb rebuilds it on each node (verify, explain); another verb refuses ``--on`` with it."""
    from manifest.rerun.environment import RebuildOptions

    if args.env == "run" and not on_cluster and getattr(args, "on", "local") != "local":
        raise UsageError(f"--env run with --on: {args.verb} does not rebuild the run's "
                         "environment on the cluster's nodes yet (verify and explain do); run "
                         "it without --env run, or here.")
    if args.env != "run":
        if args.find_links or args.index_url:
            raise UsageError("--find-links and --index-url say where --env run rebuilds the "
                             "run's environment from; pass --env run.")
        return None
    return RebuildOptions(tuple(args.find_links), tuple(args.index_url))


def _outputs_dir(raw: str | None, no_rerun: bool) -> Path | None:
    """``--outputs DIR``: an existing folder (its files are checked when they are used)."""
    if raw is None:
        return None
    if no_rerun:
        raise UsageError("--outputs names the recorded outputs a re-run is compared with; "
                         "--no-rerun compares none.")
    folder = Path(raw)
    if not folder.is_dir():
        raise UsageError(f"--outputs {raw}: no such folder.")
    return folder.resolve()


def trusted_signer(args: argparse.Namespace, data: bytes) -> str | None:
    """The identity of a signature over the manifest that the user's policy trusts, if any;
    refuses contradictory sandbox flags. Shared by every verb that re-runs a manifest."""
    if args.no_sandbox and args.require_sandbox:
        raise UsageError("--no-sandbox and --require-sandbox contradict each other.")
    check = signature_check(args.file, data, args.signature, accept_untrusted=args.trust)
    if check is not None and not getattr(args, "quiet", False):
        from manifest.trust import escape_text

        note = "" if check.trusted else " (not in your trust policy; running under --trust)"
        sys.stderr.write(f"manifest: signed by {escape_text(check.signer)}{note}\n")
    return check.signer if check is not None and check.trusted else None


def _explain_after_verify(args: argparse.Namespace, data: bytes, signer: str | None,
                          step: int | None) -> ExplainReport:
    """explain on the bytes verify read (``-`` is stdin, which can be read once) with the
    signer verify checked (checked once, named once on stderr)."""
    from manifest.explain.pipeline import ExplainOptions, explain_run

    # Past step 1000 the recorded trail is sampled: let explain locate the exact step.
    options = ExplainOptions(rerun=rerun_options(args, signer),
                             threads=args.threads, keep=args.keep,
                             step=step if step is not None and step <= 1000 else None,
                             rebuild=rebuild_options(args, on_cluster=True))
    return explain_run(data, file=args.file, cwd=Path.cwd(), options=options,
                       show_plan=show_plan)


def rerun_options(args: argparse.Namespace, signer: str | None) -> RerunOptions:
    """The re-run engine's options from the shared flags (``add_rerun_options``)."""
    from manifest.rerun.plan import RerunOptions

    return RerunOptions(trust=getattr(args, "trust", False), signer=signer,
                        sandbox=not args.no_sandbox, require_sandbox=args.require_sandbox,
                        network=args.network, in_place=getattr(args, "in_place", False),
                        cluster=cluster_from_args(args))


def register_gate(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "gate", help="the pre-merge reproducibility check (determinism, baseline, hygiene)",
        description="Capture the smoke training from [tool.manifest], re-run it once, compare "
        "it with the committed baseline, and check the project's hygiene; policy from "
        "[tool.manifest.gate]. The report goes to stdout (--format); the Markdown summary is "
        "also appended to $GITHUB_STEP_SUMMARY when set.",
        epilog="Exit status: 0 pass, 1 a check failed, 2 bad config or input, 3 no verdict.")
    p.add_argument("files", nargs="*", metavar="MANIFEST",
                   help="with --no-rerun: manifests to validate (default: the baseline and "
                   "the policy's manifests)")
    p.add_argument("--no-rerun", action="store_true",
                   help="train nothing: validate committed manifests and their hygiene")
    p.add_argument("--update-baseline", action="store_true",
                   help="rewrite the baseline (atomically) with this run if it is deterministic")
    p.add_argument("--warn-hygiene", action="store_true",
                   help="report hygiene problems as warnings, not failures (pre-commit)")
    add_environment_options(p)
    add_format_option(p)
    p.add_argument("--json-file", metavar="FILE",
                   help="also write the JSON report to FILE (atomically), e.g. for a CI artifact")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no report and no progress (the exit status and --json-file still say it)")
    p.set_defaults(func=_cmd_gate)


def _gate_rebuild(args: argparse.Namespace) -> RebuildOptions | None:
    """``gate --env run``: the determinism re-run in the fresh capture's own environment,
    rebuilt and proven; --no-rerun re-runs nothing to rebuild for."""
    options = rebuild_options(args)
    if options is not None and args.no_rerun:
        raise UsageError("--env run rebuilds the environment the determinism re-run uses; "
                         "--no-rerun re-runs nothing.")
    return options


def _cmd_gate(args: argparse.Namespace) -> int:
    import os

    from manifest.cli.render_gate import gate_json_bytes, gate_markdown, render_gate
    from manifest.gate.checks import run_gate
    from manifest.gate.report import GateOptions

    report = run_gate(Path.cwd(), GateOptions(
        no_rerun=args.no_rerun, update_baseline=args.update_baseline,
        files=tuple(args.files), warn_hygiene=args.warn_hygiene, quiet=args.quiet,
        rebuild=_gate_rebuild(args), note=None if args.quiet else progress))
    if args.json_file:
        write_output(gate_json_bytes(report), args.json_file)
    if args.format is ReportFormat.JSON:
        write_output(gate_json_bytes(report), None)
    elif args.quiet:
        pass
    elif args.format is ReportFormat.MARKDOWN:
        write_output(gate_markdown(report).encode(), None)
    else:
        render_gate(report, sys.stdout)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(gate_markdown(report))
        except OSError as exc:
            sys.stderr.write(f"manifest: cannot write the job summary {summary}: {exc}\n")
    return report.exit_code
