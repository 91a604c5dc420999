"""Verbs that make and read a manifest: capture, show, schema, hash.

These four touch one manifest (or one dataset) and no second run: capture
writes it, show prints it, schema prints the models it follows, hash prints
the dataset root capture records. Until the split they shared one 851-line
``app.py`` with the other nine verbs. Each verb is a ``register_*`` function
(its arguments, in the order its ``--help`` lists them) and a ``_cmd_*``
function (parse, call the library, render); ``app.build_parser`` calls the
``register_*`` functions in the order ``manifest --help`` lists the verbs.
The library is imported inside ``_cmd_*``: ``manifest --help`` loads no
pydantic model, git or torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from manifest.cli.files import (
    read_manifest_file,
    signature_check,
    unpacked,
    write_output,
    write_pack,
)
from manifest.cli.options import (
    Parser,
    ReportFormat,
    add_format_option,
    add_verbosity_options,
    positive_int,
    seed_value,
)
from manifest.errors import OutputError, UsageError


def register_capture(sub: argparse._SubParsersAction[Parser]) -> None:
    cap = sub.add_parser(
        "capture",
        help="record the environment, or run a command and record the run",
        description="Record code, data, environment and hardware; with '-- CMD', run CMD "
        "under the launcher and record the run. Writes canonical JSON to stdout or -o FILE.",
    )
    cap.add_argument("-o", "--out", dest="output", metavar="FILE",
                     help="write the manifest here (atomically) instead of stdout")
    cap.add_argument("--seed", type=seed_value, default=None,
                     help="base seed (default: config or 0)")
    cap.add_argument("--data", action="append", default=None, metavar="[NAME=]PATH",
                     help="dataset to digest (repeatable)")
    cap.add_argument("--artifact", dest="artifacts", action="append", default=None,
                     metavar="GLOB",
                     help="file(s) the run writes, to digest after it (repeatable; weight files "
                     "also get a per-tensor table)")
    cap.add_argument("--output", dest="old_outputs", action="append", default=None,
                     metavar="GLOB", help="deprecated spelling of --artifact")
    cap.add_argument("--threads", type=positive_int, default=None,
                     help="pin the torch/OpenMP thread count (default: the count in force)")
    cap.add_argument("--no-deterministic", action="store_true",
                     help="do not enforce the deterministic recipe (flags are still recorded)")
    cap.add_argument("--per-rank-seed", action="store_true",
                     help="seed each rank with base + RANK (default: every rank gets the base)")
    cap.add_argument("--no-trail", action="store_true",
                     help="do not fingerprint the parameters after every optimizer step "
                     "(verify then cannot name the first divergent step)")
    cap.add_argument("--fingerprint-ops", type=positive_int, default=None, metavar="STEPS",
                     help="store the op-level fingerprint stream of the first STEPS optimizer "
                     "steps, so verify elsewhere can name the first op that computes "
                     "differently (costs a few times those steps)")
    cap.add_argument("--envelope", type=positive_int, default=0, metavar="N",
                     help="after the run, N more with the state moved one ULP and one under "
                     "another thread count: the run's own noise envelope, stored outside "
                     "identity, against which verify elsewhere can say 'equivalent'")
    cap.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                     help="the matmul precision the envelope covers: a re-run on a device "
                     "using TF32 or bf16 autocast is judged against an envelope whose runs "
                     "emulate it on CPU (default fp32: the run's own)")
    cap.add_argument("--store", metavar="DIR", help="blob store (default: <repo>/.manifest)")
    cap.add_argument("--pack", metavar="FILE",
                     help="also write a pack (manifest + its blobs) here, see 'manifest pack'")
    cap.add_argument("--no-cache", action="store_true", help="re-read every data file")
    remote = cap.add_mutually_exclusive_group()
    remote.add_argument("--checksums", action="store_true",
                        help="s3:// data: also ask each object's full-object checksum (one HEAD "
                        "per object, no body read)")
    remote.add_argument("--deep", action="store_true",
                        help="s3://, gs://, hf:// data: read every object and record the BLAKE3 "
                        "root a local copy of it gives")
    nodes = cap.add_argument_group(
        "multi-node", "run the same capture on every node; the records meet in a shared "
        "directory and the last node merges them (manifest.nodes.gather)")
    nodes.add_argument("--nodes", metavar="DIR", dest="nodes_dir",
                       help="write this node's record into DIR (shared by every node); the "
                       "node that completes the set writes DIR/run.json, the merged run")
    nodes.add_argument("--nodes-timeout", type=positive_int, metavar="SECONDS", default=None,
                       help="how long a node waits for the others' records before naming the "
                       "missing ones (default 600)")
    add_verbosity_options(cap)
    cap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS… to run")
    cap.set_defaults(func=_cmd_capture)


def _cmd_capture(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    from manifest.probes.repo import prefetch

    prefetch(cwd)  # git runs on a thread while the models import (~20 ms of ~0.15 s)
    from manifest.canonical import dumps

    for target in (args.output, args.pack):
        if target and target != "-" and not Path(target).parent.is_dir():
            raise OutputError(f"cannot write {target}: directory {Path(target).parent} "
                              "does not exist.")
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if args.nodes_dir is not None:
        from manifest.nodes.gather import check_directory

        if not command:
            raise UsageError("--nodes needs the command each node runs: manifest capture "
                             "--nodes DIR -- torchrun ….")
        check_directory(Path(args.nodes_dir))
    if args.old_outputs:
        _note("--output GLOB is deprecated (it was easy to mistake for the manifest file); "
              "use --artifact GLOB.")
    artifacts = (args.artifacts or []) + (args.old_outputs or [])
    from manifest.capture.run import CaptureOptions, capture_from_cli
    from manifest.cli.startup import resume_collector

    options = CaptureOptions(
        command=command, seed=args.seed, data=args.data, outputs=artifacts or None,
        threads=args.threads, deterministic=not args.no_deterministic, store_dir=args.store,
        no_cache=args.no_cache, quiet=args.quiet, per_rank_seed=args.per_rank_seed,
        manifest_file=Path(args.output) if args.output and args.output != "-" else None,
        fingerprint_ops=args.fingerprint_ops, trail=not args.no_trail,
        remote_mode="deep" if args.deep else "checksums" if args.checksums else "listing",
        envelope=args.envelope, precision=args.precision)
    resume_collector()  # the imports are in; a run under capture is collected as usual
    tagging: list[Any] = []
    notes: list[str] = []
    manifest, exit_code = capture_from_cli(
        cwd, options, progress=None if args.quiet else _note_progress,
        data_progress=None if args.quiet else ProgressLine(), notes=notes, tagging=tagging)
    for note in notes:
        _note(note)
    write_output(dumps(manifest), args.output)
    if args.pack:
        write_pack(dumps(manifest), args.pack, cwd)
    if args.nodes_dir is not None:  # a failed node too: merge names its failure
        from manifest.nodes.gather import DEFAULT_TIMEOUT_S, gather

        done = gather(manifest, Path(args.nodes_dir),
                      timeout_s=float(args.nodes_timeout or DEFAULT_TIMEOUT_S),
                      note=lambda text: _note(text))
        if not args.quiet:
            how = "merged every node's record into" if done.merged_here else "merged run in"
            sys.stderr.write(f"manifest: {how} {done.merged} (run_id {done.run_id})\n")
    if not args.quiet:
        from manifest.cli.render import capture_notes
        from manifest.cli.text import printable

        if manifest.command is None:  # nothing on the line, nothing in [tool.manifest]
            _note("no command given: this is a command-less capture (environment and code "
                  "only; nothing ran, so verify has nothing to re-run). To record a run: "
                  "manifest capture -- python train.py.")
        for note in capture_notes(manifest, verbose=args.verbose):
            _note(printable(note))
    if exit_code and manifest.outputs is not None:
        from manifest.cli.render import capture_failure
        from manifest.cli.text import printable

        sys.stderr.write(f"manifest: {printable(capture_failure(manifest.outputs))}\n")
    _tag_trackers(tagging, quiet=args.quiet)
    return exit_code


def _tag_trackers(tagging: list[Any], *, quiet: bool) -> None:
    """Last, once the manifest is written: the tracker runs get the run_id (an interrupt
    or a tracker that does not answer costs nothing but their tags)."""
    for plan in tagging:
        if plan.locators and not quiet:
            _note_progress(f"tagging {len(plan.locators)} tracker run(s)…")
        plan.run(say=None if quiet else _note_progress)


class ProgressLine:
    """A library's progress line on stderr (``manifest.data.remote.source.ProgressSink``):
    redrawn in place on a terminal, one line each otherwise."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()

    def __call__(self, text: str | None) -> None:
        if text is None:
            if self.live:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(f"manifest: {text}" + ("\r" if self.live else "\n"))
        sys.stderr.flush()


