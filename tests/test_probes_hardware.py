"""Hardware probe: NVML through a fake (and the real one when present), CPU facts."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import blake3_name, dumps
from manifest.capture.snapshot import capture_snapshot
from manifest.probes import hardware
from manifest.probes.hardware import logical_cpus, probe_hardware, read_cpu, read_nvml
from tests.conftest import FakeGpu, FakeNvml, GitRepo

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma avx512f avx512bw amx_tile amx_bf16 ht

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_1
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


@pytest.mark.fake_gpu
def test_two_gpus_through_fake_nvml(fake_nvml: FakeNvml) -> None:
    hw, facts, reason = probe_hardware(fake_nvml)
    assert reason is None
    assert facts is not None
    assert hw.gpu_count == 2
    assert hw.gpu_driver == "550.54.15"
    assert facts.cuda_driver == "12.4"
    assert hw.gpus is not None
    gpu = hw.gpus[1]
    assert (gpu.index, gpu.name, gpu.memory_bytes, gpu.compute_capability) == (
        1, "NVIDIA H100 80GB HBM3", 85_520_809_984, "9.0")
    assert (gpu.mig_mode, gpu.ecc_mode) == (False, True)
    assert facts.uuid_hashes == [blake3_name(g.uuid.encode()) for g in fake_nvml.gpus]
    assert "gpus" not in hw.unavailable
    assert fake_nvml.calls[0] == "nvmlInit"
    assert fake_nvml.calls[-1] == "nvmlShutdown"
    assert "GPU-" not in hw.model_dump_json(), "UUIDs never enter the hardware section"


@pytest.mark.fake_gpu
def test_features_a_board_lacks_are_null() -> None:
    nvml = FakeNvml([FakeGpu(name="NVIDIA GeForce RTX 4090", mig=None, ecc=None)],
                    driver=b"535.104.05", cuda_driver=12020)
    hw, facts, _ = probe_hardware(nvml)
    assert hw.gpus is not None
    assert (hw.gpus[0].mig_mode, hw.gpus[0].ecc_mode) == (None, None)
    assert hw.gpu_driver == "535.104.05"
    assert facts is not None
    assert facts.cuda_driver == "12.2"


@pytest.mark.fake_gpu
def test_driver_present_but_not_loaded() -> None:
    nvml = FakeNvml(fail_init=True)
    hw, facts, reason = probe_hardware(nvml)
    assert facts is None
    assert hw.gpus is None
    assert hw.gpu_count is None
    assert reason == "NVML could not initialise: Driver Not Loaded"
    assert hw.unavailable["gpus"] == reason


@pytest.mark.fake_gpu
def test_query_failure_is_a_reason_and_nvml_is_shut_down() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise self.NVMLError("GPU is lost")

    nvml = Broken()
    facts, reason = read_nvml(nvml)
    assert facts is None
    assert reason == "NVML query failed: GPU is lost"
    assert nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.fake_gpu
def test_zero_gpus() -> None:
    hw, facts, _ = probe_hardware(FakeNvml([]))
    assert hw.gpus == []
    assert hw.gpu_count == 0
    assert facts is not None


@pytest.mark.fake_gpu
def test_capture_with_fake_gpus_keeps_uuids_out_of_identity(
    repo: GitRepo, fake_nvml: FakeNvml
) -> None:
    manifest = capture_snapshot(repo.path, nvml=fake_nvml)
    assert manifest.hardware.gpu_count == 2
    assert manifest.env.cuda_driver == "12.4"
    assert "cuda_driver" not in manifest.env.unavailable
    assert len(manifest.observed.gpu_uuid_hashes) == 2
    data = dumps(manifest)
    for gpu in fake_nvml.gpus:
        assert gpu.uuid.encode() not in data
    again = capture_snapshot(repo.path, nvml=FakeNvml(
        [FakeGpu(uuid="GPU-other-1"), FakeGpu(uuid="GPU-other-2")]))
    assert again.run_id == manifest.run_id, "another board of the same SKU is the same run"
    fewer = capture_snapshot(repo.path, nvml=FakeNvml([FakeGpu()]))
    assert fewer.run_id != manifest.run_id, "GPU count is identity"


def test_no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(name: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(sys, "platform", "linux")
    hw, facts, reason = probe_hardware()
    assert facts is None
    assert hw.gpus is None
    assert reason == "NVML library not available (libnvidia-ml.so.1): no NVIDIA driver"


def test_no_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")  # skips the driver check
    monkeypatch.setitem(sys.modules, "pynvml", None)
    facts, reason = read_nvml()
    assert facts is None
    assert reason == "nvidia-ml-py (pynvml) is not installed"


def test_probe_without_a_driver_never_raises() -> None:
    hw, _facts, reason = probe_hardware()
    assert (hw.gpus is None) == (reason is not None)
    assert hw.cpu_isa == sorted(hw.cpu_isa)


@pytest.mark.gpu
def test_real_gpu() -> None:
    hw, facts, reason = probe_hardware()
    assert reason is None
    assert facts is not None
    assert hw.gpus
    assert hw.gpu_count == len(hw.gpus)
    assert all(g.name for g in hw.gpus)
    assert facts.cuda_driver is not None


def test_cpu_model_and_isa_x86(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86_CPUINFO)
    model, isa = read_cpu(cpuinfo)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert isa == ["amx_bf16", "amx_tile", "avx", "avx2", "avx512bw", "avx512f", "fma",
                   "sse4_1", "sse4_2"]


def test_cpu_model_and_isa_aarch64(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ARM_CPUINFO)
    model, isa = read_cpu(cpuinfo)
    assert model is not None
    assert model.endswith("part 0xd4f")
    assert isa == ["asimd", "bf16", "i8mm", "sve", "sve2"]


def test_cpu_info_unreadable(tmp_path: Path) -> None:
    assert read_cpu(tmp_path / "absent") == (None, [])
    hw, _, _ = probe_hardware()
    assert isinstance(hw.cpu_isa, list)


def test_logical_cpus() -> None:
    count = logical_cpus()
    assert count is not None
    assert count >= 1


def test_hardware_module_does_not_import_pynvml_without_a_driver() -> None:
    assert hardware.NVML_LIBRARY == "libnvidia-ml.so.1"
