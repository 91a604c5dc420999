"""Write the golden manifest pairs for ``manifest diff`` (tests/test_diff_golden.py).

Each case is a folder holding ``a.json`` and ``b.json`` (sealed canonical
manifests, except where the case is a bad file) and ``expected.json`` (the
``manifest diff --json`` document, or the exit status and error for a bad
file). The pairs are built from one base manifest by a small edit each, so a
reader sees what each case changes in ``CASES`` below.

    python tests/golden/diff/make_pairs.py            # rewrite the folders here
    python tests/golden/diff/make_pairs.py --out DIR  # write elsewhere (drift test)

A change to these files is a change to the diff's output: review it.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from manifest.canonical import dumps, seal
from manifest.cli.render_diff import diff_json_bytes
from manifest.diff.engine import diff_manifests, load_for_diff

HERE = Path(__file__).resolve().parent

Doc = dict[str, Any]


def d(label: str) -> str:
    """A stable fake digest named by a label."""
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def base() -> Doc:
    """A one-GPU training run with a step trail and a safetensors output."""
    flags = {
        "deterministic_algorithms": True, "deterministic_warn_only": False,
        "cudnn_deterministic": True, "cudnn_benchmark": False, "allow_tf32_matmul": False,
        "allow_tf32_cudnn": False, "float32_matmul_precision": "highest", "autocast": False,
        "num_threads": 2, "num_interop_threads": 2,
    }
    fingerprints = {"python": d("py0"), "numpy": d("np0"), "torch_cpu": d("cpu0"),
                    "cuda": [d("cuda0")]}
    tensors = {
        name: {"dtype": "float32", "shape": shape, "digest": d(f"w:{name}")}
        for name, shape in [("embed.weight", [512, 64]), ("fc.bias", [10]),
                            ("fc.weight", [10, 64]), ("norm.running_mean", [64])]
    }
    return {
        "schema": "manifest/v1",
        "code": {
            "commit": "3f2a9c1e5b7d4a6f8e0c2b1d9a7f5e3c1b0a9d8e", "dirty": False,
            "diff_digest": None, "untracked_files": 0, "submodules": [], "shallow": False,
            "detached": False, "lockfiles": {"uv.lock": d("uv.lock")}, "unavailable": {},
        },
        "data": [
            {"name": "mnist", "path": "data/mnist", "root": d("mnist"), "files": 4,
             "bytes": 55_000_000, "listing": d("mnist-listing")},
            {"name": "tokens", "path": "data/tokens", "root": d("tokens"), "files": 1,
             "bytes": 1_200_000, "listing": None},
        ],
        "env": {
            "python": "3.11.9", "implementation": "CPython", "torch": "2.4.0",
            "torch_cuda": "12.4", "torch_hip": None, "torch_git": "e4ee3be4063b",
            "numpy": "1.26.4", "cuda_runtime": "12.4.127", "cuda_driver": "12.5",
            "cudnn": "9.1.0", "nccl": "2.20.5", "blas": "mkl",
            "packages": {"filelock": "3.15.4", "jinja2": "3.1.4", "numpy": "1.26.4",
                         "safetensors": "0.4.3", "sympy": "1.13.0", "torch": "2.4.0",
                         "tqdm": "4.66.4"},
            "packages_digest": d("packages-1"),
            "container": {"runtime": None, "image_digest": None, "source": None},
            "variables": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "2",
                          "PYTHONHASHSEED": "0"},
            "unavailable": {"torch_hip": "torch was built for CUDA, not ROCm"},
        },
        "hardware": {
            "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB",
                      "memory_bytes": 85_899_345_920, "compute_capability": "8.0",
                      "mig_mode": False, "ecc_mode": True}],
            "gpu_count": 1, "gpu_driver": "555.42.06",
            "cpu_model": "AMD EPYC 7763 64-Core Processor",
            "cpu_isa": ["avx", "avx2", "fma", "sse4_1", "sse4_2"], "unavailable": {},
        },
        "randomness": {
            "seed": 42, "derivation": "same",
            "processes": [{"rank": 0, "seed": 42, "at_start": fingerprints}],
            "unavailable": {},
        },
        "determinism": {
            "requested": True, "num_threads": 2, "cublas_workspace_config": ":4096:8",
            "pythonhashseed": "0",
            "processes": [{"rank": 0, "local_rank": 0, "world_size": 1, "torch_imported": True,
                           "flags": flags, "pythonhashseed": "0", "cuda_runtime": "12.4",
                           "cudnn": "9.1.0", "nccl": "2.20.5", "devices": ["cuda:0"]}],
            "unavailable": {},
        },
        "command": {"argv": ["python", "train.py", "--epochs", "2"], "cwd": ".",
                    "outputs": ["model.safetensors"], "datasets": ["mnist", "tokens"]},
        "outputs": {
            "status": "ok", "exit_code": 0, "error": None,
            "artifacts": [{"path": "model.safetensors", "digest": d("file:model"),
                           "bytes": 147_000, "format": "safetensors", "tensors": tensors}],
            "processes": [{"rank": 0,
                           "at_exit": {**fingerprints, "torch_cpu": d("cpu-exit")},
                           "trail": [{"step": s, "digest": d(f"step{s}")}
                                     for s in (0, 100, 200)]}],
        },
        "observed": {
            "tool_version": "0.1.0", "started_at": "2025-05-01T10:00:00.000000Z",
            "finished_at": "2025-05-01T10:07:12.500000Z", "duration_s": 432.5,
            "hostname_hash": d("host-a"), "branch": "main",
            "remote_url": "https://github.com/example/mnist-train.git", "store": ".manifest",
            "logical_cpus": 16, "gpu_uuid_hashes": [d("gpu-uuid-a")], "pids": [4242],
        },
    }


# -------------------------------------------------------------------- edits


def identical(doc: Doc) -> None:
    pass


def observed_only(doc: Doc) -> None:
    doc["observed"].update(
        started_at="2025-05-02T09:00:00.000000Z", finished_at="2025-05-02T09:07:30.000000Z",
        duration_s=450.0, hostname_hash=d("host-b"), branch="feature/faster-loader",
        remote_url="git@github.com:example/mnist-train.git", pids=[777],
        gpu_uuid_hashes=[d("gpu-uuid-b")],
    )


def _new_weights(doc: Doc, tag: str, names: list[str] | None = None) -> None:
    art = doc["outputs"]["artifacts"][0]
    for name, tensor in art["tensors"].items():
        if names is None or name in names:
            tensor["digest"] = d(f"w:{name}:{tag}")
    art["digest"] = d(f"file:model:{tag}")


def seed_change(doc: Doc) -> None:
    doc["randomness"]["seed"] = 43
    proc = doc["randomness"]["processes"][0]
    proc["seed"] = 43
    proc["at_start"] = {"python": d("py1"), "numpy": d("np1"), "torch_cpu": d("cpu1"),
                        "cuda": [d("cuda1")]}
    _new_weights(doc, "seed43")
    for point in doc["outputs"]["processes"][0]["trail"]:
        point["digest"] = d(f"step{point['step']}:seed43")


def dataset_changed(doc: Doc) -> None:
    doc["data"][0].update(root=d("mnist-v2"), files=5, bytes=56_000_000,
                          listing=d("mnist-listing-v2"))
    _new_weights(doc, "data2")


def torch_version(doc: Doc) -> None:
    doc["env"].update(torch="2.5.1", torch_git="a8d6afb511a6", cudnn="9.3.0")
    doc["env"]["packages"]["torch"] = "2.5.1"
    doc["env"]["packages_digest"] = d("packages-torch251")
    doc["determinism"]["processes"][0]["cudnn"] = "9.3.0"


def gpu_sku(doc: Doc) -> None:
    doc["hardware"]["gpus"][0].update(name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    doc["observed"]["gpu_uuid_hashes"] = [d("gpu-uuid-h100")]


def thread_count(doc: Doc) -> None:
    doc["env"]["variables"]["OMP_NUM_THREADS"] = "1"
    doc["determinism"]["num_threads"] = 1
    doc["determinism"]["processes"][0]["flags"]["num_threads"] = 1
    _new_weights(doc, "threads1", ["norm.running_mean", "fc.weight"])


def packages(doc: Doc) -> None:
    pkgs = doc["env"]["packages"]
    del pkgs["tqdm"]
    pkgs["rich"] = "13.7.1"
    doc["env"]["packages_digest"] = d("packages-rich")


def dirty_diff(doc: Doc) -> None:
    doc["code"].update(dirty=True, diff_digest=d("patch-2"), untracked_files=1)


def dirty_diff_a(doc: Doc) -> None:
    doc["code"].update(dirty=True, diff_digest=d("patch-1"), untracked_files=0)


def same_run_id_outputs(doc: Doc) -> None:
    _new_weights(doc, "rerun", ["fc.weight", "norm.running_mean"])
    doc["outputs"]["processes"][0]["trail"][2]["digest"] = d("step200:rerun")
    doc["observed"]["started_at"] = "2025-05-01T11:00:00.000000Z"


def container_metadata(doc: Doc) -> None:
    art = doc["outputs"]["artifacts"][0]
    art.update(path="model.pt", format="torch", digest=d("file:model.pt:copy"), bytes=148_211)
    doc["command"]["outputs"] = ["model.pt"]


def container_metadata_a(doc: Doc) -> None:
    art = doc["outputs"]["artifacts"][0]
    art.update(path="model.pt", format="torch", digest=d("file:model.pt"), bytes=148_203)
    doc["command"]["outputs"] = ["model.pt"]


def reordered(doc: Doc) -> None:
    doc["data"].reverse()
    doc["hardware"]["cpu_isa"].reverse()


Edit = Callable[[Doc], None]

CASES: dict[str, tuple[str, Edit, Edit]] = {
    # name: (what it shows, edit to a, edit to b)
    "identical": ("the same manifest twice", identical, identical),
    "observed_only": ("times, host, branch and remote differ: benign, exit 0",
                      identical, observed_only),
    "seed_change": ("seed 42 -> 43, so every tensor differs", identical, seed_change),
    "dataset_changed": ("one dataset's bytes changed", identical, dataset_changed),
    "torch_version": ("torch 2.4.0 -> 2.5.1 with cuDNN 9.1.0 -> 9.3.0", identical,
                      torch_version),
    "gpu_sku": ("A100 -> H100", identical, gpu_sku),
    "thread_count": ("2 threads -> 1", identical, thread_count),
    "packages": ("tqdm removed, rich added", identical, packages),
    "dirty_diff": ("both dirty, different uncommitted diffs", dirty_diff_a, dirty_diff),
    "same_run_id_outputs": ("same run_id, two tensors differ", identical, same_run_id_outputs),
    "container_metadata": ("torch.save file bytes differ, tensors identical",
                           container_metadata_a, container_metadata),
    "reordered": ("datasets and ISA flags listed in another order", identical, reordered),
}

BAD_CASES = ("tampered", "schema_v2")
"""Cases whose b.json must be refused (exit 2)."""


def sealed(edit: Edit) -> bytes:
    doc = copy.deepcopy(base())
    edit(doc)
    return dumps(seal(doc))


def expected_json(a: bytes, b: bytes) -> bytes:
    diff = diff_manifests(load_for_diff(a, name="a.json"), load_for_diff(b, name="b.json"))
    return diff_json_bytes(diff, a_file="a.json", b_file="b.json")


def bad_files() -> dict[str, tuple[bytes, bytes, Doc]]:
    """(a, b, expected) for the cases where b cannot be read."""
    a = sealed(identical)
    tampered = json.loads(a)
    tampered["randomness"]["seed"] = 7  # edited by hand: digest and run_id no longer match
    v2 = json.loads(a)
    v2["schema"] = "manifest/v2"
    return {
        "tampered": (a, json.dumps(tampered, sort_keys=True).encode(),
                     {"exit": 2, "stderr": "manifest: b.json: manifest digest does not match "
                      "its content: the file was edited or corrupted. Refusing to use it; "
                      "re-capture the run.\n"}),
        "schema_v2": (a, json.dumps(v2, sort_keys=True).encode(),
                      {"exit": 2, "stderr": "manifest: b.json: schema 'manifest/v2' is major "
                       "version v2, and this manifest reads 'manifest/v1' (major v1); manifests "
                       "of different major versions cannot be compared field by field. Upgrade "
                       "manifest to diff them, or diff two manifests of the same version.\n"}),
    }


def write_all(out: Path) -> None:
    for name, (_, edit_a, edit_b) in CASES.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        a, b = sealed(edit_a), sealed(edit_b)
        (folder / "a.json").write_bytes(a)
        (folder / "b.json").write_bytes(b)
        (folder / "expected.json").write_bytes(expected_json(a, b))
    for name, (a, b, expected) in bad_files().items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "a.json").write_bytes(a)
        (folder / "b.json").write_bytes(b)
        (folder / "expected.json").write_bytes((json.dumps(expected, indent=2) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=HERE)
    write_all(parser.parse_args().out)


if __name__ == "__main__":
    main()
