"""Which executor runs a plan: this machine, every node here at once, or a cluster.

The top of the re-run engine's one direction (plan → workspace → executor → cluster):
:mod:`manifest.rerun.executor` holds the local executor, which the node executor
(:mod:`manifest.rerun.nodes`) and the cluster's remote entrypoint run inside; choosing
among them lives here, above all three, so none of them imports its chooser back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from manifest.rerun.executor import Executor, LocalExecutor

if TYPE_CHECKING:
    from manifest.rerun.plan import RerunPlan


def executor_for(plan: RerunPlan) -> Executor:
    """The executor the plan names: this machine, or a cluster (``--on``, imported lazily)."""
    if plan.cluster is not None:
        from manifest.rerun.cluster import executor_for_cluster

        return executor_for_cluster(plan)
    if plan.nodes:  # a multi-node run, every node here at once (manifest.rerun.nodes)
        from manifest.rerun.nodes import LocalNodesExecutor

        return LocalNodesExecutor(confined=plan.confined, network=plan.network)
    return LocalExecutor(confined=plan.confined, network=plan.network)
