"""``manifest verify --segments N | --at STEP…``: the options, and the report's renderings.

Parsing and rendering only; the replay is ``manifest.verify.segments``, the
choice of stretches ``manifest.verify.stretches``. Exit status as for verify: 0
every replayed stretch identical, 1 one differs, 2 bad input (``--at`` with no
step in it, ``--segments`` with ``--at``, ``--seed`` without ``--segments``, a
run with no checkpoint to cut it at: refused before anything runs), 3 no
verdict (a checkpoint missing or changed, a replay that failed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from manifest.cli.options import cluster_from_args, positive_int, seed_value, show_plan
from manifest.judge import Verdict

if TYPE_CHECKING:
    from manifest.verify.segments import SegmentsReport


def add_segment_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("long runs (replay stretches from recorded checkpoints)")
    # One or the other, refused as the arguments are read (exit 2), before the manifest is.
    which = g.add_mutually_exclusive_group()
    which.add_argument("--segments", type=positive_int, default=None, metavar="N",
                   help="replay N stretches between recorded checkpoints, drawn from a fresh "
                   "nonce this verifier makes and prints, and compare the step trail exactly")
    g.add_argument("--seed", type=seed_value, default=None, metavar="S",
                   help="with --segments: draw from S instead of a fresh nonce, to repeat a "
                   "choice a report printed")
    which.add_argument("--at", type=_steps, action="append", default=None, metavar="STEP[,STEP…]",
                   help="replay the stretches holding these optimizer steps, chosen by you "
                   "(repeatable; not with --segments)")
    g.add_argument("--resume-args", default=None, metavar="TEMPLATE",
                   help="how the script resumes, e.g. '--resume {checkpoint}' (default: "
                   "[tool.manifest] resume)")


def _steps(text: str) -> list[int]:
    steps = [positive_int(part) for part in text.split(",") if part.strip()]
    if not steps:
        raise argparse.ArgumentTypeError(f"expected optimizer steps such as 12 or 12,40, not "
                                          f"{text!r}")
    return steps


def wants_segments(args: argparse.Namespace) -> bool:
    """Whether verify replays stretches; refuses (exit 2, before anything runs) options that
    contradict each other."""
    from manifest.errors import UsageError

    if args.segments is not None and args.at is not None:
        raise UsageError("--segments draws the stretches and --at names them: give one of "
                         "the two.")
    if args.seed is not None and args.segments is None:
        raise UsageError("--seed repeats the draw of --segments N: give --segments too"
                         + (" (--at names the stretches itself)." if args.at else "."))
    return args.segments is not None or args.at is not None


def run_segments(args: argparse.Namespace, data: bytes, signer: str | None) -> int:
    from manifest.cli.render import render_command
    from manifest.errors import UsageError
    from manifest.verify.report import VerifyOptions
    from manifest.verify.segments import verify_segments

    if args.no_rerun or args.in_place or args.explain:
        raise UsageError("--segments/--at replay stretches in scratch clones: leave out "
                         "--no-rerun, --in-place and --explain.")
    options = VerifyOptions(strict=args.strict, trust=args.trust, threads=args.threads,
                            keep=args.keep, quiet=args.quiet, network=args.network,
                            sandbox=not args.no_sandbox, require_sandbox=args.require_sandbox,
                            signer=signer, cluster=cluster_from_args(args), layout=args.layout)
    report = verify_segments(data, file=args.file, cwd=Path.cwd(), options=options,
                             segments=args.segments,
                             at=[s for group in args.at or [] for s in group] or None,
                             resume=args.resume_args, seed=args.seed,
                             announce=None if args.quiet else render_command,
                             show_plan=show_plan)
    from manifest.cli.options import ReportFormat

    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        sys.stdout.write(json_text(report.to_json()) + "\n")
    else:
        sys.stdout.write(segments_text(report))
    return report.exit_code


def segments_text(report: SegmentsReport) -> str:
    from manifest.cli.text import printable

    if report.seed is None:
        how = "chosen by you (--at)"
    elif report.chosen_by == "--seed":
        how = (f"repeated from --seed {report.seed}: whoever gave the seed chose the "
               "stretches, so no chance of catching anything applies")
    else:
        how = (f"drawn from a fresh nonce, {report.seed}: --seed {report.seed} repeats this "
               "choice")
    lines = [f"verify --segments: {report.verdict}",
             f"  run: {report.run_id}",
             f"  stretches: {len(report.segments)} of {report.stretches}, {how}",
             f"  steps checked: {report.steps_checked} of {report.total_steps} "
             f"({100 * report.share:.1f}%)"]
    odds = report.chances
    if odds is not None:
        never = (f"; the {odds.unchecked_steps} steps of stretches that cannot be replayed are "
                 "never checked" if odds.unchecked_steps else "")
        among = (f" of the {odds.replayable} stretch{'es' if odds.replayable > 1 else ''} "
                 "that can be replayed" if report.unreplayable else "")
        lines += [f"  chance of catching a single bad step: {100 * odds.single_bad_step:.1f}% "
                  f"(assuming one bad step anywhere in the run, equally likely at every step"
                  f"{never})",
                  f"  chance of catching a tampered stretch: {100 * odds.tampered_stretch:.1f}%"
                  f"{among} (one whole stretch tampered by someone who could not know this "
                  "draw)"]
    if report.recorded_wall_s:
        lines.append(f"  time: {report.spent_wall_s:.1f} s replaying against "
                     f"{report.recorded_wall_s:.1f} s recorded "
                     f"({100 * report.spent_wall_s / report.recorded_wall_s:.0f}%)")
    if report.executor:
        lines.append(f"  ran on: {printable(report.executor)}, each stretch a job of its own "
                     f"({report.elapsed_s:.1f} s from the first submission to the last verdict)")
    for s in report.segments:
        head = f"  steps {s.start + 1}–{s.end}"
        head += (f" from {printable(s.resume_from or s.checkpoint)}" if s.checkpoint
                 else " from the start")
        text = f"{head}: {s.verdict}"
        if s.first_divergent_step is not None:
            text += f", first divergent step {s.first_divergent_step}"
        elif s.verdict == Verdict.IDENTICAL:
            text += f", {s.steps_compared} trail points equal"
        for path, same in s.end_checkpoints.items():
            text += f"; checkpoint {printable(path)} {'identical' if same else 'differs'}"
        if s.reason:
            text += f" ({printable(s.reason)})"
        if s.job is not None:
            text += f" [{printable(str(s.job['executor']))} job {printable(str(s.job['job_id']))}]"
        lines.append(text)
        if s.weight is not None and s.weight.weak:
            lines.append(f"    {printable(s.weight.reason)}")
    for drift in report.drift:
        lines.append(f"  drift (bits): {printable(drift)}")
    for change in report.changed_data:
        lines.append(f"  data changed: {printable(change)}")
    for note in report.notes:
        lines.append(f"  note: {printable(note)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------- lab --resume-at


def add_resume_audit_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("resume audit (instead of the lab's runs)")
    g.add_argument("--resume-at", type=positive_int, default=None, metavar="K",
                   help="stop the command after step K, resume it from the checkpoint it "
                   "saved then, and compare with the uninterrupted run step by step; name "
                   "the state the checkpoint forgot")
    g.add_argument("--resume-args", default=None, metavar="TEMPLATE",
                   help="how the script resumes, e.g. '--resume {checkpoint}' (default: "
                   "[tool.manifest] resume)")


def run_resume_audit(args: argparse.Namespace, command: list[str], rerun: object) -> int:
    from manifest.capture.run import _config_int
    from manifest.cli.options import ReportFormat
    from manifest.config import load_config
    from manifest.errors import EXIT_FAILED, EXIT_OK
    from manifest.lab.resume import resume_audit
    from manifest.lab.runs import _command
    from manifest.launch.runner import default_threads

    cwd = Path.cwd()
    table, origin = load_config(cwd)
    command = _command(command, table, origin)
    seed = args.seed if args.seed is not None else (_config_int(table, "seed", origin) or 0)
    threads = args.threads or _config_int(table, "threads", origin) or default_threads()

    def progress(text: str) -> None:
        if not args.quiet:
            sys.stderr.write(f"manifest: lab: {text}\n")

    audit = resume_audit(cwd, command, at=args.resume_at, template=args.resume_args,
                         seed=seed, threads=threads, rerun=rerun,  # type: ignore[arg-type]
                         progress=progress, show_plan=None if args.quiet else show_plan)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        sys.stdout.write(json_text(audit.to_json()) + "\n")
    else:
        from manifest.cli.text import printable, shell_join

        lines = [f"resume audit: {'bit-identical' if audit.identical else 'differs'}",
                 f"  stopped after step {audit.at}, resumed with: "
                 f"{printable(shell_join(audit.resumed_command))}",
                 f"  steps compared after the resume: {audit.steps_compared}"]
        if audit.first_divergent_step is not None:
            lines.append(f"  first divergent step: {audit.first_divergent_step}")
            lines.extend(f"  the checkpoint did not carry: {printable(f)}"
                         for f in audit.forgotten)
        if audit.detail:
            lines.append(f"  note: {printable(audit.detail)}")
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK if audit.identical else EXIT_FAILED
