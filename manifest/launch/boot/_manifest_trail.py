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
tensor); ``optimizer_fingerprint`` sums the parameters' bits as int32 words on
their own device, two integers per parameter group fetched in one transfer per
device, which is what makes a point at every step affordable.

What recording costs (``benchmarks/step_cost.py``, one thread, thread CPU time, paired
and interleaved): on a 1.07 M-parameter nanoGPT-shaped model the fingerprint plus numeric
point take 1.007× a bare step, 0.993× on a 25.5 M one; the recording's own time is 1.9%
and 1.6% of the step (the fingerprint alone 0.8% and 0.5%). Int64 copies for the squared
sum, a float64 matmul against dense directions and fresh float64 copies (whose page
faults cost more than the arithmetic) measured 1.13× and 1.20×. Both read each
parameter's bytes once per step, into buffers made at the first step and kept with the
views that fill them (``_plan``).

Standard library at import; torch is taken from ``sys.modules`` when called.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

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

_F = TypeVar("_F")


def _timed(fn: _F) -> _F:
    """Adds the wall time of every call to ``state["recording_ns"]``: what recording cost
    this process, written to its record at exit and shown by ``manifest show``."""
    @functools.wraps(fn)  # type: ignore[arg-type]
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)  # type: ignore[operator]
        finally:
            _state["recording_ns"] = _state.get("recording_ns", 0) + time.perf_counter_ns() - began
    return timed  # type: ignore[return-value]



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

_WORD_VIEW = {1: "int8", 2: "int16"}

WORDS = 1 << 18
"""Words gathered and reduced at a time on the CPU: a 1 MiB int32 buffer, reused every step,
that stays in a core's L2 cache while it is summed, squared and summed again;
``FUSED_WORDS`` off the CPU, where each launch, not memory, is the cost."""
FUSED_WORDS = 1 << 24

_MASK32 = (1 << 32) - 1


AUTO_SCHEME = "word-sums-32"
"""How :func:`optimizer_fingerprint` fingerprints a step, recorded beside the trail
(``ProcessOutcome.trail_scheme``): a manifest whose automatic trail was made another way
(none recorded: before this marker) cannot be compared with a re-run's point for point."""


@_timed
def optimizer_fingerprint(optimizer: Any, *, words: int | None = None) -> str | None:
    """blake3 of (dtype, shape) of every parameter and, per parameter group, two integer
    sums over the int32 words of its parameters' bits: ``Σ w`` and ``Σ w²``, both mod 2^32.

    A 4- or 8-byte element is read as one or two int32 words; a 1- or 2-byte element is
    widened to one. ``Σ w`` moves by k for a k-ULP change in one weight. Two changes that
    compensate (+1 ULP in one weight, -1 in another, as a planted ULP's gradients made at
    the next update on this machine) leave it unchanged, and ``Σ w²`` catches them: +k at
    w_i and -k at w_j move it by 2k(w_i - w_j + k), zero mod 2^32 only when w_j = w_i + k
    (the two weights traded values) or w_i - w_j + k = ±2^31, which takes a positive and a
    negative weight of adjacent magnitudes. One change alone moves it by 2kw + k², odd for
    odd k: never zero.

    Each parameter's bytes are read once: copied, ``words`` at a time (``WORDS`` on the
    CPU, ``FUSED_WORDS`` elsewhere), into one cached int32 buffer per device that is
    summed, squared in place and summed again, wrapping in int32; no int64 copy is made.
    On a GPU that is a handful of launches per group, not per parameter, and every sum
    comes back in one transfer per device per step. The sums are exact integers mod 2^32,
    so the buffer size, the device and the reduction order never change the digest.
    """
    torch = sys.modules["torch"]
    header: list[str] = []
    sums: list[tuple[int, Any]] = []  # (group, [Σw, Σw²] int32 tensor on its device)
    with torch.no_grad():
        for index, group in enumerate(optimizer.param_groups):
            plan = _plan(("words", words), list(group["params"]), lambda ps: _word_plan(
                torch, ps, words))
            header.extend(plan[0])
            for buf, chunks in plan[1]:
                for width, pieces in chunks:
                    into = buf[:width]
                    if len(pieces) == 1 and pieces[0].dtype == torch.int32:
                        # one run of a parameter: read where it is, squared into the buffer
                        s1 = pieces[0].sum(dtype=torch.int32)
                        squares = torch.mul(pieces[0], pieces[0], out=into)
                    else:
                        torch.cat(pieces, out=into)
                        s1 = into.sum(dtype=torch.int32)
                        squares = into.mul_(into)
                    sums.append((index, torch.stack([s1, squares.sum(dtype=torch.int32)])))
    totals = [[0, 0] for _ in optimizer.param_groups]
    if sums:
        devices: dict[Any, list[Any]] = {}
        for _, pair in sums:
            devices.setdefault(pair.device, []).append(pair)
        fetched = {d: iter(torch.stack(v).cpu().tolist()) for d, v in devices.items()}
        for index, pair in sums:
            s1, s2 = next(fetched[pair.device])
            totals[index][0] += s1
            totals[index][1] += s2
    packed = b"".join((t[0] & _MASK32).to_bytes(4, "little")
                      + (t[1] & _MASK32).to_bytes(4, "little") for t in totals)
    return blake3_hex([json.dumps(header).encode(), packed])


