"""The recorded GPU model in each engine's words, and the refusal where the engine lacks it.

The engines themselves are exercised in tests/test_cluster_k8s_api.py (the stand-in API's
node labels), tests/test_cluster_ray.py (two raylets, one declaring H100s) and
tests/test_cluster_slurm.py (a typed GRES on one slurmd); here, the names and requests.
"""

from __future__ import annotations

import pytest

from manifest.rerun.cluster.hardware import (
    GpuNeed,
    gpu_need,
    k8s_product,
    k8s_selector,
    missing_model,
    ray_accelerator_type,
    ray_resources,
    slurm_gres_type,
    slurm_request,
)
from manifest.rerun.cluster.slurm import gpu_gres

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(("name", "ray", "gres", "product"), [
    (H100, "H100", "h100", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA H200", "H200", "h200", "NVIDIA-H200"),
    ("NVIDIA A100-SXM4-80GB", "A100", "a100", "NVIDIA-A100-SXM4-80GB"),
    ("Tesla V100-SXM2-16GB", "V100", "v100", "Tesla-V100-SXM2-16GB"),
])
def test_names_are_derived_as_each_engine_declares_them(name: str, ray: str, gres: str,
                                                        product: str) -> None:
    assert ray_accelerator_type(name) == ray
    assert slurm_gres_type(name) == gres
    assert k8s_product(name) == product


def test_the_sites_map_wins_over_the_derived_name() -> None:
    assert ray_accelerator_type(H100, {H100: "H100-80G"}) == "H100-80G"
    assert slurm_gres_type(H100, {H100: "hopper"}) == "hopper"
    assert k8s_product(H100, {H100: "h100-sxm"}) == "h100-sxm"


def test_each_engines_request() -> None:
    need = gpu_need([(H100, False, True), (H100, False, True)], 2)
    assert need == GpuNeed(model=H100, count=2, mig=False, ecc=True)
    assert ray_resources(need) == {"accelerator_type:H100": 0.001}
    assert slurm_request(need) == {"slurm_gres": "gpu:h100:2"}
    assert slurm_request(need, features={H100: "hopper80"}) == {
        "gpus_per_node": "2", "slurm_constraint": "hopper80"}
    assert k8s_selector(need, "nvidia.com/gpu.product") == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert need.unexpressed == ["MIG mode off", "ECC mode on"]
    # a CPU run asks for nothing; a count with no model asks for the count
    cpu = gpu_need(None, 0)
    assert (ray_resources(cpu), slurm_request(cpu), k8s_selector(cpu, "x")) == ({}, {}, {})
    assert slurm_request(GpuNeed(model=None, count=1)) == {"gpus_per_node": "1"}


def test_sinfo_gres_fields_are_read_by_type() -> None:
    assert gpu_gres("gpu:h100:2(S:0),gpu:a100:1") == {"h100": 2, "a100": 1}
    assert gpu_gres("gpu:4") == {"": 4}
    assert gpu_gres("(null)") == {}
    assert gpu_gres("gpu:h100:2(S:0-1),mps:100") == {"h100": 2}


def test_missing_model_names_what_the_run_recorded_and_what_the_cluster_has() -> None:
    need = GpuNeed(model=H100, count=2)
    said = missing_model(need, ["A100", "A100", "L4"], wanted="accelerator_type:H100",
                         per_node=[])
    assert said is not None
    assert said.startswith('the run recorded 2 × "NVIDIA H100 80GB HBM3" '
                           "(accelerator_type:H100) per node and the cluster has no node")
    assert '(it declares "A100", "L4")' in said and "--other-gpu" in said
    # too few per node is no fit either; enough is
    assert missing_model(need, ["H100"], wanted="w", per_node=[("n", 1)]) is not None
    assert missing_model(need, ["H100"], wanted="w", per_node=[("n", 2)]) is None
    two = missing_model(need, ["H100"], wanted="w", nodes=2, per_node=[("n", 2)])
    assert two is not None and "1 node with them of the 2 needed" in two
    assert missing_model(GpuNeed(model=None, count=0), [], wanted="w") is None


def test_a_hostile_gpu_name_is_quoted_printable_and_cut() -> None:
    name = "NVIDIA \x1b[31mH100\u202e" + "X" * 200
    said = missing_model(GpuNeed(model=name, count=1), [name], wanted="w", per_node=[])
    assert said is not None
    assert "\x1b" not in said and "\u202e" not in said and "X" * 65 not in said
