"""What a user on a GPU gets, end to end through the CLI (issue 27).

Every test here is ``gpu``: it needs a real NVIDIA GPU and driver and skips
without one (``conftest.py``). ``benchmarks/gpu_check.sh`` runs this file, the
other ``gpu`` tests and the bundled example on a bare GPU machine and writes
one log. The branches these tests reach are kept honest between GPU runs by
their CPU twins in ``test_gpu_twins.py``.

The training script exercises what a real GPU run uses: a cuDNN convolution
with BatchNorm, bf16 autocast, ``torch.compile`` (when asked), a DataLoader
with 2 workers, AdamW, and a checkpoint in safetensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.runs import capture, make_repo, manifest_cli

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CUDA_TRAIN = """
import argparse, os
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--compile", action="store_true")
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

torch.manual_seed(3407)  # reseeds before any draw, as makemore does
data = TensorDataset(torch.randn(512, 3, 16, 16), torch.randint(0, 10, (512,)))
loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Dropout(0.1), nn.Flatten(), nn.Linear(16 * 16 * 16, 10)).cuda()
step_fn = torch.compile(model) if args.compile else model
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
while step < args.steps:
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(step_fn(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step >= args.steps:
            break
print(f"final loss {loss.item():.6f}")
os.makedirs("out", exist_ok=True)
from safetensors.torch import save_file
save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
          "out/model.safetensors")
"""


def _verify(repo: Path, manifest: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(manifest), "--json", *args, cwd=repo, timeout=900)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr, stderr
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {}), stderr


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA device")
    return make_repo(tmp_path_factory.mktemp("gpu") / "repo", {"cuda_train.py": CUDA_TRAIN},
                     example=False)


def test_two_captures_get_one_run_id(gpu_repo: Path) -> None:
    """The H100 bug: the CUDA RNG state at start was read before torch's queued seed."""
    _, a = capture(gpu_repo, "--seed", "0", command=["python", "cuda_train.py"],
                   name="twice-a.json")
    _, b = capture(gpu_repo, "--seed", "0", command=["python", "cuda_train.py"],
                   name="twice-b.json")
    [pa] = a["randomness"]["processes"]
    assert pa["at_start"]["cuda"], "the CUDA generator's state at first use is recorded"
    assert a["randomness"] == b["randomness"]
    assert a["run_id"] == b["run_id"]
    assert a["outputs"]["artifacts"] == b["outputs"]["artifacts"]


def test_lab_recipe_runs_agree_and_the_cost_is_measured(gpu_repo: Path) -> None:
    proc = manifest_cli("lab", "--runs", "2", "--json", "--no-sandbox", "--artifact",
                        "out/*.safetensors", "--", "python", "cuda_train.py", cwd=gpu_repo,
                        timeout=1800)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert doc["recipe"]["bit_identical"] is True
    assert doc["identity"]["recipe_runs_agree"] is True
    assert doc["cost"]["determinism_cost_pct"] is not None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_confined_verify_binds_the_gpu_device_nodes(gpu_repo: Path) -> None:
    manifest, _ = capture(gpu_repo, "--seed", "0", command=["python", "cuda_train.py"],
                          name="confined.json")
    code, report, stderr = _verify(gpu_repo, manifest, "--require-sandbox")
    if code == 3 and "cannot be confined" in stderr:
        pytest.skip(f"bubblewrap cannot confine here: {stderr.strip()}")
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    assert report["confinement"] and "not confined" not in report["confinement"]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_capture_then_verify_is_identical_under_the_recipe(gpu_repo: Path,
                                                           compiled: bool) -> None:
    cmd = ["python", "cuda_train.py", *(["--compile"] if compiled else [])]
    manifest, doc = capture(gpu_repo, "--seed", "0", command=cmd, name=f"v-{compiled}.json")
    # torch.compile starts compile workers, each a Python process under the launcher too.
    assert any(p["devices"] for p in doc["determinism"]["processes"]), \
        "the CUDA device used is recorded"
    code, report, stderr = _verify(gpu_repo, manifest, "--no-sandbox")
    assert code == 0, stderr
    assert report["verdict"] == "identical"


DEVICE_TRAIN = """
import os
import torch
from safetensors.torch import save_file

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
x, y = torch.randn(256, 16), torch.randn(256, 1)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(8):
    loss = ((model(x.to(dev)) - y.to(dev)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
os.makedirs("out", exist_ok=True)
save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
          "out/model.safetensors")
"""


def test_the_verifiers_device_visibility_does_not_move_the_rerun(tmp_path: Path) -> None:
    """verify replays the run's numerics variables, CUDA_VISIBLE_DEVICES among them: a
    verifier whose shell hides the GPU still re-runs a GPU run on the GPU, and gets its
    bits (measured on an H100). So a CPU re-run of a GPU run, and the rule that gives it
    no numeric verdict (numeric.precision.device_change), happen on a machine without a
    GPU; tests/test_equivalent_verifier.py holds that rule on CPU."""
    repo = make_repo(tmp_path / "repo", {"device_train.py": DEVICE_TRAIN}, example=False)
    manifest, doc = capture(repo, "--seed", "0", command=["python", "device_train.py"],
                            name="gpu.json")
    gpus = {name for p in doc["determinism"]["processes"] for name in p["devices"]}
    assert gpus, "the CUDA device used is recorded"
    proc = manifest_cli("verify", str(manifest), "--json", "--no-sandbox", cwd=repo,
                        env={"CUDA_VISIBLE_DEVICES": ""}, timeout=900)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr, stderr
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (0, "identical"), report.get("reason")
