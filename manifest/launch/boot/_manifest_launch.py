"""In-process side of the launcher: seed, lock, fingerprint, record.

This module runs inside every Python process that ``manifest capture``
starts (through ``sitecustomize``), before user code. It imports only the
standard library at start-up; torch and numpy setup happen in an import hook
the moment the user's code imports them, so a process that never imports
torch pays nothing for it. It is also the implementation behind the public
recipe API (``manifest.launch.recipe``), so the launcher and a script that calls
``manifest.seed_everything`` apply exactly the same steps.

Per-process record (JSON, written atomically at exit to
``$MANIFEST_LAUNCH_RECORDS/<pid>.json``)::

    {"pid", "start_ns", "argv0", "rank", "local_rank", "world_size",
     "seed", "torch_imported", "numpy_imported", "flags", "pythonhashseed",
     "cuda_runtime", "cudnn", "nccl", "devices", "at_start", "at_exit",
     "trail", "log", "errors", "modules", "fp32_precision",
     "opened", "reseeds", "switches", "loaders"}

The last group comes from ``_manifest_observe`` (what the script itself did,
with call sites); ``capture`` turns it into manifest fields.

Seeds: every process gets the base seed; with derivation ``base+rank`` a
process whose environment carries ``RANK`` gets ``base + RANK``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import random
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

try:  # under the launcher this directory is on sys.path; as a package module otherwise
    import _manifest_observe as observe  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
    from manifest.launch.boot import _manifest_observe as observe

CONFIG_VAR = "MANIFEST_LAUNCH"
RECORDS_VAR = "MANIFEST_LAUNCH_RECORDS"
CUBLAS_DETERMINISTIC = ":4096:8"

_state: dict[str, Any] = {
    "config": None,
    "record": None,
    "trail": [],
    "hooked": set(),
    # Automatic trail: every optimizer step of this process (see _after_optimizer_step).
    "steps": 0,
    "auto_trail": [],
    "ops": None,
    "log": [],
}


# ------------------------------------------------------------------ hashing


def _blake3_hex(chunks: Sequence[bytes | memoryview]) -> str | None:
    try:
        import blake3
    except ImportError:
        return None
    h = blake3.blake3()
    for chunk in chunks:
        h.update(chunk)
    return "blake3:" + str(h.hexdigest())


def python_rng_fingerprint() -> str | None:
    version, internal, gauss = random.getstate()
    return _blake3_hex([json.dumps([version, list(internal), gauss]).encode()])


def numpy_rng_fingerprint() -> str | None:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    header = json.dumps([str(name), int(pos), int(has_gauss), float(cached)]).encode()
    return _blake3_hex([header, keys.tobytes()])


def _tensor_bytes(t: Any) -> bytes:
    return bytes(t.contiguous().view(-1).numpy().view("uint8").tobytes()) if t.numel() else b""


def torch_rng_fingerprints() -> tuple[str | None, list[str]]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, []
    cpu = _blake3_hex([torch.get_rng_state().numpy().tobytes()])
    cuda: list[str] = []
    # Never initialise CUDA just to look at it: only read states that exist.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for state in torch.cuda.get_rng_state_all():
            digest = _blake3_hex([state.numpy().tobytes()])
            if digest:
                cuda.append(digest)
    return cpu, cuda


def rng_fingerprints() -> dict[str, Any]:
    cpu, cuda = torch_rng_fingerprints()
    return {
        "python": python_rng_fingerprint(),
        "numpy": numpy_rng_fingerprint(),
        "torch_cpu": cpu,
        "cuda": cuda,
    }


def parameters_fingerprint(module: Any) -> str | None:
    """blake3 over (name, dtype, shape, raw bytes) of every state_dict tensor, by name."""
    parts: list[bytes] = []
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        parts.append(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        parts.append(_tensor_bytes(t))
    return _blake3_hex(parts)


# ------------------------------------------------------------------ seeding


def seed_python(seed: int) -> None:
    random.seed(seed)


def seed_numpy(seed: int) -> None:
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


def seed_torch(seed: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        # manual_seed seeds the CPU generator and queues every CUDA device's
        # seed lazily: it does not initialise CUDA.
        torch.manual_seed(seed)


def seed_all(seed: int) -> None:
    seed_python(seed)
    seed_numpy(seed)
    seed_torch(seed)


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


def _on_inductor_config(module: ModuleType) -> None:
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
        _on_inductor_config(loaded)
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


# -------------------------------------------------------------------- trail


def record_trail(step: int, digest: str | None) -> None:
    if digest is not None:
        _state["trail"].append({"step": int(step), "digest": digest})


def record_log(values: dict[str, float]) -> None:
    """``manifest.log(loss=…)``: values at the current optimizer step, kept in the record."""
    if _state["record"] is not None:
        _state["log"].append({"step": _state["steps"], **values})


def trail_points() -> list[dict[str, Any]]:
    return list(_state["trail"])


_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def optimizer_fingerprint(optimizer: Any) -> str | None:
    """blake3 of (dtype, shape) and an integer sum over the bit view of every parameter.

    The sums run on the device the parameters live on and come back in one
    transfer per device: a 1-ULP change anywhere moves a sum by one, at the
    cost of one reduction per parameter (see benchmarks/trail_overhead.py).
    """
    torch = sys.modules["torch"]
    header: list[str] = []
    by_device: dict[str, list[Any]] = {}
    cache = _state.setdefault("bit_views", {})
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                # The flat integer view shares the parameter's storage, so it is
                # made once and follows in-place updates; a parameter whose
                # storage was swapped (p.data = …) gets a new one.
                key = id(p)
                hit = cache.get(key)
                if hit is None or hit[0]() is not p or hit[1] != p.data_ptr():
                    hit = (weakref.ref(p), p.data_ptr(), _bit_view(torch, p.detach()),
                           f"{p.dtype}{list(p.shape)}")
                    cache[key] = hit
                header.append(hit[3])
                view = hit[2]
                if view is None and p.numel() and not p.is_contiguous():
                    view = _bit_view(torch, p.detach().contiguous())  # a copy: not cached
                if view is not None:
                    by_device.setdefault(str(view.device), []).append(
                        view.sum(dtype=torch.int64))
    parts: list[bytes | memoryview] = [json.dumps(header).encode()]
    for device in sorted(by_device):
        parts.append(torch.stack(by_device[device]).cpu().numpy().tobytes())
    return _blake3_hex(parts)


def _bit_view(torch: Any, t: Any) -> Any:
    """A flat integer view of ``t``'s storage (None when it has no such view)."""
    if t.numel() == 0 or t.is_sparse or t.is_complex() or not t.is_contiguous():
        return None
    flat = t.view(-1)
    width = flat.element_size()
    if width in _INT_VIEW and flat.is_floating_point():
        flat = flat.view(getattr(torch, _INT_VIEW[width]))
    return flat


