"""The compute record of a run: wall time per rank, GPU-hours, energy per GPU.

The EU AI Act's documentation for general-purpose models (Annex XI) asks for the
compute and energy a training used, and NIST's AI RMF for its resource cost; the
numbers belong with the run that spent them. They go in ``observed``: they
describe a run, they never name it (two identical runs cost different joules).

Energy comes from NVML's total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption``: millijoules since the driver loaded,
Volta and later), read once before the command and once after; the delta is
the run's energy on that board. Two reads cost two ``nvmlInit`` calls (tens of
ms with a driver, about 0.1 ms without one: the library load fails at once)
and no sampling thread: polling power at 1 Hz would miss bursts and run
beside the training. The counter is per board, so another process on the same
GPU is counted too; a board that does not expose it is named in
``unavailable``. GPU-hours are the GPUs visible to the run (NVML's count,
narrowed by a numeric ``CUDA_VISIBLE_DEVICES``) times the command's wall time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from manifest.launch.boot._manifest_wire import ProcessRecord

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class EnergyReading:
    """Counter values (mJ) per GPU index, and why any board has none."""

    mj: dict[int, int] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    gpu_count: int = 0


def read_energy(nvml: Any | None = None) -> EnergyReading:
    """Every GPU's total-energy counter; never raises (``nvml`` may be a fake of pynvml)."""
    from manifest.probes.hardware import NVML_LIBRARY, _load_pynvml

    if nvml is None:
        try:
            nvml = _load_pynvml()
        except OSError:
            return EnergyReading(unavailable={
                "energy": f"NVML library not available ({NVML_LIBRARY}): no NVIDIA driver"})
        except ImportError:
            return EnergyReading(unavailable={"energy": "nvidia-ml-py (pynvml) is not installed"})
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and subclasses
        return EnergyReading(unavailable={"energy": f"NVML could not initialise: {exc}"})
    try:
        count = int(nvml.nvmlDeviceGetCount())
        values: dict[int, int] = {}
        missing: dict[str, str] = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                values[index] = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except Exception as exc:
                missing[f"gpu {index}"] = f"total-energy counter not exposed: {exc}"
        return EnergyReading(values, missing, count)
    except Exception as exc:
        return EnergyReading(unavailable={"energy": f"NVML query failed: {exc}"})
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def visible_gpus(count: int, env: Mapping[str, str]) -> list[int]:
    """NVML indices the run could use: all, or those a numeric CUDA_VISIBLE_DEVICES names."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    picked: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdecimal():
            # CUDA stops at the first entry it cannot parse; UUIDs/MIG names are
            # not mapped to NVML indices here: stop the same way.
            break
        index = int(part)
        if index < count and index not in picked:
            picked.append(index)
    return picked


def compute_record(
    *,
    wall_s: float,
    records: list[ProcessRecord],
    before: EnergyReading,
    after: EnergyReading,
    env: Mapping[str, str],
) -> dict[str, Any]:
    """The ``observed.compute`` section of a run (a dict for the sealing step)."""
    ranks = []
    for r in records:
        start, end, rank = r.get("start_ns"), r.get("end_ns"), r.get("rank")
        if isinstance(start, int) and isinstance(end, int) and isinstance(rank, int):
            ranks.append({"rank": rank, "wall_s": round(max(0, end - start) / NS_PER_S, 6)})
    ranks.sort(key=lambda x: x["rank"])
    gpus = visible_gpus(max(before.gpu_count, after.gpu_count), env)
    unavailable = {**before.unavailable, **after.unavailable}
    energy = []
    for index in gpus:
        a, b = before.mj.get(index), after.mj.get(index)
        if a is None or b is None:
            unavailable.setdefault(f"gpu {index}", "total-energy counter not read")
            continue
        if b < a:  # the driver reloaded during the run and the counter restarted
            unavailable[f"gpu {index}"] = "total-energy counter went back (driver reloaded?)"
            continue
        energy.append({"index": index, "energy_j": round((b - a) / 1000, 3)})
    if not gpus and not unavailable:
        unavailable["energy"] = "no GPU visible to the run"
    wall = round(max(0.0, wall_s), 6)  # GPU-hours from the recorded wall time, not a finer one
    return {
        "wall_s": wall,
        "ranks": ranks,
        "gpu_count": len(gpus),
        "gpu_hours": round(len(gpus) * wall / 3600, 9),
        "energy_j": round(sum(e["energy_j"] for e in energy), 3) if energy else None,
        "gpus": energy,
        "unavailable": unavailable,
    }
