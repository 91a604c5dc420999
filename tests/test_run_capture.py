"""Capturing real training runs on CPU under the launcher (issue 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from manifest.launch.runner import LaunchSettings, ProcessRecord, select_ranks
from manifest.redact import redact_argv
from tests.runs import capture, free_port, make_repo, manifest_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("capture") / "repo", {})


@pytest.fixture(scope="module")
def twice(repo: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    _, a = capture(repo, "--seed", "0", name="a.json")
    _, b = capture(repo, "--seed", "0", name="b.json")
    return a, b


def test_same_seed_twice_gives_same_run_id_and_identical_outputs(
    twice: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    a, b = twice
    assert a["run_id"] == b["run_id"]
    assert a["digest"] != b["digest"]  # observed times differ
    arts_a = a["outputs"]["artifacts"]
    arts_b = b["outputs"]["artifacts"]
    assert [x["digest"] for x in arts_a] == [x["digest"] for x in arts_b]
    tensors = arts_a[0]["tensors"]
    assert set(tensors) >= {"conv1.weight", "bn1.running_mean", "fc.bias"}
    assert tensors["conv1.weight"]["shape"] == [8, 1, 3, 3]
    assert tensors["conv1.weight"]["dtype"] == "float32"


def test_launcher_records_flags_seed_and_threads(
    twice: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    a, _ = twice
    det = a["determinism"]
    assert det["requested"] is True
    assert det["cublas_workspace_config"] == ":4096:8"
    [proc] = det["processes"]
    flags = proc["flags"]
    assert proc["torch_imported"] is True
    assert flags["deterministic_algorithms"] is True
    assert flags["cudnn_deterministic"] is True
    assert flags["cudnn_benchmark"] is False
    assert flags["allow_tf32_matmul"] is False
    assert flags["float32_matmul_precision"] == "highest"
    assert flags["num_threads"] == det["num_threads"]
    assert proc["pythonhashseed"] == "0"
    rnd = a["randomness"]
    assert rnd["seed"] == 0
    [r] = rnd["processes"]
    assert r["at_start"]["torch_cpu"].startswith("blake3:")
    assert a["outputs"]["processes"][0]["at_exit"]["torch_cpu"].startswith("blake3:")
    assert a["command"]["argv"] == ["python", "train.py", "--steps", "20"]


def test_different_seed_changes_run_id_and_outputs(
    repo: Path, twice: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    a, _ = twice
    _, c = capture(repo, "--seed", "1", name="c.json")
    assert c["run_id"] != a["run_id"]
    assert (c["outputs"]["artifacts"][0]["digest"]
            != a["outputs"]["artifacts"][0]["digest"])


def test_thread_count_is_part_of_identity(repo: Path) -> None:
    _, one = capture(repo, "--seed", "0", "--threads", "1", name="t1.json")
    _, two = capture(repo, "--seed", "0", "--threads", "2", name="t2.json")
    assert one["determinism"]["num_threads"] == 1
    assert one["determinism"]["processes"][0]["flags"]["num_threads"] == 1
    assert one["run_id"] != two["run_id"]


def test_torch_save_checkpoints_are_digested_per_tensor(tmp_path: Path) -> None:
    script = """
