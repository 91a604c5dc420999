"""After ``capture`` seals a run, the tracker runs the callbacks logged to carry its run_id
(issue 38: "the integration id is the run_id"; ``manifest.capture.trackers``).

Real libraries, offline: Lightning with an MLflow file store under tmp, the HF Trainer
with its output directory, captures and verifies through the CLI. A locator is the run's
own output, so the hostile cases put crafted locators into the process record the way the
callbacks do, from a script run under ``manifest capture``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from manifest.capture.trackers import MAX_LOCATOR_BYTES, _glob_names, read_locators
from tests.runs import make_repo, manifest_cli
from tests.tiny_trainers import hf_script, lightning_script

LIGHTNING_MLFLOW = lightning_script(
    rows=8, steps=2, imports="from lightning.pytorch.loggers import MLFlowLogger",
    logger='enable_checkpointing=False, logger=MLFlowLogger(experiment_name="tiny"), ',
    after='torch.save(trainer.model.state_dict(), "out/w.pt")')

HF = hf_script(steps=2, saving='save_strategy="no"')

LEAVES = """
import json, os, sys
from pathlib import Path
record = sys.modules["_manifest_state"].state["record"]
record["trackers"] = json.loads(os.environ["LOCATORS"])
Path("out").mkdir(exist_ok=True)
Path("out/w.txt").write_text("done")
"""


def _shown_launch_and_run_id(repo: Path, manifest: str) -> tuple[str, str]:
    shown = manifest_cli("show", manifest, cwd=repo)
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stdout.decode()
    run_id = re.search(r"^run_id (blake3:[0-9a-f]{64})$", text, re.MULTILINE)
    launch = re.search(r"launch id +(blake3:[0-9a-f]{64})$", text, re.MULTILINE)
    assert run_id is not None and launch is not None, text
    return launch.group(1), run_id.group(1)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # mlflow's own imports
@pytest.mark.filterwarnings("ignore::FutureWarning")  # mlflow 3: the file store's future
def test_lightning_mlflow_run_is_tagged_with_the_run_id_and_a_rerun_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 (see test_integration_mlflow)
    pytest.importorskip("lightning")
    store = tmp_path / "mlruns"
    env = {"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
    repo = make_repo(tmp_path / "repo", {"fit.py": LIGHTNING_MLFLOW}, example=False)
    (repo / "out").mkdir()
    cap = manifest_cli("capture", "--artifact", "out/w.pt", "-o", "run.json", "--",
                       "python", "fit.py", cwd=repo, env=env, timeout=600)
    err = cap.stderr.decode()
    assert cap.returncode == 0, err
    assert "Traceback" not in err
    launch_id, run_id = _shown_launch_and_run_id(repo, "run.json")
    assert launch_id != run_id
    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    [exp] = [e for e in client.search_experiments() if e.name == "tiny"]
    [logged] = client.search_runs([exp.experiment_id])
    # During the run: the launch id, under its own key; after the seal: the run_id.
    assert logged.data.params["manifest.launch_id"] == launch_id
    assert logged.data.tags["manifest.run_id"] == run_id
    assert logged.data.tags["manifest.digest"] == json.loads(
        (repo / "run.json").read_text())["digest"]
    assert f"tagged MLflow run {logged.info.run_id}" in err
    before = dict(client.get_run(logged.info.run_id).data.tags)
    # The re-run logs to the same store (the script's own logger) but is never tagged.
    again = manifest_cli("verify", "--no-sandbox", "-q", "run.json", cwd=repo, env=env,
                         timeout=600)
    assert again.returncode == 0, again.stderr.decode()
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 2  # the positive control: the re-run did reach the tracker
    assert client.get_run(logged.info.run_id).data.tags == before
    [rerun] = [r for r in runs if r.info.run_id != logged.info.run_id]
    assert rerun.data.params["manifest.launch_id"] == launch_id
    assert "manifest.run_id" not in rerun.data.tags


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_hf_trainer_output_dir_gets_manifest_run_json(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    # Only the manifests ignored: what lands in hf_out/ is untracked and not ignored.
    repo = make_repo(tmp_path / "repo", {"hf.py": HF, ".gitignore": "run*.json\n"},
                     example=False)
    cap = manifest_cli("capture", "-o", "run.json", "--", "python", "hf.py", cwd=repo,
                       timeout=600)
    err = cap.stderr.decode()
    assert cap.returncode == 0, err
    launch_id, run_id = _shown_launch_and_run_id(repo, "run.json")
    written = json.loads((repo / "hf_out" / "manifest-run.json").read_text())
    doc = json.loads((repo / "run.json").read_text())
    assert written == {"run_id": run_id, "digest": doc["digest"], "launch_id": launch_id}
    assert "wrote hf_out/manifest-run.json" in err
    # During the run the trail file carried the launch id, under its own key.
    trail = json.loads((repo / "hf_out" / "manifest-trail.json").read_text())
    assert trail["manifest.launch_id"] == launch_id and "manifest.run_id" not in trail
    # The file is remembered as run-written: a second capture's code is the same.
    second = manifest_cli("capture", "-o", "run2.json", "--", "python", "hf.py", cwd=repo,
                          timeout=600)
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads((repo / "run2.json").read_text())["code"] == doc["code"]
    # The positive control: a file there that no run wrote is code, and changes it.
    (repo / "hf_out" / "note.json").write_text("{}")
    third = manifest_cli("capture", "-o", "run3.json", cwd=repo)
    assert third.returncode == 0, third.stderr.decode()
    assert json.loads((repo / "run3.json").read_text())["code"] != doc["code"]


def _capture_leaving(repo: Path, locators: Any, *extra: str) -> tuple[int, str]:
    cap = manifest_cli("capture", "--artifact", "out/w.txt", *extra, "-o", "run.json", "--",
                       "python", "leaves.py", cwd=repo,
                       env={"LOCATORS": json.dumps(locators)}, timeout=300)
    return cap.returncode, cap.stderr.decode()


@pytest.mark.slow
def test_hostile_locators_are_notes_and_the_capture_exits_as_usual(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"leaves.py": LEAVES, "logs/keep": ""}, example=False)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo / "linked").symlink_to(outside)
    # The unsafe twin: a path check on the name alone passes, and a plain write through
    # it lands outside the tree.
    naive = repo / "linked" / "manifest-run.json"
    assert naive.resolve().parent == outside.resolve()
    benign = {"kind": "log_dir", "path": str(repo / "logs")}
    cases: list[tuple[Any, str]] = [
        ([{"kind": "log_dir", "path": str(repo / "linked")}], "is a link at linked"),
        ([{"kind": "log_dir", "path": str(outside)}], "is outside the run's tree"),
        ([{"kind": "log_dir", "path": "../elsewhere"}], "is outside the run's tree"),
        ([{"kind": "log_dir", "path": "x" * (MAX_LOCATOR_BYTES + 10)}], "over the 16 KiB"),
        ([{"kind": "mlflow", "tracking_uri": "file:///tmp", "run_id": "../../etc"}],
         "malformed (0.mlflow.run_id"),
        ([{"kind": "f\x1b[2Jtp", "path": "x"}], "malformed"),
        ({"kind": "log_dir"}, "malformed"),
        ([{**benign, "extra": 1}], "malformed (0.log_dir.extra"),
    ]
    for locators, said in cases:
        code, err = _capture_leaving(repo, locators)
        assert code == 0, err
        assert said in err, (locators, err)
        assert "Traceback" not in err and "\x1b" not in err
        assert not (repo / "logs" / "manifest-run.json").exists()
    assert list(outside.iterdir()) == []
    # A tracker that cannot be reached is one note; the capture still succeeds.
    code, err = _capture_leaving(repo, [{"kind": "mlflow", "tracking_uri":
                                         "http://user:pw@127.0.0.1:9/", "run_id": "abc"}])
    assert code == 0 and "MLflow run abc at http://<redacted>@127.0.0.1:9/ not tagged" in err, err
    assert "pw" not in err and "Traceback" not in err
    # The positive control: the same capture with a log dir inside the tree writes it.
    code, err = _capture_leaving(repo, [benign])
    assert code == 0, err
    written = json.loads((repo / "logs" / "manifest-run.json").read_text())
    assert written["run_id"] == json.loads((repo / "run.json").read_text())["run_id"]
    # Where a declared output glob would find it, it is not written (the next capture
    # would refuse it as an earlier run's leftover).
    code, err = _capture_leaving(repo, [{"kind": "log_dir", "path": str(repo / "out")}],
                                 "--artifact", "out/*")
    assert code == 0 and "would match a declared output glob" in err, err
    assert not (repo / "out" / "manifest-run.json").exists()


def test_glob_names_follows_capture_glob_rules(tmp_path: Path) -> None:
    """``_glob_names`` answers before the file exists what ``glob.glob`` says after."""
    import glob

    rels = ["out/manifest-run.json", "out/a/manifest-run.json", ".hid/manifest-run.json",
            "logs/v0/manifest-run.json"]
    for rel in rels:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    patterns = ["out/*", "out/**", "**/*.json", "out/*/*.json", "logs/v*/*.ckpt", "*",
                "**", "out/manifest-run.json", "[ol]*/**/manifest-run.json"]
    for pattern in patterns:
        found = set(glob.glob(pattern, root_dir=tmp_path, recursive=True))
        for rel in rels:
            assert _glob_names(pattern, rel) == (rel in found), (pattern, rel)


def test_read_locators_takes_valid_ones_once_and_names_each_refusal() -> None:
    good = {"kind": "log_dir", "path": "/x/logs"}
    found, notes = read_locators([{"rank": 0, "trackers": [good, good]},
                                  {"rank": 1, "trackers": [good]},
                                  {"rank": 2, "trackers": [good] * 40},
                                  {"rank": 3}])
    assert [loc.path for loc in found] == ["/x/logs"]
    assert len(notes) == 1 and notes[0].startswith("rank 2's tracker locators are malformed")


def test_callbacks_leave_nothing_without_the_launcher() -> None:
    from manifest.integrations._locators import leave

    assert "MANIFEST_LAUNCH_RECORDS" not in os.environ
    assert leave([{"kind": "log_dir", "path": "/x"}]) is False


GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_hf_active_mlflow_run_is_located_and_tagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF ``report_to="mlflow"`` leaves the active run; a relative file store is made
    absolute, so the capture (another working directory) reaches the same store."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from manifest.canonical import load_manifest
    from manifest.capture.snapshot import now_iso
    from manifest.capture.trackers import tag_trackers
    from manifest.integrations._locators import transformers_locators

    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf_out").mkdir()
    mlflow.set_tracking_uri("file:./mlruns")
    try:
        with mlflow.start_run() as run:
            locators = transformers_locators(SimpleNamespace(output_dir="hf_out"))
    finally:
        mlflow.set_tracking_uri("")
    assert locators == [
        {"kind": "mlflow", "tracking_uri": (tmp_path / "mlruns").as_uri(),
         "run_id": run.info.run_id},
        {"kind": "log_dir", "path": str(tmp_path / "hf_out")}]
    golden = load_manifest(GOLDEN.read_bytes())
    # Tagged only as a run this capture started: the golden manifest's window is made now.
    started = datetime.fromtimestamp(run.info.start_time / 1000, UTC)
    manifest = golden.model_copy(update={"observed": golden.observed.model_copy(update={
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "finished_at": now_iso()})})
    monkeypatch.chdir(tmp_path.parent)
    said: list[str] = []
    tag_trackers(manifest, [{"rank": 0, "trackers": locators}], tree=tmp_path, say=said.append)
    tags = mlflow.MlflowClient((tmp_path / "mlruns").as_uri()).get_run(run.info.run_id).data.tags
    assert tags["manifest.run_id"] == manifest.run_id
    assert tags["manifest.digest"] == manifest.digest
    assert json.loads((tmp_path / "hf_out" / "manifest-run.json").read_text())["run_id"] \
        == manifest.run_id
    assert len(said) == 2 and said[0].startswith("tagged MLflow run")


def test_offline_wandb_run_gets_a_note_saying_what_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.canonical import load_manifest
    from manifest.capture.trackers import tag_trackers
    from manifest.integrations._locators import wandb_locator

    wandb = pytest.importorskip("wandb")
    for name, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"),
                      ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(name, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="manifest-test", dir=str(tmp_path))
    try:
        locator = wandb_locator(run)
    finally:
        run.finish()
        wandb.teardown()
    assert locator["offline"] is True and locator["run_id"] == run.id
    manifest = load_manifest(GOLDEN.read_bytes())
    [line] = tag_trackers(manifest, [{"rank": 0, "trackers": [locator]}], tree=tmp_path)
    path = "/".join(filter(None, [locator["entity"], "manifest-test", run.id]))
    assert line.startswith(f"W&B run {path} is offline")
    assert "wandb sync" in line and manifest.run_id in line and "\n" not in line
    # What it says to run is one shell command whose Python compiles.
    import shlex

    words = shlex.split(line.split(", run ", 1)[1].rstrip("."))
    assert words[:2] == ["python", "-c"] and len(words) == 3
    compile(words[2], "<note>", "exec")
    assert repr(manifest.run_id) in words[2]


# ------------------------------------------------ the hostile review of the tagging (T38b)


def test_read_locators_caps_the_total_and_skips_a_record_that_is_no_object() -> None:
    """32 locators per process was the only bound: 100 processes could name 3,200 servers
    (20 s each when one does not answer). Now 32 in all, with one note."""
    def many(rank: int) -> dict[str, Any]:
        return {"rank": rank, "trackers": [{"kind": "log_dir", "path": f"/x/{rank}/{i}"}
                                           for i in range(20)]}

    # The positive control: each record alone is within the per-process bound.
    assert all(len(read_locators([many(r)])[0]) == 20 for r in range(3))
    found, notes = read_locators([[1], "x", many(0), many(1), many(2)])
    assert len(found) == 32
    assert notes == ["28 more tracker run(s) not tagged: at most 32 are tagged per capture, "
                     "whatever the number of processes."]


def _golden() -> Any:
    """The golden manifest (dataset ``data/tiny``, output ``out/model.safetensors``)."""
    from manifest.canonical import load_manifest

    return load_manifest(GOLDEN.read_bytes())


def test_run_file_is_refused_in_a_dataset_in_git_and_over_a_tracked_file(tmp_path: Path) -> None:
    from manifest.capture.trackers import RUN_FILE, tag_trackers
    from manifest.data.datasets import hash_from_cli

    repo = make_repo(tmp_path / "repo", {"data/tiny/a.bin": "a", "logs/keep": "",
                                         "committed/keep": ""}, example=False)
    (repo / "committed" / RUN_FILE).write_text("{}\n")
    from tests.runs import git

    git(repo, "add", "-f", f"committed/{RUN_FILE}")
    git(repo, "commit", "-q", "-m", "a committed run file")
    manifest = _golden()

    def said(path: str) -> list[str]:
        return tag_trackers(manifest, [{"rank": 0, "trackers": [
            {"kind": "log_dir", "path": path}]}], tree=repo)

    def root() -> str:
        return hash_from_cli(repo / "data" / "tiny", no_cache=True, store_dir=None, quiet=True,
                             as_json=False)

    before = root()
    assert said(str(repo / "data" / "tiny")) == [
        f"log directory data/tiny is inside the dataset tiny; {RUN_FILE} not written (the "
        "dataset's digest would change)."]
    assert root() == before
    # The unsafe twin: the file written there changes the dataset's root (verify: "data
    # changed").
    (repo / "data" / "tiny" / RUN_FILE).write_text("{}\n")
    assert root() != before
    (repo / "data" / "tiny" / RUN_FILE).unlink()
    # A directory holding the dataset is no dataset: the file lands beside it.
    assert said(str(repo / "data"))[0].startswith(f"wrote data/{RUN_FILE}")
    assert root() == before
    assert said(str(repo / ".git" / "info")) == [
        f"log directory {repo / '.git' / 'info'} is inside .git; {RUN_FILE} not written."]
    assert not (repo / ".git" / "info" / RUN_FILE).exists()
    assert said(str(repo / "committed")) == [
        f"committed/{RUN_FILE} is tracked by git; not overwritten (it is code, not a run's "
        "output)."]
    assert (repo / "committed" / RUN_FILE).read_text() == "{}\n"
    # The positive control: the untracked twin beside it is written.
    assert said(str(repo / "logs"))[0].startswith(f"wrote logs/{RUN_FILE}")


def test_tree_root_is_a_log_dir_each_directory_once_and_notes_are_redacted(
        tmp_path: Path) -> None:
    from manifest.capture.trackers import RUN_FILE, tag_trackers

    repo = make_repo(tmp_path / "repo", {"logs/keep": ""}, example=False)
    manifest = _golden()
    logs = str(repo / "logs")
    lines = tag_trackers(manifest, [
        {"rank": 0, "trackers": [{"kind": "log_dir", "path": str(repo)},
                                 {"kind": "log_dir", "path": logs},
                                 {"kind": "log_dir", "path": logs + "/."},
                                 {"kind": "log_dir", "path": logs + "/../logs/"},
                                 {"kind": "log_dir", "path": "s3://AKIA:s3cret@bucket/tb"}]},
        {"rank": 1, "trackers": [{"kind": "log_dir", "path": logs, "http://u:pw9@h/": 1}]},
        {"rank": 2, "trackers": [{"kind": "ftp://me:pw8@h/", "path": logs}]}],
        tree=repo)
    # HF output_dir="." is the tree itself: written there.
    assert json.loads((repo / RUN_FILE).read_text())["run_id"] == manifest.run_id
    assert [line for line in lines if line.startswith("wrote")] == [
        f"wrote {RUN_FILE} (run_id {manifest.run_id}).",
        f"wrote logs/{RUN_FILE} (run_id {manifest.run_id})."]
    text = "\n".join(lines)
    assert "log directory s3://<redacted>@bucket/tb is not a local directory" in text
    assert "malformed (0.log_dir.http://<redacted>@h/" in text
    assert "Input tag 'ftp://<redacted>@h/'" in text  # pydantic quotes the input
    assert "s3cret" not in text and "pw9" not in text and "pw8" not in text
    assert len(lines) == 5


def test_log_dir_locator_keeps_a_url_as_given(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.integrations._locators import log_dir_locator

    monkeypatch.chdir(tmp_path)
    assert log_dir_locator("s3://b/tb")["path"] == "s3://b/tb"
    assert log_dir_locator("tb")["path"] == str(tmp_path / "tb")  # the control


MLFLOW_IN_TREE = """
from pathlib import Path
from mlflow import MlflowClient
from manifest.integrations._locators import leave, mlflow_locator

