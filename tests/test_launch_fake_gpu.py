"""The launcher's CUDA paths, against a fake torch with a fake GPU (CPU-only machines)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from manifest.launch.boot import _manifest_rng as rng
from manifest.launch.boot import _manifest_switches as switches

pytestmark = pytest.mark.fake_gpu


class _State:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def numpy(self) -> Any:
        import numpy as np

        return np.frombuffer(self.data, dtype=np.uint8)


def _fake_torch(initialised: bool) -> Any:
    cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: initialised,
        get_rng_state_all=lambda: [_State(b"dev0"), _State(b"dev1")],
        device_count=lambda: 2,
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
        nccl=SimpleNamespace(version=lambda: (2, 21, 5)),
    )
    return SimpleNamespace(
        cuda=cuda,
        version=SimpleNamespace(cuda="12.4", hip=None),
        backends=SimpleNamespace(cudnn=SimpleNamespace(is_available=lambda: True,
                                                       version=lambda: 90100)),
        get_rng_state=lambda: _State(b"cpu-state"),
    )


def test_loaded_versions_read_cudnn_nccl_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialised=True))
    got = switches.loaded_versions()
    assert got == {"cuda_runtime": "12.4", "cudnn": "9.1.0", "nccl": "2.21.5",
                   "devices": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]}


def test_cuda_rng_states_are_fingerprinted_only_once_cuda_is_initialised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialised=False))
    cpu, cuda = rng.torch_rng_fingerprints()
    assert cpu is not None and cuda == []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialised=True))
    cpu2, cuda2 = rng.torch_rng_fingerprints()
    assert cpu2 == cpu
    assert len(cuda2) == 2 and cuda2[0] != cuda2[1]


def test_cudnn_version_encodings() -> None:
    assert switches._cudnn_text(90100) == "9.1.0"
    assert switches._cudnn_text(90300) == "9.3.0"
    assert switches._cudnn_text(8902) == "8.9.2"
