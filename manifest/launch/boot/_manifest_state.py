"""The launcher's state in this process: one dict that every launcher module shares.

The launcher is split by hook (``_manifest_launch`` installs them;
``_manifest_switches``, ``_manifest_trail`` and ``_manifest_rng`` are the
pieces they call), and the pieces read and write the same per-process state:
the config, the record written at exit, the step count and the trail points.
It lives here, below all of them, so no piece imports the entry module (that
would be an import cycle) and there is exactly one copy of it per process.

One copy matters because the launcher's modules can be reached under two
names: as top-level modules (``_manifest_launch``: this directory is first on
the child's ``sys.path``) and as ``manifest.launch.boot._manifest_launch``
(the recipe API in a process that was not launched). Every module imports
its siblings top-level first, so in a launched process both routes end at the
same module objects and the recipe API writes into the record the launcher
will write at exit.

Standard library only, like every module of this directory: it is imported
at start-up of every Python process ``manifest capture`` starts.
"""

from __future__ import annotations

from typing import Any

state: dict[str, Any] = {
    "config": None,
    "record": None,
    "trail": [],
    "hooked": set(),
    # Automatic trail: every optimizer step (_manifest_launch._after_optimizer_step).
    "steps": 0,
    "auto_trail": [],
    "ops": None,
    "log": [],
    # Numeric trail (_manifest_trail.numeric_point): loss, norms, projections per step.
    "numeric": [],
    "numeric_failed": False,
    # backward() calls, the last loss, and the graph's leaves: steps where no optimizer steps.
    "backwards": 0,
    "loss": None,
    "leaves": [],
    # (trail points, numeric points) of backward() steps, until an optimizer step shows
    # that the process has one (then they were micro-batches and are dropped).
    "backward_points": ([], []),
    "perturbed": False,
}
