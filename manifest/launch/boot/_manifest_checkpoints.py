"""Checkpoints as the run writes them, and the launcher's side of a resumed segment.

Recording: ``torch.save``, ``safetensors.torch.save_file``/``save_model`` and
``torch.distributed.checkpoint.save`` are wrapped the moment their module is
imported (before the script can bind them by name), and each save to a path
appends ``{"path", "step", "kind", "sig"}`` to the process record's
``checkpoints``: ``step`` is the launcher's optimizer-step count when the save
returned, ``sig`` the (size, mtime_ns, inode) of the file (of ``.metadata`` for a
DCP directory, written last). Capture digests each checkpoint after the run
and keeps its table only when ``sig`` still matches (``manifest.capture.checkpoints``):
a path saved again later (``ckpt.pt`` every 50 steps) is named as overwritten,
never recorded with the wrong step. Saves to a file object (DCP writing one
item into a ``.distcp`` stream, Lightning's in-memory buffer) and saves nested
inside a recorded one are not checkpoints of their own. Nothing is hashed in
the training process: a stat per save is the whole cost.

A resumed segment (``verify --segments``): ``MANIFEST_SEGMENT``'s ``step_offset``
starts the step count at the checkpoint's step, so the resumed run's trail
points carry the recorded run's step numbers; ``stop_after`` ends the process
when the next ``optimizer.step()`` would go past that step (a pre-step hook),
after the script had its chance to save the checkpoint of the step before.

The resume audit (``manifest lab --resume-at K``): with ``MANIFEST_RESUME_PROBE``,
before each optimizer step after K the process records what that step depends
on, fingerprinted apart (``state_probe``), so the audit can name the state a
resume lost at the first step where the resumed and uninterrupted runs part.

Standard library only, like every module of this directory.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot import _manifest_rng as rng
    from manifest.launch.boot import _manifest_wire as wire
    from manifest.launch.boot._manifest_state import state as _state
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        import _manifest_rng as rng
        import _manifest_wire as wire
        from _manifest_state import state as _state
    except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
        from manifest.launch.boot import _manifest_rng as rng
        from manifest.launch.boot import _manifest_wire as wire
        from manifest.launch.boot._manifest_state import state as _state

SEGMENT_VAR = wire.SEGMENT_VAR
"""``{"step_offset": S, "stop_after": E}``: a resumed segment (``verify --segments``)."""

_saving = [0]  # depth of recorded saves in progress (a save inside a save is not another)


def _signature(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _note(path: Any, kind: str) -> None:
    record = _state["record"]
    if record is None or not isinstance(path, (str, os.PathLike)):
        return
    full = os.path.abspath(os.fspath(path))
    sig = _signature(os.path.join(full, ".metadata") if kind == "dcp" else full)
    if sig is None:
        return
    record.setdefault("checkpoints", []).append(
        {"path": full, "step": int(_state["steps"]), "kind": kind, "sig": sig})


def _wrap(original: Callable[..., Any], kind: str,
          target: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    if getattr(original, "_manifest_checkpoint", False):
        return original

    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        _saving[0] += 1
        try:
            result = original(*args, **kwargs)
        finally:
            _saving[0] -= 1
        if _saving[0] == 0:
            try:
                _note(target(args, kwargs), kind)
            except Exception as exc:  # recorded, never breaks the user's save
                record = _state["record"]
                if record is not None:
                    record["errors"].append(f"checkpoint record failed: {exc}")
        return result

    save._manifest_checkpoint = True  # type: ignore[attr-defined]
    return save


def _arg(index: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    return lambda args, kwargs: kwargs.get(name, args[index] if len(args) > index else None)


def _dcp_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    found = kwargs.get("checkpoint_id")
    if found is None and kwargs.get("storage_writer") is not None:
        found = getattr(kwargs["storage_writer"], "path", None)
    return found


def on_torch(torch: Any, write_record: Callable[[], None]) -> None:
    """Wrap ``torch.save``; start the step count at ``step_offset``; stop at ``stop_after``."""
    torch.save = _wrap(torch.save, "torch", _arg(1, "f"))
    try:
        segment = json.loads(os.environ.get(SEGMENT_VAR) or "{}")
    except ValueError:
        segment = {}
    if not isinstance(segment, dict):
        segment = {}
    offset = segment.get("step_offset")
    if isinstance(offset, int) and offset > 0 and _state["steps"] == 0:
        _state["steps"] = offset
    stop = segment.get("stop_after")
    if isinstance(stop, int):
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            if _state["steps"] >= stop and not _state.get("inert_step"):
                # The segment is done: leave as explain does at its step, record written.
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                record = _state["record"]
                if record is not None:
                    record["stopped_at"] = stop
                write_record()
                os._exit(0)

        register_optimizer_step_pre_hook(before_step)
    probe = os.environ.get(PROBE_VAR)
    if probe:
        try:
            start = int(json.loads(probe)["from"])
        except (ValueError, KeyError, TypeError):
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def probe_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            step = int(_state["steps"]) + 1
            record = _state["record"]
            if (step <= start or record is None or _state.get("inert_step")
                    or len(record.get("probes", ())) >= MAX_PROBES):
                return
            try:
                record.setdefault("probes", []).append({"step": step, **state_probe(optimizer)})
            except Exception as exc:  # recorded, never breaks the user's step
                record["errors"].append(f"resume probe failed: {type(exc).__name__}: {exc}")

        register_optimizer_step_pre_hook(probe_step)


# ------------------------------------------------------------ resume audit

PROBE_VAR = wire.PROBE_VAR
"""``{"from": K}``: before each optimizer step after K, fingerprint what a resume must carry
(``manifest lab --resume-at K``, ``manifest.lab.resume``)."""
MAX_PROBES = 2000


def _tensor_bytes(t: Any) -> bytes:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return bytes(t.contiguous().view(-1).view(sys.modules["torch"].uint8).numpy().tobytes())


def _fingerprint(tensors: list[Any]) -> str | None:
    parts: list[bytes | memoryview] = []
    for t in tensors:
        if t is None:
            parts.append(b"none")
            continue
        parts.append(json.dumps([str(t.dtype), list(t.shape)]).encode())
        parts.append(_tensor_bytes(t) if t.numel() else b"")
    return rng.blake3_hex(parts)


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return repr(type(value).__name__)


def state_probe(optimizer: Any) -> dict[str, Any]:
    """What the next optimizer step depends on, each fingerprinted apart: the parameters,
    their gradients (the data the step saw), the optimizer's state (momentum, moments),
    its hyperparameters (what an LR scheduler sets) and the global generators."""
    torch = sys.modules["torch"]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state: list[Any] = []
    for p in params:
        entry = optimizer.state.get(p, {})
        for key in sorted(entry, key=str):
            value = entry[key]
            state.append(value if isinstance(value, torch.Tensor) else torch.tensor(
                float(value) if isinstance(value, (int, float)) else 0.0))
    with torch.no_grad():
        return {
            "params": _fingerprint(list(params)),
            "grads": _fingerprint([p.grad for p in params]),
            "optimizer_state": _fingerprint(state),
            "hyper": [{k: _plain(v) for k, v in sorted(g.items()) if k != "params"}
                      for g in optimizer.param_groups],
            "rng": rng.rng_fingerprints(),
        }


def on_safetensors(module: Any) -> None:
    for name in ("save_file", "save_model"):
        if hasattr(module, name):
            setattr(module, name, _wrap(getattr(module, name), "safetensors", _arg(1, "filename")))


def on_dcp(module: Any) -> None:
    saver = getattr(module, "state_dict_saver", None)
    for owner in (module, saver):
        if owner is not None and hasattr(owner, "save"):
            owner.save = _wrap(owner.save, "dcp", _dcp_target)


def _not_a_step(original: Callable[..., Any]) -> Callable[..., Any]:
    """DCP's ``_init_optim_state`` calls ``optimizer.step()`` with zero gradients and lr 0
    to create the optimizer's state before a load (a resume's ``get_state_dict``). It is
    not a training step: the count, trail points and probes it made are taken back, so a
    resumed run numbers its steps as the uninterrupted one did."""
    if getattr(original, "_manifest_checkpoint", False):
        return original

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        kept = {key: len(_state[key]) for key in ("auto_trail", "numeric")
                if isinstance(_state.get(key), list)}
        steps = _state["steps"]
        _state["inert_step"] = True
        try:
            return original(*args, **kwargs)
        finally:
            _state["inert_step"] = False
            _state["steps"] = steps
            for key, n in kept.items():
                del _state[key][n:]

    init._manifest_checkpoint = True  # type: ignore[attr-defined]
    return init


def on_dcp_state_dict(module: Any) -> None:
    if hasattr(module, "_init_optim_state"):
        module._init_optim_state = _not_a_step(module._init_optim_state)


# -------------------------------------------------- known resume conventions

RESUME_VAR = wire.RESUME_VAR
"""A checkpoint for a script that resumes by a known convention, no template needed:
Lightning's ``Trainer.fit(ckpt_path=…)``, the Hugging Face ``Trainer.train(
resume_from_checkpoint=…)``. Given only where the script passed none. A convention the
script's argv selects (nanoGPT's ``--init_from=resume``, ``manifest.verify.conventions``)
is proven by the load itself: ``torch.load`` or a safetensors load of this file."""


def _loaded_path(value: Any) -> str | None:
    """The file a load reads: a path, or an open file's ``name``."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        return path if isinstance(path, str) else None
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else None


