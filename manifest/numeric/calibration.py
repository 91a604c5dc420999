"""The bound ``equivalent`` is judged against: a model of rounding noise with a stated rate.

An envelope holds each rounding-only run's distance from the base run, step by step
(``envelope.measure_envelope``). The old bound, the running maximum of ~4 runs times
their first-step spread, is exceeded by one more draw of the same noise about 1 time in
5 (order statistics: 1 in runs + 1). Measured on the bundled example: 3 false
``differs`` in 6 thread-count re-runs, each 1.03–1.05× that bound.

The model (``calibrate``). Per quantity k (the loss, each parameter group) and step t,
work in log distance: L_r,k(t) = log max(d_r,k(s), floor) over s ≤ t, each run's running
maximum (rounding grows by chaos; a quiet step is luck). The runs whose state was moved
one ULP before the first update, each with its own seed, are exchangeable draws of one
noise: their mean curve m_k(t) is the common growth curve. Each run r's excess z_r is its
worst log distance above the other runs' mean curve, over every step and quantity
(leave-one-out, so z_r is distributed as a new run's excess over a curve it did not
shape). A re-run falls outside ``m_k(t) + q`` exactly when its own excess passes q, so

    q = mean(z) + t_{n-1}(1 - α) · sd(z) · sqrt(1 + 1/n)

(a Student-t prediction bound, n one-ULP runs) makes a rounding-only re-run fall outside
with probability α (``ALPHA`` = 1%; half of it spent on the parameter groups, half on
the loss). The parameters' margin is fitted per step on the excess up to that step and
held as a running maximum, so a discrete event that parts the runs late (the CNN's
max-pool, below) widens the bound from there on, not at step 1: one margin for the whole
run let 1 such run in 4 open step 1's bound by e^10 (123 of 280 planted changes
``equivalent`` in a replay of 40 envelopes). With fewer than ``MODEL_RUNS`` one-ULP runs
the bound is the runs' running maximum, exceeded 1 time in runs + 1. The first step's
bound never exceeds what rounding can produce there (``plausible_first_step``). The
bound never lies below any envelope run's own running maximum, nor the loss below its
rounding (``GROWTH_AT_FIRST_STEP × loss_eps``). Distances of exactly zero are floored at
``FLOOR`` (the float64 sums' resolution) so that nothing is log(0).

Measured with benchmarks/calibration.py (three model families × 10, 40, 200 steps; see
docs/concepts/equivalent.md for the counts): excesses z of 24 one-ULP runs per model had
sd 0.27 nats (Transformer, GRU, 40 steps) to 0.64 (the CNN, bimodal: 20 seeds of 24 jump
to one other state near step 15, 8e-3 from the base run at step 40, while the other 4
stay near 1e-6). ``DEFAULT_RUNS`` trades the margin t·sd·sqrt(1 + 1/n) at 99.5% (2 runs:
78 sd; 3: 11.5; 4: 6.5; 6: 4.4; 8: 3.7) against the cost of runs. Replayed on stored
runs (15 random envelopes of 6 seeds from 24, every other seed and thread count judged):
0 false ``differs`` in 345 per model and length (9 cells), 0 false ``equivalent``; at 4
seeds one envelope in 40 let a planted change through, at 6 none did.

Hostile envelopes (``check_envelope``): an envelope carried in a manifest is written by
the run's author. NaN, inf, negative, empty or mismatched lists, steps out of order, and
a first-step distance above what rounding can produce are refused, one sentence each.
That plausibility bound (``plausible_first_step``): one ULP moves each element by at most
eps·|x|, so the state by at most eps relative; one update of a stable step (lr·λ_max < 2)
adds at most 2× that through the gradient, and the update's own rounding one eps more:
4·eps of the precision (float32: 4.8e-7). Measured at step 1 on the calibration models
(24 seeds, the trail's 16-value sketch): one-ULP runs 0.44-0.98 eps, thread counts 2-4 at
most 0.14 eps; a learning rate ×1.001 gives 22 (Transformer), 37 (GRU), 870 eps (CNN).
``narrow`` lets a carried envelope only lower the verifier's own bound.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from manifest.models import Envelope, NumericPoint
from manifest.numeric.defaults import ALPHA as ALPHA  # callers name it here
from manifest.numeric.defaults import DEFAULT_RUNS as DEFAULT_RUNS  # callers name it here

FLOOR = 2.0 ** -50
"""Relative distances below this are zero: the trail's float64 sums resolve no finer."""

ULP_LABEL = "1 ULP"
"""How ``measure`` names a run whose state was moved one ULP (``1 ULP (seed N)``)."""

EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "tf32": 2.0 ** -10,
       "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7,
       "fp32": 2.0 ** -23, "bf16": 2.0 ** -7}  # Envelope.precision's names (numeric.precision)
