"""Equivalent across device types (issue 37): the CPU emulation of TF32 / bf16 autocast
and the envelope at the re-run's precision, on real training in this process.

The emulation (``launch/boot/_manifest_precision``) stands in for another device: a run
captured at float32 is re-run under TF32 or bf16 emulation at another thread count or
with a fresh one-ULP seed (honest), or with a planted change. Each is judged against the
envelope measured at its precision (``numeric.precision.at_precision``, DEFAULT_RUNS
emulated one-ULP runs), and, as the positive control, against the float32 envelope.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from manifest.launch.boot._manifest_precision import emulating, round_mantissa
from manifest.models import NumericPoint
from manifest.numeric.calibration import DEFAULT_RUNS
from manifest.numeric.envelope import ULP_LABEL, judge
from manifest.numeric.precision import (
    at_precision,
    choose,
    coarser,
    device_change,
    device_kinds,
    resolution_sentence,
)
from tests.numeric_runs import train

torch = pytest.importorskip("torch")

STEPS = 12


def _pts(trail: list[dict[str, Any]]) -> list[NumericPoint]:
    return [NumericPoint.model_validate(p) for p in trail]


# ------------------------------------------------------------------ the rounding


def test_tf32_rounds_to_nearest_even_at_ten_mantissa_bits() -> None:
    one = 1.0
    ulp = 2.0 ** -10  # TF32's spacing at 1.0
    x = torch.tensor([one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2.0 ** -20,
                      one + ulp / 4, -(one + 3 * ulp / 2), math.inf, -math.inf, math.nan])
    got = round_mantissa(x, "tf32")
    # ties go to the even neighbour (1.0, 1 + 2ulp), above a tie rounds up, below down
    assert got[:5].tolist() == [one, one + 2 * ulp, one + ulp, one, -(one + 2 * ulp)]
    assert got[5] == math.inf and got[6] == -math.inf and math.isnan(got[7])
    wide = torch.randn(10_000)
    err = ((round_mantissa(wide, "tf32") - wide).abs() / wide.abs()).max().item()
    assert 2.0 ** -12 < err <= 2.0 ** -11  # at most half a TF32 ULP, and it does round
    assert torch.equal(round_mantissa(wide, "bf16"), wide.to(torch.bfloat16).float())
    doubles = wide.double()
    assert round_mantissa(doubles, "tf32") is doubles  # float64 is never rounded


def test_seeded_rounding_is_another_rounding_at_the_same_precision() -> None:
    wide = torch.randn(100_000)
    nearest = round_mantissa(wide, "bf16")
    one, two = (round_mantissa(wide, "bf16", torch.Generator().manual_seed(s)) for s in (1, 2))
    ulp = 2.0 ** -7
    for got in (one, two):  # each element goes to one of its two bf16 neighbours
        assert torch.equal(got, got.to(torch.bfloat16).float())
        assert (((got - wide).abs() / wide.abs()) < ulp).all()
    assert not torch.equal(one, two) and not torch.equal(one, nearest)
    # unbiased: the mean error is far below the nearest rounding's typical error
    assert abs((one - wide).mean().item()) < 0.05 * (nearest - wide).abs().mean().item()


def test_emulation_rounds_linear_conv_and_attention_inputs_and_is_off_outside() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    exact = lin(x)
    with emulating("tf32"):
        emulated = lin(x)
    expected = round_mantissa(x, "tf32") @ round_mantissa(lin.weight, "tf32").T + lin.bias
    assert torch.allclose(emulated, expected, rtol=0, atol=1e-6)
    assert not torch.equal(emulated, exact)  # it does change the result
    assert torch.equal(lin(x), exact)  # and is off again outside the block
    with emulating("bf16"):
        half = lin(x)
    assert torch.equal(half, half.to(torch.bfloat16).float())  # autocast: a bf16 output
    conv = torch.nn.Conv2d(3, 4, 3)
    img = torch.randn(2, 3, 8, 8)
    with emulating("tf32"):
        got = conv(img)
    want = torch.nn.functional.conv2d(round_mantissa(img, "tf32"),
                                      round_mantissa(conv.weight, "tf32"), conv.bias)
    assert torch.allclose(got, want, rtol=0, atol=1e-6) and not torch.equal(got, conv(img))
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with emulating("bf16"):
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.equal(att, att.to(torch.bfloat16).float()) and not torch.equal(att, plain)


def test_backward_matmuls_are_rounded_too() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    with emulating("bf16"):
        lin(x).square().sum().backward()
    grad = lin.weight.grad
    assert grad is not None and torch.equal(grad, grad.to(torch.bfloat16).float())


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown precision"), emulating("fp8"):
        pass
    with pytest.raises(ValueError, match="unknown precision"):
        coarser("tf32", "fp4")


# ------------------------------------------------------------------ choosing


def test_choose_picks_the_coarser_precision_or_says_none_covers() -> None:
    base = _pts(train("transformer", steps=3, threads=1))
    runs = [(f"{ULP_LABEL} (seed 1)", _pts(train("transformer", steps=3, threads=1,
                                                 perturb=1)))]
    fp32 = at_precision(base, runs, "fp32", "measured")
    tf32 = fp32.model_copy(update={"precision": "tf32", "how": "emulated"})
    assert coarser("fp32", "tf32") == "tf32" and coarser("bf16", "tf32") == "bf16"
    assert choose([fp32, tf32], "fp32", "tf32").envelope is tf32
    assert choose([fp32, tf32], "fp32", "fp32").envelope is fp32
    none = choose([fp32], "fp32", "tf32")
    assert none.envelope is None and "no envelope covers tf32" in none.reason
    assert "8192×" in none.reason  # 2^13: how much further a TF32 re-run starts
    # an older envelope without the field is a float32 one
    legacy = fp32.model_copy(update={"precision": None, "how": None})
    assert choose([legacy], "fp32", "fp32").envelope is legacy
    assert choose([legacy], "fp32", "bf16").envelope is None


# ------------------------------------------------------------------ verdicts


def test_a_change_of_device_type_decides_nothing() -> None:
    """CPU ↔ GPU: the trails cannot tell a device's rounding from a change (measured on an
    H100 and an H200, benchmarks/device_pairs.py), so verify says so instead of judging;
    other GPU models likewise. The same devices are judged as before."""
    from manifest.canonical import load_manifest

    golden = load_manifest((Path(__file__).parent / "golden" / "manifest_v1.json")
                           .read_bytes())
    det = golden.determinism
    assert det is not None and det.processes

    def on(*devices: str) -> Any:
        procs = [p.model_copy(update={"devices": list(devices)}) for p in det.processes]
        return golden.model_copy(update={"determinism": det.model_copy(
            update={"processes": procs})})

    cpu, h100, h200 = on(), on("NVIDIA H100 80GB HBM3"), on("NVIDIA H200")
    assert device_kinds(cpu) == frozenset() and device_kinds(h100) == {"NVIDIA H100 80GB HBM3"}
    assert device_change(cpu, on()) is None
    assert device_change(h100, on(*["NVIDIA H100 80GB HBM3"] * 8)) is None  # a set of models
    there = device_change(cpu, h100)
    back = device_change(h200, cpu)
    assert there is not None and back is not None
    assert there.startswith("the run computed on CPU and the re-run on 'NVIDIA H100 80GB HBM3'")
    assert back.startswith("the run computed on 'NVIDIA H200' and the re-run on CPU")
    assert "decide nothing" in there
    assert device_change(h100, h200) is not None  # another GPU model: the same rule
    # a manifest's names are its author's: a name "cpu" is a name, not the CPU; quoted, capped
    forged = device_change(on("cpu", "NVIDIA H100 80GB HBM3"), cpu)
    assert forged is not None
    assert forged.startswith("the run computed on 'NVIDIA H100 80GB HBM3', 'cpu' and")
    many = device_change(on(*(f"gpu{i:05d}" + "x" * 200 for i in range(10_000))), cpu)
    assert many is not None and "and 9996 more" in many and len(many) < 1_000


@pytest.fixture(scope="module", params=["tf32", "bf16"])
def setting(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A float32 run, its float32 envelope, its emulated twin and the envelope of
    DEFAULT_RUNS one-ULP emulated runs and one at threads 2 against the twin (capture's)."""
    precision = request.param
    base = _pts(train("transformer", steps=STEPS, threads=1))
    fp32 = at_precision(base, [(f"{ULP_LABEL} (seed {s})",
                                _pts(train("transformer", steps=STEPS, threads=1, perturb=s)))
                               for s in range(1, DEFAULT_RUNS + 1)], "fp32", "measured")
    with emulating(precision):  # as the boot runs an envelope run
        twin = _pts(train("transformer", steps=STEPS, threads=1))
        runs = [(f"{ULP_LABEL} (seed {s})",
                 _pts(train("transformer", steps=STEPS, threads=1, perturb=s)))
                for s in range(1, DEFAULT_RUNS + 1)]
        runs.append(("threads 1 → 2", _pts(train("transformer", steps=STEPS, threads=2))))
    return {"precision": precision, "base": base, "fp32": fp32, "twin": twin,
            "env": at_precision(base, runs, precision, "emulated", twin=twin),
            "before": at_precision(base, runs, precision, "emulated")}