def _watch_load(original: Callable[..., Any],
                target: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    """``original`` noting ``resumed_from`` when it returns having read ``RESUME_VAR``'s
    file (both resolved against the cwd: the given one when the module is wrapped). Not
    wrapped without the variable: nothing is added to a run's loads."""
    given = os.environ.get(RESUME_VAR)
    if not given or getattr(original, "_manifest_resume_load", False):
        return original
    want = os.path.realpath(given)

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            record = _state["record"]
            path = _loaded_path(target(args, kwargs))
            if record is not None and path is not None and os.path.realpath(path) == want:
                record.setdefault("resumed_from", given)  # a convention's own note stands
        except Exception as exc:  # recorded, never breaks the user's load
            with contextlib.suppress(Exception):
                _state["record"]["errors"].append(
                    f"resume record failed: {type(exc).__name__}: {exc}")
        return result

    load._manifest_resume_load = True  # type: ignore[attr-defined]
    return load


def on_torch_serialization(module: Any) -> None:
    """``torch.load``: ``torch/__init__`` binds it from ``torch.serialization`` after
    importing that module, so wrapping it here wraps ``torch.load`` too."""
    if not hasattr(module, "load"):
        return
    original = module.load
    module.load = _watch_load(original, _arg(0, "f"))
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "load", None) is original:
        setattr(torch, "load", module.load)  # noqa: B010


