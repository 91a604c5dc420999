"""Executors: where a planned re-run's processes actually run.

An executor takes a plan (``manifest.rerun.plan``), a workspace
(``manifest.rerun.workspace``), the launcher settings of this one run (a verb
may run the plan several times with overrides: explain's two thread counts,
lab's two switch sets, an op window) and returns the launcher's records
(``LaunchResult``: exit status, per-process records, op streams, files
opened). verify, explain and lab only ever talk to this interface, so a
cluster executor (SLURM, Ray, Kubernetes) is one more class here and no
change in them: ``--on ray|slurm|k8s`` picks one of ``manifest.rerun.cluster``.

Two local executors, chosen by the plan:

* **confined** (``local-confined``): bubblewrap (``manifest.rerun.sandbox``):
  the system read-only, the tree the only writable place (mounted at the
  repository's path), inputs read-only, private ``/tmp``, no network unless
  asked; ``--die-with-parent`` and a PID namespace take every process down
  with the verb;
* **unconfined** (``local-unconfined``): chosen with ``--no-sandbox`` or when
  bubblewrap cannot run here, and reported as such. The command runs under
  a keeper (``manifest/rerun/_guard.py``) that the kernel signals when the
  verb dies (parent-death signal) and that kills the command's process group
  and every descendant, so a ``kill -9`` of verify no longer leaves a
  training running with nobody to own it.

Directories the verb itself reads back after a run (explain's op streams,
lab's audit) are passed as ``writable``: bound read-write into the sandbox.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchResult, LaunchSettings
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace

GUARD = Path(__file__).resolve().parent / "_guard.py"


class Executor(Protocol):
    """Runs one run of a plan in a workspace; returns the launcher's records."""

    @property
    def name(self) -> str: ...

    def run(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
            env: dict[str, str], *, writable: Sequence[Path] = ()) -> LaunchResult: ...


@dataclass(frozen=True)
class LocalExecutor:
    """This machine: confined by bubblewrap, or unconfined under the guard."""

    confined: bool
    network: bool = False

    @property
    def name(self) -> str:
        return "local-confined" if self.confined else "local-unconfined"

    def run(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
            env: dict[str, str], *, writable: Sequence[Path] = ()) -> LaunchResult:
        from manifest.launch.runner import run_under_launcher
        from manifest.rerun.environment import argv_to_run

        argv = argv_to_run(plan.argv)
        if self.confined:
            from manifest.rerun.sandbox import SandboxSpec, wrap

            cwd_inside = workspace.mount_at / workspace.cwd.relative_to(workspace.tree)
            extra = list(writable)

            def confine(command: list[str], records: Path) -> list[str]:
                spec = SandboxSpec(workspace.tree, workspace.mount_at,
                                   list(workspace.ro_binds), [*extra, records], self.network)
                return wrap(spec, command, cwd_inside)

            return run_under_launcher(argv, workspace.cwd, settings, base_env=env, wrap=confine)

        def guard(command: list[str], records: Path) -> list[str]:
            del records
            return [sys.executable, "-I", "-S", str(GUARD), "--", *command]

        return run_under_launcher(argv, workspace.cwd, settings, base_env=env, wrap=guard)


def confined_hint(plan: RerunPlan) -> str:
    """What a failed re-run's reason adds when it ran confined (every verb says the same:
    a write to the home directory or a download fails there, and it is not the code)."""
    if not plan.confined:
        return ""
    return (" (the run was confined: the system read-only outside "
            + ("your tree" if plan.in_place else "the scratch tree")
            + ("" if plan.network else ", no network")
            + "; --no-sandbox runs it unconfined)")
