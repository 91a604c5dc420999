"""A run's own noise envelope, and the verdict ``equivalent`` judged against it.

Bits are the right question on the machine that made a run. On another SKU, driver,
library build or thread count, rounding differs and bits cannot be expected. What can
be expected is that the re-run stays as close to the recorded run as rounding alone
takes runs apart, step by step. This module measures that (``measure_envelope``) and
judges a re-run against it (``judge``).

Distances (``step_distance``), between two numeric-trail points of the same step:

* parameters, per group: sqrt(mean_i (Δ projection_i)^2) / norm. The projections are on
  random directions of unit variance, so this estimates |θ_a − θ_b| / |θ_a| (relative L2);
* loss: |Δloss| / |loss|.

The envelope is every rounding-only run's distance from the base run at every step: runs
whose state was moved by one ULP before the first update (each with its own seed), and
runs under another thread count. Its bound at each step comes from a model of that noise
with a stated false-``differs`` rate (``calibration.calibrate``: the one-ULP runs' mean
log running maximum, plus a Student-t prediction margin fitted on each run's
leave-one-out excess; ``ALPHA`` = 1%). The old bound (spread × running maximum of 4
runs) was exceeded by a fifth draw about 1 time in 5: 3 false ``differs`` in 6 honest
thread-count re-runs of the bundled example.

Measured on CPU (tests/numeric_runs.py, a Transformer encoder layer with Adam, 30 steps):
a one-ULP perturbation gives 6e-8 at step 1 and 1e-5 at step 30, threads 2 → 1 gives
3e-11 and 2e-5; a learning rate ×1.01 gives 2e-5 at step 1. ``docs/verdicts.md`` plots it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from manifest.models import Envelope, EnvelopeStep, NumericPoint
from manifest.numeric.calibration import (
    ULP_LABEL,
    Bound,
    Calibration,
    check_envelope,
    loss_rounding,
    resolution,
    verdict_calibration,
)

__all__ = ["ULP_LABEL", "Bound", "Calibration", "Judgement", "bounds", "judge",
           "measure_envelope", "milestones", "rounding_only", "spread", "step_distance"]

Verdict = Literal["equivalent", "differs", "not-compared"]


def step_distance(a: NumericPoint, b: NumericPoint) -> tuple[float, list[float]] | None:
    """(loss distance, per-group parameter distances) of ``b`` from ``a``; None when the
    two points do not have the same parameter groups (another model, another optimizer)."""
    if len(a.groups) != len(b.groups) or any(len(x) != len(y)
                                             for x, y in zip(a.groups, b.groups, strict=True)):
        return None
    groups = []
    for ga, gb in zip(a.groups, b.groups, strict=True):
        k = len(ga) - 1
        delta = math.sqrt(sum((x - y) ** 2 for x, y in zip(ga[1:], gb[1:], strict=True)) / k) \
            if k else abs(ga[0] - gb[0])
        groups.append(_relative(delta, ga[0]))
    if a.loss is None or b.loss is None:
        loss = 0.0 if a.loss == b.loss else math.inf
    else:
        loss = _relative(abs(a.loss - b.loss), a.loss)
    return loss, groups


def _relative(delta: float, scale: float) -> float:
    if delta == 0:
        return 0.0
    return delta / abs(scale) if scale else math.inf


def measure_envelope(base: Sequence[NumericPoint],
                     runs: Sequence[tuple[str, Sequence[NumericPoint]]]) -> Envelope:
    """Each run's distance from ``base`` at every step they all recorded."""
    by_step = [{p.step: p for p in trail} for _, trail in runs]
    steps: list[EnvelopeStep] = []
    for point in base:
        others = [m.get(point.step) for m in by_step]
        if any(o is None for o in others):
            continue
        measured = [step_distance(point, o) for o in others if o is not None]
        if any(m is None for m in measured):
            continue
        pairs = [m for m in measured if m is not None]
        steps.append(EnvelopeStep(
            step=point.step, loss=[_finite(m[0]) for m in pairs],
            groups=[[_finite(m[1][g]) for m in pairs] for g in range(len(point.groups))]))
    eps = loss_rounding(base)
    return Envelope(runs=[label for label, _ in runs], steps=steps,
                    loss_eps=eps if eps > 0 else None)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 1.0  # a run that lost its loss: as far as it gets


def spread(envelope: Envelope) -> float:
    """Descriptive (``show``): how much one-ULP perturbations of different seeds differ
    in size at the envelope's first step, before chaos picks among them: the largest over
    the smallest of those runs' distances, in the group where that ratio is largest (1
    with fewer than two such runs). The bound no longer uses it (``calibrate``).

    Not the spread at later steps: there one perturbation may have flipped a discrete
    event (a ReLU, a max-pool's argmax) and its run left the others by 1000×; the running
    maximum already holds that run, and multiplying by its ratio would open the bound by
    1000× more (measured: a BatchNorm CNN, one seed of three)."""
    if not envelope.steps:
        return 1.0
    first = min(envelope.steps, key=lambda s: s.step)
    ulp = [i for i, label in enumerate(envelope.runs) if label.startswith(ULP_LABEL)]
    worst = 1.0
    for distances in first.groups:
        moved = [distances[i] for i in ulp if i < len(distances) and distances[i] > 0]
        if len(moved) >= 2:
            worst = max(worst, max(moved) / min(moved))
    return worst


