"""The determinism switches: set them, read them back, save and restore them.

The switch hook of the launcher: when the script imports torch,
``_manifest_launch`` calls ``apply_flags`` (unless the capture was told
``--no-deterministic``); ``manifest.deterministic()`` calls ``apply_flags``
between ``snapshot_flags`` and ``restore_flags``, so the launcher and the
recipe API turn on the same switches. At exit the launcher records
``read_flags`` (every switch as torch reports it then) and ``loaded_versions``
(the CUDA runtime, cuDNN and NCCL this process loaded, and its devices).

``torch.use_deterministic_algorithms`` imports ``torch._inductor.config``
(about 1.2 s on CPU) to set one switch in it; the launcher sets the ATen flag
directly and sets inductor's switch from an import hook
(``on_inductor_config``) if the script ever loads inductor.

Nothing here imports torch: the caller passes it, or it is read from
``sys.modules`` (no torch imported: no flags to read).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot._manifest_state import state as _state
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        from _manifest_state import state as _state
    except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
        from manifest.launch.boot._manifest_state import state as _state

# -------------------------------------------------------------------- flags


def read_flags() -> dict[str, Any] | None:
    """Every determinism-relevant switch as torch reports it now."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    def read(get: Callable[[], Any]) -> Any:
        # One unreadable switch must not lose the others: torch raises for the
        # legacy TF32 getters once a script mixed them with fp32_precision.
        try:
            return get()
        except Exception:
            return None

    b = torch.backends
    return {
        "deterministic_algorithms": read(
            lambda: bool(torch.are_deterministic_algorithms_enabled())),
        "deterministic_warn_only": read(
            lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled())),
        "cudnn_deterministic": read(lambda: bool(b.cudnn.deterministic)),
        "cudnn_benchmark": read(lambda: bool(b.cudnn.benchmark)),
        "allow_tf32_matmul": read(lambda: bool(b.cuda.matmul.allow_tf32)),
        "allow_tf32_cudnn": read(lambda: bool(b.cudnn.allow_tf32)),
        "float32_matmul_precision": read(lambda: str(torch.get_float32_matmul_precision())),
        "autocast": read(lambda: bool(torch.is_autocast_enabled("cpu"))
                         or bool(torch.is_autocast_enabled("cuda"))),
        "num_threads": read(lambda: int(torch.get_num_threads())),
        "num_interop_threads": read(lambda: int(torch.get_num_interop_threads())),
    }


def on_inductor_config(module: ModuleType) -> None:
    mode = _state.get("inductor_deterministic")
    if mode is not None:
        module.deterministic = mode  # type: ignore[attr-defined]


def _set_deterministic_lazily(torch: Any, warn_only: bool) -> bool:
    """``use_deterministic_algorithms(True)`` without importing inductor now.

    torch's own function imports ``torch._inductor.config`` (about 1.2 s on
    CPU) just to set its ``deterministic`` switch. Under the launcher the
    ATen flag is set directly and inductor's switch is set by the import
    hook the moment inductor is loaded, if ever. Returns False where this
    torch has no such private entry point (the caller uses the public one).
    """
    setter = getattr(getattr(torch, "_C", None), "_set_deterministic_algorithms", None)
    if setter is None:
        return False
    setter(True, warn_only=warn_only)
    _state["inductor_deterministic"] = True
    loaded = sys.modules.get("torch._inductor.config")
    if loaded is not None:
        on_inductor_config(loaded)
    return True


def apply_flags(torch: Any, *, warn_only: bool = False, lazy_inductor: bool = False) -> None:
    """The deterministic recipe: flags that make kernels and reductions repeatable."""
    if not (lazy_inductor and _set_deterministic_lazily(torch, warn_only)):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def snapshot_flags(torch: Any) -> dict[str, Any]:
    return {
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        "warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "precision": torch.get_float32_matmul_precision(),
    }


def restore_flags(torch: Any, saved: dict[str, Any]) -> None:
    torch.use_deterministic_algorithms(saved["deterministic"], warn_only=saved["warn_only"])
    torch.backends.cudnn.deterministic = saved["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = saved["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = saved["tf32_cudnn"]
    torch.set_float32_matmul_precision(saved["precision"])


def loaded_versions() -> dict[str, Any]:
    """CUDA runtime/cuDNN/NCCL versions loaded in this process, and devices used."""
    out: dict[str, Any] = {"cuda_runtime": None, "cudnn": None, "nccl": None, "devices": []}
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    out["cuda_runtime"] = torch.version.cuda or getattr(torch.version, "hip", None)
    with contextlib.suppress(Exception):
        if torch.backends.cudnn.is_available():
            v = torch.backends.cudnn.version()
            out["cudnn"] = None if v is None else _cudnn_text(int(v))
    with contextlib.suppress(Exception):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            nccl = torch.cuda.nccl.version()
            out["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
            out["devices"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
    return out


def _cudnn_text(v: int) -> str:
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 major*1000 + minor*100 + patch.
    if v >= 10000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"

