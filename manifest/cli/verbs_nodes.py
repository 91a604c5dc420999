"""``manifest merge NODE.json… > run.json``: the verb over ``manifest.nodes.merge``.

Parses, reads each record through the bounded reader, merges, writes the
canonical bytes to stdout (or ``-o``); a refusal is one sentence, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from manifest.cli.options import Parser


def register_merge(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "merge", help="merge the node records of a multi-node run into one manifest",
        description="Merge node records (manifest capture on each node of a torchrun, srun, "
                    "Indexed Job or mpirun run) into the manifest of the whole run. The "
                    "result does not depend on the order of the records; records that "
                    "disagree on code, data, seeds, recipe or build are refused (exit 2).")
    p.add_argument("records", nargs="+", metavar="NODE.json", help="one record per node")
    p.add_argument("-o", "--out", dest="output", metavar="FILE",
                   help="write the merged manifest here instead of stdout")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from manifest.canonical import dumps, load_manifest
    from manifest.cli.files import read_manifest_file, write_output
    from manifest.nodes.intake import NodeIntake
    from manifest.nodes.merge import merge_nodes
    from manifest.trust import record_sealed, was_sealed_here

    # Each record is checked as it is read (manifest.nodes.intake): a duplicate or a
    # topology that cannot be is named at once, not after every record is loaded.
    intake = NodeIntake(len(args.records))
    records = []
    for name in args.records:
        data = read_manifest_file(name)
        intake.add_bytes(name, data)
        record = load_manifest(data)
        intake.add(name, record)
        records.append((name, record))
    intake.finish()
    def note(text: str) -> None:
        sys.stderr.write(f"manifest: {text}\n")

    from pathlib import Path

    from manifest.rerun.workspace import repo_root_of, store_for

    root = repo_root_of(Path.cwd()) or Path.cwd()
    # The local store only: in a shared checkout it holds every node's patch, so a
    # refusal can name the files whose uncommitted changes differ.
    merged = merge_nodes(records, note=note, store=store_for(records[0][1], root))
    if all(was_sealed_here(m.digest) for _, m in records):
        record_sealed(merged.digest)  # every part was recorded here by this tool
    write_output(dumps(merged), args.output)
    t = merged.command.topology if merged.command else None
    if t is not None:
        sys.stderr.write(f"manifest: merged {len(records)} node record(s): {t.nodes} node(s), "
                         f"world size {t.world_size}, backend {t.backend or 'none'}; "
                         f"run_id {merged.run_id}\n")
    return 0
