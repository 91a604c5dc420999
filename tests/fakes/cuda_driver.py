"""A CUDA driver faked on CPU, below torch: torch's own lazy init, queue and seeding run.

CI has no GPU, so the launcher's CUDA branches (the read of each device's RNG
state at first use, lazy seeding) would never run there. This module replaces
only what a CPU build of torch lacks, the boundary torch's Python code calls
into: ``torch._C._cuda_init`` (which, like the real one, makes each device's
default generator and seeds it from a nondeterministic source, as
``getDefaultCUDAGenerator`` does), the device count and a non-None
``_cudart``. Everything above it is torch's own code: ``_lazy_call``,
``_lazy_init`` with its queue (plain calls first, then the seed tracker's
seeds), ``manual_seed_all``, ``get_rng_state_all``. A change in how torch
orders them shows here as it would on a GPU.

Used by a training script copied into a test repository (``import
cuda_driver; cuda_driver.install()``), after ``import torch``, as a script
would import torch before touching CUDA. Each "device" generator is a CPU
``torch.Generator``, so a script can draw from it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DEVICE_NAME = "Fake CUDA device (CPU twin)"


def install(devices: int = 1) -> None:
    import torch

    cuda: Any = sys.modules["torch.cuda"]  # patched below: typed as what it is, a module
    if cuda.is_initialized():
        raise RuntimeError("CUDA is initialised already: install the fake driver before use")

    def cuda_init() -> None:
        generators = []
        for _ in range(devices):
            g = torch.Generator()
            g.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
            generators.append(g)
        cuda.default_generators = tuple(generators)
        # Only init needs "compiled with CUDA" (_lazy_init's check, device_count in the
        # queued seeds); left in place, torch's compiler stack would take this for a CUDA
        # build and import what it lacks. Forgotten by a call queued after the seeds.
        cuda._queued_calls.append((forget_compiled, []))

    def forget_compiled() -> None:
        del c._cuda_getDeviceCount

    c: Any = torch._C
    c._cuda_init = cuda_init
    c._cuda_getDeviceCount = lambda: devices
    cuda.is_available = lambda: True
    c._cuda_getDevice = lambda: 0
    cuda._cudart = object()
    random_module: Any = sys.modules.get("torch.cuda.random")
    for module in (cuda, random_module):
        if module is not None:  # random.py holds its own reference (manual_seed_all's loop)
            module.device_count = lambda: devices
    cuda.get_device_name = lambda device=None: DEVICE_NAME
    # What torch queued at import to run at init reads real device properties.
    skip = {"_check_capability", "_check_cubins", "_register_triton_kernels"}
    cuda._queued_calls[:] = [q for q in cuda._queued_calls if q[0].__name__ not in skip]
