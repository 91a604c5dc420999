"""The part both training-loop callbacks share: an id at the start, a trail per step.

At the start of training the callback takes the run's id. Under ``manifest
capture`` or a re-run (``verify``, ``explain``, ``lab``) that is the launcher's
``MANIFEST_SEALED_RUN`` (``manifest.launch.runner.launch_identity``: the recorded
code, the command as the manifest records it, secrets redacted, and the seed; the id
``manifest show`` prints as ``launch id``), logged as ``manifest.launch_id``: it is
fixed before the run, the same in the capture and every re-run, and it is not the
run_id, which also covers what the run did (its discovered inputs, the environment
variables it read) and so exists only after it. The callback also leaves a locator of
each tracker it can name (``manifest.integrations._locators``), and once ``capture``
has sealed and written the manifest it tags those tracker runs with the real
``manifest.run_id`` (``manifest.capture.trackers``; MLflow params are immutable, hence a
second key, not a late value for the first; ``gate`` and the re-runs never tag). Run
bare, it seals a snapshot of code, environment and hardware (what ``manifest capture``
with no command records) and logs its ``run_id`` and ``digest``. Then it fingerprints
the model's parameters after every ``every``-th optimizer step with the launcher's own
fingerprint (blake3 over each state_dict tensor's name, dtype, shape and raw bytes), so
the points compare with the trail ``manifest capture`` records. Under ``manifest
capture`` the points also land in the capture's process record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.integrations import TAG_DIGEST, TAG_LAUNCH_ID, TAG_RUN_ID, snapshot_here

if TYPE_CHECKING:
    from manifest.launch.recipe import Trail
    from manifest.models import Manifest


class StepRecorder:
    """Snapshot + step trail for one training run."""

    def __init__(self, every: int = 1, *, snapshot: bool = True) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every
        self.snapshot = snapshot
        self.manifest: Manifest | None = None
        self.sealed: str | None = None
        """The launcher's id of this run (``MANIFEST_SEALED_RUN``), when it runs under one."""
        self.points: list[tuple[int, str]] = []
        self._trail: Trail | None = None

    @property
    def tags(self) -> dict[str, str]:
        if self.sealed is not None:
            return {TAG_LAUNCH_ID: self.sealed}
        if self.manifest is None:
            return {}
        return {TAG_RUN_ID: self.manifest.run_id, TAG_DIGEST: self.manifest.digest}

    @property
    def run_id(self) -> str | None:
        """The run_id a bare run logs (its snapshot's); None under the launcher, where the
        run_id exists only once ``capture`` has sealed the run (see :attr:`launch_id`)."""
        return self.manifest.run_id if self.sealed is None and self.manifest else None

    @property
    def launch_id(self) -> str | None:
        return self.sealed

    def start(self, model: Any) -> dict[str, str]:
        import os

        from manifest.launch.recipe import trail
        from manifest.launch.runner import SEALED_RUN_VAR

        self.sealed = os.environ.get(SEALED_RUN_VAR) or None
        if self.snapshot and self.sealed is None and self.manifest is None:
            self.manifest = snapshot_here()
        self.points = []
        self._trail = trail(model, every=self.every)
        return self.tags

    def stop(self) -> list[tuple[int, str]]:
        if self._trail is not None:
            self._trail.remove()
            self.points = list(self._trail.points)
            self._trail = None
        return self.points

    def live_points(self) -> list[tuple[int, str]]:
        return list(self._trail.points) if self._trail is not None else list(self.points)

    def write(self, directory: str | Path) -> Path:
        """``manifest-trail.json`` in ``directory``: the tags and every (step, digest)."""
        from manifest.store import atomic_write

        path = Path(directory) / "manifest-trail.json"
        doc = {**self.tags, "trail": [{"step": s, "digest": d} for s, d in self.points]}
        atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode())
        return path


class CallbackState:
    """What both framework callbacks hold: the recorder, the trail file it wrote, the ids."""

    def __init__(self, every: int = 1, *, snapshot: bool = True) -> None:
        self.recorder = StepRecorder(every, snapshot=snapshot)
        self.trail_file: str | None = None

    @property
    def points(self) -> list[tuple[int, str]]:
        return self.recorder.live_points()

    @property
    def run_id(self) -> str | None:
        return self.recorder.run_id

    @property
    def launch_id(self) -> str | None:
        return self.recorder.launch_id

    def leave_locators(self, locators: list[dict[str, Any]]) -> None:
        """Under the launcher, where this run's trackers live (``_locators.leave``)."""
        if self.recorder.sealed is not None and locators:
            from manifest.integrations._locators import leave

            leave(locators)
