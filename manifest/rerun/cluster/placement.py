"""Multi-node placement on a cluster: one job per recorded node, one result for the verdict.

A merged multi-node run (``manifest merge``, or ``manifest capture --nodes``)
is re-run the way it ran: one torchrun per node, each on its own node of
the cluster, meeting at node 0. The plan holds one command for every node
(``manifest.nodes.layout.cluster_launch``); the engine places the nodes and
each node's launch gets its node rank and node 0's endpoint where it runs
(``manifest.nodes.layout.node_env``):

* Ray: a placement group with one bundle per node, ``STRICT_SPREAD`` (no two
  on one Ray node), and one task per bundle (``manifest.rerun.cluster.ray_nodes``);
* SLURM: one job of ``nodes=N``, ``tasks_per_node=1`` through submitit, the
  endpoint on the job's first node (``manifest.rerun.cluster.slurm``).

Each node's remote entrypoint (``manifest.rerun.remote``) checks the same
bundle on arrival and returns its own result; :func:`combine_results` makes
them one result, as the local nodes executor's one records directory is one
run: every rank's records, op streams and files opened, each output from the
node that wrote it. The verdict is then the same topology-aware one as a
local re-run.

Nodes must reach each other, so a multi-node bundle asks for the network
where the host confines the run (bubblewrap would give each node a network
namespace of its own); the plan and the report say so.

:func:`shortfall` is what says, before anything is submitted, that a cluster
cannot place the recorded layout (too few nodes with the CPUs or GPUs one
node needs), from the engine's own view of its nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeNeed:
    """What each node of the re-run needs, and how many such nodes."""

    nodes: int
    cpus: int
    gpus: int

    def __str__(self) -> str:
        each = f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}" + (
            f" and {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else "")
        if self.nodes == 1:
            return f"one node with {each}"
        return f"{self.nodes} distinct nodes with {each} each"


def need_of(topology: dict[str, Any] | None, threads: int) -> NodeNeed:
    """The recorded layout as a placement request: N nodes, each with the run's thread
    count in CPUs and its GPUs per node."""
    topology = topology or {}
    nodes = int(topology.get("nodes") or 1)
    gpus = int(topology.get("gpus") or 0)
    per_node_gpus = -(-gpus // nodes) if gpus else 0
    return NodeNeed(nodes=nodes, cpus=max(1, int(threads)), gpus=per_node_gpus)


def shortfall(need: NodeNeed, free: Sequence[tuple[str, float, float]]) -> str | None:
    """None when ``free`` (name, CPUs, GPUs of each alive node) can hold ``need``, else the
    sentence that says why not."""
    fit = [name for name, cpus, gpus in free if cpus >= need.cpus and gpus >= need.gpus]
    if len(fit) >= need.nodes:
        return None
    seen = ", ".join(f"{name} ({cpus:g} CPU{'' if cpus == 1 else 's'}"
                     + (f", {gpus:g} GPU{'' if gpus == 1 else 's'}" if gpus else "") + ")"
                     for name, cpus, gpus in free) or "no alive node"
    return (f"the recorded layout needs {need}; the cluster has {len(fit)} such node"
            f"{'' if len(fit) == 1 else 's'} ({seen})")


def combine_results(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One remote result from each node's (in node order): what a single result would hold
    had every node written into one records directory."""
    if len(docs) == 1:
        return dict(docs[0])
    refused = [(i, d) for i, d in enumerate(docs) if "refused" in d]
    if refused:
        i, doc = refused[0]
        return {**doc, "refused": f"node {i}: {doc['refused']}"}
    first = docs[0]
    failed = [d for d in docs if int(d["exit_code"]) != 0]
    artifacts: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for artifact in doc["artifacts"]:
            artifacts.setdefault(artifact["path"], artifact)
    missing = sorted(set.intersection(*(set(d["missing"]) for d in docs)))
    writable: list[dict[str, str]] = []
    for i in range(max(len(d["writable"]) for d in docs)):
        merged: dict[str, str] = {}
        for doc in docs:
            if i < len(doc["writable"]):
                for rel, data in doc["writable"][i].items():
                    merged.setdefault(rel, data)
        writable.append(merged)
    confinements = list(dict.fromkeys(str(d.get("confinement")) for d in docs))
    return {
        **first,
        "exit_code": int(failed[0]["exit_code"]) if failed else 0,
        "records": [r for d in docs for r in d["records"]],
        "env": first["env"],
        "op_streams": {k: v for d in docs for k, v in d["op_streams"].items()},
        "opened": {k: v for d in docs for k, v in d["opened"].items()},
        "modules": sorted({m for d in docs for m in d["modules"]}),
        "started_ns": min(int(d["started_ns"]) for d in docs),
        "outside": [o for d in docs for o in d["outside"]],
        "workers": sum(int(d["workers"]) for d in docs),
        "artifacts": [artifacts[p] for p in sorted(artifacts)],
        "missing": missing,
        "writable": writable,
        "outputs": {k: v for d in docs for k, v in (d.get("outputs") or {}).items()},
        "confinement": confinements[0] if len(confinements) == 1 else "; ".join(
            f"node {i}: {c}" for i, c in enumerate(str(d.get("confinement")) for d in docs)),
        "nodes": len(docs),
        **({"probes": [d.get("probe") for d in docs]}
           if all(d.get("probe") for d in docs) else {}),
        **({"environments": [d.get("environment") or {} for d in docs]}
           if any(d.get("environment") for d in docs) else {}),
    }