import os, torch
from torch import nn
m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
opt = torch.optim.Adam(m.parameters())
for _ in range(3):
    loss = m(torch.randn(16, 4)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
os.makedirs("out", exist_ok=True)
torch.save(m, "out/whole.pt")
torch.save({"model": m.state_dict(), "optim": opt.state_dict(), "epoch": 3}, "out/ckpt.pt")
"""
    repo = make_repo(tmp_path / "repo", {"save.py": script}, example=False)
    _, doc = capture(repo, command=["python", "save.py"], outputs="out/*.pt")
    arts = {a["path"]: a for a in doc["outputs"]["artifacts"]}
    whole, ckpt = arts["out/whole.pt"], arts["out/ckpt.pt"]
    assert whole["format"] == ckpt["format"] == "torch"
    assert set(whole["tensors"]) == {"0.weight", "0.bias", "1.weight", "1.bias",
                                     "1.running_mean", "1.running_var",
                                     "1.num_batches_tracked", "2.weight", "2.bias"}
    for name, entry in whole["tensors"].items():
        assert ckpt["tensors"][f"model.{name}"] == entry
    assert "optim.state.0.exp_avg" in ckpt["tensors"]


def test_nondeterministic_cuda_ops_run_on_cpu_with_flags_in_force(tmp_path: Path) -> None:
    script = """
import torch
x = torch.zeros(5)
x.index_add_(0, torch.tensor([0, 1, 1]), torch.ones(3))
src = torch.ones(4, requires_grad=True)
torch.zeros(3).scatter_add(0, torch.tensor([0, 1, 1, 2]), src).sum().backward()
print("deterministic:", torch.are_deterministic_algorithms_enabled())
"""
    repo = make_repo(tmp_path / "repo", {"ops.py": script}, example=False)
    proc = manifest_cli("capture", "--", "python", "ops.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"deterministic: True" in proc.stderr  # child stdout goes to our stderr
    doc = json.loads(proc.stdout)
    assert doc["outputs"]["status"] == "ok"
    assert doc["determinism"]["processes"][0]["flags"]["deterministic_algorithms"] is True


@pytest.mark.gpu
def test_nondeterministic_op_fails_under_launcher_on_gpu(tmp_path: Path) -> None:
    script = """
import torch
x = torch.rand(1000, device="cuda")
torch.histc(x, bins=10)  # no deterministic CUDA kernel: raises in deterministic mode
torch.cuda.synchronize()
"""
    repo = make_repo(tmp_path / "repo", {"ops.py": script}, example=False)
    proc = manifest_cli("capture", "--", "python", "ops.py", cwd=repo)
    assert proc.returncode == 3
    doc = json.loads(proc.stdout)
    assert doc["outputs"]["status"] == "failed"
    assert "deterministic" in doc["outputs"]["error"]
    [p] = doc["determinism"]["processes"]
    assert p["devices"], "the CUDA device used is recorded"


def test_script_without_torch_pays_no_torch_import(tmp_path: Path) -> None:
    script = ("import sys, random\n"
              "print('torch' in sys.modules, 'numpy' in sys.modules, random.random())\n")
    repo = make_repo(tmp_path / "repo", {"plain.py": script}, example=False)
    proc = manifest_cli("capture", "--seed", "7", "--", "python", "plain.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    first = proc.stderr.decode().splitlines()[0]
    assert first.startswith("False False ")
    again = manifest_cli("capture", "--seed", "7", "--", "python", "plain.py", cwd=repo)
    assert again.stderr.decode().splitlines()[0] == first  # python random seeded
    doc = json.loads(proc.stdout)
    [p] = doc["determinism"]["processes"]
    assert p["torch_imported"] is False and p["flags"] is None


def test_failed_command_still_writes_a_manifest_marked_failed(tmp_path: Path) -> None:
    script = "import torch\nraise RuntimeError('boom at step 3')\n"
    repo = make_repo(tmp_path / "repo", {"fail.py": script}, example=False)
    out = tmp_path / "failed.json"
    proc = manifest_cli("capture", "-o", str(out), "--", "python", "fail.py", cwd=repo)
    assert proc.returncode == 3
    doc = json.loads(out.read_bytes())
    assert doc["outputs"]["status"] == "failed"
    assert doc["outputs"]["exit_code"] == 1
    assert "boom at step 3" in doc["outputs"]["error"]


def test_missing_declared_output_is_a_failed_run(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"noop.py": "pass\n"}, example=False)
    proc = manifest_cli("capture", "--artifact", "out/*.pt", "--", "python", "noop.py", cwd=repo)
    assert proc.returncode == 3
    doc = json.loads(proc.stdout)
    assert "matched no file" in doc["outputs"]["error"]


def test_existing_sitecustomize_is_chained(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    script = "import os, random\nprint(os.environ.get('USER_SITE_RAN'), random.random())\n"
    repo = make_repo(tmp_path / "repo", {"s.py": script}, example=False)
    proc = manifest_cli("capture", "--seed", "3", "--", "python", "s.py", cwd=repo,
                        env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().startswith("yes ")
    doc = json.loads(proc.stdout)
    assert doc["determinism"]["processes"], "the launcher still ran"


def test_secrets_in_argv_are_redacted(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "pass\n"}, example=False)
    proc = manifest_cli("capture", "--", "python", "a.py", "--api-key=sk-live-123",
                        "--token", "hf_abcdef", "https://bob:pa55@example.com/x", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    for secret in (b"sk-live-123", b"hf_abcdef", b"pa55"):
        assert secret not in proc.stdout
    doc = json.loads(proc.stdout)
    assert doc["command"]["argv"][2:] == ["--api-key=<redacted:1>", "--token", "<redacted:2>",
                                          "https://bob:<redacted:3>@example.com/x"]


def test_redact_argv_keeps_ordinary_arguments() -> None:
    argv = ["python", "train.py", "--lr", "0.1", "--key-size", "4", "--password=x"]
    assert redact_argv(argv) == ["python", "train.py", "--lr", "0.1", "--key-size", "4",
                                 "--password=<redacted:1>"]


def test_select_ranks_prefers_ranked_processes() -> None:
    records: list[ProcessRecord] = [
        {"pid": 1, "start_ns": 1, "rank": None},  # torchrun's own process
        {"pid": 3, "start_ns": 3, "rank": 1},
        {"pid": 2, "start_ns": 2, "rank": 0},
        {"pid": 4, "start_ns": 4, "rank": None, "mp_child": True},
    ]
    assert [r["pid"] for r in select_ranks(records)] == [2, 3]
    plain: list[ProcessRecord] = [{"pid": 9, "start_ns": 5, "rank": None},
                                   {"pid": 8, "start_ns": 4, "rank": None}]
    assert [(r["pid"], r["rank"]) for r in select_ranks(plain)] == [(8, 0), (9, 1)]


def test_child_environment_pins_seed_threads_and_cublas(tmp_path: Path) -> None:
    env = LaunchSettings(seed=2**40 + 5, derivation="same", threads=3,
                         deterministic=True).child_env(tmp_path, base={"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].endswith(":/x")
    # The hash seed is a switch, not the run's seed: another --seed keeps it.
    assert env["PYTHONHASHSEED"] == "0"
    replay = LaunchSettings(seed=5, derivation="same", threads=1, deterministic=True,
                            hashseed="5").child_env(tmp_path, base={})
    assert replay["PYTHONHASHSEED"] == "5"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    kept = LaunchSettings(seed=1, derivation="same", threads=1, deterministic=False).child_env(
        tmp_path, base={"PYTHONHASHSEED": "123"})
    assert kept["PYTHONHASHSEED"] == "123" and "CUBLAS_WORKSPACE_CONFIG" not in kept


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_two_ranks_gloo_records_each_rank_and_agrees(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    docs = []
    port = free_port()  # argv is part of the identity: the same port both times
    for i in range(2):
        cmd = ["torchrun", "--nproc_per_node=2", f"--master_port={port}",
               "train.py", "--steps", "10"]
        _, doc = capture(repo, "--seed", "0", "--per-rank-seed", command=cmd, name=f"d{i}.json")
        docs.append(doc)
    a, b = docs
    ranks = a["determinism"]["processes"]
    assert [(p["rank"], p["world_size"]) for p in ranks] == [(0, 2), (1, 2)]
    seeds = [p["seed"] for p in a["randomness"]["processes"]]
    assert seeds == [0, 1]  # base + RANK
    assert a["run_id"] == b["run_id"]
    assert (a["outputs"]["artifacts"][0]["tensors"]
            == b["outputs"]["artifacts"][0]["tensors"])


def test_manifest_written_inside_the_repo_is_not_part_of_the_code(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"noop.py": "pass\n"}, example=False)
    (repo / ".gitignore").write_text("")  # manifests are not ignored here
    ids = []
    for _ in range(2):
        proc = manifest_cli("capture", "-o", "run.json", "--", "python", "noop.py", cwd=repo)
        assert proc.returncode == 0, proc.stderr.decode()
        ids.append(json.loads((repo / "run.json").read_bytes())["run_id"])
    assert ids[0] == ids[1]


def test_recipe_does_not_import_inductor_but_sets_it_when_loaded(tmp_path: Path) -> None:
    script = ("import sys, torch\n"
              "print('inductor loaded:', 'torch._inductor.config' in sys.modules)\n"
              "import torch._inductor.config as c\n"
              "print('inductor deterministic:', c.deterministic)\n")
    repo = make_repo(tmp_path / "repo", {"ind.py": script}, example=False)
    proc = manifest_cli("capture", "--", "python", "ind.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stderr.decode().splitlines()
    assert "inductor loaded: False" in lines
    assert "inductor deterministic: True" in lines
