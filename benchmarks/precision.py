"""Equivalent across device types on CPU (issue 37): calibration per precision pair,
and the emulation's cost per step (the feasibility of exact tensor-core replay is
``benchmarks/tensor_core.py``).

Part 1, calibration. Per model family (tests/numeric_runs.py: the bundled example's CNN,
a Transformer layer, a GRU; one thread) and per precision (TF32, bf16 autocast): a
float32 base run, its emulated twin (``numeric.twin``: the recipe once more under the
precision's emulation, unperturbed), a pool of one-ULP emulated runs and one at threads 2.
Several envelopes are drawn from the pool (DEFAULT_RUNS runs each, as capture makes one),
measured against the twin; those ``check_twin`` refuses are counted and decide nothing.
Against each envelope verify accepts, each under the same emulation:

* honest re-runs: fresh one-ULP seeds at threads 1 and 2 → false ``differs``, with the
  closest one's distance over the bound;
* planted changes: lr ×1.01, lr ×1.001, a swapped batch at step 5, a bias at step 5 →
  false ``equivalent``, with the smallest ratio over the bound; each twice: as the
  twin's number for number up to the change (what an emulated re-run is), and parted
  from the twin from step 1 by a fresh one-ULP seed (what a device re-run would be);
* "unguarded": the same counts over every envelope, the refused ones too.

Part 2, cost: ms per training step with and without the emulation (interleaved rounds,
median), and the matmul work of one step (multiply-adds counted by a dispatch mode).

Part 3, the feasibility of exact tensor-core replay, is ``benchmarks/tensor_core.py``.

    python benchmarks/precision.py [--steps 20] [--honest 6] [--families cnn,transformer,gru]
    python benchmarks/precision.py --quick
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


def _ratio(verdict: Any) -> float:
    """Distance over bound at the closest step (equivalent) or the first outside (differs)."""
    if verdict.verdict == "equivalent":
        return float(verdict.closest or 0.0)
    times = verdict.times_outside
    return float("nan") if times is None else float(times)


def calibrate(families: list[str], steps: int, honest: int, pool: int,
              envelopes: int) -> None:
    import random

    from manifest.launch.boot._manifest_precision import emulating
    from manifest.numeric.calibration import DEFAULT_RUNS, resolution
    from manifest.numeric.envelope import ULP_LABEL, judge
    from manifest.numeric.precision import at_precision
    from manifest.numeric.twin import check_twin
    from tests.numeric_runs import train

    print(f"calibration: {steps} steps; {envelopes} envelopes per pair, each {DEFAULT_RUNS} "
          f"emulated one-ULP runs drawn from {pool} and one at threads 2, measured against "
          f"the run's emulated twin; {honest} honest re-runs (fresh seeds, threads 1-2) and "
          f"{len(PLANTED)} planted changes judged against each envelope verify accepts "
          "(numeric.twin.check_twin); 'unguarded': every envelope, refused ones too; ratio = "
          "distance / bound at the closest step (honest) or the first step outside (planted)")
    print(f"{'family':12} {'pair':10} {'refused':>8} {'false differs':>14} {'false equiv':>12} "
          f"{'closest honest':>15} {'smallest planted':>17} {'resolution':>11}  unguarded: "
          "false differs, false equiv, smallest planted; planted runs parted from the twin "
          "(a fresh one-ULP seed, as a device re-run is)")
    for kind in families:
        base = _pts(train(kind, steps=steps, threads=1))
        for precision in ("tf32", "bf16"):
            with emulating(precision):
                twin = _pts(train(kind, steps=steps, threads=1))
                runs = [(f"{ULP_LABEL} (seed {s})",
                         _pts(train(kind, steps=steps, threads=1, perturb=s)))
                        for s in range(1, pool + 1)]
                threads = ("threads 1 → 2", _pts(train(kind, steps=steps, threads=2)))
                again = [_pts(train(kind, steps=steps, threads=1 + i % 2, perturb=1000 + i))
                         for i in range(honest)]
                planted = [_pts(train(kind, steps=steps, threads=1, plant=p))
                           for p in PLANTED]
                # as a device re-run would: parted from the twin from step 1 on
                parted = [_pts(train(kind, steps=steps, threads=1, plant=p, perturb=2000 + j))
                          for j, p in enumerate(PLANTED)]
            draw = random.Random(kind + precision)
            counts = {"refused": 0, "differs": 0, "equiv": 0, "judged": 0,
                      "u_differs": 0, "u_equiv": 0, "parted": 0, "u_parted": 0}
            missed: set[str] = set()
            closest, smallest, u_smallest = 0.0, float("inf"), float("inf")
            shown: list[float] = []
            for _ in range(envelopes):
                chosen = [*draw.sample(runs, DEFAULT_RUNS), threads]
                envelope = at_precision(base, chosen, precision, "emulated", twin=twin)
                accepted = not check_twin(envelope, base)
                counts["refused"] += not accepted
                counts["judged"] += accepted
                for trail in again:
                    verdict = judge(twin, trail, envelope)
                    counts["u_differs"] += verdict.verdict != "equivalent"
                    if accepted:
                        counts["differs"] += verdict.verdict != "equivalent"
                        closest = max(closest, _ratio(verdict))
                for trail in planted:
                    verdict = judge(twin, trail, envelope)
                    counts["u_equiv"] += verdict.verdict == "equivalent"
                    ratio = _ratio(verdict) if verdict.verdict == "differs" else 0.0
                    u_smallest = min(u_smallest, ratio)
                    if accepted:
                        counts["equiv"] += verdict.verdict == "equivalent"
                        smallest = min(smallest, ratio)
                for plant, trail in zip(PLANTED, parted, strict=True):
                    verdict = judge(twin, trail, envelope)
                    counts["u_parted"] += verdict.verdict == "equivalent"
                    if accepted and verdict.verdict == "equivalent":
                        counts["parted"] += 1
                        missed.add(plant)
                if accepted and (seen := resolution(envelope)) is not None:
                    shown.append(seen)
            n_h, n_p = honest * counts["judged"], len(PLANTED) * counts["judged"]
            res = format(statistics.median(shown), ".2g") if shown else "-"
            print(f"{kind:12} fp32→{precision:5} {counts['refused']:>4}/{envelopes:<3} "
                  f"{counts['differs']:>7}/{n_h:<6} {counts['equiv']:>6}/{n_p:<5} "
                  f"{closest:>15.3g} {smallest:>17.3g} {res:>11}  "
                  f"{counts['u_differs']}/{honest * envelopes}, "
                  f"{counts['u_equiv']}/{len(PLANTED) * envelopes}, {u_smallest:.3g}; "
                  f"parted plants false equiv {counts['parted']}/{n_p} "
                  f"({', '.join(sorted(missed)) or '-'}), unguarded "
                  f"{counts['u_parted']}/{len(PLANTED) * envelopes}", flush=True)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--honest", type=int, default=30)
    parser.add_argument("--pool", type=int, default=12, help="one-ULP runs to draw from")
    parser.add_argument("--envelopes", type=int, default=8, help="envelopes per pair")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--families", default="cnn,transformer,gru")
    parser.add_argument("--quick", action="store_true",
                        help="one family, 10 steps, 2 honest re-runs, 3 rounds")
    parser.add_argument("--no-cost", action="store_true", help="only the calibration")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    families = args.families.split(",")
    if args.quick:
        families, args.steps, args.honest, args.rounds = ["transformer"], 10, 4, 3
        args.pool, args.envelopes = 8, 3
    calibrate(families, args.steps, args.honest, args.pool, args.envelopes)
    if not args.no_cost:
        cost(families, args.steps, args.rounds)


if __name__ == "__main__":
    main()
