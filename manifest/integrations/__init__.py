"""Hooks into the tools training runs are already logged in: MLflow, Weights & Biases,
Lightning and the Hugging Face Trainer.

Each module imports its library only when called (``import manifest`` and the
CLI never load them) and is tested against the real library, installed as an
optional extra (``pip install 'torch-manifest[mlflow]'`` …):

* :mod:`manifest.integrations.mlflow` and :mod:`manifest.integrations.wandb`
  attach a manifest to a tracked run: the file as an artifact, and its
  ``run_id``, ``digest`` and (after ``manifest verify``) verdict as tags;
* :mod:`manifest.integrations.lightning` (a ``Callback``) and
  :mod:`manifest.integrations.transformers` (a ``TrainerCallback``) record the
  parameter trail at every optimizer step (the same fingerprint the launcher
  records, so ``manifest verify`` can compare them). Under ``manifest capture`` they log
  the run's launch id (``manifest.launch_id``) while it trains and leave a locator of
  each tracker (``_locators``), and once the manifest is sealed the capture tags those
  tracker runs with the real ``manifest.run_id`` and ``manifest.digest``
  (``manifest.capture.trackers``); run bare, they log the run_id of the environment
  snapshot they seal at the start of training.

The tag names are the same everywhere (:data:`TAG_RUN_ID` …), defined with the tagging
in ``manifest.capture.trackers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from manifest.capture.tracker_names import TAG_DIGEST, TAG_LAUNCH_ID, TAG_RUN_ID

if TYPE_CHECKING:
    from manifest.models import Manifest

TAG_VERDICT = "manifest.verdict"
__all__ = ["TAG_DIGEST", "TAG_LAUNCH_ID", "TAG_RUN_ID", "TAG_VERDICT", "manifest_tags",
           "read_manifest", "snapshot_here"]


def read_manifest(path: str | Path) -> Manifest:
    """Load (and digest-check) a manifest file; the project's errors on failure."""
    from manifest.canonical import load_manifest, read_manifest_file

    return load_manifest(read_manifest_file(path))


def manifest_tags(manifest: Manifest, verdict: str | None = None) -> dict[str, str]:
    """The tags every integration attaches: run_id, digest and, when given, the verdict."""
    from manifest.errors import UsageError
    from manifest.judge import Verdict  # the one list of verify's verdicts

    tags = {TAG_RUN_ID: manifest.run_id, TAG_DIGEST: manifest.digest}
    if verdict is not None:
        known = [v.value for v in Verdict]
        if verdict not in known:
            raise UsageError(f"verdict must be one of {', '.join(known)}, not {verdict!r}.")
        tags[TAG_VERDICT] = verdict
    return tags


def snapshot_here(cwd: Path | None = None) -> Manifest:
    """A sealed snapshot of code, environment and hardware (no command), as `capture` does."""
    from manifest.capture.snapshot import capture_snapshot

    return capture_snapshot(cwd or Path.cwd())
