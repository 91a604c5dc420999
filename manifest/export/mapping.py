"""What a run consists of, once, for every export format.

Each exporter walks these plain records instead of the manifest, so CycloneDX
and SPDX cannot disagree about what a run used and produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from manifest.models import Manifest


def hex_of(digest: str) -> str:
    """``blake3:<hex>`` → ``<hex>``."""
    return digest.split(":", 1)[1]


@dataclass(frozen=True)
class Item:
    """One thing the run used or produced."""

    key: str
    """Stable local name: ``code``, ``data:NAME``, ``model:PATH``, ``pkg:NAME``, ``gpu:N``."""
    name: str
    version: str | None = None
    blake3: str | None = None
    sha1: str | None = None
    props: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunBill:
    run_id: str
    started: str
    finished: str
    tool_version: str
    code: Item | None
    data: list[Item]
    models: list[Item]
    packages: list[Item]
    hardware: list[Item]
    env: dict[str, str]
    parameters: dict[str, str]
    compute: dict[str, str]
    energy_kwh: float | None


def _put(props: dict[str, str], key: str, value: object) -> None:
    if value is not None:
        props[key] = str(value).lower() if isinstance(value, bool) else str(value)


def run_bill(manifest: Manifest) -> RunBill:
    code = manifest.code
    code_item = None
    if code.commit is not None:
        props: dict[str, str] = {}
        _put(props, "manifest:code:dirty", code.dirty)
        _put(props, "manifest:code:diff_digest", code.diff_digest)
        for path, digest in sorted(code.lockfiles.items()):
            props[f"manifest:code:lockfile:{path}"] = digest
        code_item = Item("code", "source tree", version=code.commit,
                         sha1=code.commit if len(code.commit) == 40 else None, props=props)
    data = [Item(f"data:{d.name}", d.name, blake3=hex_of(d.root),
                 props={"manifest:data:path": d.path, "manifest:data:files": str(d.files),
                        "manifest:data:bytes": str(d.bytes)})
            for d in manifest.data]
    models = []
    if manifest.outputs is not None:
        for art in manifest.outputs.artifacts:
            props = {"manifest:artifact:format": art.format,
                     "manifest:artifact:bytes": str(art.bytes)}
            if art.tensors is not None:
                props["manifest:artifact:tensors"] = str(len(art.tensors))
            models.append(Item(f"model:{art.path}", art.path, blake3=hex_of(art.digest),
                               props=props))
    env = manifest.env
    packages = [Item(f"pkg:{name}", name, version=version)
                for name, version in sorted(env.packages.items())]
    hw = manifest.hardware
    hardware = []
    for gpu in hw.gpus or []:
        props = {}
        _put(props, "manifest:gpu:memory_bytes", gpu.memory_bytes)
        _put(props, "manifest:gpu:compute_capability", gpu.compute_capability)
        _put(props, "manifest:gpu:driver", hw.gpu_driver)
        hardware.append(Item(f"gpu:{gpu.index}", gpu.name, props=props))
    if hw.cpu_model:
        hardware.append(Item("cpu", hw.cpu_model,
                             props={"manifest:cpu:isa": " ".join(hw.cpu_isa)}))
    env_facts: dict[str, str] = {}
    for key in ("python", "torch", "torch_cuda", "torch_hip", "cudnn", "nccl", "cuda_runtime",
                "cuda_driver", "numpy", "blas"):
        _put(env_facts, key, getattr(env, key))
    env_facts["packages_digest"] = env.packages_digest
    for key, value in sorted(env.variables.items()):
        env_facts[f"env:{key}"] = value
    params: dict[str, str] = {}
    if manifest.command is not None:
        params["argv"] = " ".join(manifest.command.argv)
        params["cwd"] = manifest.command.cwd
    _put(params, "seed", manifest.randomness.seed)
    _put(params, "seed_derivation", manifest.randomness.derivation)
    _put(params, "deterministic", manifest.determinism.requested)
    _put(params, "num_threads", manifest.determinism.num_threads)
    compute: dict[str, str] = {}
    energy_kwh = None
    c = manifest.observed.compute
    if c is not None:
        compute["wall_s"] = str(c.wall_s)
        for rank in c.ranks:
            compute[f"rank {rank.rank} wall_s"] = str(rank.wall_s)
        compute["gpu_count"] = str(c.gpu_count)
        compute["gpu_hours"] = str(c.gpu_hours)
        if c.energy_j is not None:
            compute["energy_j"] = str(c.energy_j)
            energy_kwh = c.energy_j / 3.6e6
        for gpu_energy in c.gpus:
            compute[f"gpu {gpu_energy.index} energy_j"] = str(gpu_energy.energy_j)
    return RunBill(manifest.run_id, manifest.observed.started_at, manifest.observed.finished_at,
                   manifest.observed.tool_version, code_item, data, models, packages, hardware,
                   env_facts, params, compute, energy_kwh)
