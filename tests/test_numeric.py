"""The numeric trail and the verdict ``equivalent`` (issue 28), calibrated on real training.

The calibration set runs in this process (``tests/numeric_runs.py``): two tiny models, the
bundled example's CNN (SGD with momentum, BatchNorm, dropout) and a Transformer encoder
layer (Adam), 30 steps each on one thread. Per model, the envelope is measured from four
rounding-only runs (one ULP, three seeds; threads 1 → 3) and then

* rounding-only re-runs that the envelope never saw (threads 2 and 4, the recipe's switch
  off, oneDNN off: another BLAS path) must come out ``equivalent``;
* twelve planted real changes must come out ``differs``, at the step where they start
  (24 planted cases in all: 0 false ``equivalent`` is the bar).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from manifest.models import Envelope, EnvelopeStep, NumericPoint
from manifest.numeric.envelope import bounds, judge, measure_envelope, spread, step_distance


def _p(step: int, loss: float | None, *groups: list[float]) -> NumericPoint:
    return NumericPoint(step=step, loss=loss, loss_eps=2.0**-23, groups=[list(g) for g in groups])


# ------------------------------------------------------------------ distances


def test_step_distance_is_relative_l2_of_projections_and_relative_loss() -> None:
    a = _p(1, 2.0, [10.0, 1.0, 2.0, 3.0, 4.0])
    b = _p(1, 2.002, [10.0, 1.0, 2.0, 3.0, 6.0])
    loss, groups = step_distance(a, b)  # type: ignore[misc]
    assert loss == pytest.approx(1e-3)
    assert groups == [pytest.approx(math.sqrt(4 / 4) / 10)]
    assert step_distance(a, _p(1, 2.0, [1.0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0])) is None


def test_spread_is_the_one_ulp_runs_largest_over_smallest_at_the_first_step() -> None:
    runs = ["1 ULP (seed 1)", "1 ULP (seed 2)", "threads 2 → 1"]
    env = Envelope(runs=runs, steps=[
        EnvelopeStep(step=1, loss=[0, 0, 0], groups=[[2e-8, 5e-8, 1e-11], [1e-8, 1e-8, 0]]),
        # later, one seed flipped a discrete event and left the others by 1000x: that run
        # raises the running maximum, never the spread
        EnvelopeStep(step=2, loss=[0, 0, 0], groups=[[2e-8, 5e-5, 1e-8], [1e-8, 1e-8, 0]])])
    assert spread(env) == pytest.approx(2.5)
    one = Envelope(runs=["1 ULP (seed 1)", "threads 2 → 1"], steps=env.steps)
    assert spread(one) == 1.0  # one ULP run: nothing to measure a spread from


def test_bounds_run_on_as_a_running_maximum_times_the_spread() -> None:
    env = Envelope(runs=["1 ULP (seed 1)", "1 ULP (seed 2)"], steps=[
        EnvelopeStep(step=1, loss=[0.0, 0.0], groups=[[1e-8, 2e-8]]),
        EnvelopeStep(step=2, loss=[1e-7, 0.0], groups=[[1e-9, 1e-9]]),  # a quiet step
        EnvelopeStep(step=3, loss=[2e-7, 4e-7], groups=[[4e-7, 2e-7]])])
    limit = bounds(env)
    factor = 2e-8 / 1e-8
    assert [b.groups[0] for b in limit] == pytest.approx([2e-8 * factor, 2e-8 * factor,
                                                          4e-7 * factor])
    # the loss of step t is held to the envelope's losses up to t + 1
    assert limit[0].loss == pytest.approx(1e-7 * factor)


def _trail(scale: float, start: int = 1, steps: int = 5) -> list[NumericPoint]:
    return [_p(s, 1.0 + (scale * s if s >= start else 0.0),
               [1.0, 1.0 + (scale * s if s >= start else 0.0), 0.0, 0.0, 0.0])
            for s in range(1, steps + 1)]


def test_judge_equivalent_differs_and_not_compared() -> None:
    base = _trail(0.0)
    env = measure_envelope(base, [("1 ULP (seed 1)", _trail(1e-7)),
                                  ("1 ULP (seed 2)", _trail(2e-7))])
    assert judge(base, _trail(1.5e-7), env).verdict == "equivalent"
    far = judge(base, _trail(1e-3), env)
    assert (far.verdict, far.first_step, far.where) == ("differs", 1, "loss")
    assert far.times_outside is not None and far.times_outside > 100
    assert "step 1: loss" in far.sentence()
    assert judge(base, base, env).verdict == "equivalent"
    assert judge(base, _trail(1e-7), None).verdict == "not-compared"
    longer = [*base, _p(6, 1.0, [1.0, 1.0, 0.0, 0.0, 0.0])]
    short = judge(longer, [*_trail(1e-7), _p(6, 1.0, [1.0, 1.0, 0.0, 0.0, 0.0])], env)
    assert short.verdict == "not-compared" and "does not reach" in (short.reason or "")


def test_a_run_that_parts_late_is_judged_from_where_it_parts() -> None:
    base = _trail(0.0, steps=6)
    env = measure_envelope(base, [
        ("1 ULP (seed 1)", [_p(s, 1.0, [1.0, 1.0 + 1e-8 * 10**s, 0, 0, 0]) for s in range(1, 7)]),
        ("1 ULP (seed 2)", [_p(s, 1.0, [1.0, 1.0 + 2e-8 * 10**s, 0, 0, 0]) for s in range(1, 7)])])
    # bit-identical to step 4, then a jump that step 5's envelope would hide
    late = [_p(s, 1.0, [1.0, 1.0 + (1e-5 if s >= 5 else 0.0), 0, 0, 0]) for s in range(1, 7)]
    verdict = judge(base, late, env)
    assert (verdict.verdict, verdict.first_step) == ("differs", 5)


# ----------------------------------------------------------- calibration set

BASE_THREADS = 1
"""The base run's thread count. One: an OpenMP thread that waits for a busy core spins,
and on a shared 2-core CI box a 2-thread run took 20× the CPU of a 1-thread one."""
ROUNDING_ONLY: dict[str, dict[str, Any]] = {
    "threads 2": {"threads": 2}, "threads 4": {"threads": 4},
    "recipe switch off": {"deterministic": False}, "oneDNN off": {"mkldnn": False}}
PLANTED = {"lr": 1, "loss": 1, "dropout": 1, "shard": 1, "wd": 1, "clip": 1,
           "swap@5": 5, "bias@5": 5, "skip@5": 5, "labels@5": 5, "swap@20": 20, "bias@20": 20}
LATE = {("transformer", "clip"): 5}
"""Planted changes that Adam hides at first: clipping scales step 1's gradient, and Adam's
first update does not depend on the gradient's scale, so step 1 moves at rounding level."""


