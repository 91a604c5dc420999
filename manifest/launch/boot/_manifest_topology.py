"""Where this process sits in a distributed run: the launcher's variables, backend, device.

The topology hook of the launcher (``_manifest_launch``). A multi-node run is
recorded one node at a time (``manifest capture -- torchrun --nnodes=N
--node-rank=i …``), so each process says, in its own record, what its
launcher told it: torchrun's ``GROUP_RANK``/``RANK``/``LOCAL_RANK``/
``WORLD_SIZE``/``LOCAL_WORLD_SIZE``/restart count/rendezvous id, SLURM's
``SLURM_NODEID``/``SLURM_PROCID``/…, a Kubernetes Indexed Job's
``JOB_COMPLETION_INDEX``, MPI's ``OMPI_COMM_WORLD_*``/``PMI_*``. The worker
sees them, not the capture (torchrun sets them per worker), which is why they
are read here. ``manifest.nodes.topology`` turns them into the manifest's
``command.topology``.

The NCCL variables a deterministic run depends on are read here too, as the
worker sees them: the recipe sets ``NCCL_ALGO`` where the user did not
(``manifest.launch.runner``), a user may set the others.

The backend is read when the script calls ``init_process_group`` (a script
usually destroys the group before exit), the device at exit, without
initialising CUDA.

Standard library only: imported at start-up of every launched process.
"""

from __future__ import annotations

import contextlib
import functools
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the record's type, for mypy only: nothing more loads at start-up
    from manifest.launch.boot._manifest_wire import ProcessRecord

LAUNCH_VARS = (
    # torchrun / torchelastic
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    # SLURM
    "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_NTASKS",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT",
    # Kubernetes Indexed Job
    "JOB_COMPLETION_INDEX",
    # MPI (Open MPI, MPICH/PMI)
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE",
    "CUDA_VISIBLE_DEVICES",
)
"""Variables a launcher gives each process to say where it sits (never addresses or ports:
those name machines, not the run)."""

NCCL_VARS = (
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
    "NCCL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE",
    "NCCL_TREE_THRESHOLD", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
    "NCCL_NET", "NCCL_CROSS_NIC", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_CUMEM_ENABLE",
    "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
)
"""Settings that choose a collective's algorithm, protocol, channel count or transport, and
so the order its sums are taken in (``NVTE_…``: Transformer Engine's kernel switch, which
Megatron's deterministic mode sets beside ``NCCL_ALGO``)."""


def launch_env() -> dict[str, str]:
    """The launcher variables and NCCL settings this process started with."""
    return {k: os.environ[k] for k in (*LAUNCH_VARS, *NCCL_VARS) if k in os.environ}


def on_torch(torch: ModuleType, record: ProcessRecord) -> None:
    """Note the backend when the script starts a process group."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not hasattr(dist, "init_process_group"):
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            record["backend"] = str(dist.get_backend())
        return result

    dist.init_process_group = init_process_group
    c10d = getattr(dist, "distributed_c10d", None)
    if c10d is not None and getattr(c10d, "init_process_group", None) is original:
        c10d.init_process_group = init_process_group


def at_exit(record: ProcessRecord, torch: ModuleType | None) -> None:
    """The device this process computed on: ``cuda:<physical index>`` or ``cpu``."""
    if torch is None:
        return
    device = "cpu"
    with contextlib.suppress(Exception):
        if torch.cuda.is_initialized():
            index = int(torch.cuda.current_device())
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            parts = [p.strip() for p in visible.split(",")] if visible else []
            physical = parts[index] if index < len(parts) else str(index)
            if not physical.isdigit():  # a GPU-/MIG- UUID names a board, not a place
                physical = str(index)
            device = f"cuda:{physical}"
    record["device"] = device
    if "backend" not in record:
        with contextlib.suppress(Exception):
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                record["backend"] = str(dist.get_backend())
