"""The part both training-loop callbacks share: a snapshot at the start, a trail per step.

At the start of training the callback seals a snapshot of code, environment
and hardware (what ``manifest capture`` with no command records) and keeps its
``run_id``; then it fingerprints the model's parameters after every
``every``-th optimizer step with the launcher's own fingerprint (blake3 over
each state_dict tensor's name, dtype, shape and raw bytes), so the points
compare with the trail ``manifest capture`` records. Under ``manifest
capture`` the points also land in the capture's process record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.integrations import TAG_DIGEST, TAG_RUN_ID, snapshot_here

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
        self.points: list[tuple[int, str]] = []
        self._trail: Trail | None = None

    @property
    def tags(self) -> dict[str, str]:
        if self.manifest is None:
            return {}
        return {TAG_RUN_ID: self.manifest.run_id, TAG_DIGEST: self.manifest.digest}

    def start(self, model: Any) -> dict[str, str]:
        from manifest.launch.recipe import trail

        if self.snapshot and self.manifest is None:
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
    """What both framework callbacks hold: the recorder, the trail file it wrote, the run_id."""

    def __init__(self, every: int = 1, *, snapshot: bool = True) -> None:
        self.recorder = StepRecorder(every, snapshot=snapshot)
        self.trail_file: str | None = None

    @property
    def points(self) -> list[tuple[int, str]]:
        return self.recorder.live_points()

    @property
    def run_id(self) -> str | None:
        return self.recorder.manifest.run_id if self.recorder.manifest else None
