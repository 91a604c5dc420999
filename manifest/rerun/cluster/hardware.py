"""The recorded GPU model as each engine's request, and whether the engine has it.

A bit-exact verdict holds on the run's own GPU model: the same runs were bit-identical on
an H100 and an H200 in 126 of 126 trails, but a re-run on another device type gets no
numeric verdict (docs/guides/devices.md). So a cluster re-run asks for the model the run
recorded (NVML's name, ``hardware.gpus[*].name``), per node, in the engine's own words:

* Ray: ``accelerator_type:<T>``, the resource Ray itself declares on a node from NVML's
  name (``NVIDIA H100 80GB HBM3`` → ``H100``, Ray's own derivation when Ray is importable),
  with ``num_gpus``;
* SLURM: a typed GRES (``--gres=gpu:h100:N``), or a node feature (``--constraint``) where
  the site types its GPUs that way; the site's names come from
  ``[tool.manifest.executors.slurm] gpu_types`` / ``gpu_features``, else derived;
* Kubernetes: ``nvidia.com/gpu`` plus a node selector on the product label NVIDIA's GPU
  feature discovery sets (``nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3``); the key and
  the names are configurable.

MIG and ECC modes are not resources any of the three can request; when the run recorded
them, the request says so by name (:attr:`GpuNeed.unexpressed`).

Before anything is submitted, :func:`missing_model` reads the engine's view (Ray's node
resources, ``sinfo``'s GRES and features, the nodes' labels) and says, in one sentence,
what the run recorded and what the cluster has. ``--other-gpu`` runs anyway; the verdict
then follows the device rule.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MAX_NAME = 64
"""A GPU name is the manifest author's string: quoted and cut to this many characters."""


@dataclass(frozen=True)
class GpuNeed:
    """The recorded GPUs of one node: the model NVML named, how many, MIG and ECC modes."""

    model: str | None
    count: int
    mig: bool | None = None
    ecc: bool | None = None

    @property
    def unexpressed(self) -> list[str]:
        """What the run recorded that no engine request can carry."""
        said = []
        if self.mig is not None:
            said.append(f"MIG mode {'on' if self.mig else 'off'}")
        if self.ecc is not None:
            said.append(f"ECC mode {'on' if self.ecc else 'off'}")
        return said


def shown(name: str) -> str:
    """A recorded name as a sentence may quote it: printable ASCII, cut, quoted."""
    clean = "".join(c if c.isascii() and c.isprintable() else "?" for c in name)
    if len(clean) > MAX_NAME:
        clean = clean[:MAX_NAME] + "…"
    return f'"{clean}"'


def gpu_need(gpus: Sequence[tuple[str, bool | None, bool | None]] | None,
             count: int) -> GpuNeed:
    """One node's need from its recorded GPUs (name, MIG mode, ECC mode each); a node whose
    GPUs are of several models asks for the first one's (the others are named by the
    verdict's device rule)."""
    if not gpus or not count:
        return GpuNeed(model=None, count=count)
    name, mig, ecc = gpus[0]
    return GpuNeed(model=name, count=count, mig=mig, ecc=ecc)


_RAY_PATTERN = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def ray_accelerator_type(name: str, site: Mapping[str, str] | None = None) -> str:
    """The ``accelerator_type`` Ray declares for a GPU of this NVML name (the site's map
    first, else Ray's own derivation, else the same rule written here)."""
    if site and name in site:
        return site[name]
    with contextlib.suppress(Exception):  # Ray absent or its helper moved: the rule below
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        derived = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(  # type: ignore[no-untyped-call]
            name)
        if isinstance(derived, str) and derived:
            return derived
    match = _RAY_PATTERN.match(name)
    if match and len(match.group(1)) > 1:
        return match.group(1).replace(" ", "-")
    return re.sub(r"^NVIDIA\s+", "", name).strip().replace(" ", "-")


def slurm_gres_type(name: str, site: Mapping[str, str] | None = None) -> str:
    """The GRES type a site would give this GPU: the map, else Ray's model token lowercased
    (``NVIDIA H100 80GB HBM3`` → ``h100``), which is how most sites name theirs."""
    if site and name in site:
        return site[name]
    return ray_accelerator_type(name).lower()


def k8s_product(name: str, site: Mapping[str, str] | None = None) -> str:
    """The value GPU feature discovery writes in ``nvidia.com/gpu.product``: NVML's name with
    spaces as hyphens (``NVIDIA-H100-80GB-HBM3``), or the site's map."""
    if site and name in site:
        return site[name]
    return "-".join(name.split())


def ray_resources(need: GpuNeed, site: Mapping[str, str] | None = None) -> dict[str, float]:
    """The custom resource a Ray task or job asks for besides ``num_gpus``: the same tiny
    share Ray's own ``accelerator_type=`` option requests."""
    if need.model is None:
        return {}
    return {f"accelerator_type:{ray_accelerator_type(need.model, site)}": 0.001}


def slurm_request(need: GpuNeed, types: Mapping[str, str] | None = None,
                  features: Mapping[str, str] | None = None) -> dict[str, str]:
    """submitit parameters for the GPUs: ``slurm_gres`` typed, or ``slurm_constraint``
    plus ``gpus_per_node`` where the site names the model by feature."""
    if not need.count:
        return {}
    if need.model is None:
        return {"gpus_per_node": str(need.count)}
    if features and need.model in features:
        return {"gpus_per_node": str(need.count), "slurm_constraint": features[need.model]}
    return {"slurm_gres": f"gpu:{slurm_gres_type(need.model, types)}:{need.count}"}


def k8s_selector(need: GpuNeed, label: str, products: Mapping[str, str] | None = None
                 ) -> dict[str, str]:
    """The node selector that puts a pod on the recorded model."""
    if need.model is None or not need.count:
        return {}
    return {label: k8s_product(need.model, products)}


def missing_model(need: GpuNeed, have: Iterable[str], *, wanted: str, nodes: int = 1,
                  per_node: Sequence[tuple[str, int]] | None = None) -> str | None:
    """None when the cluster has ``nodes`` nodes with ``wanted`` (the engine's word for the
    recorded model) and enough of them, else one sentence: what the run recorded and what
    the cluster has. ``have`` is every model the cluster declares; ``per_node`` the count of
    ``wanted`` on each node."""
    if need.model is None or not need.count:
        return None
    fit = [n for n, count in (per_node or []) if count >= need.count]
    if per_node is not None and len(fit) >= nodes:
        return None
    seen = sorted(set(have))
    has = ", ".join(shown(h) for h in seen[:6]) + (f" and {len(seen) - 6} more"
                                                   if len(seen) > 6 else "")
    each = f"{need.count} × {shown(need.model)} ({wanted})"
    where = ("no node with them" if nodes == 1 or not fit
             else f"{len(fit)} node{'s' if len(fit) != 1 else ''} with them of the {nodes} "
                  "needed")
    return (f"the run recorded {each} per node and the cluster has {where} "
            f"(it declares {has or 'no GPU model'}); --other-gpu runs it anyway, and then "
            "no numeric verdict is given across GPU models")
