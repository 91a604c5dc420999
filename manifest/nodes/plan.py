"""A re-run plan's node launches: how verify re-runs a multi-node run on this machine.

Called by ``manifest.rerun.plan.plan_from_manifest`` for every plan, and returns
what the plan changes, never the plan itself: the node layout is owned here and this
module imports nothing of the re-run engine above it. For a local plan:
a manifest without a topology, or one of a single node re-run on its own
layout, keeps its plan as it was (one command); a merged multi-node run, or
``--layout NxP`` on any torchrun run, gets one torchrun per node meeting on
``127.0.0.1`` (``manifest.nodes.layout.local_launches``), which the plan
lists and ``manifest.rerun.nodes.LocalNodesExecutor`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from manifest.errors import UsageError

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.nodes.layout import Layout


@dataclass(frozen=True)
class NodeRun:
    """One node's launch of a multi-node re-run on this machine (``manifest.rerun.nodes``)."""

    node: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class NodeLaunches:
    """What a plan of a multi-node run changes: one launch per node here (``nodes``), or
    the one command every cluster node runs (``argv``), and the layout it runs on."""

    layout: str
    nodes: tuple[NodeRun, ...] = ()
    argv: tuple[str, ...] = ()
    placed: tuple[int, int] | None = None
    """Cluster: (nodes, processes per node) the executor places."""


def _layout_to_run(recorded: Manifest, layout_text: str | None, also: str) -> Layout | None:
    """The layout a re-run of ``recorded`` takes (``--layout`` or the recorded one); None
    for a run of one node on its own layout. A node record, not the whole run, is refused."""
    from manifest.nodes.layout import layout_of, parse_layout

    topology = recorded.command.topology if recorded.command is not None else None
    if layout_text is None and (topology is None or topology.nodes <= 1):
        return None
    if topology is None:
        raise UsageError("--layout: the recorded run is not a distributed run (no "
                         "command.topology), so it has no layout to change.")
    if topology.node is not None:
        raise UsageError(
            f"this is the node record of node {topology.node} of {topology.nodes}, not the "
            "whole run: a re-run needs every node.",
            hint=f"Merge the node records first: manifest merge NODE.json… > run.json{also}.")
    return parse_layout(layout_text) if layout_text is not None else layout_of(topology)


def node_runs(argv: list[str], recorded: Manifest, layout_text: str | None
              ) -> NodeLaunches | None:
    """One torchrun per node on this machine, meeting on 127.0.0.1; None when the plan
    keeps its one command."""
    from manifest.nodes.layout import free_port, local_launches

    layout = _layout_to_run(recorded, layout_text, "")
    if layout is None:
        return None
    launches = local_launches(argv, layout, free_port())
    return NodeLaunches(str(layout),
                        nodes=tuple(NodeRun(i, tuple(a)) for i, a in enumerate(launches)))


def cluster_node_runs(argv: list[str], recorded: Manifest, layout_text: str | None
                      ) -> NodeLaunches | None:
    """A cluster plan (``--on ray|slurm|k8s``) of a multi-node run, or of ``--layout NxP``:
    one torchrun command for every node (``manifest.nodes.layout.cluster_launch``: no node
    rank, no endpoint; each node gets them where it runs), and the node count the
    executor places. A run of one node, on its own layout, keeps its plan."""
    from manifest.nodes.layout import cluster_launch

    layout = _layout_to_run(recorded, layout_text, ", or capture with --nodes DIR")
    if layout is None:
        return None
    return NodeLaunches(str(layout), argv=tuple(cluster_launch(argv, layout)),
                        placed=(layout.nodes, layout.per_node))
