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
import math
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


SQUARE_CHUNK = 1 << 24
"""Elements squared at a time: the int64 copy the second sum needs stays under 128 MiB."""


def optimizer_fingerprint(optimizer: Any) -> str | None:
    """blake3 of (dtype, shape) and two integer sums over the bit view of every parameter.

    The sums run on the device the parameters live on and come back in one
    transfer per device. The plain sum moves by one for a 1-ULP change, but two
    changes that compensate (+1 ULP in one weight, -1 in another, as a planted
    ULP's gradients made at the next update on this machine) left it, and the
    trail, unchanged for two steps. The sum of the squared bit patterns moves
    for those: +k at x_i and -k at x_j change it by 2k(x_i - x_j + k).
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
                    sums = by_device.setdefault(str(view.device), [])
                    sums.append(view.sum(dtype=torch.int64))
                    squares = None
                    for chunk in view.split(SQUARE_CHUNK):
                        part = chunk.to(torch.int64).square_().sum()
                        squares = part if squares is None else squares + part
                    sums.append(squares)
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



# ------------------------------------------------------------- numeric trail
#
# The digests above say whether two runs hold the same bits; they cannot say how
# far apart two runs are. The numeric trail can, without saving a checkpoint: at
# the same steps, the loss the script last passed to backward() and, per
# parameter group, the group's L2 norm and its projection on PROJECTIONS fixed
# random directions. Projections are linear, so the difference of two runs'
# projections is the projection of the difference of their parameters, and
# mean((r_i . d)^2) estimates |d|^2 for directions of unit variance: the
# numeric trail measures the parameter distance between two runs, step by step
# (``manifest.numeric.envelope`` turns it into a verdict).
#
# Parameters are flattened together in buckets (``BUCKET``); each direction over a
# bucket of n elements, seen as an r x c matrix (c = ceil(sqrt(n))), is the outer
# product a (x) b of a length-r and a length-c Gaussian vector (zero mean, unit
# variance, so E[(a (x) b . d)^2] = |d|^2 still holds): stored it costs about
# 2 sqrt(n) floats per direction, not n, and the projection is one matmul. The
# directions come from a private generator seeded by the bucket's position, never
# the script's generators, so the trail changes no random state and is the same in
# every run of the same code.
# Sums run in float64: a projection computed in float32 would itself round by
# about 1e-7 of the norm, more than the distance a thread count makes at step 1.

PROJECTIONS = 4

BUCKET = 1 << 24
"""Parameters are projected in buckets of up to this many elements, flattened together:
a handful of tensor ops per bucket instead of per parameter (on the bundled example's
10-parameter CNN that took the trail from +2 ms to a fraction of it per step), and a
float64 copy of at most 128 MiB at a time (one larger parameter is a bucket alone)."""


def _directions(torch: Any, size: int, index: int, device: Any) -> tuple[Any, Any]:
    """Direction factors for a bucket of ``size`` elements seen as a ``rows × cols`` matrix
    (``cols`` = ceil(sqrt(size)), zero-padded): ``a`` (rows × k), ``b`` (cols × k)."""
    cols = max(1, math.isqrt(size - 1) + 1) if size > 1 else 1
    rows = -(-size // cols)
    gen = torch.Generator().manual_seed(0x6D616E69 + index)
    a = torch.randn(rows, PROJECTIONS, generator=gen, dtype=torch.float64)
    b = torch.randn(cols, PROJECTIONS, generator=gen, dtype=torch.float64)
    return a.to(device), b.to(device)


def _buckets(params: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    size = 0
    for p in params:
        if not p.is_floating_point() or p.numel() == 0 or p.is_sparse:
            continue
        if (not out or size + p.numel() > BUCKET or out[-1][0].device != p.device
                or out[-1][0].dtype != p.dtype):
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel()
    return out


def numeric_point(groups: list[list[Any]], loss: Any) -> dict[str, Any] | None:
    """``{"loss", "loss_eps", "groups": [[norm, proj_1, …], …]}`` of ``groups``' parameters.

    ``loss_eps`` is the machine epsilon of the loss's dtype: a loss is a rounded number,
    and two runs a rounding apart may differ in it by that much, relatively."""
    torch = sys.modules["torch"]
    cache = _state.setdefault("directions", {})
    rows: list[Any] = []
    with torch.no_grad():
        index = 0
        for params in groups:
            total: Any = None
            for bucket in _buckets(params):
                index += 1
                flat = torch.cat([p.detach().reshape(-1) for p in bucket]).to(torch.float64)
                size = flat.numel()
                key = (index, size, str(flat.device))
                hit = cache.get(key)
                if hit is None:
                    hit = cache[key] = _directions(torch, size, index, flat.device)
                a, b = hit
                padded = torch.nn.functional.pad(flat, (0, a.shape[0] * b.shape[0] - size))
                proj = ((padded.view(a.shape[0], b.shape[0]) @ b) * a).sum(0)
                row = torch.cat([torch.dot(flat, flat).reshape(1), proj])
                total = row if total is None else total + row.to(total.device)
            rows.append(total)
        device = next((r.device for r in rows if r is not None), None)
        out = [r.to(device) if r is not None else torch.zeros(PROJECTIONS + 1,
               dtype=torch.float64, device=device) for r in rows] if device is not None else []
        values: list[list[float]] = []
        if out:
            values = torch.stack(out).cpu().tolist()
        lost = eps = None
        if loss is not None:
            lost = float(loss.detach().to(torch.float64).cpu().reshape(-1)[0])
            eps = float(torch.finfo(loss.dtype).eps) if loss.is_floating_point() else None
    groups_out = [[math.sqrt(v[0]), *v[1:]] for v in values]
    if lost is not None and not math.isfinite(lost):
        lost = None
    if any(not math.isfinite(x) for g in groups_out for x in g):
        return None  # a run that went to NaN/inf has no numeric point to compare
    return {"loss": lost, "loss_eps": eps, "groups": groups_out}


def optimizer_groups(optimizer: Any) -> list[list[Any]]:
    return [list(group["params"]) for group in optimizer.param_groups]


# --------------------------------------------------------- steps by backward()
#
# Scripts that update weights by hand (word_language_model: ``p.data.add_(p.grad,
# alpha=-lr)``) never call an optimizer step. There, the launcher counts backward()
# calls as steps: the n-th backward() starts after the (n-1)-th update, so the point
# of step n-1 is taken as backward() n begins and the last step's at exit. The
# parameters are the leaves the first backward() reached (AccumulateGrad nodes of its
# graph), in graph order, which is the same in every run of the same code. Once any
# optimizer step happens in the process, backward() counts nothing: steps are the
# optimizer's.


def graph_leaves(tensor: Any) -> list[Any]:
    """The leaf tensors that backward() from ``tensor`` accumulates gradients into."""
    seen: set[int] = set()
    leaves: list[Any] = []
    stack = [tensor.grad_fn] if getattr(tensor, "grad_fn", None) is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves.append(variable)
            continue
        stack.extend(n for n, _ in reversed(node.next_functions))
    return leaves


def perturb_one_ulp(params: list[Any], seed: int) -> None:
    """Move every float element of ``params`` one ULP up or down (a seeded choice each):
    the lab's and capture's rounding-only perturbation of a run's state."""
    torch = sys.modules["torch"]
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for p in params:
            if not p.is_floating_point() or p.numel() == 0:
                continue
            up = torch.rand(p.shape, generator=gen) < 0.5
            target = torch.where(up, torch.tensor(math.inf), torch.tensor(-math.inf))
            p.data.copy_(torch.nextafter(p.data, target.to(p.device, p.dtype)))
