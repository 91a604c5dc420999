"""Capture records every checkpoint a run saves, with the launcher's step and its table.

Real runs under the launcher: the bundled example with ``--save-every``, and a
script that saves through ``torch.save`` to one reused path, through
``torch.distributed.checkpoint`` and through ``huggingface_hub``'s sharded
safetensors, at known optimizer steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import make_repo, manifest_cli

_SAVES = """
import os, warnings
import torch
from huggingface_hub import save_torch_state_dict
from torch.distributed.checkpoint.state_dict_saver import save
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
os.makedirs("out/hf", exist_ok=True)
for step in range(1, 7):
    opt.zero_grad()
    model(torch.randn(5, 8)).pow(2).mean().backward()
    opt.step()
    if step % 2 == 0:
        torch.save(model.state_dict(), "out/last.pt")   # the same path, three times
    if step == 3:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            save(model.state_dict(), checkpoint_id="out/dcp-3")
    if step == 5:
        save_torch_state_dict(model.state_dict(), "out/hf", max_shard_size=100)
"""


def _checkpoints(doc: dict[str, object]) -> list[tuple[int, str, str | None, str | None]]:
    outputs = doc["outputs"]
    assert isinstance(outputs, dict)
    return [(c["step"], c["path"], c["artifact"]["format"] if c["artifact"] else None,
             c["lost"]) for c in outputs["checkpoints"]]


@pytest.mark.slow
def test_each_checkpoint_is_recorded_with_its_step(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"saves.py": _SAVES}, example=False)
    cap = manifest_cli("capture", "--seed", "3", "--", "python", "saves.py", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    doc = json.loads(cap.stdout)
    assert _checkpoints(doc) == [
        (2, "out/last.pt", None, "saved again at step 6 (one file per checkpoint keeps each)"),
        (3, "out/dcp-3", "dcp", None),
        (4, "out/last.pt", None, "saved again at step 6 (one file per checkpoint keeps each)"),
        (5, "out/hf/model.safetensors.index.json", "safetensors-index", None),
        (6, "out/last.pt", "torch", None),
    ]
    by_step = {c["step"]: c for c in doc["outputs"]["checkpoints"]}
    assert set(by_step[5]["artifact"]["tensors"]) == {"weight", "bias"}
    assert set(by_step[3]["artifact"]["tensors"]) == {"weight", "bias"}
    # The step-6 file's table is the final weights: the trail's last point is step 6.
    assert doc["outputs"]["processes"][0]["trail"][-1]["step"] == 6


@pytest.mark.slow
def test_bundled_example_saves_every_n_steps(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    cap = manifest_cli("capture", "--seed", "0", "--artifact", "out/*.safetensors", "--",
                       "python", "train.py", "--steps", "20", "--save-every", "5", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    got = _checkpoints(json.loads(cap.stdout))
    assert got == [(5, "out/ckpt/step-5.pt", "torch", None),
                   (10, "out/ckpt/step-10.pt", "torch", None),
                   (15, "out/ckpt/step-15.pt", "torch", None),
                   (20, "out/ckpt/step-20.pt", "torch", None),
                   (20, "out/model.safetensors", "safetensors", None)]
