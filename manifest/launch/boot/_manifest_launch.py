"""In-process side of the launcher: seed, lock, fingerprint, record.

This module runs inside every Python process that ``manifest capture``
starts (through ``sitecustomize``), before user code. It imports only the
standard library at start-up; torch and numpy setup happen in an import hook
the moment the user's code imports them, so a process that never imports
torch pays nothing for it. It is also the implementation behind the public
recipe API (``manifest.launch.recipe``), so the launcher and a script that calls
``manifest.seed_everything`` apply exactly the same steps.
Longer than 500 lines because each module this file imports is loaded, before user
code, into every process of every run: its start-up hooks stay in one file, and the work
that runs later lives beside it (``_manifest_trail``, ``_manifest_observe``,
``_manifest_environ``, ``_manifest_checkpoints``).

Per-process record: JSON, written atomically at exit to
``$MANIFEST_LAUNCH_RECORDS/<pid>.json``; its keys and their types are
``_manifest_wire.ProcessRecord``, the one type the host reads it through.

Each worker (a fork, a multiprocessing child) also leaves ``worker-<pid>`` there
the moment it starts (``note_worker``): one killed later writes no record.

What the script itself did, with call sites, comes from ``_manifest_observe``;
``capture`` turns it into manifest fields.

Seeds: every process gets the base seed; with derivation ``base+rank`` a
process whose environment carries ``RANK`` gets ``base + RANK``.

This module is the launcher's life cycle: ``install`` at start-up, the import
hook that prepares numpy and torch the moment the script imports them, the
optimizer-step hook, and the record at exit. What those hooks do lives
beside it, one module per hook, each with the same ``_manifest_`` prefix so
that none can shadow a module of the user's (this directory is first on the
child's ``sys.path``): ``_manifest_rng`` (seeding and generator
fingerprints), ``_manifest_switches`` (the determinism switches and the
runtime versions), ``_manifest_trail`` (step-trail fingerprints and points),
``_manifest_state`` (the one per-process state they share) and
``_manifest_observe`` (what the script itself did). All five are standard
library at import and load at start-up with this one; ``_manifest_ops``,
``_manifest_opstream`` and ``_manifest_audit`` load only for ``explain`` and
``lab`` runs. The four extra files cost about 0.5 ms of each process's
start-up (``python -X importtime``: sitecustomize with all it loads, median
of 31, 10.3 ms as one file, 10.9 ms split, on a 2-core dev machine).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot import _manifest_checkpoints as checkpoints
    from manifest.launch.boot import _manifest_environ as envreads
    from manifest.launch.boot import _manifest_observe as observe
    from manifest.launch.boot import _manifest_rng as rng
    from manifest.launch.boot import _manifest_switches as switches
    from manifest.launch.boot import _manifest_topology as topology
    from manifest.launch.boot import _manifest_trail as trail
    from manifest.launch.boot import _manifest_wire as wire
    from manifest.launch.boot._manifest_state import state as _state
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        import _manifest_checkpoints as checkpoints
        import _manifest_environ as envreads
        import _manifest_observe as observe
        import _manifest_rng as rng
        import _manifest_switches as switches
        import _manifest_topology as topology
        import _manifest_trail as trail
        import _manifest_wire as wire
        from _manifest_state import state as _state
    except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
        from manifest.launch.boot import _manifest_checkpoints as checkpoints
        from manifest.launch.boot import _manifest_environ as envreads
        from manifest.launch.boot import _manifest_observe as observe
        from manifest.launch.boot import _manifest_rng as rng
        from manifest.launch.boot import _manifest_switches as switches
        from manifest.launch.boot import _manifest_topology as topology
        from manifest.launch.boot import _manifest_trail as trail
        from manifest.launch.boot import _manifest_wire as wire
        from manifest.launch.boot._manifest_state import state as _state

CONFIG_VAR = wire.CONFIG_VAR
RECORDS_VAR = wire.RECORDS_VAR
CUBLAS_DETERMINISTIC = wire.CUBLAS_DETERMINISTIC


# ---------------------------------------------------------------- step hook


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _state["steps"] == 0:
        # backward() calls before the first optimizer step were micro-batches of it
        # (gradient accumulation), not steps: their points are dropped.
        _state["backward_points"] = ([], [])
    _state["steps"] += 1
    step = _state["steps"]
    config = _state["config"] or {}
    ops = _state["ops"]
    mode = config.get("trail", "sampled")
    if mode and trail.keep_point(step, mode):
        if ops is not None:
            ops.paused = True
        try:
            digest = trail.optimizer_fingerprint(optimizer)
        finally:
            if ops is not None:
                ops.paused = False
        if digest is not None:
            _state["auto_trail"].append({"step": step, "digest": digest})
        if config.get("numeric", True):
            _numeric(step, trail.optimizer_groups(optimizer), _state["loss"], _state["numeric"])
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


def _numeric(step: int, groups: list[list[Any]], loss: Any, into: list[Any]) -> None:
    """A numeric-trail point (``_manifest_trail.numeric_point``), paused from the op stream."""
    ops = _state["ops"]
    if ops is not None:
        ops.paused = True
    try:
        point = trail.numeric_point(groups, loss)
    except Exception as exc:  # recorded once, never breaks the user's step
        point = None
        if not _state["numeric_failed"]:
            _state["numeric_failed"] = True
            _note_error(f"numeric trail failed: {type(exc).__name__}: {exc}")
    finally:
        if ops is not None:
            ops.paused = False
    if point is not None:
        into.append({"step": step, **point})


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """``perturb``: the state moved by one ULP before the first update (an envelope run)."""
    seed = (_state["config"] or {}).get("perturb")
    if seed is not None and not _state["perturbed"]:
        _state["perturbed"] = True
        trail.perturb_one_ulp([p for g in trail.optimizer_groups(optimizer) for p in g],
                              int(seed))


def _on_backward(tensors: Any) -> None:
    """Every backward(): keep the loss; count it as a step while no optimizer steps."""
    torch = sys.modules["torch"]
    loss = tensors if isinstance(tensors, torch.Tensor) else (
        tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        loss = None
    _state["backwards"] += 1
    if _state["steps"] == 0:
        if _state["backwards"] == 1 and loss is not None:
            _state["leaves"] = [weakref.ref(t) for t in trail.graph_leaves(loss)]
        elif _state["backwards"] > 1:
            _backward_step(_state["backwards"] - 1)
    _state["loss"] = loss.detach() if loss is not None else None


def _backward_step(step: int) -> None:
    """The point of hand-updated step ``step`` (no torch.optim in this process so far): kept
    aside until the process ends without an optimizer step (``_write_record``)."""
    config = _state["config"] or {}
    params = [p for p in (ref() for ref in _state["leaves"]) if p is not None]
    if not params:
        return
    if config.get("perturb") is not None and not _state["perturbed"]:
        _state["perturbed"] = True
        trail.perturb_one_ulp(params, int(config["perturb"]))
    mode = config.get("trail", "sampled")
    if not trail.keep_point(step, mode):
        return
    ops = _state["ops"]
    if ops is not None:
        ops.paused = True
    try:
        digest = trail.optimizer_fingerprint(_Groups([{"params": params}]))
    finally:
        if ops is not None:
            ops.paused = False
    digests, numeric = _state["backward_points"]
    if digest is not None:
        digests.append({"step": step, "digest": digest})
    if config.get("numeric", True):
        _numeric(step, [params], _state["loss"], numeric)


class _Groups:
    """The one attribute of an optimizer that the fingerprints read."""

    def __init__(self, param_groups: list[dict[str, Any]]) -> None:
        self.param_groups = param_groups


def _install_backward_hook(torch: Any) -> None:
    """Wrap ``torch.autograd.backward`` (``Tensor.backward`` calls it by that name)."""
    original = torch.autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _on_backward(tensors)
        except Exception as exc:  # recorded, never breaks the user's backward
            _note_error(f"backward step hook failed: {type(exc).__name__}: {exc}")
        return original(tensors, *args, **kwargs)

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    torch.autograd.backward = backward


def _install_step_hook(torch: Any) -> None:
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    register_optimizer_step_post_hook(_after_optimizer_step)
    # Registered in every run (a no-op without a perturbation): the hook table must not
    # tell an envelope run from the real one.
    register_optimizer_step_pre_hook(_before_optimizer_step)
    _install_backward_hook(torch)
    raw = os.environ.get(wire.OPS_VAR)
    if raw:
        import _manifest_opstream  # type: ignore[import-not-found]

        _state["ops"] = _manifest_opstream.StepWindow(json.loads(raw), _rank_env("RANK"))
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
        rng.seed_numpy(process_seed(config))
    observe.note_launch_state(["numpy"])
    observe.on_numpy(module)
    _state["record"]["numpy_imported"] = True


def _install_precision(precision: str) -> None:
    try:
        import _manifest_precision  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - as a package module (the recipe API)
        from manifest.launch.boot import _manifest_precision
    try:
        _manifest_precision.install(precision)
    except Exception as exc:  # recorded; the run then is not the one asked for
        _note_error(f"precision emulation failed: {type(exc).__name__}: {exc}")
    _state["record"]["emulate"] = _manifest_precision.installed()


def _on_torch(module: ModuleType) -> None:
    config = _state["config"]
    record = _state["record"]
    record["torch_imported"] = True
    threads = config.get("threads")
    if threads:
        module.set_num_threads(int(threads))
        with contextlib.suppress(RuntimeError):
            module.set_num_interop_threads(int(threads))
    # The launcher reseeds python and numpy here; draws made before (the script's, with
    # the seed the launcher set at start-up) would leave no trace in the state at start.
    early = observe.drawn_since_seeding(["python", "numpy"])
    if early:
        observe.note_unaccounted(early)
    with observe.launching():
        if config.get("deterministic", True):
            switches.apply_flags(module, lazy_inductor=True)
        rng.seed_all(process_seed(config))
    record["at_start"] = rng.rng_fingerprints()
    # Checkpoints the run saves, and a resumed segment's step offset and stop.
    checkpoints.on_torch(module, _write_record)
    if config.get("trail", "sampled") or os.environ.get(wire.OPS_VAR):
        _install_step_hook(module)
    if config.get("emulate"):  # another device's matmul precision (_manifest_precision)
        _install_precision(str(config["emulate"]))
    if os.environ.get(wire.AUDIT_VAR):  # manifest lab's op audit (_manifest_audit)
        import _manifest_audit  # type: ignore[import-not-found]

        _manifest_audit.start(os.environ[wire.AUDIT_VAR])
    observe.note_launch_state(["python", "numpy", "torch_cpu"])
    observe.on_torch(module)
    topology.on_torch(module, record)


def _write_record() -> None:
    record: wire.ProcessRecord | None = _state["record"]
    directory = os.environ.get(RECORDS_VAR)
    if record is None or not directory:
        return
    try:
        record["end_ns"] = time.time_ns()  # the rank's wall time, for the compute record
        record["flags"] = switches.read_flags()
        versions = switches.loaded_versions()
        record["cuda_runtime"] = versions["cuda_runtime"]
        record["cudnn"] = versions["cudnn"]
        record["nccl"] = versions["nccl"]
        record["devices"] = versions["devices"]
        record["at_exit"] = rng.rng_fingerprints() if record["torch_imported"] else None
        record["trail"] = cast("list[wire.StepDigest]", trail.trail_points())
        if _state["steps"] == 0 and _state["backwards"] and _state["leaves"]:
            # Hand-updated weights: the last backward()'s update is the last step.
            _backward_step(_state["backwards"])
            _state["auto_trail"].extend(_state["backward_points"][0])
            _state["numeric"].extend(_state["backward_points"][1])
            record["step_source"] = "backward"
            record["steps"] = _state["backwards"]
        else:
            record["steps"] = _state["steps"]
        record["numeric"] = list(_state["numeric"])
        record["recording_ns"] = _state.get("recording_ns", 0)  # _manifest_trail._timed
        record["auto_trail"] = list(_state["auto_trail"])
        record["auto_trail_scheme"] = trail.AUTO_SCHEME
        record["log"] = list(_state["log"])
        if _state["ops"] is not None:
            _state["ops"].finish()
        record["modules"] = observe.modules_imported()
        torch = sys.modules.get("torch")
        record["fp32_precision"] = observe.fp32_precision(torch) if torch is not None else None
        topology.at_exit(record, torch)
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


def note_worker() -> None:
    """A worker (a fork, or a multiprocessing child) starts: say so in the records directory
    now, with its parent, since a worker killed later writes no record of its own."""
    directory = os.environ.get(RECORDS_VAR)
    if not directory:
        return
    try:
        name = f"{wire.WORKER_PREFIX}{os.getpid()}"
        with open(os.path.join(directory, name), "w", encoding="utf-8") as fh:
            fh.write(str(os.getppid()))
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


PRIVATE_FILE = wire.PRIVATE_FILE
"""Every run's private settings, in the records directory, the same name and length in
every run (``manifest.launch.runner.write_private``); nothing of it enters the environment."""


def _private_settings() -> dict[str, Any]:
    """The run's private settings (an envelope run's ``perturb`` seed); {} when absent."""
    directory = os.environ.get(RECORDS_VAR)
    if not directory:
        return {}
    try:
        with open(os.path.join(directory, PRIVATE_FILE), encoding="utf-8") as fh:
            loaded = json.loads(fh.read(4096))
    except (OSError, ValueError):
        return {}
    seed = loaded.get("perturb") if isinstance(loaded, dict) else None
    return {"perturb": seed} if isinstance(seed, int) and not isinstance(seed, bool) else {}


def install() -> None:
    """Prepare this process (called from sitecustomize); a no-op without config."""
    raw = os.environ.get(CONFIG_VAR)
    if not raw or _state["config"] is not None:
        return
    try:
        config = json.loads(raw)
    except ValueError:
        return
    config.pop("perturb", None)  # only ever from the private file, never the environment
    config.update(_private_settings())
    _state["config"] = config
    record: wire.ProcessRecord = {
        "pid": os.getpid(),
        "start_ns": time.time_ns(),
        "argv0": sys.argv[0] if sys.argv else None,
        "rank": _rank_env("RANK"),
        "local_rank": _rank_env("LOCAL_RANK"),
        "world_size": _rank_env("WORLD_SIZE"),
        # Where it sits in a distributed run, as its launcher said (_manifest_topology).
        "launch_env": topology.launch_env(),
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
    _state["record"] = record
    observe.install(_state["record"], config.get("root"), sys.modules[__name__])
    # The variables the script's own code reads (_manifest_environ), never their values.
    envreads.install(_state["record"], observe._obs["code_skip"], observe._where)
    with observe.launching():
        rng.seed_python(process_seed(config))
    observe.note_launch_state(["python"])
    hooks: dict[str, Callable[[ModuleType], None]] = {"torch": _on_torch, "numpy": _on_numpy,
             "torch._inductor.config": switches.on_inductor_config}
    hooks.update(dict.fromkeys(observe.SEED_MODULES, observe.on_seed_module))
    hooks.update(checkpoints.IMPORT_HOOKS)
    sys.meta_path.insert(0, _AfterImport(hooks))
    for name, callback in (("numpy", _on_numpy), ("torch", _on_torch)):
        if name in sys.modules:  # imported by an earlier sitecustomize
            _state["hooked"].add(name)
            callback(sys.modules[name])
    sys.excepthook = _excepthook_wrapper(sys.excepthook)
    observe.note_user_start()
    atexit.register(_write_record)
    if "--multiprocessing-fork" in sys.argv:  # a spawned multiprocessing child
        note_worker()