client = MlflowClient(tracking_uri="file:./mlruns")  # Lightning MLFlowLogger's default
exp = client.get_experiment_by_name("t")
run = client.create_run(exp.experiment_id if exp else client.create_experiment("t"))
client.log_param(run.info.run_id, "p", 1)
client.set_terminated(run.info.run_id)
leave([mlflow_locator("file:./mlruns", run.info.run_id)])
Path("out").mkdir(exist_ok=True)
Path("out/w.txt").write_text("done")
"""
MLFLOW_ENV = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
              "DO_NOT_TRACK": "true"}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_mlflow_file_store_in_the_tree_keeps_the_next_capture_s_run_id(tmp_path: Path) -> None:
    """The tag files ``set_tag`` adds to ``./mlruns`` were untracked, unremembered files:
    the next capture took them for code, and every capture had a new run_id."""
    pytest.importorskip("mlflow")
    from manifest.capture.observed import remembered_written
    from manifest.store import BlobStore

    repo = make_repo(tmp_path / "repo", {"ml.py": MLFLOW_IN_TREE}, example=False)
    ids = []
    for name in ("run1.json", "run2.json"):
        cap = manifest_cli("capture", "--artifact", "out/w.txt", "-o", name, "--", "python",
                           "ml.py", cwd=repo, env=MLFLOW_ENV, timeout=300)
        assert cap.returncode == 0, cap.stderr.decode()
        assert "tagged MLflow run" in cap.stderr.decode()
        ids.append(json.loads((repo / name).read_text())["run_id"])
    assert ids[0] == ids[1]
    tags = sorted(p.relative_to(repo).as_posix() for p in repo.glob("mlruns/*/*/tags/manifest.*"))
    assert len(tags) == 4 and set(tags) <= remembered_written(BlobStore(repo / ".manifest"))
    # The positive control: a file there that no run or tagging wrote is code.
    (repo / "mlruns" / "stray.txt").write_text("x")
    third = manifest_cli("capture", "--artifact", "out/w.txt", "-o", "run3.json", "--",
                         "python", "ml.py", cwd=repo, env=MLFLOW_ENV, timeout=300)
    assert third.returncode == 0, third.stderr.decode()
    assert json.loads((repo / "run3.json").read_text())["run_id"] != ids[0]


@pytest.mark.slow
def test_an_interrupt_while_tagging_keeps_the_written_manifest(tmp_path: Path) -> None:
    """Tagging waits up to 20 s per server that does not answer; it now runs after the
    manifest is written, says so first, and Ctrl-C there costs only the tags."""
    pytest.importorskip("mlflow")
    import signal
    import socket
    import subprocess
    import sys

    repo = make_repo(tmp_path / "repo", {"leaves.py": LEAVES}, example=False)
    with socket.socket() as server:  # accepts connections (the backlog) and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        locators = json.dumps([{"kind": "mlflow", "tracking_uri": f"http://127.0.0.1:{port}/",
                                "run_id": "abc"}])
        # The user named that server for this capture: tagging asks it for the run (the
        # capture's own runs only), and waits there
        env = {**os.environ, "LOCATORS": locators,
               "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}/"}
        env.pop("PYTHONHASHSEED", None)
        # Ctrl-C's own handler, whatever this process inherited: a test run started in the
        # background of a non-interactive shell ignores SIGINT, and so would the child
        start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                 "signal.default_int_handler); sys.argv[0] = 'manifest'; "
                 "runpy.run_module('manifest', run_name='__main__')")
        proc = subprocess.Popen(
            [sys.executable, "-c", start, "capture", "--artifact", "out/w.txt", "-o",
             "run.json", "--", "python", "leaves.py"],
            cwd=repo, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "tagging 1 tracker run(s)" in line:
                written = json.loads((repo / "run.json").read_text())  # written before
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=120)[1]
    err = "".join(seen) + rest
    assert proc.returncode == 130, err
    assert "manifest: interrupted." in err and "Traceback" not in err
    assert json.loads((repo / "run.json").read_text()) == written
    shown = manifest_cli("show", "run.json", cwd=repo)
    assert shown.returncode == 0, shown.stderr.decode()


GATE_PYPROJECT = """[tool.manifest]
command = ["python", "leaves.py"]
outputs = ["out/w.txt"]
threads = 1

