"""The recorded run's emulated twin: what a TF32 or bf16 re-run is judged against.

Why. Measured from the float32 run, every run under a precision's emulation carries the
same rounding offset (TF32 keeps 10 mantissa bits of a matmul's inputs, bf16 7), and the
offset dominates: one-ULP emulated runs and an honest emulated re-run all sit near it, so
the margins were thin (Transformer, bf16, 20 steps: 3 of 6 honest re-runs at 1.01× the
bound, and a bias planted at step 5 ``equivalent`` in 3 of 12 cells). The twin is the
recorded recipe run once more under the same emulation, unperturbed
(``capture --envelope N --precision P``); the envelope's one-ULP emulated runs are
measured against it, and ``verify --emulate P`` judges the re-run's trail against it.
The shared offset cancels (``benchmarks/precision.py``, three families × two precisions,
8 envelopes each): 0 of 1,260 honest re-runs ``differs`` (closest 0.98 of the bound), 0
of 168 planted changes ``equivalent`` when the re-run is the twin's number for number up
to the change, as ``verify --emulate``'s is. Not solved: a re-run already apart from the
twin (a device's, from its first rounding flip) sees a change only above the bound where
it happens, and 32 of 168 small planted changes (a bias or a swapped batch at step 5)
were ``equivalent`` that way.

It stands in for the device only where the device rounds as the emulation does: a GPU
run must show that (docs/guides/devices.md).

The outputs. The recorded files are float32's; the re-run's are emulated. A re-run r
inside the bound b of the twin T (relative to |T|) lies, by the triangle inequality,
within |r − R| / |R| ≤ b · |T| / |R| + |T − R| / |R| ≤ b · (1 + o) + o of the recorded
run R, with o = |T − R| / |R|. o is measured exactly at capture, file by file, tensor by
tensor (``Envelope.twin_outputs``, ``file_distance``), not from the trail's 16-value
sketch, whose estimate of a distance is off by about 18% (one standard deviation):
enough to put an honest output outside when o is 100× b.

A carried twin is the author's numbers, held as the envelope is (``check_twin``), and
more (a reviewer's repros): o itself is held to the trails, since o = 1e6 or
o + 1.05 d let an output edited by d through. o may be at most ``OFFSET_OVER_SKETCH`` = 2×
the twin's last-step distance from the recorded trail (the sketch's, off by ~18% sd: 2× is
over 5 sd) plus float32's first-step move (4 eps = 4.8e-7: the file is float32); measured
on the bundled CNN in TF32, o = 7.9e-5 against a sketch distance of 8.1e-5 (0.98×). And the
recorded trail is judged against the twin at every step (``trail_apart``), with the
envelope's bound scaled by the twin's start: the same CNN's trail stayed 7.3e-5–8.2e-5 from
its twin while the scaled bound grew from 7.3e-5 to 4.4e-2 (531× the envelope's), so a
trail planted from step 6 on (5e-2 from the twin) is refused, an honest one is not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Envelope, NumericPoint

if TYPE_CHECKING:
    from manifest.numeric.calibration import Calibration
    from manifest.weights.raw import RawTensor

OFFSET_OVER_SKETCH = 2.0
"""How far the twin's exact output offset o may exceed its last-step sketch distance from
the recorded trail (module docstring)."""

TWIN_LABEL = "twin (unperturbed)"
"""How ``measure`` names the twin run in its list of runs left out."""


def floats(tensor: RawTensor) -> Any:
    """The tensor's values as float64 (None: not a floating dtype numpy can read)."""
    import numpy as np

    if tensor.dtype == "bfloat16":
        raw = np.frombuffer(tensor.data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).astype(np.float64)
    kind = {"float64": "<f8", "float32": "<f4", "float16": "<f2"}.get(tensor.dtype)
    return None if kind is None else np.frombuffer(tensor.data, dtype=kind).astype(np.float64)


@dataclass
class Distance:
    """|Δ| / |θ| over every floating tensor, and the tensor with the largest share."""

    distance: float
    worst: str | None
    worst_share: float | None


def tensor_distance(old: dict[str, RawTensor], new: dict[str, RawTensor]) -> Distance | str:
    """Relative L2 of ``new`` from ``old`` over the floating tensors (integer tensors must
    be equal); a sentence when they cannot be compared."""
    if set(new) != set(old):
        return "the re-run's file holds other tensors"
    squared: dict[str, float] = {}
    norm = 0.0
    for name in sorted(old):
        a, b = old[name], new[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name}: dtype or shape differs"
        fa, fb = floats(a), floats(b)
        if fa is None or fb is None:
            if bytes(a.data) != bytes(b.data):
                return f"{name} ({a.dtype}) differs, and it is not a rounded number"
            continue
        norm += float((fa * fa).sum())
        squared[name] = float(((fa - fb) ** 2).sum())
    if not math.isfinite(norm) or not all(math.isfinite(v) for v in squared.values()):
        return "a tensor holds NaN or inf"
    scale = math.sqrt(norm)
    total = math.sqrt(sum(squared.values()))
    out = Distance(total / scale if scale else (0.0 if total == 0 else math.inf), None, None)
    if squared:
        out.worst = max(squared, key=lambda n: squared[n])
        share = math.sqrt(squared[out.worst])
        out.worst_share = share / scale if scale else (0.0 if share == 0 else math.inf)
    return out


