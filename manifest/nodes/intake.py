"""Node records checked as they arrive: the topology as a whole, before anything is sized by it.

A node record is data from another machine, so merge believes none of its claims:
one node-0 record holding every rank of a 2-node world, a record whose
``node`` disagrees with its ranks', two records both claiming node 0, a
record claiming node 99 of 2 would otherwise merge with exit 0, and two records
claiming world size 10^8 would grow memory until killed (a coverage check that
built ``set(range(world_size))``). So every claim is checked against the records
actually given, one record at a time as it is read
(:class:`NodeIntake`), and nothing is ever allocated from a claimed number:

* a record is a node record (``command.topology.node`` set) of ``nodes``
  nodes and ``world_size`` ranks, both at least 1, and the same for every
  record;
* its node index lies in ``[0, nodes)`` and no other record has it;
* it holds at least one rank and no more than the world; every rank lies in
  ``[0, world_size)``, sits on the record's own node, appears once in the
  whole run, and its local rank lies below ``local_world_size`` when that is
  recorded;
* a record whose bytes are those of a record already read is named at once
  (:meth:`NodeIntake.add_bytes`), before it is parsed: 2,000 copies of one
  record stop at the second;
* when all are read (:meth:`NodeIntake.finish`), ``nodes`` is the number of
  records given and ``world_size`` the number of ranks they hold: a claim
  beyond them names the missing ranks (at most 8, found from the ranks held,
  never from ``range(world_size)``).

Each refusal is one sentence, exit 2 (:class:`MergeRefused`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from manifest.errors import InvalidManifestError

if TYPE_CHECKING:
    from manifest.models import Manifest, Topology

SHOWN_MISSING = 8
"""How many missing ranks a refusal names."""


class MergeRefused(InvalidManifestError):
    """Node records that cannot be one run (exit 2)."""


def node_topology(label: str, m: Manifest) -> Topology:
    """The topology of a node record, or a refusal naming what ``label`` is instead."""
    topology = m.command.topology if m.command is not None else None
    if topology is None or topology.node is None:
        what = ("a complete run (its ranks cover the world)" if topology is not None
                else "not a record of a distributed run")
        raise MergeRefused(
            f"{label} is {what}, not a node record.",
            hint="Capture each node with manifest capture -- torchrun --nnodes=N "
                 "--node-rank=i … (or under srun, an Indexed Job or mpirun) and merge those.")
    return topology


def missing_ranks(held: set[int], world: int) -> list[int]:
    """Up to :data:`SHOWN_MISSING` ranks of ``range(world)`` not in ``held``, in order, found
    in time and memory proportional to ``len(held)``, whatever ``world`` claims."""
    out: list[int] = []
    expected = 0
    for rank in sorted(held):
        while expected < min(rank, world) and len(out) < SHOWN_MISSING:
            out.append(expected)
            expected += 1
        if len(out) >= SHOWN_MISSING:
            return out
        expected = rank + 1
    while expected < world and len(out) < SHOWN_MISSING:
        out.append(expected)
        expected += 1
    return out


class NodeIntake:
    """The node records of one merge, checked one by one as they are read (see the module
    docstring); ``given`` is how many records the user passed."""

    def __init__(self, given: int) -> None:
        self.given = given
        self.first: tuple[str, Topology] | None = None
        self.nodes: dict[int, str] = {}
        self.ranks: dict[int, str] = {}
        self.seen_bytes: dict[bytes, str] = {}

    def add_bytes(self, label: str, data: bytes) -> None:
        """Refuse, before parsing, a record whose bytes were already given under another
        name."""
        import hashlib

        key = hashlib.sha256(data).digest()
        other = self.seen_bytes.get(key)
        if other is not None:
            what = "is given twice" if other == label else f"is the same record as {other}"
            raise MergeRefused(f"{label} {what} (its ranks would be in two node records): pass "
                               "each node's record once.")
        self.seen_bytes[key] = label

    def add(self, label: str, m: Manifest) -> Topology:
        """Check one record against itself and the records read before it."""
        t = node_topology(label, m)
        assert t.node is not None
        who = f"{label} (node {t.node})"
        if t.nodes < 1 or t.world_size < 1:
            raise MergeRefused(f"{who} claims {t.nodes} node(s) and world size "
                               f"{t.world_size}: a run has at least one of each.")
        if self.first is not None:
            label0, t0 = self.first
            for name, want, got in (("nodes", t0.nodes, t.nodes),
                                    ("world_size", t0.world_size, t.world_size)):
                if want != got:
                    raise MergeRefused(
                        f"{who} disagrees with {label0} on command.topology.{name} ({got} vs "
                        f"{want}): these node records are not one run, refusing to merge.")
        if t.node >= t.nodes:
            raise MergeRefused(f"{who} claims node {t.node} of {t.nodes}: node indexes lie in "
                               f"[0, {t.nodes}).")
        if not t.ranks:
            raise MergeRefused(f"{who} holds no rank: a node record holds its node's ranks.")
        if len(t.ranks) > t.world_size:
            raise MergeRefused(f"{who} holds {len(t.ranks)} ranks, more than its world size "
                               f"{t.world_size}.")
        if t.local_world_size is not None and len(t.ranks) > t.local_world_size:
            raise MergeRefused(f"{who} holds {len(t.ranks)} ranks, more than the "
                               f"{t.local_world_size} processes per node it records "
                               "(local_world_size).")
        mine: set[int] = set()
        for place in t.ranks:
            if place.node != t.node:
                raise MergeRefused(
                    f"{who} holds rank {place.rank} placed on node {place.node}: a node "
                    "record holds its own node's ranks only, refusing to merge.")
            if place.rank >= t.world_size:
                raise MergeRefused(f"node {t.node} ({label}) has rank {place.rank}, outside "
                                   f"world size {t.world_size}.")
            if (t.local_world_size is not None and place.local_rank is not None
                    and place.local_rank >= t.local_world_size):
                raise MergeRefused(f"{who} has rank {place.rank} at local rank "
                                   f"{place.local_rank}, outside its {t.local_world_size} "
                                   "processes per node.")
            owner = self.ranks.get(place.rank)
            if owner is not None or place.rank in mine:
                raise MergeRefused(
                    f"rank {place.rank} is in two node records ({owner or label} and {label}, "
                    f"node {t.node}): pass each node's record once.")
            mine.add(place.rank)
        other = self.nodes.get(t.node)
        if other is not None:
            raise MergeRefused(f"node {t.node} is claimed by two records ({other} and "
                               f"{label}): pass each node's record once.")
        self.nodes[t.node] = label
        self.ranks.update(dict.fromkeys(mine, label))
        if self.first is None:
            self.first = (label, t)
        return t

    def finish(self) -> None:
        """Once every record is read: the claimed nodes and ranks are the ones given."""
        if self.first is None:
            raise MergeRefused("merge needs at least one node record.")
        _, t0 = self.first
        if len(self.ranks) < t0.world_size or len(self.nodes) < t0.nodes:
            missing = missing_ranks(set(self.ranks), t0.world_size)
            shown = ", ".join(map(str, missing)) + (
                " …" if t0.world_size - len(self.ranks) > len(missing) else "")
            nodes = (f" ({len(self.nodes)} record(s) given for {t0.nodes} nodes)"
                     if len(self.nodes) < t0.nodes else "")
            what = (f"ranks {shown} of world size {t0.world_size} are in none of the node "
                    f"records{nodes}" if missing else
                    f"the records claim {t0.nodes} nodes but {len(self.nodes)} were given")
            raise MergeRefused(f"{what}: merge needs the record of every node.")