"""Machine epsilon per precision: what one ULP moves a number by, relative, at most."""

MODEL_RUNS = 3
"""Fewest one-ULP runs the model is fitted on. With two, the 1% t margin is 39 standard
deviations of one difference: a bound that sees nothing; below this the bound is the
runs' running maximum, and the report says it is exceeded 1 time in runs + 1."""

SHARE_PARAMS = 0.5
"""The share of ``ALPHA`` spent on the parameter groups; the rest on the loss (two tests,
so their rates add)."""

GROWTH_AT_FIRST_STEP = 4
"""eps (the one-ULP move) + 2·eps (a stable step's gradient, lr·λ_max < 2) + eps (the
update's rounding): see the module docstring."""


@dataclass(frozen=True)
class Bound:
    step: int
    loss: float
    groups: list[float]


@dataclass
class Calibration:
    """The bound at every step, and how often a rounding-only re-run falls outside it."""

    bounds: list[Bound]
    loss_ceiling: float
    """The loss bound once the runs have parted (see ``envelope.judge``)."""
    one_in: float
    """A rounding-only re-run falls outside this bound about 1 time in ``one_in``."""
    margin: float
    """The factor over the one-ULP runs' mean curve (exp q); 1 without a model."""
    runs: list[str] = field(default_factory=list)
    source: str = "the run's envelope"
    notes: list[str] = field(default_factory=list)
    """What was ignored or refused, one sentence each."""


def precision_eps(envelope: Envelope) -> float:
    """The eps of the precision the envelope covers (float32 unless it says otherwise)."""
    name = getattr(envelope, "precision", None)
    return EPS.get(str(name), EPS["float32"]) if name else EPS["float32"]


def plausible_first_step(envelope: Envelope) -> float:
    return GROWTH_AT_FIRST_STEP * precision_eps(envelope)


def check_envelope(envelope: Envelope) -> list[str]:
    """What makes ``envelope`` unusable as a bound, one sentence each (empty: usable)."""
    problems = _shape_problems(envelope)
    if problems:
        return problems
    first = envelope.steps[0]
    worst = max((x for xs in first.groups for x in xs), default=0.0)
    limit = plausible_first_step(envelope)
    if worst > limit:
        problems.append(f"the envelope's first-step distance {worst:.3g} is not rounding: one "
                        f"ULP and one update move the parameters by at most {limit:.3g}")
    return problems


def _shape_problems(envelope: Envelope) -> list[str]:
    """NaN, inf, negative, empty or mismatched lists, steps out of order."""
    problems: list[str] = []
    n = len(envelope.runs)
    if n == 0 or not envelope.steps:
        return ["the envelope has no runs or no steps"]
    widths = {len(s.groups) for s in envelope.steps}
    if widths == {0}:
        problems.append("the envelope has no parameter groups")
    elif len(widths) > 1:
        problems.append(f"the envelope's steps have different numbers of parameter groups "
                        f"({', '.join(str(w) for w in sorted(widths))})")
    steps = [s.step for s in envelope.steps]
    if any(b <= a for a, b in itertools.pairwise(steps)):
        problems.append("the envelope's steps are out of order or repeated")
    for s in envelope.steps:
        lists = [s.loss, *s.groups]
        if any(len(x) != n for x in lists):
            problems.append(f"step {s.step} of the envelope does not hold one distance per "
                            f"run ({n} runs)")
            break
        bad = next((x for xs in lists for x in xs if not math.isfinite(x) or x < 0), None)
        if bad is not None:
            problems.append(f"step {s.step} of the envelope holds a distance of {bad!r} "
                            "(distances are finite and not negative)")
            break
    return problems