def _rerun(precision: str, **kw: Any) -> list[NumericPoint]:
    with emulating(precision):
        return _pts(train("transformer", steps=STEPS, **kw))


@pytest.mark.parametrize("honest", [{"threads": 2}, {"threads": 1, "perturb": 101},
                                    {"threads": 2, "perturb": 102}])
def test_an_emulated_rerun_is_equivalent_to_the_twin_and_not_at_fp32(
        setting: dict[str, Any], honest: dict[str, Any]) -> None:
    rerun = _rerun(setting["precision"], **honest)
    verdict = judge(setting["twin"], rerun, setting["env"])
    assert verdict.verdict == "equivalent", verdict.sentence()
    # the positive controls: the float32 envelope calls the precision's rounding a change,
    # and so does the twin's envelope held to the float32 trail (the twin is what cancels it)
    assert judge(setting["base"], rerun, setting["fp32"]).verdict == "differs"
    assert judge(setting["base"], rerun, setting["env"]).verdict == "differs"


@pytest.mark.parametrize("plant", ["lr", "lr1e-3", "swap@5", "bias@5"])
def test_planted_changes_differ_against_the_twin(setting: dict[str, Any], plant: str) -> None:
    rerun = _rerun(setting["precision"], threads=1, plant=plant)
    verdict = judge(setting["twin"], rerun, setting["env"])
    assert verdict.verdict == "differs", verdict.sentence()


