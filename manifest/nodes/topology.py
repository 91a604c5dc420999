"""A capture's process records → ``command.topology`` and ``outputs.segments``.

Each launched process records the variables its launcher gave it
(``_manifest_topology``): torchrun's ``GROUP_RANK``/``RANK``/``LOCAL_RANK``/
``WORLD_SIZE``/``LOCAL_WORLD_SIZE``, SLURM's ``SLURM_NODEID``/``SLURM_PROCID``,
an Indexed Job's ``JOB_COMPLETION_INDEX``, MPI's ``OMPI_COMM_WORLD_*``/
``PMI_*``. The first variable present in each list below wins, so torchrun
inside ``srun`` is read as torchrun (its ranks are the process group's).

A capture whose ranks cover the whole world is a complete run; one that
covers part of it is a node record (``topology.node`` set) that ``manifest
merge`` joins with the others. A run without any of these variables (a plain
``python train.py``) has no topology, and its manifest keeps its bytes.

Collective settings, which lab and gate report (:func:`collective_summary`,
:func:`collective_problems`): torch's ``use_deterministic_algorithms`` sets no
NCCL variable (it only checks ``CUBLAS_WORKSPACE_CONFIG`` for cuBLAS), and
NCCL otherwise picks its algorithm per message size from a tuning model, NVLS
reducing inside the NVSwitch. Megatron-LM's ``--deterministic-mode`` refuses
to start unless ``NCCL_ALGO`` is one of :data:`DETERMINISTIC_ALGOS` (and
turns off flash attention and fused cross-entropy); its MCore helpers set
``Ring`` and ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``. The launcher's recipe
sets the same two where the user did not
(``manifest.launch.runner.RECIPE_NCCL``); the ranks record what they saw
(``command.topology.nccl``).
"""

from __future__ import annotations

from typing import Any

from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.launch.process import Process, read_process, read_processes
from manifest.models import Manifest, RankPlace, Segment, Topology

GLOBAL_RANK = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
NODE_RANK = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK",
             "JOB_COMPLETION_INDEX")
LOCAL_RANK = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
WORLD = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_WORLD = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
NODE_COUNT = ("GROUP_WORLD_SIZE", "SLURM_NNODES")


def _first_int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.strip().isdecimal():
            return int(value)
    return None


def launch_env(record: ProcessRecord) -> dict[str, str]:
    """The launcher variables a process saw, as strings (empty when it recorded none)."""
    return read_process(record).launch_env


def launcher_of(env: dict[str, str]) -> str | None:
    if "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env:
        return "torchrun"
    if "SLURM_PROCID" in env:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "mpi"
    if "JOB_COMPLETION_INDEX" in env:
        return "kubernetes"
    if "RANK" in env:
        return "env"
    return None


def global_rank(record: ProcessRecord) -> int | None:
    """The rank a launcher gave a process, whichever launcher it was."""
    return _first_int(launch_env(record), GLOBAL_RANK)


def _rank_of(process: Process) -> int:
    rank = _first_int(process.launch_env, GLOBAL_RANK)
    return (process.rank or 0) if rank is None else rank


def rendezvous_of(records: list[ProcessRecord]) -> str | None:
    """What names one distributed run across its node records: torchelastic's run id, or
    SLURM's job and step."""
    for process in read_processes(records):
        env = process.launch_env
        if env.get("TORCHELASTIC_RUN_ID"):
            return f"torchelastic:{env['TORCHELASTIC_RUN_ID']}"
        if env.get("SLURM_JOB_ID"):
            return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}".rstrip(".")
    return None


