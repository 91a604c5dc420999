"""Command-line interface: parses arguments, calls the library, renders results.

stdout carries only the requested document or report; messages go to stderr.
Exit status (all verbs): 0 success, 1 check failed, 2 bad usage or input,
3 no verdict. Heavy modules are imported inside each verb.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from manifest import __version__
from manifest.cli.options import (
    ReportFormat,
    add_format_option,
    add_verbosity_options,
)
from manifest.errors import (
    EXIT_BAD_INPUT,
    EXIT_NO_VERDICT,
    ManifestError,
    OutputError,
    UsageError,
)

if TYPE_CHECKING:
    from manifest.explain.pipeline import ExplainReport
    from manifest.travel.sign import SignatureCheck
    from manifest.verify.trust import RunPlan, TrustDecision


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one sentence and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help').")


def _write_output(data: bytes, output: str | None) -> None:
    """Write a document to ``output`` atomically, or to stdout."""
    if output is None or output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    from manifest.store import atomic_write

    atomic_write(Path(output), data)


def _read_manifest_file(path: str) -> bytes:
    from manifest.canonical import read_manifest_file

    return read_manifest_file(path)


# ------------------------------------------------------------------ verbs


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
    if args.old_outputs:
        _note("--output GLOB is deprecated (it was easy to mistake for the manifest file); "
              "use --artifact GLOB.")
    artifacts = (args.artifacts or []) + (args.old_outputs or [])
    from manifest.capture.run import capture_from_cli

    manifest, exit_code = capture_from_cli(
        cwd,
        command=command,
        seed=args.seed,
        data=args.data,
        outputs=artifacts or None,
        threads=args.threads,
        deterministic=not args.no_deterministic,
        store_dir=args.store,
        no_cache=args.no_cache,
        quiet=args.quiet,
        per_rank_seed=args.per_rank_seed,
        manifest_file=Path(args.output) if args.output and args.output != "-" else None,
        fingerprint_ops=args.fingerprint_ops,
        trail=not args.no_trail,
    )
    _write_output(dumps(manifest), args.output)
    if args.pack:
        _write_pack(dumps(manifest), args.pack, cwd)
    if not args.quiet:
        from manifest.cli.render import capture_notes
        from manifest.cli.text import printable

        for note in capture_notes(manifest, verbose=args.verbose):
            _note(printable(note))
    if exit_code and manifest.outputs is not None:
        from manifest.cli.render import capture_failure
        from manifest.cli.text import printable

        sys.stderr.write(f"manifest: {printable(capture_failure(manifest.outputs))}\n")
    return exit_code


def _note(text: str) -> None:
    sys.stderr.write(f"manifest: note: {text}\n")


def _cmd_show(args: argparse.Namespace) -> int:
    from manifest.canonical import load_manifest
    from manifest.cli.render import render_show

    data = _read_manifest_file(args.file)
    manifest = load_manifest(_unpacked(data))
    check = _signature_check(args.file, data, args.signature, accept_untrusted=True)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        doc = manifest.model_dump(mode="json", by_alias=True, exclude_none=False)
        text = json_text(doc) + "\n"
        _write_output(text.encode(), None)
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render import show_rows
        from manifest.cli.render_markdown import show_markdown

        _write_output(show_markdown(show_rows(manifest), run_id=manifest.run_id,
                                    digest=manifest.digest).encode(), None)
    else:
        render_show(manifest)
    if check is not None:
        from manifest.verify.trust import escape_text

        trusted = "trusted by your policy" if check.trusted else "not in your trust policy"
        line = f"signed by {escape_text(check.signer)} ({check.method}; {trusted})\n"
        # Beside a JSON or Markdown document the line goes to stderr, keeping stdout parseable.
        (sys.stdout if args.format is ReportFormat.TABLE else sys.stderr).write(line)
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from manifest.schema import schema_text

    if args.lab:
        from manifest.lab.report import lab_schema_text

        _write_output(lab_schema_text().encode(), args.output)
        return 0
    _write_output(schema_text().encode(), args.output)
    return 0


# ----------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="manifest",
        description="Record PyTorch training runs as canonical manifests and prove they reproduce.",
        epilog="Exit status: 0 ok, 1 check failed, 2 bad usage or input, 3 no verdict.",
    )
    parser.add_argument("--version", action="version", version=f"manifest {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    cap = sub.add_parser(
        "capture",
        help="record the environment, or run a command and record the run",
        description="Record code, data, environment and hardware; with '-- CMD', run CMD "
        "under the launcher and record the run. Writes canonical JSON to stdout or -o FILE.",
    )
    cap.add_argument("-o", "--out", dest="output", metavar="FILE",
                     help="write the manifest here (atomically) instead of stdout")
    cap.add_argument("--seed", type=_seed, default=None, help="base seed (default: config or 0)")
    cap.add_argument("--data", action="append", default=None, metavar="[NAME=]PATH",
                     help="dataset to digest (repeatable)")
    cap.add_argument("--artifact", dest="artifacts", action="append", default=None,
                     metavar="GLOB",
                     help="file(s) the run writes, to digest after it (repeatable; weight files "
                     "also get a per-tensor table)")
    cap.add_argument("--output", dest="old_outputs", action="append", default=None,
                     metavar="GLOB", help="deprecated spelling of --artifact")
    cap.add_argument("--threads", type=_positive, default=None,
                     help="pin the torch/OpenMP thread count (default: the count in force)")
    cap.add_argument("--no-deterministic", action="store_true",
                     help="do not enforce the deterministic recipe (flags are still recorded)")
    cap.add_argument("--per-rank-seed", action="store_true",
                     help="seed each rank with base + RANK (default: every rank gets the base)")
    cap.add_argument("--no-trail", action="store_true",
                     help="do not fingerprint the parameters after every optimizer step "
                     "(verify then cannot name the first divergent step)")
    cap.add_argument("--fingerprint-ops", type=_positive, default=None, metavar="STEPS",
                     help="store the op-level fingerprint stream of the first STEPS optimizer "
                     "steps, so verify elsewhere can name the first op that computes "
                     "differently (costs a few times those steps)")
    cap.add_argument("--store", metavar="DIR", help="blob store (default: <repo>/.manifest)")
    cap.add_argument("--pack", metavar="FILE",
                     help="also write a pack (manifest + its blobs) here, see 'manifest pack'")
    cap.add_argument("--no-cache", action="store_true", help="re-read every data file")
    add_verbosity_options(cap)
    cap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS… to run")
    cap.set_defaults(func=_cmd_capture)

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

    schema = sub.add_parser(
        "schema", help="print the JSON Schema of the manifest",
        description="Print the JSON Schema (draft 2020-12) generated from the manifest's models.")
    schema.add_argument("-o", "--out", dest="output", metavar="FILE",
                        help="write the schema here (atomically) instead of stdout")
    schema.add_argument("--lab", action="store_true",
                        help="print the schema of 'manifest lab --json' instead")
    schema.set_defaults(func=_cmd_schema)

    for register in _EXTRA_VERBS:
        register(sub)
    return parser


def _seed(text: str) -> int:
    from manifest.models import MAX_SAFE_INT

    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be an integer, not {text!r}") from None
    if not 0 <= value <= MAX_SAFE_INT:
        raise argparse.ArgumentTypeError(f"seed must be between 0 and 2**53-1, not {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def _register_hash(sub: argparse._SubParsersAction[_Parser]) -> None:
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


def _register_diff(sub: argparse._SubParsersAction[_Parser]) -> None:
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
    p.set_defaults(func=_cmd_diff)


def _cmd_diff(args: argparse.Namespace) -> int:
    from manifest.diff.engine import diff_manifests, load_for_diff
    from manifest.diff.rules import Impact
    from manifest.errors import EXIT_FAILED, EXIT_OK

    if args.a == "-" and args.b == "-":
        raise UsageError("only one of the two manifests can be read from stdin ('-').")
    # A short-lived process that builds tens of thousands of acyclic objects:
    # the cyclic collector would only re-scan them (about 20% of the run).
    import gc

    gc.disable()
    a = load_for_diff(_unpacked(_read_manifest_file(args.a)), name=args.a)
    b = load_for_diff(_unpacked(_read_manifest_file(args.b)), name=args.b)
    result = diff_manifests(a, b)
    only = None if args.only is None else Impact(args.only)
    if args.format is ReportFormat.JSON:
        from manifest.cli.render_diff import diff_json_bytes

        _write_output(diff_json_bytes(result, a_file=args.a, b_file=args.b, only=only), None)
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_markdown import diff_markdown

        _write_output(diff_markdown(result, a_file=args.a, b_file=args.b, only=only).encode(),
                      None)
    else:
        from manifest.cli.render_diff import render_diff

        render_diff(result, a_file=args.a, b_file=args.b, only=only, fold=not args.all)
    return EXIT_FAILED if result.has_bits else EXIT_OK


def _register_verify(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "verify", help="re-run a recorded training and compare its outputs bit for bit",
        description="Check a manifest's integrity, environment drift and data; re-run its "
        "command in a scratch clone under the recorded seeds and flags; compare the outputs "
        "tensor by tensor. Exit 0 identical, 1 differs, 2 bad input, 3 no verdict.")
    p.add_argument("file", help="manifest file or pack ('-' for stdin)")
    p.add_argument("--signature", metavar="FILE",
                   help="signature to check (default: FILE.sig, or the pack's own); a valid "
                   "signature by a signer your trust policy lists stands in for --trust")
    p.add_argument("--strict", action="store_true",
                   help="refuse to re-run when the environment or data drifted in a way "
                   "that can change bits")
    p.add_argument("--trust", action="store_true",
                   help="run the command although this machine did not seal the manifest "
                   "and no trusted identity signed it (after reading what it will run)")
    p.add_argument("--network", action="store_true",
                   help="let the confined re-run reach the network")
    p.add_argument("--require-sandbox", action="store_true",
                   help="refuse (exit 3) when the re-run cannot be confined by bubblewrap")
    p.add_argument("--no-sandbox", action="store_true",
                   help="re-run without confinement (the report says 'not confined')")
    p.add_argument("--in-place", action="store_true",
                   help="run in the current tree instead of a scratch clone (no git needed)")
    p.add_argument("--no-rerun", action="store_true",
                   help="check integrity, drift and data only")
    p.add_argument("--threads", type=_positive, default=None,
                   help="override the recorded thread count (expect differences)")
    p.add_argument("--keep", action="store_true", help="keep the scratch tree")
    p.add_argument("--no-cache", action="store_true", help="re-read every data file")
    p.add_argument("--explain", action="store_true",
                   help="when the outputs differ, explain where (see 'manifest explain')")
    add_format_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from manifest.cli.render import render_command, render_verify
    from manifest.verify.pipeline import VerifyOptions, verify_run

    data = _read_manifest_file(args.file)
    check = _signature_check(args.file, data, args.signature, accept_untrusted=args.trust)
    if check is not None and not args.quiet:
        note = "" if check.trusted else " (not in your trust policy; running under --trust)"
        from manifest.verify.trust import escape_text

        sys.stderr.write(f"manifest: signed by {escape_text(check.signer)}{note}\n")
    options = VerifyOptions(strict=args.strict, trust=args.trust, in_place=args.in_place,
                            no_rerun=args.no_rerun, threads=args.threads, keep=args.keep,
                            no_cache=args.no_cache, quiet=args.quiet, network=args.network,
                            sandbox=not args.no_sandbox, require_sandbox=args.require_sandbox,
                            signer=check.signer if check is not None and check.trusted else None)
    if args.no_sandbox and args.require_sandbox:
        raise UsageError("--no-sandbox and --require-sandbox contradict each other.")
    report = verify_run(data, file=args.file, cwd=Path.cwd(),
                        options=options, announce=render_command, show_plan=_show_plan)
    if report.rerun_exit_code is not None and report.confinement and not args.quiet:
        sys.stderr.write(f"manifest: re-run: {report.confinement}; ran because: {report.trust}.\n")
        for note in report.notes:
            sys.stderr.write(f"manifest: note: {note}.\n")
    explained = None
    if args.explain and report.verdict == "differs":
        explained = _explain_after_verify(args, report.first_divergent_step)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        doc = report.to_json()
        if explained is not None:
            doc["explain"] = explained.to_json()
        sys.stdout.write(json_text(doc) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_markdown import verify_markdown

        sys.stdout.write(verify_markdown(report))
        if explained is not None:
            import io

            from manifest.cli.render_explain import render_explain
            from manifest.cli.render_markdown import text_markdown

            text = io.StringIO()
            render_explain(explained, text)
            sys.stdout.write("\n" + text_markdown(f"Explain: {explained.verdict}",
                                                   text.getvalue()))
    else:
        render_verify(report)
        if explained is not None:
            from manifest.cli.render_explain import render_explain

            render_explain(explained)
    return report.exit_code


def _explain_after_verify(args: argparse.Namespace, step: int | None) -> ExplainReport:
    from manifest.explain.pipeline import ExplainOptions, explain_run

    # Past step 1000 the recorded trail is sampled: let explain locate the exact step.
    options = ExplainOptions(trust=args.trust, in_place=args.in_place, threads=args.threads,
                             keep=args.keep, step=step if step is not None and step <= 1000
                             else None)
    return explain_run(_read_manifest_file(args.file), file=args.file, cwd=Path.cwd(),
                       options=options)


def _show_plan(plan: RunPlan, decision: TrustDecision) -> None:
    """What verify would run, every string escaped, before it runs or refuses (stderr)."""
    head = ("will run" if decision.allowed else "would run") + f" ({decision.reason})" * (
        decision.allowed)
    lines = [f"manifest: {head}:"] + [f"manifest:   {line}" for line in plan.lines()]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _register_gate(sub: argparse._SubParsersAction[_Parser]) -> None:
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
    add_format_option(p)
    p.add_argument("--json-file", metavar="FILE",
                   help="also write the JSON report to FILE (atomically), e.g. for a CI artifact")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no report and no progress (the exit status and --json-file still say it)")
    p.set_defaults(func=_cmd_gate)


def _cmd_gate(args: argparse.Namespace) -> int:
    import os

    from manifest.cli.render_gate import gate_json_bytes, gate_markdown, render_gate
    from manifest.gate.checks import run_gate
    from manifest.gate.report import GateOptions

    report = run_gate(Path.cwd(), GateOptions(
        no_rerun=args.no_rerun, update_baseline=args.update_baseline,
        files=tuple(args.files), warn_hygiene=args.warn_hygiene, quiet=args.quiet))
    if args.json_file:
        _write_output(gate_json_bytes(report), args.json_file)
    if args.format is ReportFormat.JSON:
        _write_output(gate_json_bytes(report), None)
    elif args.quiet:
        pass
    elif args.format is ReportFormat.MARKDOWN:
        _write_output(gate_markdown(report).encode(), None)
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


def _register_explain(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "explain", help="where two runs part: the step, the op, the module and the line",
        description="Re-run the recorded command twice in a scratch clone, find the first "
        "optimizer step where the runs (or the recorded trail) part, re-run up to that step "
        "recording every aten op, and name the first op whose inputs matched and outputs "
        "differ, or the value that entered from outside torch.",
        epilog="Exit status: 0 the runs do not part, 1 they part (explained), 2 bad input, "
        "3 no verdict.")
    p.add_argument("file", help="manifest file ('-' for stdin)")
    p.add_argument("--threads", type=_positive, default=None,
                   help="run B with this thread count (A keeps the recorded one)")
    p.add_argument("--step", type=_positive, default=None,
                   help="explain this optimizer step (skip locating the first divergent one)")
    p.add_argument("--trust", action="store_true",
                   help="run the command even if the commit or patch is not known locally")
    p.add_argument("--in-place", action="store_true",
                   help="run in the current tree instead of a scratch clone")
    p.add_argument("--keep", action="store_true", help="keep the scratch tree and op streams")
    add_format_option(p)
    p.set_defaults(func=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    from manifest.cli.render import render_command
    from manifest.cli.render_explain import render_explain
    from manifest.explain.pipeline import ExplainOptions, explain_run

    options = ExplainOptions(trust=args.trust, in_place=args.in_place, threads=args.threads,
                             keep=args.keep, step=args.step)
    report = explain_run(_read_manifest_file(args.file), file=args.file, cwd=Path.cwd(),
                         options=options, announce=render_command)
    if args.format is ReportFormat.JSON:
        from manifest.cli.text import json_text

        sys.stdout.write(json_text(report.to_json()) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        import io

        from manifest.cli.render_markdown import text_markdown

        text = io.StringIO()
        render_explain(report, text)
        sys.stdout.write(text_markdown(f"Explain: {report.verdict}", text.getvalue()))
    else:
        render_explain(report)
    return report.exit_code



# ------------------------------------------------- a run that travels (issue 12)
# pack, sign, attest; show/diff/verify/gate read packs. Library: manifest.travel.


def _unpacked(data: bytes) -> bytes:
    """The manifest bytes of a manifest file or a (checked) pack."""
    from manifest.travel.pack import manifest_bytes_of

    return manifest_bytes_of(data)


def _signature_check(file: str, data: bytes, explicit: str | None, *,
                     accept_untrusted: bool) -> SignatureCheck | None:
    from manifest.travel.sign import check_input_signature

    return check_input_signature(file, data, cwd=Path.cwd(), explicit=explicit,
                                 accept_untrusted=accept_untrusted)


def _write_pack(manifest_bytes: bytes, output: str, cwd: Path,
                signature: bytes | None = None) -> None:
    from manifest.canonical import load_manifest
    from manifest.travel.pack import pack_from_store
    from manifest.verify.pipeline import repo_root_of, store_for

    store = store_for(load_manifest(manifest_bytes), repo_root_of(cwd) or cwd)
    _write_output(pack_from_store(manifest_bytes, store, signature), output)


def _register_pack(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "pack", help="one file holding a manifest and every blob it references",
        description="Write a pack (a ZIP: manifest.json, blobs/blake3-<hex>, and the "
        "signature if FILE.sig exists) that verify, diff, show and gate read wherever they "
        "read a manifest, on any clone or machine. Blobs are checked against their names.")
    p.add_argument("file", help="manifest file")
    p.add_argument("-o", "--out", dest="output", metavar="FILE", required=True,
                   help="write the pack here (atomically; '-' for stdout)")
    p.set_defaults(func=_cmd_pack)


def _cmd_pack(args: argparse.Namespace) -> int:
    from manifest.canonical import dumps, load_manifest
    from manifest.travel.sign import find_signature, signature_covers

    data = _read_manifest_file(args.file)
    canonical = dumps(load_manifest(_unpacked(data)))
    found = find_signature(args.file, data, None)
    if found is not None and not signature_covers(canonical, found[0]):
        raise UsageError(f"the signature {found[1]} covers a different manifest; "
                         "re-sign or remove it before packing.")
    _write_pack(canonical, args.output, Path.cwd(), found[0] if found else None)
    return 0


def _signing_options(p: argparse.ArgumentParser) -> None:
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--key", metavar="PEM", help="sign offline with this ECDSA P-256 or "
                     "Ed25519 private key (password from $MANIFEST_KEY_PASSWORD)")
    how.add_argument("--sigstore", action="store_true",
                     help="sign keyless with Sigstore (network; identity from "
                     "$SIGSTORE_ID_TOKEN, the CI's ambient credential, or the browser)")
    p.add_argument("--staging", action="store_true", help="use Sigstore's staging instance")


def _register_sign(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "sign", help="sign a manifest (or a pack) with a key or Sigstore keyless",
        description="Sign the manifest's canonical bytes: a Sigstore bundle around an in-toto "
        "statement. For a manifest file the signature goes to FILE.sig (or -o); for a pack it "
        "is stored inside the pack. verify and show check it against your trust policy.")
    p.add_argument("file", help="manifest file or pack")
    p.add_argument("-o", "--out", dest="output", metavar="FILE",
                   help="where to write (default: FILE.sig; for a pack, the pack itself)")
    _signing_options(p)
    p.set_defaults(func=_cmd_sign)


def _cmd_sign(args: argparse.Namespace) -> int:
    from manifest.canonical import dumps, load_manifest
    from manifest.travel.pack import build_pack, is_pack, read_pack
    from manifest.travel.sign import manifest_statement, sibling_signature, sign_statement

    if args.file == "-" and not args.output:
        raise UsageError("signing stdin needs -o FILE for the signature.")
    data = _read_manifest_file(args.file)
    manifest = load_manifest(_unpacked(data))
    canonical = dumps(manifest)
    bundle = sign_statement(manifest_statement(canonical, manifest.run_id, manifest.digest),
                            key=Path(args.key) if args.key else None, keyless=args.sigstore,
                            staging=args.staging)
    if is_pack(data):
        packed = read_pack(data)
        _write_output(build_pack(packed.manifest, packed.blobs, bundle),
                      args.output or args.file)
    else:
        _write_output(bundle, args.output or str(sibling_signature(Path(args.file))))
    return 0


def _register_attest(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "attest", help="a signed in-toto attestation of a run, and an OMS weight signature",
        description="Write a signed in-toto Statement v1 (one Sigstore bundle per line): "
        "subjects are the output artifacts by sha256, the predicate is the manifest "
        "(predicate type https://manifest.dev/predicates/training-run/v1). With --oms, also "
        "an OpenSSF model-signing signature of the weights that names the run_id.")
    p.add_argument("file", help="manifest file or pack")
    p.add_argument("-o", "--out", dest="output", metavar="FILE",
                   help="write the attestation here (default: stdout)")
    p.add_argument("--oms", metavar="SIG",
                   help="also write an OMS signature of the weights here "
                   "(check it with 'model_signing verify')")
    p.add_argument("--model", metavar="PATH",
                   help="the model file or directory the OMS signature covers "
                   "(default: the run's one output)")
    _signing_options(p)
    p.set_defaults(func=_cmd_attest)


def _cmd_attest(args: argparse.Namespace) -> int:
    from manifest.canonical import load_manifest
    from manifest.travel.attest import run_statement
    from manifest.travel.sign import sign_statement
    from manifest.verify.pipeline import repo_root_of

    manifest = load_manifest(_unpacked(_read_manifest_file(args.file)))
    cwd = Path.cwd()
    root = repo_root_of(cwd) or cwd
    key = Path(args.key) if args.key else None
    statement = run_statement(manifest, root)
    oms: bytes | None = None
    if args.oms:
        from manifest.travel.oms import check_oms_key, default_model_path, oms_statement

        if key is not None:
            check_oms_key(key)
        model = Path(args.model) if args.model else default_model_path(manifest, root)
        oms = oms_statement(manifest, model, root, Path(args.oms))
    bundle = sign_statement(statement, key=key, keyless=args.sigstore, staging=args.staging)
    oms_bundle = None if oms is None else sign_statement(
        oms, key=key, keyless=args.sigstore, staging=args.staging)
    _write_output(bundle, args.output)
    if oms_bundle is not None:
        _write_output(oms_bundle, args.oms)
    return 0


# ------------------------------------------------------------ lab (issue 14)


def _register_lab(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "lab", help="noise floor, bit-exact under the recipe, cost, op catalogue, checklist",
        description="Run CMD N times under PyTorch's default switches and N times under the "
        "recipe (same seed), compare the runs tensor by tensor, price the recipe, audit one "
        "more run for the ops that are nondeterministic on CUDA, and check code, data, "
        "environment, random state, hardware and numerics. Defaults from [tool.manifest].",
        epilog="Exit status: 0 bit-identical under the recipe, 1 the recipe runs differ, "
        "2 bad usage, 3 a run failed.")
    p.add_argument("--runs", type=_positive, default=2, help="runs per mode (default 2)")
    p.add_argument("--seed", type=_seed, default=None, help="base seed (default: config or 0)")
    p.add_argument("--threads", type=_positive, default=None,
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

    options = LabOptions(runs=args.runs, seed=args.seed, threads=args.threads, data=args.data,
                         outputs=args.outputs, store_dir=args.store, no_cache=args.no_cache,
                         quiet=args.quiet)
    report = run_lab(Path.cwd(), command, options, progress=progress)
    if args.report:
        from manifest.cli.render_lab import render_lab_markdown

        _write_output(render_lab_markdown(report).encode(), args.report)
    if args.format is ReportFormat.JSON:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    elif args.format is ReportFormat.MARKDOWN:
        from manifest.cli.render_lab import render_lab_markdown

        sys.stdout.write(render_lab_markdown(report))
    else:
        from manifest.cli.render_lab import render_lab

        render_lab(report)
    return report.exit_code


# ----------------------------------------------------------- export (issue 15)


def _register_export(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "export", help="write a run as a CycloneDX 1.6 or SPDX 3.0.1 bill of materials",
        description="Map a manifest's code, data (BLAKE3), environment, hardware, output "
        "models and compute record onto a CycloneDX 1.6 JSON BOM or an SPDX 3.0.1 JSON-LD "
        "document (Build, AI and Dataset profiles). The manifest's digest is checked first.")
    p.add_argument("file", help="manifest file ('-' for stdin)")
    p.add_argument("--format", required=True, choices=["cyclonedx", "spdx3"],
                   help="the document to write: cyclonedx (CycloneDX 1.6 JSON) or spdx3 "
                   "(SPDX 3.0.1 JSON-LD)")
    p.add_argument("-o", "--out", dest="output", metavar="FILE",
                   help="write the document here (atomically) instead of stdout")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from manifest.canonical import load_manifest
    from manifest.export import ExportFormat, export_manifest

    manifest = load_manifest(_read_manifest_file(args.file))
    _write_output(export_manifest(manifest, ExportFormat(args.format)), args.output)
    return 0


_EXTRA_VERBS = [_register_verify, _register_hash, _register_diff, _register_gate,
                _register_explain, _register_pack, _register_sign, _register_attest,
                _register_lab, _register_export]


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``manifest`` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except ManifestError as exc:
        from manifest.cli.text import printable

        # Messages quote recorded strings: never let one act on the terminal.
        sys.stderr.write(f"manifest: {printable(exc.diagnostics())}\n")
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
        sys.stderr.write(f"manifest: {exc.strerror or exc}{where}.\n")
        return EXIT_BAD_INPUT
    except Exception as exc:
        if os.environ.get("MANIFEST_DEBUG"):
            raise
        sys.stderr.write(f"manifest: internal error ({type(exc).__name__}: {exc}); no verdict. "
                         "Re-run with MANIFEST_DEBUG=1 for the traceback and report it.\n")
        return EXIT_NO_VERDICT
    except BaseException as exc:  # after Exception: only what is not an Exception
        from manifest.verify.scratch import Terminated

        if isinstance(exc, Terminated):  # SIGTERM/SIGHUP: scratch removed, exit like the signal
            sys.stderr.write("manifest: terminated.\n")
            return 128 + exc.signum
        raise

