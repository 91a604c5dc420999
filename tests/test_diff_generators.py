"""A generator the run never drew from cannot change the bits: diff says so, fail-safe.

Real captures of real CPU torch scripts under ``--seed 0`` and ``--seed 1``, through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.runs import make_repo, manifest_cli

pytestmark = pytest.mark.slow

TRAIN = '''\
import os
import random
import torch
torch.manual_seed(123)
{draw}
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
for _ in range(3):
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
os.makedirs("out", exist_ok=True)
torch.save(model.state_dict(), "out/model.pt")
'''


def diff_seeds(tmp_path: Path, draw: str) -> tuple[int, list[dict[str, Any]]]:
    repo = make_repo(tmp_path / "r", {"train.py": TRAIN.format(draw=draw)}, example=False)
    for seed in ("0", "1"):
        proc = manifest_cli("capture", "--seed", seed, "--output", "out/*.pt", "--",
                            "python", "train.py", cwd=repo)
        assert proc.returncode == 0, proc.stderr.decode()
        (repo / f"s{seed}.json").write_bytes(proc.stdout)
    proc = manifest_cli("diff", "s0.json", "s1.json", "--json", cwd=repo)
    lines: list[dict[str, Any]] = json.loads(proc.stdout)["differences"]
    return proc.returncode, lines


def rng_lines(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["path"]: d for d in lines
            if d["path"].endswith((".python", ".numpy")) or d["path"].endswith("seed")}


def test_script_seeding_torch_itself_diffs_clean(tmp_path: Path) -> None:
    code, lines = diff_seeds(tmp_path, draw="")
    assert code == 0, [d for d in lines if d["impact"] == "bits"]
    found = rng_lines(lines)
    for path in ("randomness.processes[0].at_start.python",
                 "randomness.processes[0].at_start.numpy",
                 "outputs.processes[0].at_exit.python", "outputs.processes[0].at_exit.numpy"):
        assert found[path]["impact"] == "benign" and "never drawn from" in found[path]["reason"]
    for path in ("randomness.seed", "randomness.processes[0].seed"):
        reason = found[path]["reason"]
        assert found[path]["impact"] == "benign"
        assert "python: never drawn from" in reason and "train.py:4" in reason


def test_script_that_draws_from_random_keeps_bits(tmp_path: Path) -> None:
    """Positive control: one draw from ``random`` and the launcher's seed counts again.
    The weights are identical all the same (the script seeds torch), so each such line
    says so and the exit status follows the outputs (issue 28: makemore's case)."""
    code, lines = diff_seeds(tmp_path, draw="random.random()")
    assert code == 0
    found = rng_lines(lines)
    assert found["randomness.seed"]["impact"] == "bits"
    assert found["outputs.processes[0].at_exit.python"]["impact"] == "bits"
    assert "here the outputs are identical" in found["randomness.seed"]["reason"]
    # numpy was still never drawn from.
    assert found["outputs.processes[0].at_exit.numpy"]["impact"] == "benign"


def test_a_restored_state_is_not_taken_for_no_draw(tmp_path: Path) -> None:
    """Fail-safe: a draw hidden by setstate leaves the state at exit equal to the state at
    start; the launcher saw the restore, so the python lines stay bits."""
    code, lines = diff_seeds(
        tmp_path, draw="saved = random.getstate(); random.random(); random.setstate(saved)")
    assert code == 0  # the lines stay bits; the identical weights decide the exit status
    found = rng_lines(lines)
    for name in ("s0.json", "s1.json"):  # in each run the state at exit is the one at start
        doc = json.loads((tmp_path / "r" / name).read_bytes())
        start = doc["randomness"]["processes"][0]
        assert start["at_start"]["python"] == doc["outputs"]["processes"][0]["at_exit"]["python"]
        assert start["unaccounted"] == ["python"]
    for path in ("randomness.processes[0].at_start.python", "outputs.processes[0].at_exit.python",
                 "randomness.seed"):
        assert found[path]["impact"] == "bits", path