def topology_from_records(records: list[ProcessRecord]) -> Topology | None:
    """The topology of the ranks in ``records`` (the last attempt's), or None for a run
    that no launcher placed."""
    from manifest.launch.boot._manifest_topology import NCCL_VARS

    processes = read_processes(records)
    envs = [p.launch_env for p in processes]
    kinds = [k for k in (launcher_of(e) for e in envs) if k is not None]
    if not kinds:
        return None
    if "torchrun" in kinds and set(kinds) != {"torchrun"}:
        # torchrun started inside srun, an Indexed Job or mpirun (one torchrun per node, as a
        # cluster re-run places it): its agent carries the outer launcher's variables, but
        # the ranks are torchrun's workers.
        kept = [i for i, e in enumerate(envs) if launcher_of(e) == "torchrun"]
        processes, envs, kinds = ([processes[i] for i in kept], [envs[i] for i in kept],
                                  ["torchrun"])
    places: list[RankPlace] = []
    for process, env in zip(processes, envs, strict=True):
        places.append(RankPlace(
            rank=_rank_of(process), node=_first_int(env, NODE_RANK) or 0,
            local_rank=_first_int(env, LOCAL_RANK), device=process.device))
    places.sort(key=lambda p: p.rank)
    first = envs[0]
    world = _first_int(first, WORLD) or len(places)
    local_world = _first_int(first, LOCAL_WORLD)
    nodes = _first_int(first, NODE_COUNT)
    if nodes is None:
        nodes = world // local_world if local_world and world % local_world == 0 else (
            max(p.node for p in places) + 1)
    backends = sorted({p.backend for p in processes if p.backend is not None})
    lowest = min(range(len(processes)), key=lambda i: _first_int(envs[i], GLOBAL_RANK) or 0)
    nccl = {k: v for k, v in envs[lowest].items() if k in NCCL_VARS}
    covered = {p.rank for p in places}
    node = None
    if covered != set(range(world)):
        node = min(p.node for p in places)
    return Topology(
        launcher=kinds[0],  # type: ignore[arg-type]
        nodes=nodes, world_size=world, local_world_size=local_world,
        backend=backends[0] if backends else None, ranks=places, nccl=nccl, node=node)


def segments_from(earlier: list[ProcessRecord], last: list[ProcessRecord],
                  error: str | None) -> list[Segment] | None:
    """The attempts of an elastic run in order (None when it never restarted)."""
    from manifest.launch.runner import restart_of

    if not earlier:
        return None
    by_restart: dict[int, list[Process]] = {}
    for record in [*earlier, *last]:
        by_restart.setdefault(restart_of(record), []).append(read_process(record))
    out: list[Segment] = []
    final = max(by_restart)
    previous_world: int | None = None
    for restart in sorted(by_restart):
        group = by_restart[restart]
        world = _first_int(group[0].launch_env, WORLD)
        failure = next((p.exception for p in group if p.exception), None)
        if failure is None and restart != final:
            failure = "a process of this attempt failed or was stopped, and the run restarted"
        resized = (f"{previous_world} → {world}" if previous_world is not None
                   and world is not None and world != previous_world else None)
        out.append(Segment(
            restart=restart, world_size=world,
            ranks=sorted({_rank_of(r) for r in group}),
            error=error if restart == final else failure, resized=resized))
        previous_world = world if world is not None else previous_world
    return out


def writer_nodes(records: list[ProcessRecord], topology: Topology,
                 cwd: Any) -> dict[str, int]:
    """Output path (relative to ``cwd``) → the node whose rank opened it for writing: on a
    multi-node run each node writes to its own disk, so the merged manifest says where."""
    import os

    node_of = {p.rank: p.node for p in topology.ranks}
    out: dict[str, int] = {}
    base = os.path.realpath(str(cwd))
    for process in read_processes(records):
        rank = _rank_of(process)
        if rank not in node_of:
            continue
        for path, kind in process.opened.items():
            if "w" not in kind:
                continue
            rel = os.path.relpath(os.path.realpath(str(path)), base)
            if not rel.startswith(".."):
                out.setdefault(rel, node_of[rank])
    return out


DETERMINISTIC_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")
"""The ``NCCL_ALGO`` values Megatron-LM's deterministic mode accepts."""


def collective_summary(manifest: Manifest) -> str | None:
    """One line: layout, backend and the NCCL settings in force; None for one process."""
    topology = manifest.command.topology if manifest.command is not None else None
    if topology is None:
        return None
    per_node = topology.local_world_size or "uneven"
    settings = ", ".join(f"{k}={v}" for k, v in sorted(topology.nccl.items())) or "none set"
    return (f"{topology.nodes} node(s) × {per_node} process(es), world size "
            f"{topology.world_size}, backend {topology.backend or 'none'}; NCCL settings: "
            f"{settings}")


def collective_problems(manifest: Manifest) -> list[str]:
    """What keeps a distributed run from being recorded as one deterministic run."""
    topology = manifest.command.topology if manifest.command is not None else None
    if topology is None:
        return []
    problems = []
    if topology.node is not None:
        problems.append(f"a node record (node {topology.node} of {topology.nodes}), not the "
                        "whole run: merge the node records (manifest merge)")
    algo = topology.nccl.get("NCCL_ALGO")
    if topology.backend == "nccl" and algo not in DETERMINISTIC_ALGOS:
        problems.append(
            f"NCCL_ALGO is {algo or 'unset'}: NCCL then picks its algorithm per message size "
            f"(NVLS reduces inside the switch); Megatron-LM's deterministic mode accepts "
            f"{', '.join(DETERMINISTIC_ALGOS)}")
    return problems
