"""Hardware probe: GPUs through NVML, CPU model and the ISA flags that pick kernels.

NVML is reached through nvidia-ml-py (``pynvml``). It is imported only after
a cheap check that the driver library loads at all, so machines without an
NVIDIA driver pay nothing. NVML does not create a CUDA context, so probing
never changes the state a run will see. NVML ignores CUDA_VISIBLE_DEVICES:
every GPU on the machine is listed; the variable itself is recorded in env.

GPU UUIDs identify one physical board; they go to ``observed`` as blake3
hashes only, never into the run's identity.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manifest.canonical import blake3_name
from manifest.models import Gpu, Hardware

# Flags that select different CPU kernels (oneDNN, MKL, ATen dispatch).
ISA_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx_vnni_int8",
    "avx_ne_convert", "avx_ifma", "amx_bf16", "amx_int8", "amx_tile", "amx_fp16", "amx_complex",
    "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
    "avx512_vpopcntdq", "avx512_4vnniw", "avx512_4fmaps", "avx512er", "avx512pf",
    # aarch64
    "asimd", "asimdhp", "asimddp", "sve", "sve2", "sme", "sme2", "bf16", "i8mm", "fphp",
})

NVML_LIBRARY = "libnvidia-ml.so.1"


@dataclass(frozen=True)
class NvmlFacts:
    gpus: list[Gpu]
    driver: str | None
    cuda_driver: str | None
    uuid_hashes: list[str] = field(default_factory=list)


def _load_pynvml() -> Any:
    """pynvml, or raise OSError/ImportError if no driver library is loadable."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(NVML_LIBRARY)  # raises OSError fast when there is no driver
    import pynvml

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: Any | None = None) -> tuple[NvmlFacts | None, str | None]:
    """GPU facts via NVML, or (None, reason). ``nvml`` may be a fake of pynvml."""
    if nvml is None:
        try:
            nvml = _load_pynvml()
        except OSError:
            return None, f"NVML library not available ({NVML_LIBRARY}): no NVIDIA driver"
        except ImportError:
            return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and subclasses
        return None, f"NVML could not initialise: {exc}"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_int = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        cuda_driver = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
        gpus: list[Gpu] = []
        uuids: list[str] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_bytes=_optional(lambda h=handle: int(nvml.nvmlDeviceGetMemoryInfo(h).total)),
                compute_capability=_optional(
                    lambda h=handle: "{}.{}".format(*nvml.nvmlDeviceGetCudaComputeCapability(h))),
                mig_mode=_optional(
                    lambda h=handle: bool(nvml.nvmlDeviceGetMigMode(h)[0])),
                ecc_mode=_optional(
                    lambda h=handle: bool(nvml.nvmlDeviceGetEccMode(h)[0])),
            ))
            uuid = _optional(lambda h=handle: _text(nvml.nvmlDeviceGetUUID(h)))
            if uuid:
                uuids.append(blake3_name(uuid.encode()))
        return NvmlFacts(gpus, driver, cuda_driver, uuids), None
    except Exception as exc:
        return None, f"NVML query failed: {exc}"
    finally:
        # A failing shutdown changes nothing already recorded.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _optional(read: Any) -> Any:
    """A value NVML may not support on this board (MIG/ECC on consumer GPUs)."""
    try:
        return read()
    except Exception:
        return None


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str | None, list[str]]:
    """CPU model name and the kernel-selecting ISA flags."""
    model: str | None = None
    flags: set[str] = set()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model Name", "cpu model") and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    if model is None:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "CPU part":
                model = f"{os.uname().machine} part {value.strip()}"
                break
    return model, sorted(flags & ISA_FLAGS)


def probe_hardware(nvml: Any | None = None) -> tuple[Hardware, NvmlFacts | None, str | None]:
    """Hardware section plus the raw NVML facts (driver for env, UUIDs for observed)."""
    facts, reason = read_nvml(nvml)
    cpu_model, isa = read_cpu()
    unavailable: dict[str, str] = {}
    if facts is None:
        unavailable["gpus"] = reason or "NVML not available"
    if cpu_model is None:
        unavailable["cpu_model"] = "CPU model not reported by the OS"
    hardware = Hardware(
        gpus=facts.gpus if facts else None,
        gpu_count=len(facts.gpus) if facts else None,
        gpu_driver=facts.driver if facts else None,
        cpu_model=cpu_model,
        cpu_isa=isa,
        unavailable=unavailable,
    )
    return hardware, facts, reason


def logical_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
