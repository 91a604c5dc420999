"""Equivalent across device types on CPU (issue 37): calibration per precision pair,
the emulation's cost per step, and a feasibility test of exact tensor-core replay.

Part 1, calibration. Per model family (tests/numeric_runs.py: the bundled example's CNN,
a Transformer layer, a GRU; one thread) and per precision (TF32, bf16 autocast), a
float32 base run and an envelope of DEFAULT_RUNS runs under the precision's CPU emulation
(``launch/boot/_manifest_precision``), each with its own one-ULP seed, as the boot runs
an envelope run (``numeric.precision``). Then, each under the same emulation:

* honest re-runs: fresh one-ULP seeds at threads 1 and 2, rounding to nearest (as a
  device does) → false ``differs``, against the product's envelope ("nearest": its runs
  round to nearest too) and the measured alternative ("seeded": each envelope run its
  own stochastic rounding, wider);
* planted changes: lr ×1.01, lr ×1.001, a swapped batch at step 5, a bias at step 5 →
  false ``equivalent``, with the envelope's resolution beside it;
* the control of the issue: the honest re-runs against the float32 envelope (one-ULP
  runs, no emulation) → how often that calls rounding a change.

Part 2, cost: ms per training step with and without the emulation (interleaved rounds,
median), and the matmul work of one step (multiply-adds counted by a dispatch mode).

Part 3, feasibility (``--tensor-core``): a CPU model of a tensor-core matmul for one
Linear layer in Hawkeye's manner (arXiv 2603.20421): inputs rounded to the input format,
exact products, summed in groups of G along K with every term aligned to the group's
largest exponent and truncated to P bits, then added to the float32 accumulator.
Hawkeye's H100 values of G and P were NOT found (its text was not reachable here beyond
the abstract), so G and P are arguments, not claims; the comparison with an H100's
output bits was NOT measured (no GPU in this task). Printed: how many output elements
each (G, P) changes against CPU float32 on the same rounded inputs (the bits an exact
replay must get right), and the cost per multiply-add, extrapolated to a training step.

    python benchmarks/precision.py [--steps 20] [--honest 6] [--families cnn,transformer,gru]
    python benchmarks/precision.py --quick
    python benchmarks/precision.py --tensor-core
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO))

PLANTED = ("lr", "lr1e-3", "swap@5", "bias@5")


def _pts(trail: list[dict[str, Any]]) -> list[Any]:
    from manifest.models import NumericPoint

    return [NumericPoint.model_validate(p) for p in trail]


def calibrate(families: list[str], steps: int, honest: int) -> None:
    from manifest.launch.boot._manifest_precision import emulating
    from manifest.numeric.calibration import DEFAULT_RUNS, resolution
    from manifest.numeric.envelope import ULP_LABEL, judge
    from manifest.numeric.precision import at_precision
    from tests.numeric_runs import train

    print(f"calibration: {steps} steps, envelopes of {DEFAULT_RUNS} emulated one-ULP runs, "
          f"{honest} honest re-runs (fresh seeds, threads 1-2) per pair; 'nearest': the "
          "product (every run rounds to nearest), 'seeded': each envelope run its own "
          "stochastic rounding (the measured alternative)")
    print(f"{'family':12} {'pair':10} {'false differs':>14} {'fp32 env':>9} "
          f"{'false equiv':>12} {'resolution':>11}  planted: nearest ×bound | seeded")
    for kind in families:
        base = _pts(train(kind, steps=steps, threads=1))
        fp32 = at_precision(base, [(f"{ULP_LABEL} (seed {s})",
                                    _pts(train(kind, steps=steps, threads=1, perturb=s)))
                                   for s in range(1, DEFAULT_RUNS + 1)], "fp32", "measured")
        for precision in ("tf32", "bf16"):
            seeded_runs = []
            for s in range(1, DEFAULT_RUNS + 1):
                with emulating(precision, seed=s):
                    seeded_runs.append((f"{ULP_LABEL} (seed {s})",
                                        _pts(train(kind, steps=steps, threads=1, perturb=s))))
            seeded = at_precision(base, seeded_runs, precision, "emulated")
            with emulating(precision):
                nearest = at_precision(base, [
                    (f"{ULP_LABEL} (seed {s})",
                     _pts(train(kind, steps=steps, threads=1, perturb=s)))
                    for s in range(1, DEFAULT_RUNS + 1)], precision, "emulated")
                out = {"nearest": 0, "seeded": 0, "fp32": 0}
                for i in range(honest):
                    again = _pts(train(kind, steps=steps, threads=1 + i % 2, perturb=1000 + i))
                    out["nearest"] += judge(base, again, nearest).verdict != "equivalent"
                    out["seeded"] += judge(base, again, seeded).verdict != "equivalent"
                    out["fp32"] += judge(base, again, fp32).verdict == "differs"
                planted, wrong = [], {"nearest": 0, "seeded": 0}
                for plant in PLANTED:
                    again = _pts(train(kind, steps=steps, threads=1, plant=plant))
                    said = []
                    for name, envelope in (("nearest", nearest), ("seeded", seeded)):
                        verdict = judge(base, again, envelope)
                        wrong[name] += verdict.verdict == "equivalent"
                        times = verdict.times_outside
                        said.append("equiv" if verdict.verdict == "equivalent" else
                                    f"{times:.3g}×" if times is not None else verdict.verdict)
                    planted.append(f"{plant} {' | '.join(said)}")
            res = [resolution(e) for e in (nearest, seeded)]
            print(f"{kind:12} fp32→{precision:5} {out['nearest']:>4}/{honest} | "
                  f"{out['seeded']}/{honest:<3} {out['fp32']:>5}/{honest:<3} "
                  f"{wrong['nearest']:>4}/{len(PLANTED)} | {wrong['seeded']}/{len(PLANTED)} "
                  f"{' | '.join('-' if r is None else format(r, '.2g') for r in res):>13}  "
                  f"{'; '.join(planted)}")


def cost(families: list[str], steps: int, rounds: int) -> None:
    import torch

    from manifest.launch.boot._manifest_precision import emulating
    from tests.numeric_runs import train

    print(f"\nemulation cost: {steps} steps per run, {rounds} rounds, 1 thread, median ms/step")
    for kind in families:
        train(kind, steps=2, threads=1)  # warm-up: imports, first-call allocations
        times: dict[str, list[float]] = {"fp32": [], "tf32": [], "bf16": []}
        for r in range(rounds):
            order = list(times)[r % 3:] + list(times)[:r % 3]
            for precision in order:
                start = time.perf_counter()
                with emulating(precision):
                    train(kind, steps=steps, threads=1)
                times[precision].append((time.perf_counter() - start) / steps * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        macs = _macs_per_step(torch, kind)
        print(f"{kind:12} fp32 {med['fp32']:.2f} ms  tf32 {med['tf32']:.2f} ms "
              f"({med['tf32'] / med['fp32']:.2f}×)  bf16 {med['bf16']:.2f} ms "
              f"({med['bf16'] / med['fp32']:.2f}×)  matmul work {macs / 1e6:.1f} M MAC/step")


def _macs_per_step(torch: Any, kind: str) -> int:
    """Multiply-adds of every mm/bmm/addmm/convolution in one training step (forward and
    backward), counted by a dispatch mode on a step of tests/numeric_runs.py's model."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.numeric_runs import _model

    count = [0]

    class Count(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm", "bmm", "baddbmm"):
                a = args[1] if name in ("addmm", "baddbmm") else args[0]
                count[0] += out.numel() * a.shape[-1]
            elif name == "convolution":
                w = args[1]
                count[0] += out.numel() * w[0].numel()
            elif name == "convolution_backward":
                w = args[2]
                count[0] += 2 * args[0].numel() * w[0].numel()
            return out

    torch.manual_seed(0)
    model = _model(torch, kind, 0.1)
    x = torch.randint(0, 32, (32, 12)) if kind != "cnn" else torch.randn(32, 1, 16, 16)
    with Count():  # type: ignore[no-untyped-call]
        model(x).float().sum().backward()
    return count[0]


# ------------------------------------------------------------- tensor-core model


def tensor_core_matmul(torch: Any, a: Any, b: Any, *, fmt: str, group: int,
                       bits: int) -> Any:
    """``a @ b`` (float32 in and out) the way an aligned-accumulator tensor core computes
    it: inputs rounded to ``fmt``; exact products (float64 holds a product of two ≤11-bit
    mantissas exactly); per group of ``group`` products along K, together with the
    running accumulator, every term aligned to the largest exponent and truncated toward
    zero to ``bits`` bits below it; the group's sum then rounded to float32 (nearest
    even) as the new accumulator."""
    from manifest.launch.boot._manifest_precision import round_mantissa

    ar = round_mantissa(a, fmt).double()
    br = round_mantissa(b, fmt).double()
    m, k = ar.shape
    n = br.shape[1]
    acc = torch.zeros(m, n, dtype=torch.float64)
    for start in range(0, k, group):
        terms = ar[:, start:start + group, None] * br[None, start:start + group, :]
        terms = torch.cat([terms, acc[:, None, :]], dim=1)  # (m, g + 1, n)
        top = terms.abs().amax(dim=1, keepdim=True)
        exponent = torch.floor(torch.log2(torch.where(top > 0, top, torch.ones_like(top))))
        quantum = torch.pow(2.0, exponent - bits + 1)
        aligned = torch.trunc(terms / quantum) * quantum
        acc = aligned.sum(dim=1).float().double()
    return acc.float()


def tensor_core(rounds: int) -> None:
    import torch

    from manifest.launch.boot._manifest_precision import round_mantissa

    torch.manual_seed(0)
    x = torch.randn(32, 64)  # one Linear layer: batch 32, 64 → 32 (the Transformer's head)
    w = torch.randn(64, 32) / 8
    print("\ntensor-core replay of one Linear (32×64 @ 64×32), CPU only; H100 bits: NOT "
          "measured (no GPU); Hawkeye's H100 group size and bits: NOT found, swept here")
    for fmt in ("bf16", "tf32"):
        reference = round_mantissa(x, fmt) @ round_mantissa(w, fmt)  # CPU float32 BLAS
        for group in (4, 8, 16):
            for bits in (24, 25, 28):
                out = tensor_core_matmul(torch, x, w, fmt=fmt, group=group, bits=bits)
                ulp = (out - reference).abs() / torch.finfo(torch.float32).eps \
                    / reference.abs().clamp_min(1e-30)
                changed = (out != reference).float().mean().item()
                print(f"  {fmt} G={group:<2} P={bits}: {changed:6.1%} of outputs differ from "
                      f"CPU float32, up to {ulp.max().item():.1f} ULP")
    timings: dict[str, list[float]] = {"torch": [], "model": []}
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(20):
            round_mantissa(x, "bf16") @ round_mantissa(w, "bf16")
        timings["torch"].append((time.perf_counter() - start) / 20)
        start = time.perf_counter()
        tensor_core_matmul(torch, x, w, fmt="bf16", group=16, bits=25)
        timings["model"].append(time.perf_counter() - start)
    macs = 32 * 64 * 32
    model_ns = statistics.median(timings["model"]) / macs * 1e9
    torch_ns = statistics.median(timings["torch"]) / macs * 1e9
    print(f"  cost: model {model_ns:.1f} ns/MAC against torch's {torch_ns:.2f} ns/MAC "
          f"({model_ns / torch_ns:.0f}×)")
    for kind in ("cnn", "transformer"):
        macs_step = _macs_per_step(torch, kind)
        print(f"  a whole {kind} training step ({macs_step / 1e6:.1f} M MAC in matmuls and "
              f"convolutions): about {macs_step * model_ns / 1e9:.2f} s in this model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--honest", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--families", default="cnn,transformer,gru")
    parser.add_argument("--quick", action="store_true",
                        help="one family, 10 steps, 2 honest re-runs, 3 rounds")
    parser.add_argument("--tensor-core", action="store_true",
                        help="only the feasibility part (one Linear layer)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.tensor_core:
        tensor_core(args.rounds)
        return
    families = args.families.split(",")
    if args.quick:
        families, args.steps, args.honest, args.rounds = ["transformer"], 10, 2, 3
    calibrate(families, args.steps, args.honest)
    cost(families, args.steps, args.rounds)


if __name__ == "__main__":
    main()
