"""Weights & Biases: attach a manifest to a run.

``log_manifest("run.json", verdict="identical")`` logs the file as an artifact
of type ``manifest`` (named after the run_id, its tags as metadata) and puts
``manifest.run_id``, ``manifest.digest`` and ``manifest.verdict`` in the run's
summary and config. Works online and in offline mode (``WANDB_MODE=offline``),
where everything lands in the local run directory for ``wandb sync``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from manifest.integrations import manifest_tags, read_manifest


def artifact_name(run_id: str) -> str:
    """``manifest-<first 16 hex of the run_id>`` (W&B names allow no ':')."""
    return "manifest-" + run_id.split(":", 1)[1][:16]


def log_manifest(
    path: str | Path,
    *,
    verdict: str | None = None,
    pack: str | Path | None = None,
    run: Any | None = None,
) -> dict[str, str]:
    """Log ``path`` (and ``pack``) as an artifact of ``run`` (default: ``wandb.run``)."""
    import wandb

    from manifest.errors import UsageError

    manifest = read_manifest(path)
    tags = manifest_tags(manifest, verdict)
    run = run if run is not None else wandb.run
    if run is None:
        raise UsageError("no active W&B run: call wandb.init() first or pass run=.")
    artifact = wandb.Artifact(artifact_name(manifest.run_id), type="manifest", metadata=tags)
    artifact.add_file(str(path), name="manifest.json")
    if pack is not None:
        artifact.add_file(str(pack), name=Path(pack).name)
    run.log_artifact(artifact)
    run.summary.update(tags)
    run.config.update(tags, allow_val_change=True)
    return tags
