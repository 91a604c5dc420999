"""Environment probe: the software that decides the bits.

Nothing here imports torch, numpy or initialises CUDA. Versions come from
installed-distribution metadata; torch's build facts (CUDA/HIP it was built
for, git revision) are read from ``torch/version.py`` as literals with
``ast`` instead of importing torch. The versions of cuDNN/NCCL/CUDA runtime
that a training process *actually loads* are recorded by the launcher inside
that process (see ``manifest.launch``); here they come from the NVIDIA pip
wheels when those are installed.

Container image digest, in order of trust:
1. ``MANIFEST_CONTAINER_IMAGE_DIGEST`` (set it in your image, e.g. from a
   build arg, or in the job spec): recorded as given.
2. ``/run/.containerenv`` (podman writes ``imageid=``).
Docker and Kubernetes expose no image digest inside the container; the
runtime is still recorded (``/.dockerenv``, ``KUBERNETES_SERVICE_HOST``
presence, never its value).

Environment variables are captured by an allow-list only
(:data:`NUMERICS_VARIABLES`): never a dump of the environment.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

from manifest.canonical import blake3_name, canonical_bytes
from manifest.models import Container, Env
from manifest.probes.distributions import (
    NO_RECORD,
    environment_digest,
    locate_distributions,
    probe_distributions,
    probe_sources,
)
from manifest.probes.distributions import SELF as SELF
from manifest.probes.distributions import dist_name_version as dist_name_version
from manifest.probes.distributions import distribution_paths as distribution_paths
from manifest.probes.distributions import normalise_name as normalise_name

NUMERICS_VARIABLES = frozenset({
    # reduction order / kernel choice on GPU
    "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_CUDNN_V8_API_DISABLED", "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
    "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT", "TORCH_DETERMINISTIC",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
    "NCCL_BUFFSIZE", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_CROSS_NIC",
    "NCCL_TREE_THRESHOLD", "NCCL_LL_THRESHOLD", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE",
    # hashing and threads
    "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "OMP_DYNAMIC", "MKL_DYNAMIC",
    # CPU kernel selection
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "OPENBLAS_CORETYPE",
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "TORCH_MKLDNN_MATMUL_MIN_DIM",
    # distributed layout
    "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    # XLA/ROCm analogues
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MIOPEN_FIND_MODE",
    "MIOPEN_DEBUG_CONVOLUTION_DETERMINISTIC",
})

CONTAINER_DIGEST_VAR = "MANIFEST_CONTAINER_IMAGE_DIGEST"

def installed_distributions(paths: list[str] | None = None) -> dict[str, str]:
    """``{normalised name: version}`` of the importable distributions.

    Same precedence as importlib.metadata (first on the path wins) over
    :func:`distribution_paths` unless ``paths`` is given, each directory
    parsed by :func:`dist_name_version`. The tests check this equals
    importlib.metadata's answer on the test environment.
    """
    located = locate_distributions(paths if paths is not None else distribution_paths())
    return {name: version for name, (version, _, _) in located.items()}


def torch_build_info() -> dict[str, str | None] | None:
    """Literal facts of ``torch/version.py`` without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_py.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    facts: dict[str, str | None] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if (isinstance(target, ast.Name) and isinstance(value, ast.Constant)
                and (value.value is None or isinstance(value.value, str))):
            facts[target.id] = value.value
    return facts


def probe_container(environ: dict[str, str] | None = None, root: Path = Path("/")) -> Container:
    env = os.environ if environ is None else environ
    runtime = None
    if (root / ".dockerenv").exists():
        runtime = "docker"
    containerenv = root / "run" / ".containerenv"
    podman_image: str | None = None
    if containerenv.exists():
        runtime = "podman"
        try:
            for line in containerenv.read_text(encoding="utf-8", errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key == "imageid" and value.strip('"'):
                    podman_image = "sha256:" + value.strip('"').removeprefix("sha256:")
        except OSError:
            pass
    if runtime is None and "KUBERNETES_SERVICE_HOST" in env:
        runtime = "kubernetes"
    given = env.get(CONTAINER_DIGEST_VAR)
    if given:
        return Container(runtime=runtime, image_digest=given, source=CONTAINER_DIGEST_VAR)
    if podman_image:
        return Container(runtime=runtime, image_digest=podman_image, source="/run/.containerenv")
    return Container(runtime=runtime, image_digest=None, source=None)


def numerics_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables that are set (values included)."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(NUMERICS_VARIABLES) if k in env}


def python_version() -> str:
    """``platform.python_version()`` without importing platform (3 ms of regexes)."""
    major, minor, micro, level, serial = sys.version_info
    suffix = {"alpha": f"a{serial}", "beta": f"b{serial}", "candidate": f"rc{serial}"}
    return f"{major}.{minor}.{micro}{suffix.get(level, '')}"


def _first(packages: dict[str, str], *names: str) -> str | None:
    for name in names:
        if name in packages:
            return packages[name]
    return None


def probe_env(cuda_driver: str | None = None, cuda_driver_reason: str | None = None) -> Env:
    """Record the software environment of this interpreter."""
    where = distribution_paths()
    located = locate_distributions(where)  # one scan for the names and the records
    packages = {name: version for name, (version, _, _) in located.items()}
    unavailable: dict[str, str] = {}
    build = torch_build_info()
    torch_version = packages.get("torch")
    if torch_version is None:
        unavailable["torch"] = "torch is not installed"
    if build is None and torch_version is not None:
        unavailable["torch_cuda"] = "torch/version.py could not be read"
    if build and build.get("__version__"):
        torch_version = build["__version__"]
    cudnn = _first(packages, "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")
    nccl = _first(packages, "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
    runtime = _first(packages, "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12",
                     "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime")
    loaded = "the version a training process loads is recorded by the launcher"
    if cudnn is None:
        unavailable["cudnn"] = f"no NVIDIA cuDNN wheel installed; {loaded}"
    if nccl is None:
        unavailable["nccl"] = f"no NVIDIA NCCL wheel installed; {loaded}"
    if runtime is None:
        unavailable["cuda_runtime"] = f"no NVIDIA CUDA runtime wheel installed; {loaded}"
    if cuda_driver is None:
        unavailable["cuda_driver"] = cuda_driver_reason or "no NVIDIA driver"
    unavailable["blas"] = f"needs torch imported; {loaded}"
    if "numpy" not in packages:
        unavailable["numpy"] = "numpy is not installed"
    listing = sorted(f"{n}=={v}" for n, v in packages.items())
    distributions = probe_distributions(where, located=located)
    for name, record in distributions.items():
        if record.files is None:
            unavailable[f"distributions[{name}].files"] = NO_RECORD
    return Env(
        python=python_version(),
        implementation=sys.implementation.name,
        torch=torch_version,
        torch_cuda=build.get("cuda") if build else None,
        torch_hip=build.get("hip") if build else None,
        torch_git=build.get("git_version") if build else None,
        numpy=packages.get("numpy"),
        cuda_runtime=runtime,
        cuda_driver=cuda_driver,
        cudnn=cudnn,
        nccl=nccl,
        blas=None,
        packages=packages,
        packages_digest=blake3_name(canonical_bytes(listing)),
        container=probe_container(),
        variables=numerics_variables(),
        unavailable=unavailable,
        distributions=distributions,
        sources=probe_sources(),
        environment_digest=environment_digest(distributions),
    )