def bounds(envelope: Envelope, trail: Sequence[NumericPoint] | None = None) -> list[Bound]:
    """The bound at every step of the envelope, in step order: the one the verdict judges
    against (``calibration.verdict_calibration``, with the loss's rounding unit of the
    recorded ``trail``, or the envelope's own without one).

    The loss of step t is computed on the state after step t - 1, and the envelope's
    perturbation enters with the first update, after step 1's forward: the envelope's loss
    first sees it at step 2. So the loss at step t is held to the envelope's losses up to
    step t + 1. The parameters are not given that step ahead: on an H100 it made a GPU run
    of a Transformer layer ``equivalent`` to its CPU run, but also a GPU run with 1e-3
    added to one weight at step 5 (benchmarks/numeric_trail.py --devices), and a false
    ``equivalent`` is the one error this verdict must not make."""
    return verdict_calibration(envelope, trail).bounds


@dataclass
class Judgement:
    """What the numeric trails say about a re-run that does not hold the same bits."""

    verdict: Verdict
    steps_compared: int = 0
    first_step: int | None = None
    """The first step outside the envelope (``differs``)."""
    where: str | None = None
    """``loss`` or ``parameter group N``: what left the envelope first."""
    distance: float | None = None
    bound: float | None = None
    closest: float | None = None
    """``equivalent``: the largest distance/bound over every step and quantity (≤ 1)."""
    reason: str | None = None
    runs: list[str] = field(default_factory=list)
    one_in: float | None = None
    """A rounding-only re-run falls outside the bound about 1 time in this many."""
    resolution: float | None = None
    """The smallest relative parameter change at the first step the bound would see."""
    source: str | None = None
    """Whose envelope decided (``Calibration.source``)."""
    notes: list[str] = field(default_factory=list)

    @property
    def times_outside(self) -> float | None:
        if self.distance is None or self.bound is None:
            return None
        return math.inf if self.bound == 0 else self.distance / self.bound

    def confidence(self) -> str | None:
        """``a rounding-only re-run falls outside this bound about 1 time in N``."""
        if self.one_in is None:
            return None
        return (f"a rounding-only re-run falls outside this bound about 1 time in "
                f"{self.one_in:.3g}")

    def sentence(self) -> str:
        sure = self.confidence()
        if self.verdict == "differs" and self.first_step is not None:
            times = self.times_outside
            far = "∞" if times is None or math.isinf(times) else f"{times:.3g}"
            if self.distance is None or self.bound is None:
                return f"step {self.first_step}: {self.reason or self.where}"
            return (f"step {self.first_step}: {self.where} is {self.distance:.3g} from the "
                    f"recorded run, {far}× the envelope's {self.bound:.3g}"
                    + (f" ({sure})" if sure else ""))
        if self.verdict == "equivalent":
            seen = (f"; it would see a relative parameter change of {self.resolution:.2g} "
                    "at the first step" if self.resolution is not None else "")
            return (f"all {self.steps_compared} steps inside the envelope (closest: "
                    f"{self.closest:.2g} of the bound; envelope from {len(self.runs)} "
                    f"rounding-only runs" + (f"; {sure}" if sure else "") + seen + ")")
        return self.reason or self.verdict

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "steps_compared": self.steps_compared,
                "first_step": self.first_step, "where": self.where,
                "distance": self.distance, "bound": self.bound, "closest": self.closest,
                "reason": self.reason, "envelope_runs": self.runs,
                "one_in": self.one_in, "resolution": self.resolution,
                "envelope_source": self.source, "notes": self.notes,
                "sentence": self.sentence()}


