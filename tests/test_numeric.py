"""The numeric trail and the verdict ``equivalent`` (issue 28), calibrated on real training.

The calibration set runs in this process (``tests/numeric_runs.py``): three tiny models,
the bundled example's CNN (SGD with momentum, BatchNorm, dropout), a Transformer encoder
layer and a GRU (Adam), 30 steps each on one thread. Per model, the envelope is measured
from ``DEFAULT_RUNS`` one-ULP runs and threads 1 → 3, and then

* rounding-only re-runs that the envelope never saw (threads 2 and 4, the recipe's switch
  off, oneDNN off: another BLAS path) must come out ``equivalent``;
* thirteen planted real changes must come out ``differs``, at the step where they start
  (0 false ``equivalent`` is the bar).

What the model itself guarantees (a fresh rounding-only run outside 1 time in 100) is
tested over many synthetic envelopes, with the old running maximum as the positive
control; the hostile envelopes of issue 36 are refused, and ``narrow`` never widens.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Any

import pytest

from manifest.models import Envelope, EnvelopeStep, NumericPoint
from manifest.numeric.calibration import (
    ALPHA,
    DEFAULT_RUNS,
    Bound,
    calibrate,
    check_envelope,
    narrow,
    resolution,
    t_quantile,
)
from manifest.numeric.envelope import (
    bounds,
    judge,
    measure_envelope,
    milestones,
    spread,
    step_distance,
)


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


def test_bounds_hold_every_run_and_lie_a_fitted_margin_above_the_runs_mean_curve() -> None:
    env = Envelope(runs=["1 ULP (seed 1)", "1 ULP (seed 2)", "1 ULP (seed 3)"], steps=[
        EnvelopeStep(step=1, loss=[0.0, 0.0, 0.0], groups=[[1e-8, 2e-8, 4e-8]]),
        EnvelopeStep(step=2, loss=[1e-7, 0.0, 0.0], groups=[[1e-9, 1e-9, 1e-9]]),  # quiet
        EnvelopeStep(step=3, loss=[2e-7, 4e-7, 0.0], groups=[[1e-7, 2e-7, 4e-7]])])
    cal = calibrate(env)
    limit = cal.bounds
    assert limit == bounds(env)
    # never below any run's running maximum (a quiet step is luck), nor below the loss's
    # one-step-ahead maximum
    assert limit[1].groups[0] >= 4e-8 and limit[2].groups[0] >= 4e-7
    assert limit[0].loss >= 1e-7
    # the loss is never held below what one update's rounding gives: 4 units of its eps
    assert calibrate(env, 2.0**-23).bounds[1].loss >= 4 * 2.0**-23
    # the runs part by exactly ×2 at every step: the model's centre is their geometric
    # mean and the margin is the t prediction bound of their leave-one-out excesses
    centre = math.exp(statistics.fmean(math.log(x) for x in (1e-8, 2e-8, 4e-8)))
    assert limit[1].groups[0] == pytest.approx(centre * cal.margin)
    assert limit[2].groups[0] == pytest.approx(10 * centre * cal.margin)
    zs = [math.log(x / math.sqrt(y * z)) for x, y, z in ((1, 2, 4), (2, 1, 4), (4, 1, 2))]
    q = statistics.fmean(zs) + t_quantile(1 - ALPHA / 2, 2) * statistics.stdev(zs) * math.sqrt(
        1 + 1 / 3)
    assert cal.margin == pytest.approx(math.exp(q)) and cal.one_in == pytest.approx(100)
    # three runs make a wide margin: at the first step the bound stops at what one ULP
    # and one update can produce (4 eps of float32), above which nothing is rounding
    assert centre * cal.margin > 4 * 2.0**-23 == limit[0].groups[0]
    # one ULP run: no spread to fit, the running maximum, exceeded 1 time in runs + 1
    single = Envelope(runs=["1 ULP (seed 1)", "threads 2 → 1"],
                      steps=[EnvelopeStep(step=1, loss=[0, 0], groups=[[2e-8, 1e-11]])])
    assert calibrate(single).bounds[0].groups == [2e-8] and calibrate(single).one_in == 3


def test_t_quantile_matches_the_tables() -> None:
    # Student's t, upper 1% points (any statistics table): df 1, 3, 7, 30
    for df, table in ((1, 31.821), (3, 4.541), (7, 2.998), (30, 2.457)):
        assert t_quantile(0.99, df) == pytest.approx(table, abs=1e-3)


def _noise(rng: random.Random, steps: int, growth: float) -> list[float]:
    """One rounding-only run's distances: a log-normal start (one-ULP runs of different
    seeds part by ×2 at step 1, measured), chaos growth, per-step jitter."""
    start = rng.gauss(math.log(6e-8), 0.35)
    return [math.exp(start + growth * t + rng.gauss(0, 0.2)) for t in range(steps)]


def _synthetic(rng: random.Random, runs: int, steps: int = 12) -> Envelope:
    trails = [_noise(rng, steps, 0.4) for _ in range(runs)]
    return Envelope(runs=[f"1 ULP (seed {i + 1})" for i in range(runs)], steps=[
        EnvelopeStep(step=t + 1, loss=[0.0] * runs, groups=[[tr[t] for tr in trails]])
        for t in range(steps)])


def _outside(rng: random.Random, limit: list[Any]) -> bool:
    fresh = _noise(rng, len(limit), 0.4)
    return any(d > b.groups[0] for d, b in zip(fresh, limit, strict=True))


def test_a_fresh_rounding_only_run_falls_outside_about_as_often_as_the_model_says() -> None:
    """What the calibration guarantees, over many envelopes, not one lucky draw: a fresh
    run from the same noise falls outside at most at the stated rate (1 in 100), within
    the binomial spread of the trials; the old bound (running maximum × first-step
    spread) is the positive control, outside about 1 time in runs + 1."""
    rng = random.Random(36)
    trials = 1000
    outside = old = 0
    for _ in range(trials):
        env = _synthetic(rng, DEFAULT_RUNS)
        outside += _outside(rng, calibrate(env).bounds)
        running = itertools.accumulate((max(s.groups[0]) for s in env.steps), max)
        old += _outside(rng, [Bound(s.step, 0.0, [r])
                              for s, r in zip(env.steps, running, strict=True)])
    slack = 3 * math.sqrt(trials * ALPHA * (1 - ALPHA))
    assert outside <= trials * ALPHA + slack, f"{outside} of {trials} outside"
    # the unsafe twin, the runs' running maximum alone: 1 in runs + 1, as order
    # statistics say (its own 3-sigma binomial spread)
    rate = 1 / (DEFAULT_RUNS + 1)
    assert old >= trials * rate - 3 * math.sqrt(trials * rate * (1 - rate)), old


def _trail(scale: float, start: int = 1, steps: int = 5) -> list[NumericPoint]:
    return [_p(s, 1.0 + (scale * s if s >= start else 0.0),
               [1.0, 1.0 + (scale * s if s >= start else 0.0), 0.0, 0.0, 0.0])
            for s in range(1, steps + 1)]


def test_judge_equivalent_differs_and_not_compared() -> None:
    base = _trail(0.0)
    env = measure_envelope(base, [(f"1 ULP (seed {i})", _trail(x)) for i, x in
                                  enumerate((1e-7, 2e-7, 1.3e-7, 1.7e-7))])
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
        (f"1 ULP (seed {i})", [_p(s, 1.0, [1.0, 1.0 + x * 10**s, 0, 0, 0]) for s in range(1, 7)])
        for i, x in enumerate((1e-9, 2e-9, 1.5e-9))])
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
PLANTED = {"lr": 1, "lr1e-3": 1, "loss": 1, "dropout": 1, "shard": 1, "wd": 1, "clip": 1,
           "swap@5": 5, "bias@5": 5, "skip@5": 5, "labels@5": 5, "swap@20": 20, "bias@20": 20}
NO_CHANGE = {("gru", "clip")}
"""Plants that change nothing in that model: the GRU's gradient norm stays below 1.0, so
clipping at 1.0 multiplies by exactly 1 (its trail is the base run's, number for number)."""
LATE = {("transformer", "clip"): 5}
"""Planted changes that Adam hides at first: clipping scales step 1's gradient, and Adam's
first update does not depend on the gradient's scale, so step 1 moves at rounding level."""


@pytest.fixture(scope="module", params=["cnn", "transformer", "gru"])
def calibrated(request: pytest.FixtureRequest) -> tuple[str, list[NumericPoint], Envelope]:
    from tests.numeric_runs import train

    def points(**kw: Any) -> list[NumericPoint]:
        kw.setdefault("threads", BASE_THREADS)
        return [NumericPoint.model_validate(p) for p in train(request.param, **kw)]

    base = points()
    runs = [(f"1 ULP (seed {s})", points(perturb=s)) for s in range(1, DEFAULT_RUNS + 1)]
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
    if (kind, plant) in NO_CHANGE:
        assert again == base
        return
    verdict = judge(base, again, env)
    assert verdict.verdict == "differs", f"{kind}, {plant}: false equivalent"
    start = PLANTED[plant]
    latest = LATE.get((kind, plant.partition("@")[0]), start)
    assert verdict.first_step is not None and start <= verdict.first_step <= latest, (
        f"{kind}, {plant}: {verdict.sentence()}")


# ------------------------------------------------------------ hostile envelopes


def _honest() -> tuple[list[NumericPoint], Envelope]:
    base = _trail(0.0)
    return base, measure_envelope(base, [(f"1 ULP (seed {i})", _trail(x)) for i, x in
                                         enumerate((1e-7, 2e-7, 1.3e-7, 1.7e-7, 1.1e-7))])


def _edited(env: Envelope, **change: Any) -> Envelope:
    """``env`` with ``change`` applied to every step, built without validation: NaN and
    inf are refused already when a manifest is read; check_envelope must not rely on it."""
    data = env.model_dump()
    for step in data["steps"]:
        for key, value in change.items():
            step[key] = value(step[key]) if callable(value) else value
    return Envelope.model_construct(runs=data["runs"], steps=[
        EnvelopeStep.model_construct(**step) for step in data["steps"]])


HOSTILE: dict[str, Any] = {
    "NaN": {"groups": lambda g: [[math.nan, *g[0][1:]]]},
    "inf": {"loss": lambda x: [math.inf, *x[1:]]},
    "negative": {"groups": lambda g: [[-1e-8, *g[0][1:]]]},
    "one distance short": {"groups": lambda g: [g[0][1:]]},
    "groups []": {"groups": [], "loss": lambda x: [1.0] * len(x)},
    "every distance ×1e6": {"groups": lambda g: [[x * 1e6 for x in g[0]]],
                            "loss": lambda x: [y * 1e6 for y in x]},
    "first step [1e-300, 1, 1]": {"groups": lambda g: [[1e-300, 1.0, 1.0, 1.0, 1.0]]},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_envelopes_are_refused_in_one_sentence(name: str) -> None:
    base, env = _honest()
    hostile = _edited(env, **HOSTILE[name])
    problems = check_envelope(hostile)
    assert problems and all("\n" not in p and not p.endswith(".") for p in problems), problems
    verdict = judge(base, _trail(1e-3), hostile)
    assert verdict.verdict == "not-compared" and "refused" in (verdict.reason or "")
    assert not check_envelope(env)  # the honest one passes
    milestones(hostile)  # what ``show`` prints of it: no traceback, whatever it holds


def test_steps_out_of_order_or_repeated_are_refused() -> None:
    _, env = _honest()
    data = env.model_dump()
    data["steps"][1]["step"] = data["steps"][0]["step"]
    assert "out of order or repeated" in check_envelope(Envelope.model_validate(data))[0]
    data["steps"] = data["steps"][::-1]
    assert check_envelope(Envelope.model_validate(data))


def test_a_widened_envelope_passes_a_real_change_unless_refused_or_narrowed() -> None:
    """The attack of issue 36 on real training (the Transformer, 12 steps): every distance
    ×1e6 made a learning rate ×1.01 ``equivalent``. The unsafe twin (the widened bound used
    as is) still does; ``judge`` refuses it, and ``narrow`` keeps the verifier's own."""
    from tests.numeric_runs import train

    def points(**kw: Any) -> list[NumericPoint]:
        return [NumericPoint.model_validate(p)
                for p in train("transformer", steps=12, threads=1, **kw)]

    base = points()
    own = measure_envelope(base, [(f"1 ULP (seed {s})", points(perturb=s))
                                  for s in range(1, DEFAULT_RUNS + 1)])
    planted = points(plant="lr")
    widened = _edited(own, groups=lambda g: [[x * 1e6 for x in d] for d in g],
                      loss=lambda x: [y * 1e6 for y in x])
    unsafe = judge(base, planted, None, calibration=calibrate(widened, 2.0**-23))
    assert unsafe.verdict == "equivalent"  # the positive control: the attack works
    assert judge(base, planted, widened).verdict == "not-compared"
    kept = narrow(own, widened, 2.0**-23)
    assert kept.bounds == calibrate(own, 2.0**-23).bounds
    assert kept.notes and "ignored" in kept.notes[0]
    verdict = judge(base, planted, None, calibration=kept)
    assert (verdict.verdict, verdict.first_step) == ("differs", 1)
    # widened only after the first step, it passes check_envelope: narrow still never
    # lets it open the verifier's bound
    late = _edited(own)
    late.steps[1:] = [_edited(Envelope(runs=own.runs, steps=[s]), groups=lambda g: [
        [x * 1e6 for x in d] for d in g]).steps[0] for s in own.steps[1:]]
    assert not check_envelope(late)
    assert narrow(own, late, 2.0**-23).bounds == calibrate(own, 2.0**-23).bounds
    # an honest carried envelope that is tighter narrows it, and the rates add
    tight = _edited(own, groups=lambda g: [[x / 2 for x in d] for d in g])
    narrowed = narrow(own, tight, 2.0**-23)
    assert all(b.groups[0] <= o.groups[0] for b, o in zip(
        narrowed.bounds, calibrate(own, 2.0**-23).bounds, strict=True))
    assert narrowed.one_in == pytest.approx(50)
    assert "narrowed" in narrowed.source


# --------------------------------------------------------- resolution, confidence


def test_resolution_is_the_smallest_first_step_change_the_bound_sees() -> None:
    base, env = _honest()
    seen = resolution(env)
    assert seen is not None and seen == max(calibrate(env).bounds[0].groups)

    def moved(distance: float) -> list[NumericPoint]:
        # one projection moved so that step 1's relative distance is ``distance``
        return [_p(s, 1.0, [1.0, 1.0 + (2 * distance if s == 1 else 0.0), 0.0, 0.0, 0.0])
                for s in range(1, 6)]

    above = judge(base, moved(seen * 1.01), env)
    assert (above.verdict, above.first_step, above.where) == ("differs", 1, "parameter group 0")
    below = judge(base, moved(seen * 0.99), env)
    assert below.verdict == "equivalent"


@pytest.mark.slow
def test_resolution_on_real_training_lies_between_rounding_and_a_real_change(
        calibrated: tuple[str, list[NumericPoint], Envelope]) -> None:
    from tests.numeric_runs import train

    kind, base, env = calibrated
    seen = resolution(env)
    assert seen is not None
    first = env.steps[0]
    ulp = [d for g in first.groups for i, d in enumerate(g) if env.runs[i].startswith("1 ULP")]
    assert seen >= max(ulp)
    planted = [NumericPoint.model_validate(p) for p in train(kind, threads=1, plant="lr1e-3")]
    change = step_distance(base[0], planted[0])
    assert change is not None and max(change[1]) > seen, f"{kind}: lr ×1.001 unseen"


def test_the_judgement_states_how_sure_it_is_and_what_it_would_see() -> None:
    base, env = _honest()
    same = judge(base, _trail(1.2e-7), env)
    assert same.verdict == "equivalent"
    assert "falls outside this bound about 1 time in 100" in same.sentence()
    assert "would see a relative parameter change of" in same.sentence()
    far = judge(base, _trail(1e-3), env)
    assert "about 1 time in 100" in far.sentence()
    data = far.to_json()
    assert data["one_in"] == pytest.approx(1 / ALPHA)
    assert data["resolution"] == pytest.approx(resolution(env, 2.0**-23))
    assert data["envelope_source"] == "the run's envelope"