def test_a_hostile_twin_is_refused(setting: dict[str, Any]) -> None:
    """A carried twin is the author's numbers: one that is not the recorded run's twin in
    shape or start is refused. Positive control: judged against a twin that is the planted
    run's own trail one step out of place, the planted run would be ``equivalent``."""
    from manifest.numeric.twin import check_twin, unparted

    env, base = setting["env"], setting["base"]
    honest = check_twin(env, base)  # the honest twin passes, unless its runs split
    assert honest == [] or (unparted(env) and "never left the twin" in honest[0]), honest
    planted = _rerun(setting["precision"], threads=1, plant="lr")
    shifted = [p.model_copy(update={"step": p.step + 1}) for p in planted]
    unsafe = env.model_copy(update={"twin": planted})
    assert judge(planted, planted, unsafe).verdict == "equivalent"  # what a bad twin does
    refused = check_twin(env.model_copy(update={"twin": shifted}), base)
    assert refused == ["the twin's steps are not the recorded trail's"]
    twin = setting["twin"]
    nan = [twin[0].model_copy(update={"loss": math.nan}), *twin[1:]]
    fewer = [p.model_copy(update={"groups": p.groups[:-1]}) for p in twin]
    far = [p.model_copy(update={"groups": [[g[0] * 1.5, *(x * 1.5 for x in g[1:])]
                                           for g in p.groups]}) for p in twin]
    huge = [p if p.step < 3 else p.model_copy(update={"groups": [
        [g[0], *(1e200 for _ in g[1:])] for g in p.groups]}) for p in twin]
    cases = {"not finite": {"twin": nan}, "other parameter groups": {"twin": fewer},
             "twin starts": {"twin": far}, "no steps": {"twin": []},
             "finite and not negative": {"twin_outputs": {"out/model.safetensors": -1.0}},
             "too large to measure": {"twin": huge},
             "more than its trail's last step allows":
                 {"twin_outputs": {"out/model.safetensors": 1e6}}}
    for said, update in cases.items():
        problems = check_twin(env.model_copy(update=update), base)
        assert len(problems) == 1 and said in problems[0], (said, problems)