def judge(recorded: Sequence[NumericPoint], rerun: Sequence[NumericPoint],
          envelope: Envelope | None, *, calibration: Calibration | None = None) -> Judgement:
    """``equivalent`` when every step the two trails share lies inside the bound;
    ``differs`` at the first step outside; ``not-compared`` with a reason otherwise.

    The bound is ``calibration`` when given (the verifier's, ``calibration.narrow``),
    else ``envelope``'s own (``calibrate``); an envelope with problems
    (``check_envelope``) is refused: no bound, no verdict."""
    if calibration is None:
        if envelope is None or not envelope.steps:
            return Judgement("not-compared", reason="the run has no noise envelope "
                             "(capture --envelope N, or manifest lab --envelope N, "
                             "measures one)")
        problems = check_envelope(envelope)
        if problems:
            return Judgement("not-compared", reason=f"the noise envelope is refused: "
                             f"{problems[0]}", runs=list(envelope.runs), notes=problems)
    if not recorded or not rerun:
        return Judgement("not-compared", reason="no numeric trail in "
                         + ("the recorded run" if not recorded else "the re-run"))
    if calibration is None:
        assert envelope is not None
        calibration = verdict_calibration(envelope, recorded)
    limit = calibration.bounds
    if not limit:
        return Judgement("not-compared", reason="the noise envelope has no steps")
    context: dict[str, Any] = {
        "runs": list(calibration.runs), "one_in": calibration.one_in,
        "resolution": resolution(calibration), "source": calibration.source,
        "notes": list(calibration.notes)}
    width = len(limit[0].groups)
    if any(len(p.groups) != width for p in recorded):
        return Judgement("not-compared", reason=(
            f"the noise envelope covers {width} parameter group(s), the recorded trail "
            f"{len(recorded[0].groups)}"), **context)
    again = {p.step: p for p in rerun}
    shared = [p for p in recorded if p.step in again]
    if not shared:
        return Judgement("not-compared", reason="the numeric trails share no step")
    # Rounding that first shows at step t0 grows from there as the envelope's grows from
    # its first step: a run that matched the recorded one number for number up to t0 − 1
    # is judged from t0 on against the envelope's curve from its start.
    parted = next((p.step for p in shared if p != again[p.step]), None)
    if parted is None:
        return Judgement("equivalent", len(shared), closest=0.0,
                         reason="the numeric trails are the same, number for number",
                         **context)
    first = limit[0].step
    closest = 0.0
    compared = 0
    uncovered: list[int] = []
    for point in shared:
        if point.step < parted:
            compared += 1
            continue
        target = first + point.step - parted
        bound = next((b for b in limit if b.step >= target), None)
        if bound is None:
            uncovered.append(point.step)
            continue
        measured = step_distance(point, again[point.step])
        compared += 1
        if measured is None:
            return Judgement("differs", compared, point.step, "the parameter groups",
                             reason="the re-run's parameter groups are not the recorded ones",
                             **context)
        loss, groups = measured
        # The loss is one number, a noisy reading of where the state stands: once the runs
        # have parted it may show any distance rounding showed at any step (the loss
        # distances of the envelope's runs jump between 0 and 10 units of the loss's
        # rounding from one step to the next). Only at the step they part is it held to
        # that step's bound: what catches a changed batch, label or loss scale there.
        # Later it is also allowed as far as the parameters are: a loss is a function of
        # them, and its reading has heavy tails (one-ULP seed 6 of 24, Transformer, 200
        # steps: 5.4e-6 at step 195 where its parameters were 1.3e-5 apart and every
        # other seed's loss stayed below 3.4e-7; a loss ceiling fitted on 6 runs called
        # it differs in 14 of 345 honest re-runs).
        loss_edge = (bound.loss if point.step == parted
                     else max([calibration.loss_ceiling, *bound.groups]))
        checks = [("loss", loss, loss_edge)] + [
            (f"parameter group {i}", d, b) for i, (d, b) in enumerate(
                zip(groups, bound.groups, strict=True))]
        for where, distance, edge in checks:
            if distance > edge:
                return Judgement("differs", compared, point.step, where, distance, edge,
                                 **context)
            if edge > 0:
                closest = max(closest, distance / edge)
    if uncovered:
        return Judgement("not-compared", compared, reason=(
            f"inside the envelope up to step {uncovered[0] - 1}, but the envelope (steps "
            f"{first}–{limit[-1].step}) does not reach {len(uncovered)} later step(s): "
            "measure it over the whole run"), **context)
    return Judgement("equivalent", compared, closest=closest, **context)


def milestones(envelope: Envelope,
               trail: Sequence[NumericPoint] | None = None) -> list[Bound]:
    """The bound at the first step, at 10, 100, 1000 … and at the last: what ``show`` and
    the reports print of an envelope, the verdict's own (``bounds``: pass the recorded
    trail)."""
    limit = bounds(envelope, trail)
    if not limit:
        return []
    wanted = {limit[0].step, limit[-1].step}
    decade = 10
    while decade < limit[-1].step:
        wanted.add(decade)
        decade *= 10
    return [b for b in limit if b.step in wanted]


# ------------------------------------------------------------------ eligibility

NOT_ROUNDING = ("env.variables.PYTHONHASHSEED",)
"""Environment facts that change what a program does, not how it rounds: str hashing
orders sets and dicts of strings, so another seed can reorder the data."""


def rounding_only(paths: Sequence[str]) -> bool:
    """Whether ``bits`` differences at ``paths`` (diff or drift paths) can only change how
    the same computation rounds: hardware, driver, library build, thread count. Code, data,
    seeds and command are never rounding, so a difference there is never ``equivalent``."""
    if not paths:
        return False
    for path in paths:
        if path.startswith(NOT_ROUNDING):
            return False
        if not (path.startswith(("env.", "hardware.")) or path in ("env", "hardware")
                or _THREADS.fullmatch(path)):
            return False
    return True


_THREADS = re.compile(r"determinism\.(num_threads|processes\[[^\]]+\]\.flags\."
                      r"num_(interop_)?threads)")
