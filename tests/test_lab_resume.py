"""``manifest lab --resume-at K``: the restart-replay gate, with planted faults named.

One real training script with a real resume path (model, optimizer, LR
scheduler, torch generator, step and epoch in a ``torch.save`` checkpoint),
and three copies of it that each forget one piece on resume (``--forget``):
the torch RNG state (its dropout masks then differ), the epoch that seeds the
sampler's shuffle (the data order then differs), the scheduler (the LR then
steps at the wrong time). The audit stops the script after step 6, resumes it
from the checkpoint it saved there and compares with the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifest.lab.resume import name_forgotten
from tests.runs import make_repo, manifest_cli

SCRIPT = """
import argparse
import torch

p = argparse.ArgumentParser()
p.add_argument("--resume")
p.add_argument("--forget", default="")
p.add_argument("--steps", type=int, default=14)
a = p.parse_args()

data, target = torch.randn(64, 8), torch.randn(64, 2)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
per_epoch, step, epoch = 4, 0, 0
if a.resume:
    ck = torch.load(a.resume, weights_only=True)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    step = ck["step"]
    if a.forget != "sched":
        sched.load_state_dict(ck["sched"])
    if a.forget != "rng":
        torch.set_rng_state(ck["rng"])
    if a.forget != "epoch":
        epoch = ck["epoch"]
while step < a.steps:
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1000 + epoch))
    for i in range(step % per_epoch, per_epoch):
        idx = order[i * 16 : (i + 1) * 16]
        loss = ((model(data[idx]) - target[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step % 6 == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "rng": torch.get_rng_state(),
                        "step": step, "epoch": epoch + (i + 1) // per_epoch}, f"ck-{step}.pt")
        if step >= a.steps:
            break
    epoch += 1
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("resume") / "repo", {
        "job.py": SCRIPT, "pyproject.toml": '[tool.manifest]\nresume = "--resume {checkpoint}"\n',
        ".gitignore": "ck-*.pt\n"}, example=False)


def _audit(repo: Path, *forget: str) -> tuple[int, dict[str, object]]:
    out = manifest_cli("lab", "--resume-at", "6", "--format", "json", "--seed", "0", "--",
                       "python", "job.py", *forget, cwd=repo)
    assert out.returncode in (0, 1), out.stderr.decode()
    return out.returncode, json.loads(out.stdout)


@pytest.mark.slow
def test_a_full_resume_is_bit_identical(repo: Path) -> None:
    code, doc = _audit(repo)
    assert code == 0, doc
    assert doc["identical"] is True and doc["steps_compared"] == 8
    assert doc["checkpoint"] == "ck-6.pt" and doc["forgotten"] == []


@pytest.mark.slow
@pytest.mark.parametrize(("forget", "step", "named"), [
    ("rng", 7, "torch's CPU RNG state"),
    ("epoch", 7, "the sampler's position or its epoch seed"),
    ("sched", 9, "the LR scheduler (group 0 lr 0.049 → 0.07)"),
])
def test_the_forgotten_state_is_named(repo: Path, forget: str, step: int, named: str) -> None:
    code, doc = _audit(repo, "--forget", forget)
    assert code == 1, doc
    assert doc["first_divergent_step"] == step
    forgotten = doc["forgotten"]
    assert isinstance(forgotten, list) and len(forgotten) == 1 and named in forgotten[0], doc


def test_naming_order_follows_what_a_step_uses() -> None:
    base = {"params": "p", "optimizer_state": "o", "hyper": [{"lr": 0.1}],
            "rng": {"python": "a", "numpy": "b", "torch_cpu": "c", "cuda": []}, "grads": "g"}
    assert name_forgotten(base, dict(base)) == []
    assert name_forgotten(base, {**base, "grads": "x"})[0].startswith("the data the step saw")
    both = {**base, "grads": "x", "rng": {**base["rng"], "numpy": "z"}}  # type: ignore[dict-item]
    assert name_forgotten(base, both) == ["numpy's global RNG state"]
    assert name_forgotten(base, {**base, "hyper": [{"lr": 0.2}], "grads": "x"}) == [
        "the LR scheduler (group 0 lr 0.1 → 0.2)"]
    assert "weights" in name_forgotten(base, {**base, "params": "q", "hyper": []})[0]