def test_the_twins_output_offset_is_held_to_its_trail(setting: dict[str, Any]) -> None:
    """An output offset o widens the output bound to b(1+o)+o, so o = 1e6 (or o + 1.05 d)
    would let an output edited by d through: o may be at most 2× the twin's last-step
    sketch distance from the recorded trail plus float32's rounding. Positive control: an
    honest o (measured 0.98× that distance on the bundled CNN in TF32) passes, and the
    refused one would have widened the bound past any edit."""
    from manifest.numeric.envelope import step_distance
    from manifest.numeric.twin import check_twin, offset_limit, output_bound, unparted

    env, base = setting["env"], setting["base"]
    if unparted(env):
        return  # check_twin refuses it whole (test_a_hostile_twin_is_refused)
    apart = step_distance(base[-1], setting["twin"][-1])
    assert apart is not None
    sketch = max(apart[1])
    cap = offset_limit(sketch)
    honest = env.model_copy(update={"twin_outputs": {"out/model.safetensors": sketch}})
    assert check_twin(honest, base) == []
    hostile = env.model_copy(update={"twin_outputs": {"out/model.safetensors": cap * 1.01}})
    assert "more than its trail's last step allows" in check_twin(hostile, base)[0]
    assert output_bound(1e-4, 1e6) > 1  # what the unchecked o did: an edit the size of
    # the whole model inside


def test_the_recorded_trail_is_held_to_the_twin_at_every_step(
        setting: dict[str, Any]) -> None:
    """The re-run is judged against the twin, so the recorded trail must be the twin's run:
    at every step within the envelope's bound scaled by the twin's starting distance.
    Positive controls: with a recorded trail planted from step 6 on (3× the scaled bound)
    an honest re-run is ``equivalent`` when only the twin is judged, and the trail is
    refused here; the unscaled bound would refuse the honest trail at its first step (the
    scaling is what lets it pass); a twin whose norms read ×1e300 from step 3 on is refused too.
    Measured (20 steps, 8 envelope draws): honest trails at most 0.91 of the scaled bound
    (GRU, bf16), 0.58 (CNN, TF32), 0.0024 (this Transformer, TF32). The bound is wide
    where the runs' growth is: 0.61 of the norm at step 6 here (TF32), so the planted set
    spliced into this trail stays inside; the bundled CNN's 5e-2 plant is refused (2.4×)."""
    from manifest.numeric.calibration import calibrate
    from manifest.numeric.twin import trail_apart

    env, base, twin = setting["env"], setting["base"], setting["twin"]
    calibration = calibrate(env)
    honest = trail_apart(base, twin, calibration)
    assert honest.problem is None and honest.ratio <= 1, honest
    assert honest.scale > 1  # the twin starts further than one ULP: unscaled, it is outside
    edge = {b.step: b.groups for b in calibration.bounds}  # planted: 3× the scaled bound
    mixed = [b if b.step < 6 else b.model_copy(update={"groups": [
        [g[0], *(x + 3 * honest.scale * edge[b.step][k] * abs(g[0]) for x in g[1:])]
        for k, g in enumerate(b.groups)]}) for b in base]
    rerun = _rerun(setting["precision"], threads=2)
    assert judge(twin, rerun, env).verdict == "equivalent"  # the recorded trail unseen
    refused = trail_apart(mixed, twin, calibration)
    assert refused.problem is not None and "from the twin at step" in refused.problem
    assert refused.step is not None and refused.step >= 6
    absurd = [p if p.step < 3 else p.model_copy(update={"groups": [
        [g[0] * 1e300, *g[1:]] for g in p.groups]}) for p in twin]
    said = trail_apart(base, absurd, calibration).problem
    assert said is not None and "step 3" in said


