"""The impact table: which manifest fields can change a run's bits, and why.

:data:`RULES` is the one place that labels a difference ``bits`` or
``benign`` and words its reason; the diff's walk (``manifest.diff.walk``),
verify's drift report and the gate all read it. A path is looked up
concretely first (``env.variables[OMP_NUM_THREADS]``), then with keys as
``[*]``; a field missing from the table falls back to :data:`FALLBACK_RULE`
(``bits``: fail safe), and the test suite checks that every model field has
a rule. New labels go here, never as special cases in a renderer.

Longer than 500 lines because it is one table, one rule per field of the
manifest: split, a field's rule would have two places to be looked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum


class Impact(StrEnum):
    BITS = "bits"
    """Can change the weights (or, under ``outputs``, the weights do differ)."""
    BENIGN = "benign"
    """Cannot change the weights."""


@dataclass(frozen=True, slots=True)
class Rule:
    """How one field's difference is labelled and explained.

    The reason reads ``"<label> <before> → <after>: <why>"``; ``label`` may
    name the keys on the path (``{key}`` the innermost, ``{keys[0]}`` the
    outermost). ``missing`` is how an absent or null value reads. With
    ``show_values=False`` (digests, long lists) the reason says only
    ``"<label> changed: <why>"``; the values are still in ``--json``.
    """

    impact: Impact
    label: str
    why: str = ""
    missing: str | None = None
    show_values: bool = True


B, N = Impact.BITS, Impact.BENIGN

_THREADS = "CPU reduction order changes"
_CODE = "different source code"
_DATA = "different training data"
_WEIGHTS = "different weights"
_UNAVAILABLE = "why a fact was not recorded; the fact itself is compared on its own line"
_LAYOUT = "another rank layout: sums may be taken in another order"
_INPUTS = "the run's inputs differ"
_KEYED = ("a secret's value by a digest under one machine's key: verify compares it there; "
          "that it was read, and whether set, is compared under determinism")

_RECORDS = "each distribution's version and files are compared on their own lines"
_FILES_DECIDE = "its files are compared on their own line"
_WHERE_FROM = "where distributions come from, not what they hold: their files are compared"

RULES: Mapping[str, Rule] = {
    "schema": Rule(B, "schema"),
    # ---------------------------------------------------------------- code
    "code.commit": Rule(B, "commit", _CODE),
    "code.dirty": Rule(B, "uncommitted changes", _CODE),
    "code.diff_digest": Rule(B, "uncommitted diff", _CODE, missing="none", show_values=False),
    "code.untracked_files": Rule(B, "untracked files", "different source files"),
    "code.submodules[*]": Rule(B, "submodule {key}", _CODE, missing="absent"),
    "code.submodules[*].commit": Rule(B, "submodule {key} commit", _CODE),
    "code.shallow": Rule(N, "shallow clone", "how the history was fetched, not the code"),
    "code.detached": Rule(N, "detached HEAD", "how the commit was checked out, not the code"),
    "code.lockfiles[*]": Rule(B, "lockfile {key}", "pinned dependencies differ",
                              missing="absent", show_values=False),
    "code.unavailable[*]": Rule(N, "code: reason for {key}", _UNAVAILABLE, missing="none"),
    # ---------------------------------------------------------------- data
    "data[*]": Rule(B, "dataset {key}", _DATA, missing="absent"),
    "data[*].path": Rule(N, "dataset {key} path",
                         "the bytes are identified by the content digest, compared separately"),
    "data[*].root": Rule(B, "dataset {key} content", _DATA, show_values=False),
    "data[*].files": Rule(B, "dataset {key} file count", _DATA),
    "data[*].bytes": Rule(B, "dataset {key} size", _DATA),
    "data[*].listing": Rule(N, "dataset {key} file listing",
                            "an index of the files for reporting; the content digest decides",
                            show_values=False),
    "data[*].source": Rule(N, "dataset {key} origin",
                           "declared or discovered, the content digest decides"),
    "data[*].from_repo": Rule(N, "dataset {key} place relative to the repository",
                              "where it lies, not what it holds"),
    # Remote data (manifest.data.remote): root is the pins' root, so a changed object
    # shows under data[*].root; these say how the pin was taken and what it proves.
    "data[*].remote": Rule(B, "dataset {key} remote pin", _DATA, missing="none (local data)",
                           show_values=False),
    "data[*].remote.provider": Rule(B, "dataset {key} provider", "data from another store"),
    "data[*].remote.endpoint": Rule(B, "dataset {key} endpoint",
                                    "another service may hold other bytes under the same keys",
                                    missing="the provider's default"),
    "data[*].remote.revision": Rule(B, "dataset {key} revision (Hub commit, Delta version)",
                                    _DATA, missing="none"),
    "data[*].remote.mode": Rule(N, "dataset {key} pinning mode",
                                "how the pin was taken; the root decides"),
    "data[*].remote.strength": Rule(N, "dataset {key} pin strength",
                                    "what the pin proves, not what the data holds"),
    "data[*].remote.pins": Rule(B, "dataset {key} object pins", _DATA, show_values=False),
    "data[*].remote.checksums[*]": Rule(N, "dataset {keys[0]} objects with {key} checksums",
                                        "which checksums the provider keeps; the pins decide",
                                        missing="0"),
    "data[*].remote.versioned": Rule(N, "dataset {key} versioned objects",
                                     "how many objects have a version id; the pins decide"),
    # ----------------------------------------------------------------- env
    "env.python": Rule(B, "Python", "interpreter and standard library behaviour may change"),
    "env.implementation": Rule(B, "Python implementation", "a different interpreter"),
    "env.torch": Rule(B, "torch", "kernels and defaults may change"),
    "env.torch_cuda": Rule(B, "torch CUDA build", "different GPU kernels"),
    "env.torch_hip": Rule(B, "torch ROCm build", "different GPU kernels"),
    "env.torch_git": Rule(B, "torch source revision", "a different torch build"),
    "env.numpy": Rule(B, "numpy", "random streams and kernels may change"),
    "env.cuda_runtime": Rule(B, "CUDA runtime", "GPU libraries and kernels may change"),
    "env.cuda_driver": Rule(B, "CUDA driver", "JIT-compiled kernels may change"),
    "env.cudnn": Rule(B, "cuDNN", "convolution kernels may change"),
    "env.nccl": Rule(B, "NCCL", "collective reduction order may change"),
    "env.blas": Rule(B, "BLAS backend", "matrix-multiply kernels change"),
    "env.packages[*]": Rule(B, "package {key}", "installed libraries differ",
                            missing="not installed"),
    "env.packages_digest": Rule(B, "installed distributions", "the name==version set differs",
                                show_values=False),
    "env.container.runtime": Rule(N, "container runtime",
                                  "the image decides the software, not the runtime"),
    "env.container.image_digest": Rule(B, "container image", "different system libraries"),
    "env.container.source": Rule(N, "container digest source",
                                 "where the image digest was read from"),
    "env.variables[*]": Rule(B, "{key}", "allow-listed because it can change numerics",
                             missing="unset"),
    "env.variables[OMP_NUM_THREADS]": Rule(B, "OMP_NUM_THREADS", _THREADS, missing="unset"),
    "env.variables[MKL_NUM_THREADS]": Rule(B, "MKL_NUM_THREADS", _THREADS, missing="unset"),
    "env.variables[OPENBLAS_NUM_THREADS]": Rule(B, "OPENBLAS_NUM_THREADS", _THREADS,
                                                missing="unset"),
    "env.variables[CUBLAS_WORKSPACE_CONFIG]": Rule(B, "CUBLAS_WORKSPACE_CONFIG",
                                                   "cuBLAS reduction order may change",
                                                   missing="unset"),
    "env.variables[PYTHONHASHSEED]": Rule(B, "PYTHONHASHSEED",
                                          "set and dict iteration order changes",
                                          missing="unset"),
    "env.variables[CUDA_VISIBLE_DEVICES]": Rule(B, "CUDA_VISIBLE_DEVICES",
                                                "a different set of GPUs", missing="unset"),
    "env.variables[NCCL_ALGO]": Rule(B, "NCCL_ALGO", "collective reduction order changes",
                                     missing="unset"),
    "env.variables[NCCL_PROTO]": Rule(B, "NCCL_PROTO", "collective reduction order changes",
                                      missing="unset"),
    "env.variables[MKL_CBWR]": Rule(B, "MKL_CBWR", "MKL's reproducibility mode changes",
                                    missing="unset"),
    "env.unavailable[*]": Rule(N, "env: reason for {key}", _UNAVAILABLE, missing="none"),
    "env.packages[cuda-toolkit]": Rule(B, "package cuda-toolkit",
                                       "the CUDA 13 metapackage that pins torch's nvidia-* "
                                       "wheels; they are compared on their own lines",
                                       missing="not installed"),
    "env.distributions": Rule(N, "distribution records", _RECORDS, show_values=False),
    "env.distributions[*]": Rule(N, "distribution record {key}", _RECORDS,
                                 show_values=False),
    "env.distributions[*].version": Rule(N, "{keys[0]} version",
                                         "compared on the package's own line"),
    "env.distributions[*].tags": Rule(N, "{keys[0]} wheel tags", _FILES_DECIDE),
    "env.distributions[*].installer": Rule(N, "{keys[0]} installer",
                                           "how it was installed, not what it holds: "
                                           + _FILES_DECIDE),
    "env.distributions[*].direct_url": Rule(N, "{keys[0]} direct URL", _WHERE_FROM,
                                            missing="from an index"),
    "env.distributions[*].direct_url.url": Rule(N, "{keys[0]} direct URL", _WHERE_FROM),
    "env.distributions[*].direct_url.editable": Rule(N, "{keys[0]} editable install",
                                                     _WHERE_FROM),
    "env.distributions[*].direct_url.vcs": Rule(N, "{keys[0]} VCS", _WHERE_FROM),
    "env.distributions[*].direct_url.commit_id": Rule(N, "{keys[0]} VCS commit", _WHERE_FROM),
    "env.distributions[*].direct_url.archive_hash": Rule(N, "{keys[0]} archive hash",
                                                         _WHERE_FROM),
    "env.distributions[*].files": Rule(B, "{keys[0]} files", "another build of the same "
                                       "version", missing="not recorded"),
    "env.sources": Rule(N, "configured package sources", _WHERE_FROM, show_values=False),
    "env.sources.indexes": Rule(N, "configured package indexes", _WHERE_FROM),
    "env.sources.find_links": Rule(N, "configured find-links", _WHERE_FROM),
    "env.sources.origin": Rule(N, "package sources read from", _WHERE_FROM),
    "env.environment_digest": Rule(N, "environment digest",
                                   "a summary of the distribution records; each difference "
                                   "is on its own line", show_values=False),
    "env.imported": Rule(N, "distributions imported by the run",
                         "which packages count; their versions are compared on their own lines",
                         show_values=False),
    # ------------------------------------------------------------ hardware
    "hardware.gpus": Rule(B, "GPUs", "different devices"),
    "hardware.gpus[*]": Rule(B, "GPU {key}", "different devices", missing="absent"),
    "hardware.gpus[*].name": Rule(B, "GPU {key}", "kernel selection and arithmetic differ"),
    "hardware.gpus[*].memory_bytes": Rule(B, "GPU {key} memory",
                                          "workspace-sized kernel choices may change"),
    "hardware.gpus[*].compute_capability": Rule(B, "GPU {key} compute capability",
                                                "kernels are built per architecture"),
    "hardware.gpus[*].mig_mode": Rule(B, "GPU {key} MIG mode",
                                      "the compute units a kernel gets change"),
    "hardware.gpus[*].ecc_mode": Rule(B, "GPU {key} ECC mode",
                                      "usable memory changes, so workspace-sized kernel "
                                      "choices may change"),
    "hardware.gpu_count": Rule(B, "GPU count", "parallel layout and reductions change"),
    "hardware.gpu_driver": Rule(B, "GPU driver", "JIT-compiled kernels may change"),
    "hardware.cpu_model": Rule(B, "CPU", "CPU kernels are dispatched per model"),
    "hardware.cpu_isa[*]": Rule(B, "CPU ISA flag {key}", "CPU kernels are dispatched on it",
                                missing="absent"),
    "hardware.unavailable[*]": Rule(N, "hardware: reason for {key}", _UNAVAILABLE,
                                    missing="none"),
    "hardware.nodes": Rule(B, "per-node hardware", "only one run spans several nodes",
                           missing="none (one node)", show_values=False),
    "hardware.nodes[*]": Rule(B, "node {key} hardware", "a different node layout",
                              missing="absent", show_values=False),
    # ---------------------------------------------------------- randomness
    "randomness.seed": Rule(B, "seed"),
    "randomness.derivation": Rule(B, "per-rank seed derivation", "ranks draw other streams"),
    "randomness.processes[*]": Rule(B, "rank {key} randomness", "a different process layout",
                                    missing="absent"),
    "randomness.processes[*].seed": Rule(B, "rank {key} seed"),
    "randomness.processes[*].at_start": Rule(B, "rank {key} RNG states at start",
                                             "random streams start elsewhere",
                                             show_values=False),
    "randomness.processes[*].at_start.python": Rule(B, "rank {key} python RNG state at start",
                                                    "random streams start elsewhere",
                                                    show_values=False),
    "randomness.processes[*].at_start.numpy": Rule(B, "rank {key} numpy RNG state at start",
                                                   "random streams start elsewhere",
                                                   show_values=False),
    "randomness.processes[*].at_start.torch_cpu": Rule(B, "rank {key} torch CPU RNG state at "
                                                       "start", "random streams start elsewhere",
                                                       show_values=False),
    "randomness.processes[*].at_start.cuda": Rule(B, "rank {key} CUDA RNG states at start",
                                                  "random streams start elsewhere",
                                                  show_values=False),
    "randomness.processes[*].reseeds": Rule(B, "rank {key} seeding calls",
                                            "the script seeds its generators differently",
                                            show_values=False),
    "randomness.processes[*].reseeds[*]": Rule(B, "rank {keys[0]} seeding call at {key}",
                                               "the script seeds its generators differently",
                                               missing="absent", show_values=False),
    "randomness.processes[*].reseeds[*].call": Rule(B, "rank {keys[0]} seeding call at {key}",
                                                    "another generator is seeded"),
    "randomness.processes[*].reseeds[*].seed": Rule(B, "rank {keys[0]} seed set at {key}",
                                                    "random streams start elsewhere"),
    "randomness.processes[*].reseeds[*].generators": Rule(
        B, "rank {keys[0]} generators seeded at {key}", "other streams are reset"),
    "randomness.processes[*].reseeds[*].drawn": Rule(
        B, "rank {keys[0]} generators drawn from before the seeding at {key}",
        "draws before the script's own seeding follow the launcher's seed"),
    "randomness.processes[*].loaders": Rule(B, "rank {key} DataLoader worker seeds",
                                            "workers draw other augmentations and orders",
                                            show_values=False),
    "randomness.processes[*].loaders[*]": Rule(B, "rank {keys[0]} DataLoader at {key}",
                                               "workers draw other streams", missing="absent",
                                               show_values=False),
    "randomness.processes[*].loaders[*].base_seed": Rule(
        B, "rank {keys[0]} DataLoader at {key} base seed", "workers draw other streams"),
    "randomness.processes[*].loaders[*].workers": Rule(
        B, "rank {keys[0]} DataLoader at {key} workers", "samples are split otherwise"),
    "randomness.processes[*].unaccounted": Rule(
        B, "rank {key} generators with draws not accounted for",
        "a state set from a saved one, or drawn before torch was imported", missing="none"),
    "randomness.unavailable[*]": Rule(N, "randomness: reason for {key}", _UNAVAILABLE,
                                      missing="none"),
    # --------------------------------------------------------- determinism
    "determinism.requested": Rule(B, "deterministic recipe enforced",
                                  "kernel choice and flags change"),
    "determinism.num_threads": Rule(B, "torch threads", _THREADS),
    "determinism.cublas_workspace_config": Rule(B, "CUBLAS_WORKSPACE_CONFIG",
                                                "cuBLAS reduction order may change"),
    "determinism.pythonhashseed": Rule(B, "PYTHONHASHSEED",
                                       "set and dict iteration order changes"),
    "determinism.processes[*]": Rule(B, "rank {key} flags", "a different process layout",
                                     missing="absent"),
    "determinism.processes[*].local_rank": Rule(B, "rank {key} local rank",
                                                "a different device per process"),
    "determinism.processes[*].world_size": Rule(B, "rank {key} world size",
                                                "data sharding and reductions change"),
    "determinism.processes[*].torch_imported": Rule(N, "rank {key} torch imported",
                                                    "whether flags could be read; the flags "
                                                    "are compared on their own lines"),
    "determinism.processes[*].flags": Rule(B, "rank {key} torch flags",
                                           "kernel selection may change"),
    "determinism.processes[*].flags.deterministic_algorithms": Rule(
        B, "rank {key} use_deterministic_algorithms", "non-deterministic kernels allowed or not"),
    "determinism.processes[*].flags.deterministic_warn_only": Rule(
        B, "rank {key} deterministic warn_only",
        "ops without a deterministic kernel run instead of raising"),
    "determinism.processes[*].flags.cudnn_deterministic": Rule(
        B, "rank {key} cudnn.deterministic", "cuDNN algorithm choice changes"),
    "determinism.processes[*].flags.cudnn_benchmark": Rule(
        B, "rank {key} cudnn.benchmark", "cuDNN picks kernels by timing when on"),
    "determinism.processes[*].flags.allow_tf32_matmul": Rule(
        B, "rank {key} allow_tf32 (matmul)", "matmuls run in TF32 or FP32"),
    "determinism.processes[*].flags.allow_tf32_cudnn": Rule(
        B, "rank {key} allow_tf32 (cuDNN)", "convolutions run in TF32 or FP32"),
    "determinism.processes[*].flags.float32_matmul_precision": Rule(
        B, "rank {key} float32_matmul_precision", "matmul precision changes"),
    "determinism.processes[*].flags.autocast": Rule(
        B, "rank {key} autocast", "mixed precision changes arithmetic"),
    "determinism.processes[*].flags.num_threads": Rule(B, "rank {key} torch threads", _THREADS),
    "determinism.processes[*].flags.num_interop_threads": Rule(
        B, "rank {key} inter-op threads", "the order of parallel ops and their random draws "
        "may change"),
    "determinism.processes[*].pythonhashseed": Rule(B, "rank {key} PYTHONHASHSEED",
                                                    "set and dict iteration order changes"),
    "determinism.processes[*].cuda_runtime": Rule(B, "rank {key} CUDA runtime",
                                                  "GPU libraries and kernels may change"),
    "determinism.processes[*].cudnn": Rule(B, "rank {key} cuDNN",
                                           "convolution kernels may change"),
    "determinism.processes[*].nccl": Rule(B, "rank {key} NCCL",
                                          "collective reduction order may change"),
    "determinism.processes[*].devices": Rule(B, "rank {key} devices", "different devices"),
    "determinism.processes[*].switches": Rule(B, "rank {key} switches set by the script",
                                              "kernel selection or precision may change",
                                              show_values=False),
    "determinism.processes[*].switches[*]": Rule(B, "rank {keys[0]} {key} set by the script",
                                                 "kernel selection or precision may change",
                                                 missing="not set"),
    "determinism.processes[*].switches[*].value": Rule(
        B, "rank {keys[0]} {key}", "kernel selection or precision may change"),
    "determinism.processes[*].switches[*].site": Rule(
        N, "rank {keys[0]} {key} call site", "where the script sets it; the value is compared"),
    "determinism.outside_recipe": Rule(B, "processes outside the recipe",
                                       "a Python process ran without the launcher's seeds and "
                                       "switches", missing="none", show_values=False),
    "determinism.outside_recipe[*]": Rule(B, "process outside the recipe: {key}",
                                          "it ran without the launcher's seeds and switches",
                                          missing="absent", show_values=False),
    "determinism.outside_recipe[*].reason": Rule(N, "why {keys[0]} ran outside the recipe",
                                                 "that it did is compared on its own line"),
    "determinism.outside_recipe[*].site": Rule(N, "where {keys[0]} was started",
                                               "that it ran outside the recipe is compared on "
                                               "its own line"),
    "determinism.processes[*].fp32_precision": Rule(B, "rank {key} fp32_precision switches",
                                                    "matmuls and convolutions run in TF32 or "
                                                    "FP32", show_values=False),
    "determinism.processes[*].fp32_precision[*]": Rule(
        B, "rank {keys[0]} {key}.fp32_precision", "matmuls and convolutions run in TF32 or FP32",
        missing="absent"),
    # The variables the run's own code read (manifest.capture.environ): its inputs.
    "determinism.processes[*].environ": Rule(B, "rank {key} environment variables read by "
                                             "the run's code", _INPUTS, missing="none"),
    "determinism.processes[*].environ[*]": Rule(B, "rank {keys[0]} {key}",
                                                "read by the run's own code in only one run: "
                                                "its code took another path",
                                                missing="not read", show_values=False),
    "determinism.processes[*].environ[*].site": Rule(N, "rank {keys[0]} {key} read at",
                                                     "where it is read; the code is compared "
                                                     "under code"),
    "determinism.processes[*].environ[*].set": Rule(B, "rank {keys[0]} {key} set",
                                                    "unset, the script falls back to its own "
                                                    "default: " + _INPUTS),
    "determinism.processes[*].environ[*].digest": Rule(B, "rank {keys[0]} {key}", "another "
                                                       "value, read by the run's own code: "
                                                       + _INPUTS, missing="unset or withheld",
                                                       show_values=False),
    "determinism.processes[*].environ[*].key": Rule(N, "rank {keys[0]} {key} digest key",
                                                    "which key its value is digested with",
                                                    missing="none", show_values=False),
    "determinism.unavailable[*]": Rule(N, "determinism: reason for {key}", _UNAVAILABLE,
                                       missing="none"),
    # ------------------------------------------------------------- command
    "command": Rule(B, "command", "a different program", show_values=False),
    "command.argv": Rule(B, "command line", "a different program or arguments"),
    "command.cwd": Rule(B, "working directory", "relative paths resolve elsewhere"),
    "command.outputs": Rule(N, "declared outputs",
                            "which files are digested after the run, not what it computes"),
    "command.datasets": Rule(N, "declared datasets",
                             "which datasets are digested; their content is compared under data"),
    "command.code_env": Rule(B, "code path variables", "other modules may be imported",
                             show_values=False),
    "command.code_env[*]": Rule(B, "{key}", "decides which modules are imported",
                                missing="unset"),
    "command.topology": Rule(B, "distributed layout", "only one run was distributed",
                             missing="none (one process)", show_values=False),
    "command.topology.launcher": Rule(B, "launcher", "another tool placed the processes"),
    "command.topology.nodes": Rule(B, "nodes", _LAYOUT),
    "command.topology.world_size": Rule(B, "world size",
                                        "each sum is split over another number of ranks"),
    "command.topology.local_world_size": Rule(B, "processes per node", _LAYOUT,
                                              missing="uneven"),
    "command.topology.backend": Rule(B, "collective backend",
                                     "another library takes the sums, in its own order",
                                     missing="none"),
    "command.topology.ranks[*]": Rule(B, "rank {key}", "only one run has it", missing="absent"),
    "command.topology.ranks[*].node": Rule(B, "rank {key} node", _LAYOUT),
    "command.topology.ranks[*].local_rank": Rule(B, "rank {key} local rank", _LAYOUT,
                                                 missing="none"),
    "command.topology.ranks[*].device": Rule(B, "rank {key} device",
                                             "NCCL's rings and trees follow the rank → GPU map",
                                             missing="none"),
    "command.topology.nccl[*]": Rule(B, "{key}", "chooses the collective's algorithm, "
                                     "protocol or channels, and so its reduction order",
                                     missing="unset"),
    "command.topology.node": Rule(B, "node record", "a record of one node, not of the "
                                  "whole run: merge the node records first",
                                  missing="none (the whole run)"),
    # ------------------------------------------------------------- outputs
    "outputs": Rule(B, "outputs", "only one run recorded its results", show_values=False),
    "outputs.status": Rule(B, "run status", "the runs did not end alike"),
    "outputs.exit_code": Rule(B, "exit code", "the runs did not end alike"),
    "outputs.error": Rule(N, "error message", "the text of a failure, not the weights"),
    "outputs.artifacts[*]": Rule(B, "artifact {key}", "only one run produced it",
                                 missing="absent"),
    "outputs.artifacts[*].digest": Rule(B, "artifact {key} bytes", _WEIGHTS, show_values=False),
    "outputs.artifacts[*].bytes": Rule(B, "artifact {key} size", _WEIGHTS),
    "outputs.artifacts[*].format": Rule(B, "artifact {key} format", "different file contents"),
    "outputs.artifacts[*].tensors": Rule(B, "artifact {key} tensor table",
                                         "weights were hashed in only one run",
                                         show_values=False),
    "outputs.artifacts[*].tensors[*]": Rule(B, "tensor {key} of {keys[0]}",
                                            "only one run has it", missing="absent"),
    "outputs.artifacts[*].tensors[*].dtype": Rule(B, "tensor {key} of {keys[0]} dtype",
                                                  _WEIGHTS),
    "outputs.artifacts[*].tensors[*].shape": Rule(B, "tensor {key} of {keys[0]} shape",
                                                  _WEIGHTS),
    "outputs.artifacts[*].tensors[*].digest": Rule(B, "tensor {key} of {keys[0]}", _WEIGHTS,
                                                   show_values=False),
    "outputs.artifacts[*].node": Rule(N, "artifact {key} node",
                                      "where it was written; its bytes are compared on their "
                                      "own lines", missing="none"),
    "outputs.segments": Rule(B, "elastic restarts", "a run that restarted resumed from "
                             "another state", missing="none", show_values=False),
    "outputs.segments[*]": Rule(B, "attempt {key}", "only one run restarted this often",
                                missing="absent", show_values=False),
    "outputs.segments[*].world_size": Rule(B, "attempt {key} world size",
                                           "each sum is split over another number of ranks",
                                           missing="unknown"),
    "outputs.segments[*].ranks": Rule(B, "attempt {key} ranks", "other ranks took part"),
    "outputs.segments[*].error": Rule(N, "attempt {key} error",
                                      "the text of a failure, not the weights", missing="none"),
    "outputs.segments[*].resized": Rule(B, "attempt {key} resumed on another world size",
                                        "each sum is split over another number of ranks",
                                        missing="no"),
    "outputs.workers": Rule(B, "worker processes", "other per-worker random streams",
                            missing="none"),
    "outputs.processes[*]": Rule(B, "rank {key} outcome", "only one run recorded it",
                                 missing="absent"),
    "outputs.processes[*].at_exit": Rule(B, "rank {key} RNG states at exit",
                                         "the generators ended in another state",
                                         show_values=False),
    "outputs.processes[*].at_exit.python": Rule(B, "rank {key} python RNG state at exit",
                                                "the generators ended in another state",
                                                show_values=False),
    "outputs.processes[*].at_exit.numpy": Rule(B, "rank {key} numpy RNG state at exit",
                                               "the generators ended in another state",
                                               show_values=False),
    "outputs.processes[*].at_exit.torch_cpu": Rule(B, "rank {key} torch CPU RNG state at exit",
                                                   "the generators ended in another state",
                                                   show_values=False),
    "outputs.processes[*].at_exit.cuda": Rule(B, "rank {key} CUDA RNG states at exit",
                                              "the generators ended in another state",
                                              show_values=False),
    "outputs.processes[*].trail[*]": Rule(B, "rank {keys[0]} step {key}",
                                          "the step trail has it in only one run",
                                          missing="absent", show_values=False),
    "outputs.processes[*].trail[*].digest": Rule(B, "rank {keys[0]} state at step {key}",
                                                 "training diverged here", show_values=False),
    "outputs.processes[*].ops": Rule(N, "rank {key} op stream",
                                     "recorded only under --fingerprint-ops", missing="absent",
                                     show_values=False),
    "outputs.processes[*].ops.digest": Rule(B, "rank {key} op stream",
                                            "ops of the first steps computed other values",
                                            show_values=False),
    "outputs.processes[*].ops.steps": Rule(N, "rank {key} op stream steps",
                                           "which steps were recorded"),
    "outputs.processes[*].ops.ops": Rule(N, "rank {key} ops recorded",
                                         "the count; the stream's digest decides"),
    "outputs.processes[*].numeric": Rule(N, "rank {key} numeric trail",
                                         "numbers measured from the weights (loss, norms, "
                                         "projections); the tensors and the step trail decide",
                                         missing="absent", show_values=False),
    "outputs.processes[*].secret_reads": Rule(N, "rank {key} secret-looking variables read",
                                              _KEYED, missing="none", show_values=False),
    "outputs.processes[*].secret_reads[*]": Rule(N, "rank {keys[0]} {key}", _KEYED,
                                                 missing="absent", show_values=False),
    "outputs.processes[*].secret_reads[*].key": Rule(N, "rank {keys[0]} {key} digest key",
                                                     _KEYED, show_values=False),
    "outputs.processes[*].secret_reads[*].digest": Rule(N, "rank {keys[0]} {key} keyed digest",
                                                        _KEYED, show_values=False),
    "outputs.processes[*].trail_scheme": Rule(N, "rank {key} step trail fingerprint",
                                              "how the trail was fingerprinted; the runs' "
                                              "points are compared only when it is the same",
                                              missing="absent"),
    "outputs.processes[*].recording": Rule(N, "rank {key} cost of recording the trails",
                                           "time spent recording, not what the run computed",
                                           missing="absent", show_values=False),
    "outputs.processes[*].recording.seconds": Rule(N, "rank {keys[0]} recording time (s)",
                                                   "wall-clock time"),
    "outputs.processes[*].recording.share": Rule(N, "rank {keys[0]} recording share of "
                                                 "wall time", "wall-clock time"),
    "outputs.processes[*].environ_recorded": Rule(
        N, "rank {key} environment reads recorded", "whether the launcher recorded the "
        "variables the run's code read (not in a manifest made before it did; then they are "
        "not compared)", missing="not recorded", show_values=False),
    "outputs.processes[*].environ_recorded.names": Rule(
        N, "rank {keys[0]} environment variables kept", "a count: the list itself is "
        "compared under determinism"),
    "outputs.processes[*].environ_recorded.dropped": Rule(
        N, "rank {keys[0]} environment variables read past the launcher's limit",
        "not kept, so not compared: the list is incomplete"),
    "outputs.checkpoints": Rule(N, "checkpoints saved during training",
                                "what the run saved on the way (verify --segments reads it); "
                                "the step trail and the declared outputs decide",
                                missing="absent", show_values=False),
    "outputs.envelope": Rule(N, "noise envelope", "a measurement of the run's rounding noise "
                             "(capture --envelope), outside identity", missing="absent",
                             show_values=False),
    "outputs.envelope.runs": Rule(N, "noise envelope runs", "how the envelope was measured"),
    "outputs.envelope.precision": Rule(N, "noise envelope precision", "the precision its runs "
                                       "used: verify judges a re-run against the envelope "
                                       "that covers its own", missing="fp32"),
    "outputs.envelope.how": Rule(N, "noise envelope precision obtained", "measured on the "
                                 "device or emulated on CPU: how the envelope was measured",
                                 missing="absent"),
    "outputs.envelope.steps": Rule(N, "noise envelope", "another measurement of the same "
                                   "rounding noise", show_values=False),
    "outputs.envelope.twin": Rule(N, "noise envelope twin", "the run once more under the "
                                  "precision's emulation, unperturbed: what the envelope was "
                                  "measured from", missing="absent", show_values=False),
    "outputs.envelope.twin_outputs": Rule(N, "noise envelope twin outputs", "each declared "
                                          "output's distance from the twin's: a measurement",
                                          missing="absent", show_values=False),
    "outputs.envelope.twin_outputs[*]": Rule(N, "noise envelope twin output", "one declared "
                                             "output's distance from the twin's",
                                             missing="absent", show_values=False),
    "outputs.envelope.loss_eps": Rule(N, "noise envelope loss rounding unit", "the base "
                                      "run's loss precision the bound is floored at: how the "
                                      "envelope is calibrated", missing="absent"),
    # ------------------------------------------------------------ observed
    "observed.tool_version": Rule(N, "manifest version", "the recorder, not the run"),
    "observed.lockfile_disagrees": Rule(N, "lockfile disagreements",
                                        "what a lockfile pins against what was installed; the "
                                        "installed versions are compared under env",
                                        show_values=False),
    "observed.started_at": Rule(N, "start time", "wall-clock time"),
    "observed.finished_at": Rule(N, "finish time", "wall-clock time"),
    "observed.duration_s": Rule(N, "duration (s)", "wall-clock time"),
    "observed.hostname_hash": Rule(N, "host", "a host name does not change arithmetic",
                                   show_values=False),
    "observed.branch": Rule(N, "branch", "the commit decides the code, not its branch name"),
    "observed.remote_url": Rule(N, "remote URL", "the commit decides the code, not where it "
                                "was fetched from"),
    "observed.store": Rule(N, "blob store", "where blobs are kept"),
    "observed.logical_cpus": Rule(N, "logical CPUs",
                                  "the thread count in force is compared under determinism"),
    "observed.gpu_uuid_hashes": Rule(N, "GPU boards", "other boards of the same recorded SKU",
                                     show_values=False),
    "observed.pids": Rule(N, "process ids", "bookkeeping"),
    "observed.compute": Rule(N, "compute record", "what the run cost, not what it computed"),
    "observed.compute.wall_s": Rule(N, "wall time (s)", "wall-clock time"),
    "observed.compute.ranks[*]": Rule(N, "rank {key} timed", "wall-clock time"),
    "observed.compute.ranks[*].wall_s": Rule(N, "rank {key} wall time (s)", "wall-clock time"),
    "observed.compute.gpu_count": Rule(N, "GPUs billed", "GPU model and count are compared "
                                       "under hardware"),
    "observed.compute.gpu_hours": Rule(N, "GPU-hours", "what the run cost"),
    "observed.compute.energy_j": Rule(N, "energy (J)", "what the run cost"),
    "observed.compute.gpus[*]": Rule(N, "GPU {key} energy", "what the run cost"),
    "observed.compute.gpus[*].energy_j": Rule(N, "GPU {key} energy (J)", "what the run cost"),
    "observed.compute.unavailable[*]": Rule(N, "compute not recorded: {key}",
                                            "why a cost was not read"),
    "observed.recording": Rule(N, "cost of recording the trails",
                               "time spent recording, not what the run computed",
                               missing="absent", show_values=False),
    "observed.recording[*]": Rule(N, "rank {key} cost of recording the trails",
                                  "time spent recording, not what the run computed",
                                  missing="absent", show_values=False),
    "observed.recording[*].seconds": Rule(N, "rank {keys[0]} recording time (s)",
                                          "wall-clock time"),
    "observed.recording[*].share": Rule(N, "rank {keys[0]} recording share of wall time",
                                        "wall-clock time"),
    "observed.large_untracked": Rule(N, "large untracked files",
                                     "named, not packed; not part of the code",
                                     show_values=False),
    "observed.large_untracked[*]": Rule(N, "large untracked file {key}",
                                        "named, not packed; not part of the code",
                                        missing="absent"),
    "observed.rendezvous": Rule(N, "rendezvous", "names one run's node records, not what "
                                "they computed", missing="none"),
    "observed.node_records": Rule(N, "node records merged", "which captures were merged, "
                                  "not what they computed", show_values=False),
    "observed.inputs_not_digested": Rule(N, "inputs too large to digest unasked",
                                         "declare them with --data to compare them",
                                         show_values=False),
    "observed.inputs_not_digested[*]": Rule(N, "undigested input {key}",
                                            "declare it with --data to compare it",
                                            missing="absent"),
}
"""Field pattern -> impact and reason. Keys on a path are ``[*]``; a concrete key overrides."""


def _per_node(rules: Mapping[str, Rule]) -> dict[str, Rule]:
    """``hardware.nodes[*].…``: each hardware rule, said of one node of a merged run."""
    out: dict[str, Rule] = {}
    for name, rule in rules.items():
        if name.startswith("hardware.") and not name.startswith("hardware.nodes"):
            label = "node {keys[0]} " + rule.label
            out["hardware.nodes[*]." + name.removeprefix("hardware.")] = replace(
                rule, label=label)
    return out


RULES = {**RULES, **_per_node(RULES)}

FALLBACK_RULE = Rule(B, "{path}", "not in the impact table, so assumed to change bits")

REFINED: Mapping[str, Rule] = {
    "package-not-imported": Rule(N, "package {key}", "installed, never imported by the run",
                                 missing="not installed"),
    "editable-files": Rule(N, "{keys[0]} files", "an editable install: its files name the "
                           "checkout's path, and the code section compares the code"),
    # The words are manifest.capture.environ.NOT_RECORDED's, which verify says (a test
    # holds them equal; importing it here would load the models into this table).
    "environ-not-recorded": Rule(N, "rank {key} environment variables read by the run's code",
                                 "not compared: one run did not record the environment "
                                 "variables its code read (made before the launcher "
                                 "recorded them)", missing="not recorded"),
    "seed-overridden": Rule(N, "seed", "overridden: every generator it seeded was reseeded by "
                            "the script before its first draw or never drawn from"),
    "rank-seed-overridden": Rule(N, "rank {key} seed", "overridden: every generator it seeded "
                                 "was reseeded by the script before its first draw or never "
                                 "drawn from"),
    "rng-overridden": Rule(N, "rank {key} {keys[-1]} RNG state at start",
                           "reseeded by the script before any draw", show_values=False),
    "rng-never-drawn": Rule(N, "rank {key} {keys[-1]} RNG state",
                            "never drawn from: in every process of both runs its state at exit "
                            "equals its state at start", show_values=False),
}
"""Labels that depend on both manifests, applied by ``manifest.diff.refine`` on top of
:data:`RULES`: a package neither run imported (the installed set is kept, benign), a
seed the script's own seeding replaced before any draw (the call sites are named), and
environment reads that only one run recorded (``manifest.diff.envreads``)."""

SUMMARY_FIELDS: Mapping[str, str] = {"env.packages_digest": "env.packages["}
"""Summary field -> path prefix of the facts it summarises (listed only if those are equal)."""
