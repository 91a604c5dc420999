"""``manifest capture --nodes DIR``: a multi-node capture that merges itself.

Run on every node of a multi-node run (under torchrun, srun or an Indexed
Job), each capture writes its node record into ``DIR``, a directory every
node sees (a shared filesystem), as ``node-<i>.json``; then:

* the capture that finds every node's record present takes the merge
  (``DIR/.merging``, created exclusively, so one node merges however many
  finish at once: in practice the last to arrive) and writes
  ``DIR/run.json`` with ``manifest.nodes.merge.merge_nodes``, the same
  order-free merge as ``manifest merge``;
* the others wait for ``run.json``;
* a node that never arrives is named after the timeout (``--nodes-timeout``,
  default 10 minutes) by every node still waiting, with the command that
  merges by hand once it does.

Polling, not inotify: shared filesystems (NFS, Lustre) do not deliver change
events from another client. Each look is one ``listdir`` of ``DIR`` per node
(plus a ``stat`` of each record it lists), and a node waits a tenth of the
time it has waited so far before it looks again (at least 10 ms, at most
0.5 s, :func:`poll_interval`). Nodes of one job finish within a second of
each other, and a fixed 0.5 s poll left the node that finished first waiting
up to 0.5 s past the merge: ~4% of a 13 s two-node job
(``benchmarks/nodes_overhead.py``). A node still waiting after 5 s looks
twice a second, as before.

A ``DIR`` that already holds a merged ``run.json`` is refused before the
command runs: records of two launches must never meet in one merge. A
``run.json`` that appears while a node waits is taken only when it is, byte
for byte (by digest), the merge of that node's own record, as the node holds
it in memory, with the other nodes' records in the directory: the waiting node
merges them again (``merge_nodes`` is order-free and deterministic, so the
same records give the same digest) and compares. A listed digest is not
enough. The merge names the digest of every record it was made from
(``observed.node_records``), but that list is outside the run's identity and
anyone who can read ``node-0.json`` can copy it: another run's merge (seed 99)
re-sealed with node 0's digest in its list would pass a check of the list, and
without any check a ``run.json`` dropped into the directory while node 0 waits
for node 1 would be taken. Each is refused with one sentence
(:class:`ForeignMerge`, exit 2). The cost is
one more merge on each waiting node: 64 records of 512 ranks merge in 172 ms
on a 2-core machine (``test_merge_64_synthetic_node_records_timed`` in
``tests/test_nodes.py``). Nodes that run different manifest versions could
merge to other bytes; that is refused the same way, and the hint gives the
``manifest merge`` line that merges by hand.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from manifest.errors import InvalidManifestError, ManifestError, NoVerdictError, UsageError
from manifest.models import Manifest

MERGED = "run.json"
LOCK = ".merging"
POLL_S = 0.5
"""The longest wait between two looks at the directory."""
POLL_MIN_S = 0.01
POLL_SHARE = 0.1
"""Each wait is this share of the time waited so far (between the two bounds)."""
DEFAULT_TIMEOUT_S = 600.0


class NodesMissing(NoVerdictError):
    """Some node's record never arrived in the shared directory (no merged manifest)."""


class ForeignMerge(InvalidManifestError):
    """The ``run.json`` in the shared directory is not this launch's merge (exit 2)."""


@dataclass(frozen=True)
class Gathered:
    """What one node's capture did with the shared directory."""

    record: Path
    merged: Path
    merged_here: bool
    """This node took the merge (the others found ``run.json`` written)."""
    run_id: str


def record_name(node: int) -> str:
    return f"node-{node}.json"


def check_directory(directory: Path) -> None:
    """Refuse, before anything runs, a directory that cannot take this launch's records."""
    if not directory.is_dir():
        raise UsageError(f"--nodes {directory}: no such directory (create it on the shared "
                         "filesystem every node sees).")
    if (directory / MERGED).exists():
        raise UsageError(f"--nodes {directory} already holds a merged run ({MERGED}): use an "
                         "empty directory for each launch.")


def _read(path: Path) -> Manifest:
    from manifest.canonical import load_manifest, read_manifest_file

    return load_manifest(read_manifest_file(str(path)))