@pytest.fixture(scope="module", params=["cnn", "transformer"])
def calibrated(request: pytest.FixtureRequest) -> tuple[str, list[NumericPoint], Envelope]:
    from tests.numeric_runs import train

    def points(**kw: Any) -> list[NumericPoint]:
        kw.setdefault("threads", BASE_THREADS)
        return [NumericPoint.model_validate(p) for p in train(request.param, **kw)]

    base = points()
    runs = [(f"1 ULP (seed {s})", points(perturb=s)) for s in (1, 2, 3)]
    runs.append(("threads 1 → 3", points(threads=3)))
    return request.param, base, measure_envelope(base, runs)


@pytest.mark.slow
@pytest.mark.parametrize("change", list(ROUNDING_ONLY))
def test_rounding_only_reruns_are_equivalent(
        calibrated: tuple[str, list[NumericPoint], Envelope], change: str) -> None:
    from tests.numeric_runs import train

    kind, base, env = calibrated
    again = [NumericPoint.model_validate(p)
             for p in train(kind, **{"threads": BASE_THREADS, **ROUNDING_ONLY[change]})]
    verdict = judge(base, again, env)
    assert verdict.verdict == "equivalent", f"{kind}, {change}: {verdict.sentence()}"


@pytest.mark.slow
@pytest.mark.parametrize("plant", list(PLANTED))
def test_planted_changes_differ_at_the_step_they_start(
        calibrated: tuple[str, list[NumericPoint], Envelope], plant: str) -> None:
    from tests.numeric_runs import train

    kind, base, env = calibrated
    again = [NumericPoint.model_validate(p)
             for p in train(kind, threads=BASE_THREADS, plant=plant)]
    verdict = judge(base, again, env)
    assert verdict.verdict == "differs", f"{kind}, {plant}: false equivalent"
    start = PLANTED[plant]
    latest = LATE.get((kind, plant.partition("@")[0]), start)
    assert verdict.first_step is not None and start <= verdict.first_step <= latest, (
        f"{kind}, {plant}: {verdict.sentence()}")
