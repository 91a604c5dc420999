"""The step trail: fingerprints of the parameters as training goes, step by step.

Two producers, one record. The launcher's optimizer-step hook (in
``_manifest_launch``) counts every ``optimizer.step()`` of the process and,
at the steps ``keep_point`` keeps (every step to 1000, then every 10th below
10,000, every 100th below 100,000 …, or every step with ``all``), stores
``optimizer_fingerprint``: ``auto_trail`` in the record. ``manifest.trail``
(the recipe API) stores ``parameters_fingerprint`` of a model at the steps the
script chose (``record_trail``: ``trail``), and ``manifest.log`` numbers at
the current step (``record_log``: ``log``). ``verify`` and ``explain`` find
the first step where two runs part from these points.

Two fingerprints because they cost differently: ``parameters_fingerprint``
hashes every byte of the state_dict on the host (exact, a copy per CUDA
tensor); ``optimizer_fingerprint`` sums the parameters' bit views on their own
device and fetches them, one int64 per parameter, in one transfer per device,
which is what makes a point at every step affordable (see benchmarks/trail_overhead.py).

Standard library at import; torch is taken from ``sys.modules`` when called.
"""

from __future__ import annotations

import json
import sys
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot._manifest_rng import blake3_hex
    from manifest.launch.boot._manifest_state import state as _state
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        from _manifest_rng import blake3_hex
        from _manifest_state import state as _state
    except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
        from manifest.launch.boot._manifest_rng import blake3_hex
        from manifest.launch.boot._manifest_state import state as _state


# ------------------------------------------------------------- fingerprints


def _tensor_bytes(t: Any) -> bytes:
    return bytes(t.contiguous().view(-1).numpy().view("uint8").tobytes()) if t.numel() else b""


def parameters_fingerprint(module: Any) -> str | None:
    """blake3 over (name, dtype, shape, raw bytes) of every state_dict tensor, by name."""
    parts: list[bytes] = []
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        parts.append(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        parts.append(_tensor_bytes(t))
    return blake3_hex(parts)


# ------------------------------------------------------------------- points


def record_trail(step: int, digest: str | None) -> None:
    if digest is not None:
        _state["trail"].append({"step": int(step), "digest": digest})


def record_log(values: dict[str, float]) -> None:
    """``manifest.log(loss=…)``: values at the current optimizer step, kept in the record."""
    if _state["record"] is not None:
        _state["log"].append({"step": _state["steps"], **values})


def trail_points() -> list[dict[str, Any]]:
    return list(_state["trail"])


# ------------------------------------------------------------ automatic trail

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
    return blake3_hex(parts)


def _bit_view(torch: Any, t: Any) -> Any:
    """A flat integer view of ``t``'s storage (None when it has no such view)."""
    if t.numel() == 0 or t.is_sparse or t.is_complex() or not t.is_contiguous():
        return None
    flat = t.view(-1)
    width = flat.element_size()
    if width in _INT_VIEW and flat.is_floating_point():
        flat = flat.view(getattr(torch, _INT_VIEW[width]))
    return flat


def keep_point(step: int, mode: Any) -> bool:
    """``all``: every step; ``sampled``: every step to 1000, then every 10th, 100th…"""
    if str(mode) == "all" or step <= 1000:
        return True
    interval: int = 10 ** (len(str(step)) - 3)
    return step % interval == 0