def take_merge(merged: Path, record: Manifest, node: int, nodes: int) -> Manifest:
    """The merge another node wrote, if it is exactly the merge of ``record`` with the other
    records in the directory (see the module docstring); else a refusal."""
    from manifest.nodes.merge import merge_nodes

    directory = merged.parent
    came = f"--nodes {directory}: {MERGED} appeared while node {node} waited"
    hint = _BY_HAND.format(directory=directory)
    try:
        run = _read(merged)
    except ManifestError as exc:
        raise ForeignMerge(f"{came}, and it is not a manifest this launch's merge could write "
                           f"({exc.message.rstrip('.')}).", hint=hint) from None
    if record.digest not in (run.observed.node_records or []):
        raise ForeignMerge(
            f"{came}, but it does not hold node {node}'s record ({record.digest}): it is "
            "another merge's, refusing to take it as this launch's.", hint=hint)
    missing = [i for i in range(nodes) if i != node and not (directory / record_name(i))
               .is_file()]
    if missing:
        raise ForeignMerge(
            f"{came} before the record of node {missing[0]} did, so no node of this launch "
            "merged it: refusing to take it as this launch's.", hint=hint)
    try:
        # This node's record as it holds it, not as node-<i>.json now reads: the file is in
        # a directory other writers reach.
        parts = [(record_name(i), record if i == node else _read(directory / record_name(i)))
                 for i in range(nodes)]
        again = merge_nodes(parts)
    except ManifestError as exc:
        raise ForeignMerge(f"{came}, and the records beside it do not merge "
                           f"({exc.message.rstrip('.')}): refusing to take it as this "
                           "launch's.", hint=hint) from None
    if again.digest != run.digest:
        raise ForeignMerge(
            f"{came}, and it lists node {node}'s record but is not the merge of this launch's "
            f"records (merging them gives {again.digest}, it is {run.digest}): refusing to "
            "take it as this launch's.", hint=hint)
    return run


_BY_HAND = ("Use an empty directory for each launch that no other job writes to; this "
            "launch's records can be merged by hand: manifest merge {directory}/node-*.json "
            "-o merged.json")


def _present(directory: Path, nodes: int, listed: set[str]) -> list[int]:
    return [i for i in range(nodes)
            if record_name(i) in listed and (directory / record_name(i)).is_file()]


def _listing(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:  # gone or unreadable for a moment: the next look tells
        return set()


def poll_interval(waited_s: float) -> float:
    """Seconds to sleep before the next look, having waited ``waited_s`` (module docstring)."""
    return min(POLL_S, max(POLL_MIN_S, waited_s * POLL_SHARE))


def gather(record: Manifest, directory: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
           note: Callable[[str], None] | None = None) -> Gathered:
    """Write this node's ``record`` into ``directory``; the node that completes the set merges.
    Raises :class:`NodesMissing` naming the nodes whose records did not arrive in time."""
    from manifest.canonical import dumps
    from manifest.nodes.merge import merge_nodes
    from manifest.store import atomic_write
    from manifest.trust import record_sealed, was_sealed_here

    say = note or (lambda _text: None)
    topology = record.command.topology if record.command is not None else None
    if topology is None:
        raise UsageError("--nodes: the command is not a distributed run (no launcher placed "
                         "its processes), so there are no node records to merge.")
    node = topology.node if topology.node is not None else 0
    nodes = topology.nodes
    mine = directory / record_name(node)
    if mine.exists():
        raise UsageError(f"--nodes {directory} already holds {mine.name}: another launch's "
                         "record; use an empty directory for each launch.")
    atomic_write(mine, dumps(record))
    merged = directory / MERGED
    since = time.monotonic()
    deadline = since + timeout_s
    while True:
        listed = _listing(directory)
        if MERGED in listed and merged.is_file():
            return Gathered(mine, merged, False,
                            take_merge(merged, record, node, nodes).run_id)
        present = _present(directory, nodes, listed)
        if len(present) == nodes:
            try:
                fd = os.open(directory / LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                pass  # another node is merging: wait for its run.json
            else:
                os.close(fd)
                try:
                    parts = [(record_name(i), _read(directory / record_name(i)))
                             for i in range(nodes)]
                    run = merge_nodes(parts, note=say)
                except ManifestError:
                    (directory / LOCK).unlink(missing_ok=True)
                    raise
                if all(was_sealed_here(m.digest) for _, m in parts):
                    record_sealed(run.digest)
                atomic_write(merged, dumps(run))
                (directory / LOCK).unlink(missing_ok=True)
                return Gathered(mine, merged, True, run.run_id)
        if time.monotonic() > deadline:
            missing = sorted(set(range(nodes)) - set(present))
            who = (", ".join(f"node {i}" for i in missing) if missing
                   else "none (every record is here, but the node merging them did not finish)")
            raise NodesMissing(
                f"--nodes {directory}: after {timeout_s:g} s the record of {who} of {nodes} "
                f"has not arrived; node {node}'s record is {mine}.",
                hint=f"Once every node's record is there: manifest merge {directory}/node-*.json "
                     f"-o {merged}")
        time.sleep(poll_interval(time.monotonic() - since))
