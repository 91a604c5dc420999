"""Re-runs write where the script writes (issue 32).

* A default Lightning ``Trainer`` (default logger, default checkpointing) captured
  with its checkpoint as the artifact verifies ``identical``: the scratch tree
  holds no directory the recorded run did not find at start, so the logger picks
  the same ``version_N`` directory; where it cannot (the user's tree already had
  ``version_0``), the output is matched by what the run wrote.
* ``ManifestCallback`` logs one launch id in the captured run and in its re-run.
* The Hugging Face Trainer's ``output_dir/checkpoint-N`` verifies too.

Real libraries, tiny models, CPU, no network.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from manifest.verify.rerun import match_outputs
from tests.runs import make_repo, manifest_cli
from tests.tiny_trainers import hf_script, lightning_script

LIGHTNING = lightning_script(rows=20, steps=10)

HF = hf_script(steps=4, saving='save_strategy="steps", save_steps=4')


def _capture(repo: Path, artifact: str, script: str) -> tuple[Path, dict[str, Any]]:
    proc = manifest_cli("capture", "--artifact", artifact, "--", "python", script, cwd=repo,
                        timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    path = repo / "run.json"
    path.write_bytes(proc.stdout)
    return path, json.loads(proc.stdout)


def _verify(repo: Path, manifest: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(manifest), "--json", *args, cwd=repo, timeout=600)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr.decode()


def _logged_run_id(log_dir: Path) -> str:
    """The manifest.launch_id that ManifestCallback logged as a hyperparameter."""
    for line in (log_dir / "hparams.yaml").read_text().splitlines():
        if line.startswith("manifest.launch_id:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no manifest.launch_id in {log_dir / 'hparams.yaml'}")


GUIDE_GLOB = "lightning_logs/version_*/checkpoints/*.ckpt"
"""The artifact docs/guides/integrations.md gives a default Lightning Trainer."""


@pytest.mark.slow
def test_the_guides_lightning_glob_survives_a_second_capture(tmp_path: Path) -> None:
    """Issue 39: the guide's ``version_0`` glob failed on the second capture in one tree
    (Lightning then writes ``version_1``). The guide's glob takes whichever version this run
    wrote; the earlier capture's checkpoint, unchanged, is left out as not this run's."""
    pytest.importorskip("lightning")
    guide = (Path(__file__).parents[1] / "docs" / "guides" / "integrations.md").read_text()
    assert f"--artifact '{GUIDE_GLOB}'" in guide
    repo = make_repo(tmp_path / "repo", {"fit.py": LIGHTNING, ".gitignore": (
        "out/\n*.json\nlightning_logs/\n")}, example=False)
    _, first = _capture(repo, GUIDE_GLOB, "fit.py")
    assert [a["path"] for a in first["outputs"]["artifacts"]] == [
        "lightning_logs/version_0/checkpoints/epoch=1-step=10.ckpt"]
    # The positive control: the glob the guide gave before fails the second capture.
    proc = manifest_cli("capture", "--artifact", "lightning_logs/version_0/checkpoints/*.ckpt",
                        "--", "python", "fit.py", cwd=repo, timeout=600)
    assert proc.returncode != 0 and b"left by an earlier run" in proc.stderr
    manifest, third = _capture(repo, GUIDE_GLOB, "fit.py")
    assert [a["path"] for a in third["outputs"]["artifacts"]] == [
        "lightning_logs/version_2/checkpoints/epoch=1-step=10.ckpt"]
    code, report, stderr = _verify(repo, manifest)
    assert (code, report.get("verdict")) == (0, "identical"), (report.get("reason"), stderr)


def test_outputs_match_by_what_the_run_wrote() -> None:
    recorded = ["lightning_logs/version_1/checkpoints/epoch=1-step=10.ckpt", "out/w.bin"]
    written = ["lightning_logs/version_0/checkpoints/epoch=1-step=10.ckpt", "out/w.bin"]
    assert match_outputs(recorded, written) == {recorded[0]: written[0], "out/w.bin": "out/w.bin"}
    # Only a version_N directory may differ; two candidates is no match, never a guess.
    assert match_outputs(["a/version_1/x.ckpt"], ["b/version_0/x.ckpt"]) == {}
    assert match_outputs(["v/version_1/x"], ["v/version_0/x", "v/version_2/x"]) == {}
    assert match_outputs(["myversion_1/x"], ["myversion_0/x"]) == {}


@pytest.mark.slow
def test_default_lightning_trainer_checkpoint_verifies_with_one_run_id(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    repo = make_repo(tmp_path / "repo", {"fit.py": LIGHTNING}, example=False)
    manifest, doc = _capture(repo, "lightning_logs/version_0/checkpoints/*.ckpt", "fit.py")
    [artifact] = doc["outputs"]["artifacts"]
    assert artifact["path"] == "lightning_logs/version_0/checkpoints/epoch=1-step=10.ckpt"
    captured_id = _logged_run_id(repo / "lightning_logs" / "version_0")

    code, report, stderr = _verify(repo, manifest, "--keep")
    assert (code, report.get("verdict")) == (0, "identical"), (report.get("reason"), stderr)
    assert report["basis"] == "tensors and trail"
    [kept] = [n.split(": ", 1)[1] for n in report["notes"] if "(--keep)" in n]
    try:
        [logs] = Path(kept).rglob("lightning_logs")
        # The scratch tree got version_0 (nothing pre-created), and the callback there
        # logged the captured run's id.
        assert sorted(p.name for p in logs.iterdir()) == ["version_0"]
        assert _logged_run_id(logs / "version_0") == captured_id
        assert captured_id.startswith("blake3:")
    finally:
        shutil.rmtree(kept)


@pytest.mark.slow
def test_lightning_version_dir_taken_in_the_users_tree_is_matched(tmp_path: Path) -> None:
    """An earlier run left lightning_logs/version_0 (ignored by git): the capture writes
    version_1, the re-run in a fresh clone version_0, and the two are matched."""
    pytest.importorskip("lightning")
    repo = make_repo(tmp_path / "repo", {"fit.py": LIGHTNING}, example=False)
    with (repo / ".gitignore").open("a") as ignore:
        ignore.write("lightning_logs/\n")
    (repo / "lightning_logs" / "version_0").mkdir(parents=True)
    manifest, doc = _capture(repo, "lightning_logs/version_1/checkpoints/*.ckpt", "fit.py")
    assert doc["outputs"]["artifacts"][0]["path"].startswith("lightning_logs/version_1/")
    code, report, stderr = _verify(repo, manifest)
    assert (code, report.get("verdict")) == (0, "identical"), (report.get("reason"), stderr)
    assert any("lightning_logs/version_0/" in n and "compared as the same output" in n
               for n in report["notes"]), report["notes"]


@pytest.mark.slow
def test_hf_trainer_checkpoint_verifies(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    repo = make_repo(tmp_path / "repo", {"hf.py": HF}, example=False)
    manifest, doc = _capture(repo, "hf_out/checkpoint-*/model.safetensors", "hf.py")
    assert [a["path"] for a in doc["outputs"]["artifacts"]] == [
        "hf_out/checkpoint-4/model.safetensors"]
    code, report, stderr = _verify(repo, manifest, "--keep")
    assert (code, report.get("verdict")) == (0, "identical"), (report.get("reason"), stderr)
    assert report["basis"] == "tensors and trail"
    [kept] = [n.split(": ", 1)[1] for n in report["notes"] if "(--keep)" in n]
    try:
        [state] = Path(kept).rglob("hf_out/checkpoint-4/trainer_state.json")
        assert _hf_run_ids(state) == _hf_run_ids(repo / "hf_out/checkpoint-4/trainer_state.json")
    finally:
        shutil.rmtree(kept)


def _hf_run_ids(state: Path) -> set[str]:
    """The manifest.launch_id values in a checkpoint's trainer_state.json log history."""
    history = json.loads(state.read_text())["log_history"]
    found = {entry["manifest.launch_id"] for entry in history if "manifest.launch_id" in entry}
    assert len(found) == 1 and next(iter(found)).startswith("blake3:"), history
    return found