_PLANS = 64
"""Plans kept (per parameter group and kind): the latest ones, for a handful of optimizers."""


def _plan(kind: Any, params: list[Any], build: Any) -> Any:
    """``build(params)``, made once and kept while the same tensors keep the same storage.

    A plan holds views of the parameters (they follow in-place updates), so a step pays
    for a few ops per chunk, not for slicing and viewing every parameter again; a
    parameter whose storage was swapped (``p.data = …``) gets a new plan. A group with a
    non-contiguous parameter is planned at every call: its flat view is a copy, which a
    kept plan would read stale."""
    if not all(p.is_contiguous() for p in params):
        return build(params)
    cache = _state.setdefault("plans", {})
    key = (kind, tuple(id(p) for p in params))
    stamp = [p.data_ptr() for p in params]
    hit = cache.get(key)
    if hit is None or hit[0] != stamp or any(ref() is not p for ref, p in zip(hit[1], params,
                                                                             strict=True)):
        cache.pop(key, None)
        while len(cache) >= _PLANS:
            cache.pop(next(iter(cache)))
        hit = cache[key] = (stamp, [weakref.ref(p) for p in params], build(params))
    return hit[2]


def _chunked(pieces: list[Any], size: int) -> list[tuple[int, list[Any]]]:
    """``pieces`` (flat tensors) cut into runs of at most ``size`` elements."""
    out: list[tuple[int, list[Any]]] = []
    run: list[Any] = []
    filled = 0
    for piece in pieces:
        start = 0
        while start < piece.numel():
            take = min(int(piece.numel()) - start, size - filled)
            run.append(piece[start:start + take])
            start += take
            filled += take
            if filled == size:
                out.append((filled, run))
                run, filled = [], 0
    if run:
        out.append((filled, run))
    return out


def _word_plan(torch: Any, params: list[Any], words: int | None) -> Any:
    """(header, [(int32 buffer, [(width, word views)])] per device) of one group."""
    header = [f"{p.dtype}{list(p.shape)}" for p in params]
    by_device: dict[Any, list[Any]] = {}
    for p in params:
        view = _words(torch, p.detach())
        if view is not None:
            by_device.setdefault(view.device, []).append(view)
    buffers = _state.setdefault("word_buffers", {})
    devices = []
    for device, views in by_device.items():
        size = words or (WORDS if device.type == "cpu" else FUSED_WORDS)
        size = max(1, min(size, sum(int(v.numel()) for v in views)))
        buf = buffers.get(device)
        if buf is None or buf.numel() < size:
            buf = buffers[device] = torch.empty(size, dtype=torch.int32, device=device)
        devices.append((buf, _chunked(views, size)))
    return header, devices