def _note_progress(text: str) -> None:
    sys.stderr.write(f"manifest: {text}\n")


def _note(text: str) -> None:
    sys.stderr.write(f"manifest: note: {text}\n")


def register_show(sub: argparse._SubParsersAction[Parser]) -> None:
    show = sub.add_parser(
        "show", help="print a readable summary of a manifest",
        description="Check a manifest's digest (and its signature, if any) and print its facts: "
        "code, data, environment, hardware, randomness, determinism, command, outputs and the "
        "compute record.")
    show.add_argument("file", help="manifest file or pack ('-' for stdin)")
    show.add_argument("--signature", metavar="FILE",
                      help="signature to check (default: FILE.sig, or the pack's own)")
    add_format_option(show, what="the summary (json: the whole manifest, indented)")
    show.set_defaults(func=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from manifest.canonical import load_manifest
    from manifest.cli.render import render_show

    data = read_manifest_file(args.file)
    manifest = load_manifest(unpacked(data))
    check = signature_check(args.file, data, args.signature, accept_untrusted=True)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        doc = manifest.model_dump(mode="json", by_alias=True, exclude_none=False)
        text = json_text(doc) + "\n"
        write_output(text.encode(), None)
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render import show_rows
        from manifest.cli.render_markdown import show_markdown

        write_output(show_markdown(show_rows(manifest), run_id=manifest.run_id,
                                   digest=manifest.digest).encode(), None)
    else:
        render_show(manifest)
    if check is not None:
        from manifest.trust import escape_text

        trusted = "trusted by your policy" if check.trusted else "not in your trust policy"
        line = f"signed by {escape_text(check.signer)} ({check.method}; {trusted})\n"
        # Beside a JSON or Markdown document the line goes to stderr, keeping stdout parseable.
        (sys.stdout if args.format is ReportFormat.TABLE else sys.stderr).write(line)
    return 0


def register_schema(sub: argparse._SubParsersAction[Parser]) -> None:
    schema = sub.add_parser(
        "schema", help="print the JSON Schema of the manifest",
        description="Print the JSON Schema (draft 2020-12) generated from the manifest's models.")
    schema.add_argument("-o", "--out", dest="output", metavar="FILE",
                        help="write the schema here (atomically) instead of stdout")
    schema.add_argument("--lab", action="store_true",
                        help="print the schema of 'manifest lab --json' instead")
    schema.set_defaults(func=_cmd_schema)


def _cmd_schema(args: argparse.Namespace) -> int:
    from manifest.schema import schema_text

    if args.lab:
        from manifest.lab.report import lab_schema_text

        write_output(lab_schema_text().encode(), args.output)
        return 0
    write_output(schema_text().encode(), args.output)
    return 0


def register_hash(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "hash", help="print the blake3 digest of a file or directory tree",
        description="Print a dataset's root: plain BLAKE3 of a file, or BLAKE3 (derive-key "
        "mode) of a directory's listing; the same root capture --data records.")
    p.add_argument("path", help="file or directory to digest")
    p.add_argument("--no-cache", action="store_true", help="re-read every file")
    p.add_argument("--store", metavar="DIR", help="cache location (default: <repo>/.manifest)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    add_format_option(p, what="the root (table: the root alone; json: the dataset entry)")
    p.set_defaults(func=_cmd_hash)


def _cmd_hash(args: argparse.Namespace) -> int:
    from manifest.data.datasets import hash_from_cli

    if not args.path:  # Path("") is the current directory
        raise UsageError("manifest hash: the path is empty; name a file or directory.")
    text = hash_from_cli(Path(args.path), no_cache=args.no_cache, store_dir=args.store,
                         quiet=args.quiet, as_json=args.format is not ReportFormat.TABLE)
    if args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_markdown import hash_markdown

        text = hash_markdown(text).rstrip("\n")
    sys.stdout.write(text + "\n")
    return 0
