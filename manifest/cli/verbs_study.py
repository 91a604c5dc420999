"""Verbs that study why and how much runs differ: explain, lab.

Both train several times and report on the runs. explain runs the recorded
command twice to find the first optimizer step where the runs part, then
both again up to that step recording every aten op, and names the first op
whose inputs matched and outputs differ (about 2 full runs plus 2 short
ones). lab runs a command 2 × ``--runs`` + 1 times (5 by default): under
PyTorch's default switches, under the recipe, and once more to audit the
ops that are nondeterministic on CUDA; it reports the noise floor, whether
the recipe runs are bit-identical, and what the recipe costs. Every run is
a whole training (about 2 s each on the bundled example), so these are the
slow verbs, where diff answers in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from manifest.cli.files import read_manifest_file, write_output
from manifest.cli.options import (
    Parser,
    ReportFormat,
    add_format_option,
    add_rerun_options,
    add_verbosity_options,
    positive_int,
    seed_value,
)
from manifest.errors import OutputError, UsageError


def register_explain(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "explain", help="where two runs part: the step, the op, the module and the line",
        description="Re-run the recorded command twice in a scratch clone, find the first "
        "optimizer step where the runs (or the recorded trail) part, re-run up to that step "
        "recording every aten op, and name the first op whose inputs matched and outputs "
        "differ, or the value that entered from outside torch.",
        epilog="Exit status: 0 the runs do not part, 1 they part (explained), 2 bad input, "
        "3 no verdict.")
    p.add_argument("file", help="manifest file or pack ('-' for stdin)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="run B with this thread count (A keeps the recorded one)")
    p.add_argument("--step", type=positive_int, default=None,
                   help="explain this optimizer step (skip locating the first divergent one)")
    add_rerun_options(p)
    from manifest.cli.verbs_check import add_environment_options

    add_environment_options(p)
    p.add_argument("--keep", action="store_true", help="keep the scratch tree and op streams")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every drift line (by default a torch build's CUDA libraries "
                   "fold under torch's line and packages the run never imported into one)")
    add_format_option(p)
    p.set_defaults(func=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    from manifest.cli.render import render_command
    from manifest.cli.render_explain import render_explain
    from manifest.cli.verbs_check import (
        progress,
        rebuild_options,
        rerun_options,
        show_plan,
        trusted_signer,
    )
    from manifest.explain.pipeline import ExplainOptions, explain_run

    data = read_manifest_file(args.file)
    options = ExplainOptions(rerun=rerun_options(args, trusted_signer(args, data)),
                             threads=args.threads, keep=args.keep, step=args.step,
                             rebuild=rebuild_options(args, on_cluster=True))
    report = explain_run(data, file=args.file, cwd=Path.cwd(), options=options,
                         announce=render_command, show_plan=show_plan, note=progress)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        sys.stdout.write(json_text(report.to_json()) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.canonical import load_manifest
        from manifest.cli.files import unpacked
        from manifest.cli.render_explain import explain_markdown, explain_trail

        recorded = load_manifest(unpacked(data)) if report.steps_run is not None else None
        sys.stdout.write(explain_markdown(report, trail=explain_trail(report, recorded)))
    else:
        render_explain(report, verbose=args.verbose)
    return report.exit_code


def register_lab(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "lab", help="noise floor, bit-exact under the recipe, cost, op catalogue, checklist",
        description="Run CMD N times under PyTorch's default switches and N times under the "
        "recipe (same seed), compare the runs tensor by tensor, price the recipe, audit one "
        "more run for the ops that are nondeterministic on CUDA, and check code, data, "
        "environment, random state, hardware and numerics. Defaults from [tool.manifest].",
        epilog="Exit status: 0 bit-identical under the recipe, 1 the recipe runs differ, "
        "2 bad usage, 3 a run failed.")
    p.add_argument("--runs", type=positive_int, default=2, help="runs per mode (default 2)")
    p.add_argument("--envelope", type=positive_int, default=0, metavar="N",
                   help="also measure the noise envelope: N runs with the state moved one ULP "
                   "and one under another thread count, step by step against recipe run 1")
    p.add_argument("--seed", type=seed_value, default=None, help="base seed (default: config or 0)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="pin the torch/OpenMP thread count (default: config or the count here)")
    p.add_argument("--data", action="append", default=None, metavar="[NAME=]PATH",
                   help="dataset to digest (repeatable)")
    p.add_argument("--artifact", "--output", dest="outputs", action="append", default=None,
                   metavar="GLOB", help="file(s) each run writes, compared tensor by tensor "
                   "between runs (repeatable; default: config outputs)")
    p.add_argument("--store", metavar="DIR", help="blob store (default: <repo>/.manifest)")
    p.add_argument("--no-cache", action="store_true", help="re-read every data file")
    add_format_option(p, what="the report (json: schemas/lab.v1.schema.json; markdown: with "
                      "plots when matplotlib is installed)")
    p.add_argument("--report", metavar="FILE.md",
                   help="also write the self-contained Markdown report (with plots) here")
    add_verbosity_options(p, quiet_help="no progress output on stderr")
    add_rerun_options(p, received=False)
    from manifest.cli.verbs_check import add_environment_options

    add_environment_options(p)
    from manifest.cli.verbs_segments import add_resume_audit_options

    add_resume_audit_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS… to run")
    p.set_defaults(func=_cmd_lab)


def _cmd_lab(args: argparse.Namespace) -> int:
    from manifest.lab.runs import LabOptions, run_lab

    if args.report and not Path(args.report).parent.is_dir():
        raise OutputError(f"cannot write {args.report}: its directory does not exist.")
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]

    def progress(text: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"manifest: lab: {text}\n")

    from manifest.cli.verbs_check import rebuild_options, rerun_options, show_plan

    if args.no_sandbox and args.require_sandbox:
        raise UsageError("--no-sandbox and --require-sandbox contradict each other.")
    rerun = rerun_options(args, None)
    if rerun.cluster is not None:
        # The lab compares the output files themselves (tensor by tensor, L2 between
        # runs): with --on they come back after each run, as with --fetch-outputs.
        from dataclasses import replace

        rerun = replace(rerun, cluster=replace(rerun.cluster, fetch_outputs=True))
    if args.resume_at is not None and args.env == "run":
        raise UsageError("--env run rebuilds the environment explain re-runs a parted recipe "
                         "run in; --resume-at re-runs none.")
    if args.resume_at is not None:  # the restart-replay gate only (manifest.lab.resume)
        from manifest.cli.verbs_segments import run_resume_audit

        return run_resume_audit(args, command, rerun)
    options = LabOptions(rerun=rerun, runs=args.runs, seed=args.seed,
                         threads=args.threads, data=args.data, outputs=args.outputs,
                         store_dir=args.store, no_cache=args.no_cache, quiet=args.quiet,
                         envelope=args.envelope, rebuild=rebuild_options(args))
    report = run_lab(Path.cwd(), command, options, progress=progress,
                     show_plan=None if args.quiet else show_plan)
    if args.report:
        from manifest.cli.render_lab import render_lab_markdown

        write_output(render_lab_markdown(report).encode(), args.report)
    if args.format is ReportFormat.JSON:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_lab import render_lab_markdown

        sys.stdout.write(render_lab_markdown(report))
    else:
        from manifest.cli.render_lab import render_lab

        render_lab(report)
    return report.exit_code
