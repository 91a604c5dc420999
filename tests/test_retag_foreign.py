"""Capture tags only the tracker runs its own run created or logged to (issue 49, class 6).

A locator is the run's own output and can name any MLflow run the machine reaches. A real
MLflow file store outside the tree holds another project's run, tagged with that
project's ``manifest.run_id``; a script under ``manifest capture`` leaves a locator naming
it. Its tag must be unchanged, whether or not the user named that store; the control is a
run the script itself starts in the same store, which is tagged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import make_repo, manifest_cli

LEAVES = """
import json, os, sys
from pathlib import Path
record = sys.modules["_manifest_state"].state["record"]
locators = json.loads(os.environ["LOCATORS"])
if os.environ.get("START_OWN"):
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=os.environ["STORE"])
    run = client.create_run(client.get_experiment_by_name("shared").experiment_id)
    client.log_metric(run.info.run_id, "loss", 0.5)
    locators.append({"kind": "mlflow", "tracking_uri": os.environ["STORE"],
                     "run_id": run.info.run_id})
    Path("own.txt").write_text(run.info.run_id)
record["trackers"] = locators
Path("out").mkdir(exist_ok=True)
Path("out/w.txt").write_text("done")
"""

THEIRS = "blake3:" + "ab" * 32


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_another_projects_mlflow_run_keeps_its_tag(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = (tmp_path / "shared-mlruns").as_uri()
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("shared")
    theirs = client.create_run(experiment).info.run_id
    client.set_tag(theirs, "manifest.run_id", THEIRS)
    client.set_terminated(theirs)
    repo = make_repo(tmp_path / "repo", {"leaves.py": LEAVES, ".gitignore": "own.txt\n"},
                     example=False)
    foreign = [{"kind": "mlflow", "tracking_uri": store, "run_id": theirs}]
    base = {"LOCATORS": json.dumps(foreign), "STORE": store, "MLFLOW_ALLOW_FILE_STORE": "true"}

    def capture(**env: str) -> str:
        cap = manifest_cli("capture", "--artifact", "out/w.txt", "-o", "run.json", "--",
                           "python", "leaves.py", cwd=repo, env={**base, **env}, timeout=300)
        err = cap.stderr.decode()
        assert cap.returncode == 0, err
        assert "Traceback" not in err
        return err

    # The store not named by the user: a note naming it, nothing written.
    err = capture()
    assert f"MLflow run {theirs} at {store} not tagged: its store is outside" in err, err
    assert client.get_run(theirs).data.tags["manifest.run_id"] == THEIRS
    # The user named the store, but the run was neither started nor logged to here.
    err = capture(MLFLOW_TRACKING_URI=store)
    assert f"MLflow run {theirs} at {store} not tagged: it was neither started" in err, err
    assert client.get_run(theirs).data.tags["manifest.run_id"] == THEIRS
    # The positive control: the run this capture's script started in the same named store
    # is tagged with the run_id; the other project's still is not.
    err = capture(MLFLOW_TRACKING_URI=store, START_OWN="1")
    own = (repo / "own.txt").read_text()
    run_id = json.loads((repo / "run.json").read_text())["run_id"]
    assert f"tagged MLflow run {own}" in err, err
    assert client.get_run(own).data.tags["manifest.run_id"] == run_id
    assert client.get_run(theirs).data.tags["manifest.run_id"] == THEIRS
