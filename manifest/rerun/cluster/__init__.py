"""Re-run where the run ran: the SLURM, Ray and Kubernetes executors.

Each implements the re-run engine's ``Executor`` (``manifest.rerun.executor``),
so verify, explain and lab only choose one (``--on ray|slurm|k8s``). All three
share one flow (``manifest.rerun.cluster.remote_run``):

1. the workspace the engine built (scratch clone at the recorded commit with
   the stored patch) is written as a content-addressed bundle
   (``manifest.rerun.cluster.bundle``);
2. the bundle is submitted with the remote entrypoint
   (``python -m manifest.rerun.remote``), which checks it on arrival, runs
   the command under the launcher and sends back records and each output's
   tensor table (the checkpoint itself only with ``--fetch-outputs``);
3. the result becomes the same ``LaunchResult`` a local run returns, so the
   verdict is made here by the same comparison as a local re-run.

Each cluster library is imported only when ``--on`` names it; a missing one is
one sentence naming its extra (``pip install 'torch-manifest[ray]'``), exit 2.
Credentials never enter the plan or the bundle: an address is kept without its
user and password, and a full one is taken from the environment
(``RAY_ADDRESS``) at submission.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from manifest.rerun.cluster.options import (
    EXECUTORS,
    REGISTRY,
    ClusterOptions,
    cluster_options,
    default_folder,
    missing_extra,
)

if TYPE_CHECKING:
    from manifest.rerun.executor import Executor
    from manifest.rerun.plan import RerunPlan

__all__ = ["EXECUTORS", "REGISTRY", "ClusterOptions", "cluster_options", "default_folder",
           "executor_for_cluster", "missing_extra"]


def executor_for_cluster(plan: RerunPlan) -> Executor:
    """The cluster executor ``plan.cluster`` names (its library imported here, lazily)."""
    from manifest.errors import UsageError

    options = plan.cluster
    assert options is not None
    problem = missing_extra(options.on)
    if problem is not None:
        raise UsageError(problem)
    module, _, name = REGISTRY[options.on].executor.partition(":")
    executor: Executor = getattr(importlib.import_module(module), name)(options)
    return executor