[tool.manifest.gate]
command = ["python", "leaves.py"]
checks = ["determinism"]
"""
LEAVES_AND_JUNK = LEAVES + """
Path(os.environ["MANIFEST_LAUNCH_RECORDS"], "zz-junk.json").write_text("[1]")
# an object whose fields are forged (``opened`` a list, ``modules`` a number): skipped
Path(os.environ["MANIFEST_LAUNCH_RECORDS"], "zz-forged.json").write_text(
    '{"opened": [1], "modules": 5, "trackers": 7}')
"""


@pytest.mark.slow
def test_gate_tags_nothing_and_a_record_that_is_no_object_is_one_note(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"leaves.py": LEAVES_AND_JUNK, "logs/keep": "",
                                         "pyproject.toml": GATE_PYPROJECT}, example=False)
    env = {"LOCATORS": json.dumps([{"kind": "log_dir", "path": str(repo / "logs")}])}
    gate = manifest_cli("gate", cwd=repo, env=env, timeout=300)
    err = gate.stderr.decode()
    assert gate.returncode == 0 and "gate PASS" in gate.stdout.decode(), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert "tagging" not in err and not (repo / "logs" / "manifest-run.json").exists(), err
    # The positive control: capture, same command and locator, tags; the `[1]` record
    # (r.get on a list was an internal error) is one note.
    cap = manifest_cli("capture", "-o", "run.json", "--", "python", "leaves.py", cwd=repo,
                       env=env, timeout=300)
    err = cap.stderr.decode()
    assert cap.returncode == 0, err
    assert err.count("1 process record(s) unreadable or not a JSON object; left out.") == 1
    assert "manifest: tagging 1 tracker run(s)…" in err
    assert (repo / "logs" / "manifest-run.json").exists()