def file_distance(recorded: Path, new: Path) -> float | None:
    """Relative L2 of the weight file ``new`` from ``recorded``; None when either is not a
    readable weight file or their tensors cannot be compared."""
    from manifest.errors import MalformedArtifactError
    from manifest.weights.bounds import WeightFileError
    from manifest.weights.tables import open_tensors

    opened: list[Any] = []
    try:
        for path in (recorded, new):
            table = open_tensors(path)
            if table is None:
                return None
            opened.append(table)
        got = tensor_distance(opened[0][1], opened[1][1])
    except (OSError, ValueError, WeightFileError, MalformedArtifactError):
        return None
    finally:
        for table in opened:
            table[1].clear()
            table[0].close()
    return got.distance if isinstance(got, Distance) and math.isfinite(got.distance) else None


def output_bound(bound: float, offset: float) -> float:
    """The bound on a re-run's output from the recorded one, given ``bound`` from the twin
    and the twin's measured ``offset`` from the recorded output (module docstring)."""
    return bound * (1 + offset) + offset


def check_twin(envelope: Envelope, recorded: Sequence[NumericPoint]) -> list[str]:
    """What makes ``envelope``'s twin unusable, one sentence each (empty: usable). The
    twin must be finite, hold the recorded trail's steps with its parameter groups, cover
    the envelope's steps, and start as far from the recorded run as the precision's
    rounding can put it (``calibration.plausible_first_step``); its output offsets must be
    finite, not negative, and within ``offset_limit`` of its last-step distance from
    the recorded trail; and the envelope's one-ULP runs must not split into runs that
    left it and runs that never did (``unparted``)."""
    from manifest.numeric.calibration import plausible_first_step
    from manifest.numeric.envelope import step_distance

    twin = envelope.twin or []
    if not twin:
        return ["the twin has no steps"]
    for point in twin:
        numbers = [point.loss or 0.0, *(x for g in point.groups for x in g)]
        if not all(math.isfinite(x) for x in numbers):
            return [f"the twin's step {point.step} holds a number that is not finite"]
    steps = [p.step for p in twin]
    if steps != [p.step for p in recorded]:
        return ["the twin's steps are not the recorded trail's"]
    if not {s.step for s in envelope.steps} <= set(steps):
        return ["the envelope has steps the twin does not"]
    try:
        apart = [step_distance(point, mine) for point, mine in zip(recorded, twin, strict=True)]
    except OverflowError:
        return ["the twin holds numbers too large to measure its distance from the recorded "
                "trail (a float overflowed)"]
    for point, got in zip(recorded, apart, strict=True):
        if got is None:
            return [f"the twin's step {point.step} holds other parameter groups than the "
                    "recorded trail's"]
    first, last = apart[0], apart[-1]
    assert first is not None and last is not None
    limit = plausible_first_step(envelope)
    if max(first[1], default=0.0) > limit:
        return [f"the twin starts {max(first[1]):.3g} from the recorded run at its first "
                f"step: no {envelope.precision} rounding moves the parameters further than "
                f"{limit:.3g}"]
    offsets = envelope.twin_outputs or {}
    bad = next((p for p, v in offsets.items() if not math.isfinite(v) or v < 0), None)
    if bad is not None:
        return [f"the twin's distance from the output {bad} is {offsets[bad]!r} (distances "
                "are finite and not negative)"]
    cap = offset_limit(max(last[1], default=0.0))
    far = next((p for p, v in offsets.items() if v > cap), None)
    if far is not None:
        return [f"the twin's distance from the output {far} is {offsets[far]:.3g}, more than "
                f"its trail's last step allows ({cap:.3g}: {OFFSET_OVER_SKETCH:g}× its "
                f"{max(last[1], default=0.0):.3g} from the recorded trail, plus float32's "
                "rounding)"]
    stuck = unparted(envelope)
    if stuck:
        found = {w for w in parting(envelope).values() if w is not None}
        when = [f"step {w}" for w in sorted(found)]
        return [f"{len(stuck)} of the envelope's one-ULP runs never left the twin while the "
                f"others did (they left at {', '.join(when)}): the precision's rounding "
                "swallowed their perturbation, and a bound fitted across both is too wide "
                "to judge by"]
    return []


def offset_limit(sketch: float) -> float:
    """The largest output offset o a twin ``sketch`` from the recorded trail's last point
    (the largest group's distance) may carry: ``OFFSET_OVER_SKETCH`` × sketch plus
    float32's first-step move (module docstring)."""
    from manifest.numeric.calibration import EPS, GROWTH_AT_FIRST_STEP

    return OFFSET_OVER_SKETCH * sketch + GROWTH_AT_FIRST_STEP * EPS["float32"]


