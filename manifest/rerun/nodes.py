"""The local nodes executor: a multi-node run's node launches, together, on this machine.

A merged multi-node manifest (``manifest merge``), or any torchrun run that
verify is asked to re-run on another layout (``--layout NxP``), is re-run as
one torchrun per node on ``127.0.0.1``, each with its node rank and the
rendezvous pointed at a port free here (``manifest.nodes.layout``); the plan
lists every node's command before anything runs.

The launches start together from one small shell script, inside one
sandbox (or one keeper, unconfined), for two reasons: bubblewrap gives each
sandbox its own network namespace, so two sandboxes could not meet on
``127.0.0.1``; and every process writes its record into the same records
directory, so the result is one ``LaunchResult`` whose ranks span the nodes,
recorded exactly like a capture, with nothing for verify to merge. The
script waits for every node and exits with the first failure's status.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchResult, LaunchSettings
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace


def launch_script(launches: Sequence[Sequence[str]]) -> str:
    """A POSIX shell script that starts every launch, waits for all, and exits with the
    first non-zero status (0 when all succeed)."""
    lines = []
    for i, argv in enumerate(launches):
        lines.append(f"{' '.join(shlex.quote(a) for a in argv)} & p{i}=$!")
    lines.append("s=0")
    for i in range(len(launches)):
        lines.append(f'wait "$p{i}"; r=$?; [ "$s" -eq 0 ] && s=$r')
    lines.append('exit "$s"')
    return "\n".join(lines)


@dataclass(frozen=True)
class LocalNodesExecutor:
    """Every node of the plan (``plan.nodes``) on this machine, confined like a local run."""

    confined: bool
    network: bool = False

    @property
    def name(self) -> str:
        return "local-nodes-confined" if self.confined else "local-nodes-unconfined"

    def run(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
            env: dict[str, str], *, writable: Sequence[Path] = ()) -> LaunchResult:
        from manifest.rerun.environment import argv_to_run
        from manifest.rerun.executor import LocalExecutor

        launches = [argv_to_run(list(node.argv)) for node in plan.nodes]
        script = ("sh", "-c", launch_script(launches))
        return LocalExecutor(confined=self.confined, network=self.network).run(
            replace(plan, argv=script, nodes=()), workspace, settings, env, writable=writable)
