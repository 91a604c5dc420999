"""MLflow: attach a manifest to a tracked run.

``log_manifest("run.json", verdict="identical")`` logs the file as an artifact
under ``manifest/`` and sets ``manifest.run_id``, ``manifest.digest`` and
``manifest.verdict`` as tags of the active run (or of ``mlflow_run_id``), so a
run in the MLflow UI names exactly what was trained and whether it reproduced.
A pack (``manifest pack``) can go beside it with ``pack=``. The manifest's
digest is checked before anything is logged.
"""

from __future__ import annotations

from pathlib import Path

from manifest.integrations import manifest_tags, read_manifest


def log_manifest(
    path: str | Path,
    *,
    verdict: str | None = None,
    pack: str | Path | None = None,
    mlflow_run_id: str | None = None,
) -> dict[str, str]:
    """Log ``path`` (and ``pack``) as artifacts and the manifest's tags; returns the tags."""
    import mlflow

    from manifest.errors import UsageError

    tags = manifest_tags(read_manifest(path), verdict)
    if mlflow_run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise UsageError("no active MLflow run: call inside `with mlflow.start_run():` "
                             "or pass mlflow_run_id.")
        mlflow_run_id = active.info.run_id
    client = mlflow.MlflowClient()
    client.log_artifact(mlflow_run_id, str(path), artifact_path="manifest")
    if pack is not None:
        client.log_artifact(mlflow_run_id, str(pack), artifact_path="manifest")
    for key, value in tags.items():
        client.set_tag(mlflow_run_id, key, value)
    return tags
