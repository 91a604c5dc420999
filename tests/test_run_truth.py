"""Verdicts that stay true on ordinary scripts: this run's outputs only, the seeds and
switches actually in force, identity counting only what can change the bits, and a
re-run that finds its inputs and code where the command looked.

Real git repositories and real CPU torch training, through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, load_manifest, seal, to_document
from manifest.diff.engine import diff_manifests
from tests.runs import git, make_repo, manifest_cli

pytestmark = pytest.mark.slow

TRAIN = '''\
import os, random, sys
import numpy as np
import torch
{head}
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
{body}
for _ in range(3):
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
os.makedirs("out", exist_ok=True)
torch.save(model.state_dict(), "out/model.pt")
'''


def script(head: str = "", body: str = "") -> str:
    return TRAIN.format(head=head, body=body)


def run(repo: Path, *args: str, env: dict[str, str] | None = None,
        out: str | None = None) -> tuple[int, dict[str, Any] | None, str]:
    """``manifest ARGS`` in ``repo``: (exit status, JSON stdout if any, stderr)."""
    proc = manifest_cli(*args, cwd=repo, env=env)
    doc = None
    if proc.stdout.strip().startswith(b"{"):
        doc = json.loads(proc.stdout)
        if out is not None:
            (repo / out).write_bytes(proc.stdout)
    return proc.returncode, doc, proc.stderr.decode()


def capture(repo: Path, *extra: str, cmd: list[str] | None = None, out: str = "run.json",
            env: dict[str, str] | None = None, expect: int = 0) -> dict[str, Any]:
    code, doc, err = run(repo, "capture", "--output", "out/*.pt", *extra, "--",
                         *(cmd or ["python", "train.py"]), env=env, out=out)
    assert code == expect, err
    assert doc is not None
    return doc


def verify(repo: Path, *extra: str, name: str = "run.json",
           env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    code, doc, err = run(repo, "verify", "--json", *extra, name, env=env)
    assert doc is not None, err
    return code, doc


UNCONFINED = {"MANIFEST_BWRAP": "/nonexistent/bwrap"}


# ------------------------------------------------------------ stale outputs


def test_stale_output_is_not_this_runs_and_capture_fails_naming_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": "print('I write nothing')\n"}, example=False)
    (repo / "out").mkdir()
    stale = repo / "out" / "ckpt.pt"
    stale.write_bytes(b"left by an earlier run")
    doc = capture(repo, expect=3)
    assert doc["outputs"]["status"] == "failed"
    assert doc["outputs"]["artifacts"] == []
    assert "out/ckpt.pt" in doc["outputs"]["error"]
    assert "earlier run" in doc["outputs"]["error"]
    assert stale.read_bytes() == b"left by an earlier run"  # never deleted
    # Positive control: a run that rewrites it is recorded.
    (repo / "train.py").write_text("open('out/ckpt.pt', 'wb').write(b'new')\n")
    git(repo, "commit", "-qam", "write")
    doc = capture(repo)
    assert [a["path"] for a in doc["outputs"]["artifacts"]] == ["out/ckpt.pt"]


# --------------------------------------------------------- in-place = code


def test_verify_in_place_refuses_another_commit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": script()}, example=False)
    capture(repo)
    code, report = verify(repo, "--in-place")
    assert code == 0 and report["verdict"] == "identical", report
    assert report["code_check"] == "the recorded code"
    (repo / "train.py").write_text(script().replace("lr=0.1", "lr=0.2"))
    git(repo, "commit", "-qam", "lr")
    code, report = verify(repo, "--in-place")
    assert code == 3 and report["verdict"] == "no-verdict"
    assert "not the recorded code" in report["reason"] and "commit" in report["reason"]
    assert report["rerun_exit_code"] is None  # nothing ran


# ------------------------------------------ runnable scratch clone, inputs


def test_gitignored_output_dir_absent_from_the_clone_verifies(tmp_path: Path) -> None:
    body = "torch.manual_seed(0)"
    text = script(body=body).replace('os.makedirs("out", exist_ok=True)\n', "")
    repo = make_repo(tmp_path / "r", {"train.py": text}, example=False)
    (repo / "out").mkdir()  # the user made it once; git does not carry it
    capture(repo)
    code, report = verify(repo)
    assert code == 0 and report["verdict"] == "identical", report


def test_pythonpath_exported_at_capture_is_replayed(tmp_path: Path) -> None:
    pkg = "VALUE = 3\n"
    task = ("import mypkg\n" + script(body="x = x * mypkg.VALUE"))
    repo = make_repo(tmp_path / "r", {"mypkg/__init__.py": pkg,
                                      "projects/task/train.py": task}, example=False)
    cmd = ["python", "projects/task/train.py"]
    env = {"PYTHONPATH": "."}
    doc = capture(repo, cmd=cmd, env=env)
    assert doc["command"]["code_env"] == {"PYTHONPATH": "{repo}"}
    # verify is run without PYTHONPATH: the manifest carries it.
    code, report = verify(repo, env={"PYTHONPATH": ""})
    assert code == 0 and report["verdict"] == "identical", report
    # Positive control: without the variable the script cannot import its package.
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, check=False,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert b"ModuleNotFoundError" in proc.stderr


def test_dataset_outside_the_repository_by_relative_path(tmp_path: Path) -> None:
    data = tmp_path / "data" / "x"
    data.mkdir(parents=True)
    (data / "train.npy").write_bytes(b"")
    import numpy as np

    np.save(data / "train.npy", np.arange(16, dtype=np.float32).reshape(4, 4))
    head = "arr = np.load(os.path.join(sys.argv[1], 'train.npy'))"
    repo = make_repo(tmp_path / "work" / "r", {"train.py": script(
        head=head, body="x = x + torch.from_numpy(arr).sum()")}, example=False)
    doc = capture(repo, "--data", "../../data/x", cmd=["python", "train.py", "../../data/x"])
    [ds] = doc["data"]
    assert ds["from_repo"] == "../../data/x" and os.path.isabs(ds["path"])
    for env in (None, UNCONFINED):
        code, report = verify(repo, env=env)
        assert code == 0 and report["verdict"] == "identical", (env, report)


SHARDS = '''\
data = np.memmap("data/shards/train.bin", dtype=np.float32, mode="r")
'''


def test_ignored_shards_inside_the_repository_declared_and_discovered(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {
        "train.py": script(head=SHARDS, body="x = x + torch.from_numpy(data[:4].copy())"),
        "data/shards/prepare.py": "# writes train.bin\n",
        ".gitignore": "out/\n*.json\n*.bin\n"}, example=False)
    import numpy as np

    np.arange(64, dtype=np.float32).tofile(repo / "data" / "shards" / "train.bin")
    # Declared: the directory exists in the clone (prepare.py is tracked), the shard does not.
    capture(repo, "--data", "data/shards", out="declared.json")
    code, report = verify(repo, name="declared.json")
    assert code == 0 and report["verdict"] == "identical", report
    # Undeclared: the launcher saw the run read it.
    doc = capture(repo, out="found.json")
    [ds] = doc["data"]
    assert ds["source"] == "discovered" and ds["path"] == "data/shards/train.bin"
    assert ds["bytes"] == 256
    assert doc["command"]["datasets"] == []
    for env in (None, UNCONFINED):
        code, report = verify(repo, name="found.json", env=env)
        assert code == 0 and report["verdict"] == "identical", (env, report)


# ---------------------------------------------- seeds and switches in force


RESEEDS = '''\
def seed_everything(seed):  # what Lightning's seed_everything does
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
seed_everything(7)
'''


def test_script_that_reseeds_itself_diffs_clean_across_launcher_seeds(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": script(head=RESEEDS)}, example=False)
    a = capture(repo, "--seed", "0", out="a.json")
    capture(repo, "--seed", "1", out="b.json")
    [proc] = a["randomness"]["processes"]
    calls = {c["call"]: c for c in proc["reseeds"]}
    assert calls["torch.manual_seed"]["site"] == "train.py:5"  # inside seed_everything
    assert calls["torch.manual_seed"]["seed"] == "7" and calls["torch.manual_seed"]["drawn"] == []
    code, _, out = run(repo, "diff", "a.json", "b.json")
    assert code == 0, out
    proc_diff = manifest_cli("diff", "a.json", "b.json", "--json", cwd=repo)
    lines = json.loads(proc_diff.stdout)["differences"]
    seed = [d for d in lines if d["path"] == "randomness.seed"]
    assert seed and seed[0]["impact"] == "benign"
    assert "overridden" in seed[0]["reason"] and "train.py:5" in seed[0]["reason"]
    # Positive control: a script that draws before reseeding is not overridden.
    drawn = script(head="torch.rand(1)\n" + RESEEDS)
    (repo / "train.py").write_text(drawn)
    git(repo, "commit", "-qam", "draw first")
    capture(repo, "--seed", "0", out="c.json")
    capture(repo, "--seed", "1", out="d.json")
    table = manifest_cli("diff", "c.json", "d.json", cwd=repo)
    code, out = table.returncode, table.stdout.decode()
    drawn_lines = json.loads(manifest_cli("diff", "c.json", "d.json", "--json",
                                          cwd=repo).stdout)["differences"]
    seed = [d for d in drawn_lines if d["path"] == "randomness.seed"]
    assert seed and seed[0]["impact"] == "bits"  # not overridden: it can change the bits
    assert "overridden" not in seed[0]["reason"]
    # ... but the draw fed nothing the weights depend on: the outputs are identical, and
    # diff's exit status follows the outputs (issue 28).
    assert code == 0 and "Here the outputs are identical." in out, out


SWITCHES = '''\
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.fp32_precision = "tf32"
'''
AUTOCAST = '''\
with torch.autocast("cpu", dtype=torch.bfloat16):
    model(x)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4,
                                     num_workers=2, shuffle=True)
for _ in loader:
    pass
'''


def test_switches_and_autocast_recorded_with_call_sites(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": script(head=SWITCHES, body=AUTOCAST)},
                     example=False)
    proc = manifest_cli("capture", "--output", "out/*.pt", "--", "python", "train.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    [det] = doc["determinism"]["processes"]
    switches = {s["switch"]: s for s in det["switches"]}
    assert switches["torch.backends.cuda.matmul.allow_tf32"] == {
        "switch": "torch.backends.cuda.matmul.allow_tf32", "value": "True", "site": "train.py:4"}
    assert switches["torch.backends.fp32_precision"]["site"] == "train.py:5"
    assert switches["torch.autocast"]["value"] == "cpu torch.bfloat16"
    assert switches["torch.autocast"]["site"] == "train.py:10"
    assert det["fp32_precision"]["torch.backends"] == "tf32"
    [rnd] = doc["randomness"]["processes"]
    [loader] = rnd["loaders"]
    assert loader["workers"] == 2 and loader["site"] == "train.py:14"
    err = proc.stderr.decode()
    assert "train.py:4 set torch.backends.cuda.matmul.allow_tf32 = True" in err
    assert "train.py:10 entered torch.autocast" in err
    # The launcher's own switches are not the script's.
    assert all(s["site"].startswith("train.py") for s in det["switches"])


# ------------------------------------------------------------- identity


def _reseal(doc: dict[str, Any], edit: Any) -> Any:
    manifest = load_manifest(json.dumps(doc).encode(), verify=False)
    body = to_document(manifest)
    edit(body)
    return seal(body)


def test_unrelated_package_is_benign_an_imported_one_is_bits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": script()}, example=False)
    doc = capture(repo)
    imported = doc["env"]["imported"]
    assert "numpy" in imported and "torch" in imported and "pytest" not in imported
    a = load_manifest(json.dumps(doc).encode(), verify=False)

    def install(body: dict[str, Any]) -> None:
        body["env"]["packages"]["pre-commit"] = "4.0.1"
        body["env"]["packages"]["pip"] = "99.0"

    b = _reseal(doc, install)
    result = diff_manifests(a, b)
    assert not result.has_bits, [d.reason for d in result.bits]
    reasons = [d.reason for d in result.benign]
    assert any("pre-commit" in r and "never imported by the run" in r for r in reasons)

    def upgrade(body: dict[str, Any]) -> None:
        body["env"]["packages"]["numpy"] = "0.0.1"

    c = _reseal(doc, upgrade)
    assert [d.path for d in diff_manifests(a, c).bits] == ["env.packages[numpy]"]
    # An old manifest (no imported list) keeps every package as bits: fail safe.

    def old(body: dict[str, Any]) -> None:
        body["env"].pop("imported")
        install(body)

    old_a = _reseal(doc, lambda body: body["env"].pop("imported"))
    assert diff_manifests(old_a, _reseal(doc, old)).has_bits
    assert b'"imported"' not in dumps(old_a)  # omitted while None: old bytes stay


def test_capture_stderr_file_and_run_logs_are_not_code(tmp_path: Path) -> None:
    logs = ('os.makedirs("logs", exist_ok=True)\n'
            'open(f"logs/events.{os.getpid()}", "w").write("x")\n')
    repo = make_repo(tmp_path / "r", {"train.py": script(body=logs)}, example=False)
    names = []
    for n in range(2):
        with open(repo / f"cap{n}.err", "wb") as err:
            proc = subprocess.run(
                ["python", "-m", "manifest", "capture", "--output", "out/*.pt", "--",
                 "python", "train.py"], cwd=repo, stdout=subprocess.PIPE, stderr=err,
                check=False, env={k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"})
        assert proc.returncode == 0
        names.append(json.loads(proc.stdout))
    first, second = names
    assert first["code"]["dirty"] is False  # cap0.err (this capture's stderr) is not code
    assert second["code"]["dirty"] is False  # nor cap0.err or logs/ (the first run's) later
    assert first["run_id"] == second["run_id"]
    assert len(list((repo / "logs").iterdir())) == 2
    # Positive control: a new untracked source file is code.
    (repo / "helper.py").write_text("X = 1\n")
    assert capture(repo)["code"]["dirty"] is True


def test_large_untracked_file_is_named_not_packed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"train.py": script()}, example=False)
    (repo / "mlruns").mkdir()
    (repo / "mlruns" / "blob.bin").write_bytes(os.urandom(2 << 20))
    proc = manifest_cli("capture", "--output", "out/*.pt", "--", "python", "train.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert doc["code"]["dirty"] is False
    assert doc["observed"]["large_untracked"] == {"mlruns/blob.bin": 2 << 20}
    assert "add to .gitignore: mlruns/" in proc.stderr.decode()


def test_real_lightning_and_transformers_seeding_calls_are_named(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    text = ("import lightning as L\nimport torch\nL.seed_everything(7)\n"
            "from transformers import set_seed\nset_seed(8)\n"
            "import os\nos.makedirs('out', exist_ok=True)\n"
            "torch.save({'w': torch.randn(3)}, 'out/w.pt')\n")
    repo = make_repo(tmp_path / "r", {"train.py": text}, example=False)
    doc = capture(repo)
    calls = {c["call"]: c for c in doc["randomness"]["processes"][0]["reseeds"]}
    assert calls["seed_everything"]["site"] == "train.py:3"
    assert calls["seed_everything"]["seed"] == "7"
    assert set(calls["seed_everything"]["generators"]) == {"python", "numpy", "torch_cpu", "cuda"}
    # "drawn" is since the previous seeding: set_seed follows seed_everything directly.
    assert calls["set_seed"]["site"] == "train.py:5" and calls["set_seed"]["drawn"] == []
    # matplotlib's font cache (read at import) is not training data.
    assert all(".cache" not in d["path"] for d in doc["data"])
