"""Findings: where two op streams of the same rank part, with the numbers when kept.

Used by ``explain`` (two fresh runs, or a run against a recorded stream) and
by ``verify`` (a re-run against the stream stored at capture with
``--fingerprint-ops``); it imports no verb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from manifest.ops.align import NUMBERS, Divergence, first_divergence
from manifest.ops.stream import Op, OpStream


@dataclass(frozen=True)
class Finding:
    """Where the two streams of one rank part."""

    rank: int
    step: int
    kind: str
    """``op-differs``, ``input-from-outside``, ``paths-differ``, ``missing``."""
    compared: str
    op: str
    module: str
    module_type: str
    where: str
    device: str
    tensor: str
    """dtype[shape] of the differing output (or input)."""
    listed_nondeterministic: bool
    elements: int | None = None
    total: int | None = None
    max_abs: float | None = None
    max_ulp: int | None = None
    other: str | None = None
    """For ``paths-differ``/``missing``: the op the other run ran there."""


def _numbers(stream_a: OpStream, stream_b: OpStream | None, div: Divergence) -> dict[str, Any]:
    """Elements differing, max |Δ| and max ULP of the differing tensor, if values were kept."""
    if stream_b is None or div.a is None or div.b is None or div.position is None:
        return {}
    side = "o" if div.kind == "op-differs" else "i"
    ta = stream_a.tensor(f"{side}.{div.a.row}.{div.position}")
    tb = stream_b.tensor(f"{side}.{div.b.row}.{div.position}")
    if ta is None or tb is None or ta.dtype != tb.dtype or ta.shape != tb.shape:
        return {}
    from manifest.weights.compare import numeric_delta

    delta = numeric_delta(ta, tb)
    return {"elements": delta.elements, "total": delta.total, "max_abs": delta.max_abs,
            "max_ulp": delta.max_ulp}


def _finding(rank: int, step: int, div: Divergence, compared: str, a: OpStream,
             b: OpStream | None) -> Finding:
    op: Op | None = div.a or div.b
    assert op is not None
    if div.kind == "op-differs" and div.position is not None and div.position < len(op.meta):
        tensor = op.meta[div.position]
    elif div.kind == "op-differs":
        tensor = ", ".join(op.meta)
    elif div.position is not None and div.position < len(op.inputs) and op.inputs[
            div.position].startswith(NUMBERS):
        tensor = "a number argument (a Python or numpy scalar, not a tensor)"
    else:
        tensor = "input " + ("" if div.position is None else f"#{div.position}")
    other = None
    if div.kind in ("paths-differ", "missing"):
        other_op = div.b if op is div.a else div.a
        other = other_op.short_name if other_op else None
    return Finding(
        rank=rank, step=step, kind=div.kind, compared=compared, op=op.short_name,
        module=op.module, module_type=op.module_type, where=op.where, device=op.device,
        tensor=tensor.strip(), listed_nondeterministic=listed_nondeterministic(op.name, op.device),
        other=other, **_numbers(a, b, div))


def compare_streams(a: dict[int, OpStream], b: dict[int, OpStream], step: int,
                    compared: str, *, values: bool = True,
                    since: int | None = None) -> list[Finding]:
    """Per rank, the first op where the streams of ``step`` (or of steps ``since`` to
    ``step``, aligned as one sequence) part; each finding carries its op's own step.

    A window that starts before ``step`` sees the ops that made the values ``step``
    reads: a gradient made by the backward pass before another optimizer's step, a
    buffer updated in the previous step. With ``step`` alone, such a value would look
    as if it came from outside torch.
    """
    found: list[Finding] = []
    for rank in sorted(set(a) & set(b)):
        div = first_divergence(a[rank].step(step, since), b[rank].step(step, since))
        if div is not None:
            op = div.a or div.b
            at = op.step if op is not None and op.step else step
            found.append(_finding(rank, at, div, compared, a[rank], b[rank] if values else None))
    return found


_TABLE: Any = None


def listed_nondeterministic(op: str, device: str) -> bool:
    """Whether torch documents ``op`` as nondeterministic on ``device`` with the switch off.

    The table is the lab's (``manifest.ops.catalogue``: the installed torch's
    own list in ``use_deterministic_algorithms``' docstring, a maintained
    fallback otherwise); every entry there is a CUDA condition, so on CPU
    nothing is listed (torch 2.13 raises for none of them on CPU).
    """
    global _TABLE
    if not device.startswith("cuda"):
        return False
    from manifest.ops.catalogue import base_name, load_table

    if _TABLE is None:
        _TABLE = load_table()
    return bool(_TABLE.rules.get(base_name(op)))


def first_op_difference(recorded: dict[int, OpStream], new: dict[int, OpStream]) -> Finding | None:
    """The earliest (step, rank) op where a re-run's stream parts from the recorded one."""
    ranks = sorted(set(recorded) & set(new))
    if not ranks:
        return None
    lo = min(recorded[r].steps[0] for r in ranks)
    hi = max(recorded[r].steps[1] for r in ranks)
    for step in range(lo, hi + 1):
        found = compare_streams({r: recorded[r] for r in ranks}, {r: new[r] for r in ranks},
                                step, "recorded op stream vs re-run", values=False)
        if found:
            return found[0]
    return None
