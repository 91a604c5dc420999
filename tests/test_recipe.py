"""The Python API: seed_everything, deterministic(), dataloader_kwargs, trail."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import manifest


@pytest.fixture(autouse=True)
def _hashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")


def _draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_seed_everything_seeds_python_numpy_and_torch() -> None:
    manifest.seed_everything(42)
    first = _draw()
    manifest.seed_everything(42)
    assert _draw() == first
    manifest.seed_everything(43)
    assert _draw() != first


def test_seed_everything_warns_without_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED")
    if not sys.flags.hash_randomization:
        pytest.skip("interpreter runs without hash randomisation")
    with pytest.warns(RuntimeWarning, match="PYTHONHASHSEED"):
        manifest.seed_everything(1)


def test_seed_everything_rejects_bad_seeds() -> None:
    with pytest.raises(ValueError, match="seed"):
        manifest.seed_everything(-1)


def test_deterministic_sets_and_restores_every_flag() -> None:
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")
    try:
        with manifest.deterministic():
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.backends.cudnn.deterministic is True
            assert torch.backends.cudnn.benchmark is False
            assert torch.backends.cuda.matmul.allow_tf32 is False
            assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark is True
        assert torch.get_float32_matmul_precision() == "high"

        @manifest.deterministic(warn_only=True)
        def inside() -> bool:
            return bool(torch.is_deterministic_algorithms_warn_only_enabled())

        assert inside() is True
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")


def test_dataloader_kwargs_give_repeatable_shuffles_and_worker_seeds() -> None:
    data = TensorDataset(torch.arange(32.0))

    def order(seed: int) -> list[float]:
        loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=2,
                            **manifest.dataloader_kwargs(seed))
        return [float(x) for (batch,) in loader for x in batch]

    assert order(5) == order(5)
    assert order(5) != order(6)


def test_trail_records_a_fingerprint_every_n_steps() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trail = manifest.trail(model, every=2)
    try:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
    finally:
        trail.remove()
    assert [step for step, _ in trail.points] == [2, 4]
    assert all(d.startswith("blake3:") for _, d in trail.points)
    assert trail.points[0][1] != trail.points[1][1]