def _t_cdf(x: float, df: int) -> float:
    """Student-t distribution function (regularized incomplete beta, continued fraction)."""
    if x == 0:
        return 0.5
    w = df / (df + x * x)
    tail = 0.5 * _betainc(df / 2, 0.5, w)
    return 1 - tail if x > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    # Lentz's continued fraction (Numerical Recipes, betacf)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return front * h / a


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (bisection)."""
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# One row per step: [loss, group 0, group 1, …] in log distance.
_Rows = list[list[float]]


def _log_rows(envelope: Envelope, run: int, loss_eps: float) -> _Rows:
    return [[math.log(max(s.loss[run], loss_eps, FLOOR))]
            + [math.log(max(g[run], FLOOR)) for g in s.groups] for s in envelope.steps]


def _references(rows: _Rows) -> _Rows:
    """What each log distance is held to: the running maximum for parameter groups; for
    the loss, the running maximum one step ahead (``envelope.judge``)."""
    out: _Rows = []
    best: list[float] = []
    for row in rows:
        best = row[:] if not best else [max(b, x) for b, x in zip(best, row, strict=True)]
        out.append(best)
    for i in range(len(out)):
        out[i] = [out[min(i + 1, len(out) - 1)][0], *out[i][1:]]
    return out


def _mean_curve(refs: Sequence[_Rows]) -> _Rows:
    n = len(refs)
    return [[sum(r[i][k] for r in refs) / n for k in range(len(refs[0][i]))]
            for i in range(len(refs[0]))]


def _excesses(rows: _Rows, curve: _Rows, ceiling: float) -> tuple[list[float], float]:
    """A run's worst log distance above ``curve``: of the parameter groups up to each step,
    and of the loss over the whole run, against the ceiling.

    The loss at the first step is left out: a one-ULP run's is the base run's (the
    perturbation enters after step 1's forward), so its excess there is 0 in every run,
    and a statistic clipped at 0 understates the spread (measured: 2.1% false ``differs``
    on the GRU with it, from a 1% model)."""
    worst = -math.inf
    params = []
    for row, ref in zip(rows, curve, strict=True):
        worst = max(worst, *(x - r for x, r in zip(row[1:], ref[1:], strict=True)))
        params.append(worst)
    return params, max(row[0] for row in rows) - ceiling


def _prediction(zs: Sequence[float], alpha: float) -> float:
    """The (1 - alpha) Student-t prediction bound of one more draw like ``zs``."""
    n = len(zs)
    return (statistics.fmean(zs) + t_quantile(1 - alpha, n - 1) * statistics.stdev(zs)
            * math.sqrt(1 + 1 / n))


def calibrate(envelope: Envelope, loss_eps: float = 0.0, alpha: float = ALPHA) -> Calibration:
    """The bound of ``envelope`` at every step (see the module docstring). The envelope is
    assumed checked (``check_envelope``); one whose lists do not fit together, or hold
    NaN, inf or negatives, has no bound (no steps; ``notes`` says why)."""
    broken = _shape_problems(envelope)
    if not envelope.steps or broken:
        return Calibration([], 0.0, 1.0, 1.0, list(envelope.runs), notes=broken)
    n_all = len(envelope.runs)
    # The loss is a rounded reduction: rounding-only runs differ in it by whole units of
    # its last place, 0-2 of them in one step (measured: 1.5e-7 = 1.3 eps on the
    # Transformer at step 9 while every other run of 24 showed at most 1 unit), which a
    # model fitted on a handful of floored values cannot foresee. Its floor is what one
    # update's rounding gives the parameters at the first step (GROWTH_AT_FIRST_STEP
    # units); a real change to the loss or the batch moves it by 1e-3 or more.
    loss_eps = GROWTH_AT_FIRST_STEP * loss_eps
    rows = [_log_rows(envelope, r, loss_eps) for r in range(n_all)]
    refs = [_references(x) for x in rows]
    model = [r for r, label in enumerate(envelope.runs) if label.startswith(ULP_LABEL)]
    width = len(rows[0][0])
    steps = len(rows[0])
    if len(model) >= MODEL_RUNS:
        params, losses = [], []
        for r in model:
            others = [refs[o] for o in model if o != r]
            p, loss = _excesses(rows[r], _mean_curve(others),
                                statistics.fmean(o[-1][0] for o in others))
            params.append(p)
            losses.append(loss)
        margins = []
        top = 0.0
        for i in range(steps):
            top = max(top, _prediction([z[i] for z in params], alpha * SHARE_PARAMS))
            margins.append(top)
        loss_margin = max(0.0, _prediction(losses, alpha * (1 - SHARE_PARAMS)))
        curve = _mean_curve([refs[r] for r in model])
        ceiling = statistics.fmean(refs[r][-1][0] for r in model) + loss_margin
        one_in = 1 / alpha
    else:
        margins = [0.0] * steps
        loss_margin = 0.0
        curve = [[-math.inf] * width for _ in rows[0]]
        ceiling = -math.inf
        one_in = n_all + 1.0
    out: list[Bound] = []
    # What the runs showed is compared as measured, never through exp(log(x)), which
    # may round below x: a re-run exactly as far as an envelope run is inside.
    seen = _running_max(envelope)
    for i, step in enumerate(envelope.steps):
        edge = [max(math.exp(c + m), s) for c, m, s in
                zip(curve[i], [loss_margin] + [margins[i]] * (width - 1), seen[i], strict=True)]
        if i == 0:
            # No rounding-only run is further than this at its first step (the module
            # docstring): a wider fitted bound would only admit real changes there.
            cap = plausible_first_step(envelope)
            edge[1:] = [min(e, max(cap, s)) for e, s in zip(edge[1:], seen[i][1:], strict=True)]
        out.append(Bound(step.step, max(edge[0], loss_eps), edge[1:]))
    top_loss = max(math.exp(ceiling), max(s[0] for s in seen))
    return Calibration(out, max(top_loss, loss_eps), one_in, math.exp(margins[-1]),
                       list(envelope.runs))


def loss_rounding(trail: Sequence[NumericPoint]) -> float:
    """The loss's rounding unit a trail recorded (the largest ``loss_eps`` of its points; 0
    when none did): what the verdict floors the loss bound at."""
    return max((p.loss_eps for p in trail if p.loss_eps), default=0.0)


def verdict_calibration(envelope: Envelope,
                        trail: Sequence[NumericPoint] | None = None) -> Calibration:
    """The bound a verdict judges against, for every caller that prints or uses one: the
    envelope calibrated with the loss's rounding unit of ``trail`` (the recorded run's
    numeric trail, what ``envelope.judge`` takes it from), or, with no trail at hand (lab's
    report), the one the envelope carries from its base run (``Envelope.loss_eps``).

    Without that unit the loss bound is a model fitted on distances floored at 2^-50: the
    one-ULP runs' loss distances jump between 0 and a few units of the loss's last place,
    so their log excesses spread over 30 nats and the 1% margin reaches e^160 (measured:
    ``show`` printed 5.7e+69 for a bound the verdict held at 4.8e-07)."""
    if trail is not None:  # never the envelope's own number when a trail is at hand
        return calibrate(envelope, loss_rounding(trail))
    eps = envelope.loss_eps
    return calibrate(envelope, eps if eps is not None and math.isfinite(eps) and eps > 0 else 0.0)


def _running_max(envelope: Envelope) -> list[list[float]]:
    """Per step, [loss one step ahead, group 0, …]: the largest distance any run showed."""
    out: list[list[float]] = []
    best: list[float] = []
    for s in envelope.steps:
        row = [max(s.loss, default=0.0)] + [max(g, default=0.0) for g in s.groups]
        best = row if not best else [max(b, x) for b, x in zip(best, row, strict=True)]
        out.append(best)
    return [[out[min(i + 1, len(out) - 1)][0], *out[i][1:]] for i in range(len(out))]


def resolution(envelope: Envelope | Calibration, loss_eps: float = 0.0) -> float | None:
    """The smallest relative parameter change at the first step that the bound would have
    seen: a change that moves any parameter group by more than this (relative L2) at its
    first step is ``differs``. The largest group bound at the first step, so that it holds
    whichever group the change is in."""
    cal = envelope if isinstance(envelope, Calibration) else calibrate(envelope, loss_eps)
    if not cal.bounds or not cal.bounds[0].groups:
        return None
    return max(cal.bounds[0].groups)


def narrow(own: Envelope | Calibration, carried: Envelope | None,
           loss_eps: float = 0.0) -> Calibration:
    """The verifier's bound (``own``), lowered wherever an envelope carried by the
    manifest is lower: a carried envelope may only narrow it, never widen it. A carried
    envelope with problems (``check_envelope``) or of another shape is ignored, and the
    result's ``notes`` say why. Where it narrows, the rates add: a rounding-only re-run
    falls outside the narrowed bound at most 1/a + 1/b of the time."""
    base = own if isinstance(own, Calibration) else calibrate(own, loss_eps)
    base = Calibration(list(base.bounds), base.loss_ceiling, base.one_in, base.margin,
                       list(base.runs), "the verifier's envelope", list(base.notes))
    if carried is None:
        return base
    problems = check_envelope(carried)
    if problems:
        base.notes.append(f"the manifest's envelope was ignored: {problems[0]}")
        return base
    theirs = calibrate(carried, loss_eps)
    by_step = {b.step: b for b in theirs.bounds}
    width = {len(b.groups) for b in base.bounds}
    if {len(b.groups) for b in theirs.bounds} != width:
        base.notes.append("the manifest's envelope was ignored: it covers other parameter "
                          "groups than the verifier's")
        return base
    lowered = False
    out = []
    for b in base.bounds:
        other = by_step.get(b.step)
        if other is None:
            out.append(b)
            continue
        loss = min(b.loss, other.loss)
        groups = [min(x, y) for x, y in zip(b.groups, other.groups, strict=True)]
        lowered = lowered or loss < b.loss or groups != b.groups
        out.append(Bound(b.step, loss, groups))
    ceiling = min(base.loss_ceiling, theirs.loss_ceiling)
    lowered = lowered or ceiling < base.loss_ceiling
    if not lowered:
        base.notes.append("the manifest's envelope is nowhere narrower than the verifier's")
        return base
    one_in = 1 / (1 / base.one_in + 1 / theirs.one_in)
    return Calibration(out, ceiling, one_in, base.margin, base.runs + theirs.runs,
                       "the verifier's envelope, narrowed by the manifest's", base.notes)