def _words(torch: Any, t: Any) -> Any:
    """``t``'s bits as a flat tensor of words: int32 in place for 4- and 8-byte elements,
    int8/int16 (widened where summed) for 1- and 2-byte ones; None for an empty or sparse
    tensor. A non-contiguous parameter is copied first (rare: optimizers keep them dense)."""
    if t.numel() == 0 or t.is_sparse:
        return None
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.view(-1)
    width = flat.element_size()
    return flat.view(torch.uint8).view(getattr(torch, _WORD_VIEW.get(width, "int32")))


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
# parameter group, the group's L2 norm and a count sketch of its parameters
# (SKETCH values). A count sketch is linear, so the difference of two runs'
# sketches is the sketch of the difference of their parameters, and
# mean_m (v_m(a) - v_m(b))^2 estimates |a - b|^2: the numeric trail measures the
# parameter distance between two runs, step by step (``manifest.numeric.envelope``
# turns it into a verdict).
#
# The sketch: element e of the group (its parameters flattened in order) sits in
# hash block e // BLOCK at position j = e % BLOCK. It is multiplied by a seeded
# random sign s(j) (one table of BLOCK signs) and added to bucket j % SKETCH;
# each block's SKETCH bucket sums then go, with a seeded sign per block, to a
# seeded permutation of the SKETCH values. Values are scaled by sqrt(SKETCH), so
# E[mean_m v_m^2] = |x|^2 and the variance of that estimate is about 2/SKETCH of
# its square, as with SKETCH dense Gaussian projections. It reads each element
# once (a copy into a cached buffer, a sign multiply, a widening copy, a dot and a
# sum) where the dense projections it replaced did a float64 matmul against 4
# directions on fresh float64 copies: 13.5 ms → 1.9 ms per point on a 0.47 M-parameter
# GPT (same run, loaded box). Its estimate of the distance is also closer: on the
# calibration models, |estimate/exact - 1| has median 0.09 (90th percentile 0.18)
# against 0.38 (0.80) for the 4 dense directions (benchmarks/step_cost.py
# --sketch-error). No per-element randomness is stored
# beyond the BLOCK signs, and it never touches the script's generators: the trail
# changes no random state and is the same in every run of the same code.
# Sums run in float64: a sum computed in float32 would itself round by about 1e-7
# of the norm, more than the distance a thread count makes at step 1.
# Points of the dense sketch (4 values per group, manifests before this one) and
# of this one have different lengths, which ``step_distance`` refuses to compare.

SKETCH = 16

BLOCK = 1 << 16
"""Elements per hash block: the sign table's length (512 KiB of float64)."""

CHUNK = 1 << 18
"""Elements copied to float64 at a time on the CPU (a 2 MiB buffer, reused every step);
``FUSED_CHUNK`` off the CPU, where one launch per chunk is the cost, not memory."""
FUSED_CHUNK = 1 << 24

_TABLE = 4096
"""Blocks per seeded table of block permutations and signs (tables are never resized, so
a block's permutation does not depend on how many blocks the model has)."""