@dataclass
class TrailApart:
    """The recorded trail held to the twin at every step of the bound (``trail_apart``)."""

    scale: float
    """The twin's first-step distance over the bound's first step (at least 1)."""
    ratio: float
    """The largest distance over the scaled bound at a step after the first."""
    step: int | None
    problem: str | None = None


def _apart(a: NumericPoint, b: NumericPoint) -> list[float]:
    """Per group: the sketch distance or the norms' relative difference, the larger (a
    sketch alone cannot see a norm written ×1e300)."""
    from manifest.numeric.envelope import step_distance

    got = step_distance(a, b)
    if got is None:
        raise ValueError("other parameter groups")
    return [max(d, abs(ga[0] - gb[0]) / abs(ga[0]) if ga[0] else (0.0 if gb[0] == 0 else
                                                                  math.inf))
            for d, ga, gb in zip(got[1], a.groups, b.groups, strict=True)]


def trail_apart(recorded: Sequence[NumericPoint], twin: Sequence[NumericPoint],
                calibration: Calibration) -> TrailApart:
    """The recorded trail against the twin at every step of the bound, with the bound
    scaled by the starting-size ratio (the twin's first-step distance from the recorded
    run over the bound's first step): divergence grows from its starting size by the
    run's own dynamics, so an honest float32 trail stays inside. Outside at
    any step (or not measurable): ``problem`` names it, and the twin decides nothing."""
    bounds = {b.step: b.groups for b in calibration.bounds}
    points = {p.step: p for p in recorded}
    mine = {p.step: p for p in twin}
    steps = [s for s in sorted(bounds) if s in points and s in mine]
    if not steps:
        return TrailApart(1.0, math.inf, None, "the bound has no step of the recorded trail")
    try:
        apart = {s: _apart(points[s], mine[s]) for s in steps}
    except (OverflowError, ValueError):
        return TrailApart(1.0, math.inf, None, "the twin's distance from the recorded trail "
                          "cannot be measured (a float overflowed, or other parameter groups)")
    if any(len(apart[s]) != len(bounds[s]) for s in steps):
        return TrailApart(1.0, math.inf, None, "the envelope's parameter groups are not the "
                          "recorded trail's")
    scale = 1.0
    for d, b in zip(apart[steps[0]], bounds[steps[0]], strict=True):
        scale = max(scale, d / b if b > 0 else (1.0 if d == 0 else math.inf))
    worst = TrailApart(scale, 0.0, None)
    for s in steps[1:]:
        for g, (d, b) in enumerate(zip(apart[s], bounds[s], strict=True)):
            edge = scale * b
            ratio = d / edge if edge > 0 else (0.0 if d == 0 else math.inf)
            if ratio > worst.ratio or math.isnan(ratio):
                worst.ratio, worst.step = ratio, s
                if not ratio <= 1:
                    worst.problem = (
                        f"the recorded trail is {d:.3g} from the twin at step {s} (group {g}), "
                        f"{ratio:.3g}× the envelope's bound there scaled by the twin's "
                        f"start ({scale:.3g}×): the twin is not this trail's")
                    return worst
    if not math.isfinite(scale):
        worst.problem = ("the twin starts apart from the recorded trail where the envelope's "
                         "runs did not move at all: its start cannot scale the bound")
    return worst


def parting(envelope: Envelope) -> dict[str, int | None]:
    """Each one-ULP run's parting step: the first at which it is further from the twin
    than one ULP and one update give (``GROWTH_AT_FIRST_STEP`` × its own first-step
    distance); None: it never parted."""
    from manifest.numeric.calibration import GROWTH_AT_FIRST_STEP, ULP_LABEL

    out: dict[str, int | None] = {}
    if not envelope.steps:
        return out
    for r, label in enumerate(envelope.runs):
        if not label.startswith(ULP_LABEL):
            continue
        start = max((g[r] for g in envelope.steps[0].groups if r < len(g)), default=0.0)
        out[label] = next((s.step for s in envelope.steps if any(
            r < len(g) and g[r] > GROWTH_AT_FIRST_STEP * start for g in s.groups)), None)
    return out


def unparted(envelope: Envelope) -> list[str]:
    """The one-ULP runs that never left the twin while others did (empty: no such split).

    Under TF32 or bf16 emulation a one-ULP move of the weights is often rounded away
    whole: no input of any matmul changes, and the run stays one ULP from the twin until
    some later update moves a weight across a rounding edge, or for good. Runs that part
    at different steps the calibration absorbs into a wider bound (measured on the
    bundled example's CNN, TF32, 4 runs parting at steps 2, 4, 4 and 2: ×1,250 over the
    runs' mean curve, 0.023 at step 12 against run distances of 2e-5). Runs that never
    part it cannot: bf16, 3 of 4 runs stayed at 1e-7 while one reached 1.5e-3, and the
    bound at step 12 was 4e8 (relative), calling any change after step 4 ``equivalent``.
    Such an envelope decides nothing (``check_twin``)."""
    steps = parting(envelope)
    if all(w is None for w in steps.values()):
        return []
    return [label for label, w in steps.items() if w is None]
