"""Verbs for a run that leaves this machine: pack, sign, attest, export.

A pack is one file with the manifest and every blob it references, which
show, diff, verify and gate read wherever they read a manifest; sign and
attest wrap the canonical bytes in a Sigstore bundle (a key, or keyless);
export maps the manifest onto a CycloneDX 1.6 or SPDX 3.0.1 bill of
materials. The libraries are ``manifest.travel`` and ``manifest.export``;
the signing libraries (sigstore, cryptography) are imported only when a verb
here runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from manifest.cli.files import read_manifest_file, unpacked, write_output, write_pack
from manifest.cli.options import Parser
from manifest.errors import UsageError


def register_pack(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "pack", help="one file holding a manifest and every blob it references",
        description="Write a pack (a ZIP: manifest.json, blobs/blake3-<hex>, and the "
        "signature if FILE.sig exists) that verify, diff, show and gate read wherever they "
        "read a manifest, on any clone or machine. Blobs are checked against their names.")
    p.add_argument("file", help="manifest file")
    p.add_argument("-o", "--out", dest="output", metavar="FILE", required=True,
                   help="write the pack here (atomically; '-' for stdout)")
    p.add_argument("--with-outputs", action="store_true",
                   help="also carry the declared output files, as the run wrote them, so "
                   "that a verifier elsewhere can hold its re-run to the recorded weights "
                   "('equivalent' needs them); single files within the pack's size cap, "
                   "else send them beside it for verify --outputs DIR")
    p.set_defaults(func=_cmd_pack)


def _cmd_pack(args: argparse.Namespace) -> int:
    from manifest.canonical import dumps, load_manifest
    from manifest.travel.sign import find_signature, signature_covers

    data = read_manifest_file(args.file)
    canonical = dumps(load_manifest(unpacked(data)))
    found = find_signature(args.file, data, None)
    if found is not None and not signature_covers(canonical, found[0]):
        raise UsageError(f"the signature {found[1]} covers a different manifest; "
                         "re-sign or remove it before packing.")
    write_pack(canonical, args.output, Path.cwd(), found[0] if found else None,
               with_outputs=args.with_outputs)
    return 0


def _signing_options(p: argparse.ArgumentParser) -> None:
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--key", metavar="PEM", help="sign offline with this ECDSA P-256 or "
                     "Ed25519 private key (password from $MANIFEST_KEY_PASSWORD)")
    how.add_argument("--sigstore", action="store_true",
                     help="sign keyless with Sigstore (network; identity from "
                     "$SIGSTORE_ID_TOKEN, the CI's ambient credential, or the browser)")
    p.add_argument("--staging", action="store_true", help="use Sigstore's staging instance")


def register_sign(sub: argparse._SubParsersAction[Parser]) -> None:
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
    data = read_manifest_file(args.file)
    manifest = load_manifest(unpacked(data))
    canonical = dumps(manifest)
    bundle = sign_statement(manifest_statement(canonical, manifest.run_id, manifest.digest),
                            key=Path(args.key) if args.key else None, keyless=args.sigstore,
                            staging=args.staging)
    if is_pack(data):
        packed = read_pack(data)
        write_output(build_pack(packed.manifest, packed.blobs, bundle, packed.outputs),
                     args.output or args.file)
    else:
        write_output(bundle, args.output or str(sibling_signature(Path(args.file))))
    return 0


def register_attest(sub: argparse._SubParsersAction[Parser]) -> None:
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
    from manifest.rerun.workspace import repo_root_of
    from manifest.travel.attest import run_statement
    from manifest.travel.sign import sign_statement

    manifest = load_manifest(unpacked(read_manifest_file(args.file)))
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
    write_output(bundle, args.output)
    if oms_bundle is not None:
        write_output(oms_bundle, args.oms)
    return 0


def register_export(sub: argparse._SubParsersAction[Parser]) -> None:
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

    manifest = load_manifest(read_manifest_file(args.file))
    write_output(export_manifest(manifest, ExportFormat(args.format)), args.output)
    return 0