def on_safetensors_torch(module: Any) -> None:
    """Saves recorded (``on_safetensors``); ``load_file``/``load_model`` watched."""
    on_safetensors(module)
    for name, target in (("load_file", _arg(0, "filename")), ("load_model", _arg(1, "filename"))):
        if hasattr(module, name):
            setattr(module, name, _watch_load(getattr(module, name), target))


def on_lightning_io(module: Any) -> None:
    """Lightning saves through ``_atomic_save`` (torch.save into memory, then fsspec)."""
    if hasattr(module, "_atomic_save"):
        module._atomic_save = _wrap(module._atomic_save, "lightning", _arg(1, "filepath"))


def on_lightning_trainer(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    fit = getattr(trainer, "fit", None)
    if trainer is None or fit is None or getattr(fit, "_manifest_checkpoint", False):
        return

    @functools.wraps(fit)
    def resumed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = os.environ.get(RESUME_VAR)
        # fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, …)
        if given and kwargs.get("ckpt_path") is None and len(args) < 5:
            kwargs["ckpt_path"] = given
            record = _state["record"]
            if record is not None:
                record["resumed_from"] = given
        return fit(self, *args, **kwargs)

    resumed_fit._manifest_checkpoint = True  # type: ignore[attr-defined]
    trainer.fit = resumed_fit


def on_hf_trainer(module: Any) -> None:
    """The Hugging Face Trainer resumes from a ``checkpoint-N`` directory: given a file in
    one (the checkpoint the run recorded), it gets the directory."""
    trainer = getattr(module, "Trainer", None)
    train = getattr(trainer, "train", None)
    if trainer is None or train is None or getattr(train, "_manifest_checkpoint", False):
        return

    @functools.wraps(train)
    def resumed_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = os.environ.get(RESUME_VAR)
        if given and not args and kwargs.get("resume_from_checkpoint") is None:
            folder = os.path.dirname(given) if os.path.isfile(given) else given
            kwargs["resume_from_checkpoint"] = folder
            record = _state["record"]
            if record is not None:
                record["resumed_from"] = folder
        return train(self, *args, **kwargs)

    resumed_train._manifest_checkpoint = True  # type: ignore[attr-defined]
    trainer.train = resumed_train


IMPORT_HOOKS: dict[str, Callable[[Any], None]] = {
    "transformers.trainer": on_hf_trainer,
    "safetensors.torch": on_safetensors_torch,
    "torch.serialization": on_torch_serialization,
    "torch.distributed.checkpoint": on_dcp,
    "torch.distributed.checkpoint.state_dict": on_dcp_state_dict,
    "lightning.fabric.utilities.cloud_io": on_lightning_io,
    "lightning_fabric.utilities.cloud_io": on_lightning_io,
    "lightning.pytorch.trainer.trainer": on_lightning_trainer,
    "pytorch_lightning.trainer.trainer": on_lightning_trainer,
}
"""Modules whose save functions are wrapped the moment they are imported."""