def test_the_envelope_states_what_its_precision_costs(setting: dict[str, Any]) -> None:
    """Measured from the float32 run, a TF32/bf16 envelope is far wider than float32's at
    its first step (the precision's rounding offset is the price); measured from the twin,
    the offset cancels and the first step sees what float32's does, within 10×."""
    from manifest.numeric.calibration import resolution

    coarse, fine = resolution(setting["before"]), resolution(setting["fp32"])
    twin = resolution(setting["env"])
    assert coarse is not None and fine is not None and twin is not None
    assert coarse > 100 * fine and twin < 10 * fine
    said = resolution_sentence(setting["env"])
    assert setting["precision"] in said and "emulated" in said and f"{twin:.2g}" in said


def _above_the_runs(envelope: Any) -> float:
    """The calibrated bound at the last step over the largest distance any run showed."""
    from manifest.numeric.calibration import calibrate

    top = max(x for g in envelope.steps[-1].groups for x in g)
    return float(max(calibrate(envelope).bounds[-1].groups) / top)


def test_an_envelope_whose_runs_never_part_and_part_decides_nothing(
        setting: dict[str, Any]) -> None:
    """Under the emulation a one-ULP move can be rounded away for good: that run stays at
    its first-step distance from the twin while the others grow. Positive control: three
    of the six runs held there lift the calibrated bound at the last step far above
    anything a run showed, more than 10× as far as the honest envelope's (measured:
    2e4× against 2× in TF32, 5e4× against 3e3× in bf16); ``check_twin`` refuses it."""
    from manifest.numeric.twin import check_twin, unparted

    env = setting["env"]
    if unparted(env):  # this draw split by itself: the guard must already say so
        assert "never left the twin" in check_twin(env, setting["base"])[0]
        return
    held = [step.model_copy(update={"groups": [
        [env.steps[0].groups[k][i] if i < 3 else x for i, x in enumerate(g)]
        for k, g in enumerate(step.groups)]}) for step in env.steps]
    split = env.model_copy(update={"steps": held})
    assert unparted(split) == env.runs[:3]
    assert _above_the_runs(split) > 10 * _above_the_runs(env)
    problems = check_twin(split, setting["base"])
    assert len(problems) == 1 and "never left the twin while the others did" in problems[0]


def test_the_outputs_are_held_to_the_bound_widened_by_the_twin() -> None:
    """b · (1 + o) + o (numeric.twin.output_bound). Positive control: the same output
    distance is outside the unwidened bound; an output whose twin distance was not
    measured, or whose recorded file is not the trail's last point, is not compared, never
    passed."""
    from manifest.numeric.calibration import Bound, Calibration
    from manifest.verify.equivalence import AGREES, OutputDistance, bind_outputs

    calibration = Calibration([Bound(1, 1e-6, [1e-4])], 1e-6, 100.0, 1.0)
    offset = 3e-3
    inside = OutputDistance("out/a.safetensors", distance=offset + 0.5e-4, worst="w")
    outside = OutputDistance("out/a.safetensors", distance=offset + 2e-4, worst="w")

    def bound(out: OutputDistance, offsets: dict[str, float] | None,
              trail: str = AGREES + " (step 1)") -> tuple[Any, str]:
        doc: dict[str, Any] = {"sentence": "s",
                               "outputs": [{"path": out.path, "trail": trail}]}
        problem = bind_outputs(doc, [out], calibration, compared=True, twin_offsets=offsets)
        return problem, doc["outputs_verdict"]

    assert bound(inside, None)[1] == "outside"  # unwidened: float32 against emulated
    assert bound(inside, {"out/a.safetensors": offset}) == (None, "inside")
    # widened only for a recorded file that is the trail's last point (o is held to it)
    problem, said = bound(inside, {"out/a.safetensors": offset},
                          trail="could not be mapped onto the numeric trail's last point")
    assert said == "not-compared" and problem is not None and "not held to" in problem
    assert bound(outside, {"out/a.safetensors": offset})[1] == "outside"
    problem, said = bound(inside, {})
    assert said == "not-compared" and problem is not None and "not measured" in problem
