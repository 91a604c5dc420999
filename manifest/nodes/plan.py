"""A re-run plan's node launches: how verify re-runs a multi-node run on this machine.

Called by ``manifest.rerun.plan.plan_from_manifest`` for every local plan:
a manifest without a topology, or one of a single node re-run on its own
layout, keeps its plan as it was (one command); a merged multi-node run, or
``--layout NxP`` on any torchrun run, gets one torchrun per node meeting on
``127.0.0.1`` (``manifest.nodes.layout.local_launches``), which the plan
lists and ``manifest.rerun.nodes.LocalNodesExecutor`` runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from manifest.errors import UsageError

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.rerun.plan import RerunPlan


def node_runs(plan: RerunPlan, recorded: Manifest, layout_text: str | None) -> RerunPlan:
    from manifest.nodes.layout import free_port, layout_of, local_launches, parse_layout
    from manifest.rerun.plan import NodeRun

    topology = recorded.command.topology if recorded.command is not None else None
    if layout_text is None and (topology is None or topology.nodes <= 1):
        return plan
    if topology is None:
        raise UsageError("--layout: the recorded run is not a distributed run (no "
                         "command.topology), so it has no layout to change.")
    if topology.node is not None:
        raise UsageError(
            f"this is the node record of node {topology.node} of {topology.nodes}, not the "
            "whole run: a re-run needs every node.",
            hint="Merge the node records first: manifest merge NODE.json… > run.json.")
    layout = parse_layout(layout_text) if layout_text is not None else layout_of(topology)
    launches = local_launches(list(plan.argv), layout, free_port())
    return replace(plan, nodes=tuple(NodeRun(i, tuple(a)) for i, a in enumerate(launches)),
                   layout=str(layout))
