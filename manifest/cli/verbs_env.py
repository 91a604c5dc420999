"""``manifest env lock|build RUN.json``: the run's Python environment, as a lock or rebuilt.

``env lock`` writes the recorded environment as a PEP 751 ``pylock.toml`` that uv or pip
installs without this tool; ``env build`` rebuilds it with uv in a cached venv and proves
each distribution's files against the record (``manifest.pyenv``). Both take the
sources the user names (``--find-links``, ``--index-url``); the manifest's recorded
sources are used only when it is trusted (sealed here, signed by a trusted identity, or
``--trust``), and are shown otherwise. Exit status: 0 proven (build) or written (lock),
1 built but not proven identical, 2 bad input (a hostile record, uv not installed),
3 nothing could be built (a distribution vanished, the recorded Python is absent).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from manifest.cli.options import Parser, ReportFormat, add_format_option

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.trust import TrustDecision

_HOW = (
    "How a reviewer gets the run's environment: 'manifest env build RUN.json --find-links "
    "WHEELS' (or --index-url URL) builds it with uv in a cached venv, proves every "
    "distribution's files against the record, and prints the venv's python; "
    "'manifest env lock RUN.json -o pylock.toml' writes a standard lock that 'uv pip install "
    "-r pylock.toml' or pip >= 26.1 installs without manifest. The indexes recorded in the "
    "manifest are used only when it is trusted (sealed here, signed, or --trust).")


def _sources_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="RUN.json", help="manifest file or pack")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="a folder of wheels to install from (repeatable)")
    p.add_argument("--index-url", action="append", default=[], metavar="URL",
                   help="a simple index (PEP 503) to install from (repeatable; first first)")
    p.add_argument("--trust", action="store_true",
                   help="also use the indexes and URLs recorded in the manifest, which is "
                   "neither sealed here nor signed by a signer you trust")
    p.add_argument("--signature", metavar="FILE",
                   help="signature to check (default: FILE.sig, or the pack's own); a valid "
                   "signature by a signer your trust policy lists stands in for --trust")


def register_env(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "env", help="the run's Python environment: a standard lock, or rebuilt and proven",
        description="The run's Python environment, from what capture recorded of each "
        "distribution (version, wheel tags, direct URL, a digest of its files). " + _HOW)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser,
                               help="lock (write pylock.toml) or build (rebuild and prove)")
    lock = actions.add_parser(
        "lock", help="write the recorded environment as a PEP 751 pylock.toml",
        description="Write the distributions the run imported (plus torch and its CUDA "
        "libraries) as a PEP 751 pylock.toml, each wheel with its URL and sha256 from the "
        "sources given. This tool and its own dependencies the run never imported are left "
        "out. A distribution no source serves is named, and no lock is written (exit 3).")
    _sources_options(lock)
    lock.add_argument("-o", "--out", dest="output", metavar="FILE",
                      help="write the lock here (default: stdout)")
    lock.set_defaults(func=_cmd_lock)
    build = actions.add_parser(
        "build", help="rebuild the run's environment with uv and prove its files",
        description="Rebuild the run's environment in a cached venv with uv (exact pins, "
        "no resolution, --no-config, no PIP_*/UV_* variables: this machine's pip and uv "
        "configuration never leaks in; files copied, never linked to uv's cache), then "
        "prove each distribution's files against the record. Prints the venv's python and "
        "the proof. Exit 0 proven, 1 built but not identical, 3 not built (a distribution "
        "vanished). Needs the 'rebuild' extra: pip install 'torch-manifest[rebuild]'. " + _HOW)
    _sources_options(build)
    add_format_option(build, what="the proof",
                      formats=(ReportFormat.TABLE, ReportFormat.JSON))
    build.set_defaults(func=_cmd_build)
    p.set_defaults(func=_cmd_env_help)


def _cmd_env_help(args: argparse.Namespace) -> int:
    from manifest.errors import UsageError

    raise UsageError("manifest env needs an action: lock or build (see 'manifest env --help').")


def _load(args: argparse.Namespace) -> tuple[Manifest, TrustDecision, Path]:
    """The manifest, the trust decision for it (verify's), and the project's tree."""
    from manifest.canonical import load_manifest
    from manifest.cli.files import read_manifest_file, signature_check, unpacked
    from manifest.rerun.workspace import repo_root_of
    from manifest.trust import check_trust, escape_text

    data = read_manifest_file(args.file)
    manifest = load_manifest(unpacked(data))
    check = signature_check(args.file, data, args.signature, accept_untrusted=args.trust)
    signer = check.signer if check is not None and check.trusted else None
    if check is not None:
        note = "" if check.trusted else " (not in your trust policy)"
        sys.stderr.write(f"manifest: signed by {escape_text(check.signer)}{note}\n")
    trust = check_trust(manifest, user_trusted=args.trust, signer=signer)
    tree = repo_root_of(Path.cwd()) or Path.cwd()
    return manifest, trust, tree


def _plan_lines(plan_lines: list[str]) -> None:
    for line in plan_lines:
        sys.stderr.write(f"manifest: {line}\n")


def _cmd_lock(args: argparse.Namespace) -> int:
    from manifest.cli.files import write_output
    from manifest.errors import EXIT_NO_VERDICT
    from manifest.pyenv.lock import build_lock

    manifest, trust, tree = _load(args)
    lock = build_lock(manifest, trust=trust, find_links=args.find_links,
                      index_urls=args.index_url, tree=tree)
    _plan_lines(lock.plan.lines())
    for line in lock.left_out:
        sys.stderr.write(f"manifest: left out {line}\n")
    if lock.vanished:
        sys.stderr.write(f"manifest: no lock written: no source serves "
                         f"{', '.join(lock.vanished)} (vanished); pass --find-links or "
                         "--index-url with their wheels.\n")
        return EXIT_NO_VERDICT
    write_output(lock.text.encode("utf-8"), args.output)
    sys.stderr.write(f"manifest: locked {lock.packages} distributions\n")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from manifest.cli.text import printable
    from manifest.errors import EXIT_FAILED, EXIT_NO_VERDICT
    from manifest.pyenv.rebuild import build_environment

    manifest, trust, tree = _load(args)

    def note(text: str) -> None:
        sys.stderr.write(f"manifest: {text}\n")

    built = build_environment(manifest, trust=trust, find_links=args.find_links,
                              index_urls=args.index_url, tree=tree, note=note)
    _plan_lines(built.plan.lines())
    proof = built.proof
    if args.format == ReportFormat.JSON:
        doc = {"python": str(built.python) if built.python else None, "cached": built.cached,
               "key": built.key, "sources": built.plan.lines(), **proof.to_json()}
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        lines = [f"python: {printable(str(built.python))}" if built.python
                 else "python: none (not built)"]
        if built.cached:
            lines.append("from the cache (checked: no file changed, or every file hashed again)")
        lines.append(proof.line())
        for f in proof.differing():
            lines.append(f"  {printable(f.name)} {printable(f.version)}: {f.status.value} "
                         f"({f.reason})")
        sys.stdout.write("\n".join(lines) + "\n")
    if not proof.built:
        return EXIT_NO_VERDICT
    return 0 if proof.proven else EXIT_FAILED