def _keep_point(step: int, mode: Any) -> bool:
    """``all``: every step; ``sampled``: every step to 1000, then every 10th, 100th…"""
    if str(mode) == "all" or step <= 1000:
        return True
    interval: int = 10 ** (len(str(step)) - 3)
    return step % interval == 0


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _state["steps"] += 1
    step = _state["steps"]
    config = _state["config"] or {}
    ops = _state["ops"]
    mode = config.get("trail", "sampled")
    if mode and _keep_point(step, mode):
        if ops is not None:
            ops.paused = True
        try:
            digest = optimizer_fingerprint(optimizer)
        finally:
            if ops is not None:
                ops.paused = False
        if digest is not None:
            _state["auto_trail"].append({"step": step, "digest": digest})
    if ops is not None:
        stop = ops.on_step_end(step)
        ops.on_step_start(step + 1)
        if stop:
            # Explain needs this process only up to its divergent step: write
            # what was recorded and leave without running the rest.
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            _write_record()
            os._exit(0)


def _install_step_hook(torch: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_optimizer_step)
    raw = os.environ.get("MANIFEST_OPS")
    if raw:
        import _manifest_ops  # type: ignore[import-not-found]

        _state["ops"] = _manifest_ops.StepWindow(json.loads(raw), _rank_env("RANK"))
        _state["ops"].on_step_start(1)


# ------------------------------------------------------------- import hook


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched top-level module finishes importing."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.get(fullname)
        if callback is None or fullname in _state["hooked"]:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        _state["hooked"].add(fullname)
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                callback(module)
            except Exception as exc:  # recorded, never breaks the user's import
                _note_error(f"{fullname} setup failed: {type(exc).__name__}: {exc}")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _note_error(text: str) -> None:
    record = _state["record"]
    if record is not None:
        record["errors"].append(text)