def _block_table(torch: Any, table: int) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(0x736B6574 + table)
    perm = torch.rand(_TABLE, SKETCH, generator=gen).argsort(1).argsort(1)  # inverse
    sign = torch.where(torch.rand(_TABLE, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    return perm, sign


def _tables(torch: Any, blocks: int, device: Any) -> tuple[Any, Any, Any]:
    """(element signs (BLOCK), inverse block permutations (blocks × SKETCH), block signs)."""
    cache = _state.setdefault("sketch_tables", {})
    hit = cache.get(device)
    if hit is None or hit[1].shape[0] < blocks:
        gen = torch.Generator().manual_seed(0x6D616E69)
        signs = torch.where(torch.rand(BLOCK, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
        parts = [_block_table(torch, t) for t in range(-(-max(blocks, 1) // _TABLE))]
        hit = cache[device] = (signs.to(device), torch.cat([p for p, _ in parts]).to(device),
                               torch.cat([s for _, s in parts]).to(device))
    signs, inverse, block_sign = hit
    return signs, inverse, block_sign


def _sketch_plan(torch: Any, params: list[Any], chunk: int | None) -> list[Any]:
    """Per device holding part of the group: its chunks (width, pieces that fill it exactly,
    zeros where another device's elements are or to round the last block up to SKETCH,
    whether they are staged in float32) and its blocks' tables. A chunk starts on a block;
    only the last one may end inside a block (a 4 k-parameter model is not padded to 64 k)."""
    flat = [p.detach().reshape(-1) for p in params
            if p.is_floating_point() and p.numel() and not p.is_sparse]
    blocks = -(-sum(int(p.numel()) for p in flat) // BLOCK)
    spans: dict[Any, list[tuple[int, Any]]] = {}  # device → (first element, flat parameter)
    offset = 0
    for p in flat:
        spans.setdefault(p.device, []).append((offset, p))
        offset += int(p.numel())
    plans = []
    for device, parts in spans.items():
        size = max(BLOCK, (chunk or (CHUNK if device.type == "cpu" else FUSED_CHUNK))
                   // BLOCK * BLOCK)
        first = parts[0][0] // BLOCK
        end = parts[-1][0] + int(parts[-1][1].numel())
        width = -(-(end - first * BLOCK) // SKETCH) * SKETCH
        pieces: list[Any] = []
        at = first * BLOCK
        for start, p in parts:
            if start > at:
                pieces.append(torch.zeros(start - at, device=device))
            pieces.append(p)
            at = start + int(p.numel())
        pieces.append(torch.zeros(first * BLOCK + width - at, device=device))
        chunks = []
        for n, run in _chunked(pieces, size):
            stage = all(x.dtype in (torch.float32, torch.bfloat16, torch.float16) for x in run)
            chunks.append((n, run, stage))
        signs, inverse, block_sign = _tables(torch, blocks, device)
        buffers = _state.setdefault("sketch_buffers", {})
        bufs = buffers.get(device)
        if bufs is None or bufs[0].numel() < min(size, width):
            bufs = buffers[device] = (torch.empty(min(size, width), dtype=torch.float64,
                                                  device=device),
                                      torch.empty(min(size, width), device=device))
        nb = -(-width // BLOCK)
        plans.append((bufs, chunks, signs, signs.to(torch.float32),
                      inverse[first:first + nb], block_sign[first:first + nb, None]))
    return plans


def _group_sketch(torch: Any, params: list[Any], chunk: int | None) -> list[Any]:
    """Per device: a tensor [|x|^2, v_1 … v_SKETCH] of this group's elements on it."""
    out = []
    for (wide, narrow), chunks, signs, signs32, inverse, block_sign in _plan(
            ("sketch", chunk), params, lambda ps: _sketch_plan(torch, ps, chunk)):
        squares: list[Any] = []
        sums: list[Any] = []
        for width, pieces, stage in chunks:
            view = wide[:width]
            full = width // BLOCK * BLOCK  # whole blocks; the rest is the last block's head
            # ±1 times a float32 is exact: signs in float32, then one widening copy
            signed, sign = (narrow[:width], signs32) if stage else (view, signs)
            if full == width and len(pieces) == 1 and pieces[0].dtype == signed.dtype:
                # one run of a parameter: signed where it is, no copy first
                torch.mul(pieces[0].view(-1, BLOCK), sign, out=signed.view(-1, BLOCK))
            elif full:
                torch.cat(pieces, out=signed)
                signed[:full].view(-1, BLOCK).mul_(sign)
            else:
                torch.cat(pieces, out=signed)
            if width > full:
                signed[full:].mul_(sign[:width - full])
            if stage:
                view.copy_(signed)
            squares.append(torch.dot(view, view))
            if full:
                sums.append(view[:full].view(-1, BLOCK // SKETCH, SKETCH).sum(1))
            if width > full:
                sums.append(view[full:].view(1, -1, SKETCH).sum(1))
        # value m takes, from each block b, bucket inverse[b, m] times the block's sign
        values = (torch.cat(sums).gather(1, inverse) * block_sign).sum(0)
        out.append(torch.cat([torch.stack(squares).sum().reshape(1), values]))
    return out


@_timed
def numeric_point(groups: list[list[Any]], loss: Any, *,
                  chunk: int | None = None) -> dict[str, Any] | None:
    """``{"loss", "loss_eps", "groups": [[norm, v_1, …, v_SKETCH], …]}`` of ``groups``.

    ``loss_eps`` is the machine epsilon of the loss's dtype: a loss is a rounded number,
    and two runs a rounding apart may differ in it by that much, relatively. ``chunk``:
    elements copied to float64 at a time (the values do not depend on it beyond float64
    rounding); one transfer per device per step brings every group's numbers back."""
    torch = sys.modules["torch"]
    with torch.no_grad():
        per_group = [_group_sketch(torch, params, chunk) for params in groups]
        by_device: dict[Any, list[Any]] = {}
        for rows in per_group:
            for row in rows:
                by_device.setdefault(row.device, []).append(row)
        fetched = {d: iter(torch.stack(r).cpu().tolist()) for d, r in by_device.items()}
        values: list[list[float]] = []
        for rows in per_group:
            total = [0.0] * (SKETCH + 1)
            for row in rows:
                total = [a + b for a, b in zip(total, next(fetched[row.device]), strict=True)]
            values.append(total)
        lost = eps = None
        if loss is not None:
            lost = float(loss.detach().reshape(-1)[0])  # exact: any float fits a double
            eps = float(torch.finfo(loss.dtype).eps) if loss.is_floating_point() else None
    scale = math.sqrt(SKETCH)
    groups_out = [[math.sqrt(v[0]), *(x * scale for x in v[1:])] for v in values]
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
