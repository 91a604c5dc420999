"""MLflow integration against the real library, with a local file-store tracking URI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from manifest.canonical import load_manifest
from manifest.errors import UsageError

mlflow = pytest.importorskip("mlflow")

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


@pytest.fixture
def tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # The local file store (mlflow 3 keeps it behind this switch; a database
    # backend would need SQLAlchemy, which mlflow-skinny leaves out).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri("")


def test_manifest_is_an_artifact_and_its_names_are_tags(tracking: str, tmp_path: Path) -> None:
    from manifest.integrations.mlflow import log_manifest

    manifest = load_manifest(GOLDEN.read_bytes())
    pack = tmp_path / "run.mfpack"
    pack.write_bytes(b"pack bytes")
    with mlflow.start_run() as run:
        tags = log_manifest(GOLDEN, verdict="identical", pack=pack)
    assert tags == {"manifest.run_id": manifest.run_id, "manifest.digest": manifest.digest,
                    "manifest.verdict": "identical"}
    # Read back through a fresh client, as the UI would.
    stored = mlflow.MlflowClient(tracking_uri=tracking).get_run(run.info.run_id)
    assert stored.data.tags["manifest.run_id"] == manifest.run_id
    assert stored.data.tags["manifest.digest"] == manifest.digest
    assert stored.data.tags["manifest.verdict"] == "identical"
    names = {a.path for a in mlflow.MlflowClient(tracking_uri=tracking)
             .list_artifacts(run.info.run_id, "manifest")}
    assert names == {"manifest/manifest_v1.json", "manifest/run.mfpack"}
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id,
                                                artifact_path="manifest/manifest_v1.json",
                                                dst_path=str(tmp_path / "dl"))
    assert Path(local).read_bytes() == GOLDEN.read_bytes()


def test_without_an_active_run_is_a_sentence(tracking: str) -> None:
    from manifest.integrations.mlflow import log_manifest

    with pytest.raises(UsageError, match="no active MLflow run"):
        log_manifest(GOLDEN)


def test_a_tampered_manifest_is_not_logged(tracking: str, tmp_path: Path) -> None:
    from manifest.errors import TamperedManifestError
    from manifest.integrations.mlflow import log_manifest

    bad = tmp_path / "bad.json"
    bad.write_bytes(GOLDEN.read_bytes().replace(b'"tool_version":"', b'"tool_version":"x', 1))
    with pytest.raises(TamperedManifestError):
        log_manifest(bad)