def _rank_env(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def process_seed(config: dict[str, Any]) -> int:
    base = int(config["seed"])
    if config.get("derivation") == "base+rank":
        return base + (_rank_env("RANK") or 0)
    return base


def _on_numpy(module: ModuleType) -> None:
    config = _state["config"]
    with observe.launching():
        seed_numpy(process_seed(config))
    observe.note_launch_state(["numpy"])
    observe.on_numpy(module)
    _state["record"]["numpy_imported"] = True


def _on_torch(module: ModuleType) -> None:
    config = _state["config"]
    record = _state["record"]
    record["torch_imported"] = True
    threads = config.get("threads")
    if threads:
        module.set_num_threads(int(threads))
        with contextlib.suppress(RuntimeError):
            module.set_num_interop_threads(int(threads))
    with observe.launching():
        if config.get("deterministic", True):
            apply_flags(module, lazy_inductor=True)
        seed_all(process_seed(config))
    record["at_start"] = rng_fingerprints()
    if config.get("trail", "sampled") or os.environ.get("MANIFEST_OPS"):
        _install_step_hook(module)
    if os.environ.get("MANIFEST_AUDIT"):  # manifest lab's op audit (_manifest_audit)
        import _manifest_audit  # type: ignore[import-not-found]

        _manifest_audit.start(os.environ["MANIFEST_AUDIT"])
    observe.note_launch_state(["python", "numpy", "torch_cpu"])
    observe.on_torch(module)


def _write_record() -> None:
    record = _state["record"]
    directory = os.environ.get(RECORDS_VAR)
    if record is None or not directory:
        return
    try:
        record["end_ns"] = time.time_ns()  # the rank's wall time, for the compute record
        record["flags"] = read_flags()
        record.update(loaded_versions())
        record["at_exit"] = rng_fingerprints() if record["torch_imported"] else None
        record["trail"] = trail_points()
        record["steps"] = _state["steps"]
        record["auto_trail"] = list(_state["auto_trail"])
        record["log"] = list(_state["log"])
        if _state["ops"] is not None:
            _state["ops"].finish()
        record["modules"] = observe.modules_imported()
        torch = sys.modules.get("torch")
        record["fp32_precision"] = observe.fp32_precision(torch) if torch is not None else None
        mp = sys.modules.get("multiprocessing")
        record["mp_child"] = bool(mp is not None and mp.parent_process() is not None)
    except Exception as exc:
        record["errors"].append(f"recording at exit failed: {type(exc).__name__}: {exc}")
    path = os.path.join(directory, f"{os.getpid()}.json")
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def _excepthook_wrapper(
    previous: Callable[[type[BaseException], BaseException, Any], Any],
) -> Callable[[type[BaseException], BaseException, Any], Any]:
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> Any:
        record = _state["record"]
        if record is not None:
            record["exception"] = f"{kind.__name__}: {value}"[:2000]
        return previous(kind, value, tb)

    return hook


def install() -> None:
    """Prepare this process (called from sitecustomize); a no-op without config."""
    raw = os.environ.get(CONFIG_VAR)
    if not raw or _state["config"] is not None:
        return
    try:
        config = json.loads(raw)
    except ValueError:
        return
    _state["config"] = config
    _state["record"] = {
        "pid": os.getpid(),
        "start_ns": time.time_ns(),
        "argv0": sys.argv[0] if sys.argv else None,
        "rank": _rank_env("RANK"),
        "local_rank": _rank_env("LOCAL_RANK"),
        "world_size": _rank_env("WORLD_SIZE"),
        "seed": process_seed(config),
        "torch_imported": False,
        "numpy_imported": False,
        "flags": None,
        # The variable as the interpreter saw it at start-up: str hashing was
        # fixed from then on, so later changes in os.environ do not count.
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "hash_randomization": bool(sys.flags.hash_randomization),
        "at_start": None,
        "at_exit": None,
        "trail": [],
        "errors": [],
        "exception": None,
    }
    observe.install(_state["record"], config.get("root"), sys.modules[__name__])
    with observe.launching():
        seed_python(process_seed(config))
    observe.note_launch_state(["python"])
    hooks: dict[str, Callable[[ModuleType], None]] = {"torch": _on_torch, "numpy": _on_numpy,
             "torch._inductor.config": _on_inductor_config}
    hooks.update(dict.fromkeys(observe.SEED_MODULES, observe.on_seed_module))
    sys.meta_path.insert(0, _AfterImport(hooks))
    for name, callback in (("numpy", _on_numpy), ("torch", _on_torch)):
        if name in sys.modules:  # imported by an earlier sitecustomize
            _state["hooked"].add(name)
            callback(sys.modules[name])
    sys.excepthook = _excepthook_wrapper(sys.excepthook)
    atexit.register(_write_record)
