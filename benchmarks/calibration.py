"""Both error rates of ``equivalent`` (issue 36): false ``differs`` on honest re-runs,
false ``equivalent`` on planted changes and hostile envelopes.

Three model families (``tests/numeric_runs.py``: the bundled example's SmallCNN with SGD,
a Transformer encoder layer with Adam, a GRU language model with Adam) × three lengths,
trained in this process on one thread. Per family and length:

* a base run (threads 1), ``2 × runs`` one-ULP runs (fresh seeds) and thread counts 2-4;
* two envelopes, A from the first half of the seeds plus threads 1 → 2, B from the
  second half plus threads 1 → 3 (``DEFAULT_RUNS`` one-ULP runs each, as capture makes);
* honest re-runs: every one-ULP run of the other half, and the thread counts the
  envelope did not see, each judged against the envelope that never saw it;
* planted changes, judged against both envelopes: learning rate ×1.01 and ×1.001, another
  batch at step k, 1e-3 on one weight at step k (k = half the run);
* hostile envelopes (A rewritten by the manifest's author): every distance ×1e6, first-
  step distances [1e-300, 1, 1], no parameter groups with loss distances 1.0, and
  distances ×1e6 after the first step only. Each must be refused by ``check_envelope`` or
  leave ``narrow`` (the verifier's own B, narrowed by it) no wider, and the planted
  learning rate ×1.01 judged against it must not be ``equivalent``.

Printed per family and length: false ``differs`` / honest, false ``equivalent`` /
planted, the resolution (smallest relative change at step 1 the bound sees, median of
the two envelopes), the closest honest call (distance / bound), and the envelope's cost
against the base run (one thread): its one-ULP runs together, and its thread-count run
(a 2-thread run on a busy 2-core box spins and costs far more than on an idle one).

    python benchmarks/calibration.py            # 3 families × 10, 40, 200 steps
    python benchmarks/calibration.py --quick    # 3 families × 10, 40 steps, CI-sized
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _hostile(env: Any) -> dict[str, Any]:
    from manifest.models import Envelope, EnvelopeStep

    def scaled(factor: float, after: int = 0) -> Envelope:
        return Envelope(runs=list(env.runs), steps=[EnvelopeStep(
            step=s.step, loss=[x * factor if i >= after else x for x in s.loss],
            groups=[[x * factor if i >= after else x for x in g] for g in s.groups])
            for i, s in enumerate(env.steps)])

    first = env.steps[0]
    odd = Envelope(runs=["1 ULP (seed 1)", "1 ULP (seed 2)", "1 ULP (seed 3)"], steps=[
        EnvelopeStep(step=s.step, loss=[0.0, 0.0, 0.0],
                     groups=[[1e-300, 1.0, 1.0] for _ in first.groups])
        for s in env.steps])
    empty = Envelope(runs=list(env.runs), steps=[
        EnvelopeStep(step=s.step, loss=[1.0] * len(env.runs), groups=[]) for s in env.steps])
    return {"×1e6": scaled(1e6), "first step [1e-300, 1, 1]": odd,
            "groups [] with loss 1.0": empty, "×1e6 after step 1": scaled(1e6, after=1)}


def cell(kind: str, steps: int, runs: int) -> dict[str, Any]:
    from manifest.models import NumericPoint
    from manifest.numeric.calibration import check_envelope, narrow, resolution
    from manifest.numeric.envelope import judge, measure_envelope
    from tests.numeric_runs import train

    timings: list[float] = []

    def points(**kw: Any) -> list[NumericPoint]:
        kw.setdefault("threads", 1)
        start = time.perf_counter()
        out = [NumericPoint.model_validate(p) for p in train(kind, steps=steps, **kw)]
        timings.append(time.perf_counter() - start)
        return out

    train(kind, steps=min(steps, 5), threads=1)  # warm-up: first calls, lazy imports
    base = points()
    ulp = {s: points(perturb=s) for s in range(1, 2 * runs + 1)}
    threads = {n: points(threads=n) for n in (2, 3, 4)}
    halves = {"A": (list(range(1, runs + 1)), 2), "B": (list(range(runs + 1, 2 * runs + 1)), 3)}
    envelopes = {name: measure_envelope(base, [(f"1 ULP (seed {s})", ulp[s]) for s in seeds]
                                        + [(f"threads 1 → {t}", threads[t])])
                 for name, (seeds, t) in halves.items()}
    honest = false_differs = 0
    closest: list[float] = []
    misses: list[str] = []
    for name, (seeds, seen) in halves.items():
        env = envelopes[name]
        for s, trail in ulp.items():
            if s in seeds:
                continue
            verdict = judge(base, trail, env)
            honest += 1
            if verdict.verdict != "equivalent":
                false_differs += 1
                misses.append(f"1 ULP seed {s} vs {name}: {verdict.sentence()}")
            elif verdict.closest is not None:
                closest.append(verdict.closest)
        for t, trail in threads.items():
            if t == seen:
                continue
            verdict = judge(base, trail, env)
            honest += 1
            if verdict.verdict != "equivalent":
                false_differs += 1
                misses.append(f"threads {t} vs {name}: {verdict.sentence()}")
            elif verdict.closest is not None:
                closest.append(verdict.closest)
    k = max(2, steps // 2)
    planted = false_equivalent = 0
    lr = None
    for plant in ("lr", "lr1e-3", f"swap@{k}", f"bias@{k}"):
        trail = points(plant=plant)
        lr = trail if plant == "lr" else lr
        for name, env in envelopes.items():
            verdict = judge(base, trail, env)
            planted += 1
            if verdict.verdict == "equivalent":
                false_equivalent += 1
                misses.append(f"planted {plant} vs {name}: equivalent, {verdict.sentence()}")
    assert lr is not None
    for label, hostile in _hostile(envelopes["A"]).items():
        planted += 1
        refused = bool(check_envelope(hostile))
        narrowed = narrow(envelopes["B"], hostile)
        own = narrow(envelopes["B"], None)
        wider = any(x > y for b, o in zip(narrowed.bounds, own.bounds, strict=True)
                    for x, y in zip([b.loss, *b.groups], [o.loss, *o.groups], strict=True))
        verdict = judge(base, lr, None, calibration=narrowed)
        if wider or verdict.verdict == "equivalent":
            false_equivalent += 1
            misses.append(f"hostile {label}: narrow widened={wider}, {verdict.sentence()}")
        elif not refused:
            misses.append(f"hostile {label}: passes check_envelope; narrow kept the "
                          "verifier's bound")
    one = timings[0]
    ulp_cost = sum(timings[1:1 + runs]) / one
    thread_cost = timings[1 + 2 * runs] / one
    return {"kind": kind, "steps": steps, "honest": honest, "false_differs": false_differs,
            "planted": planted, "false_equivalent": false_equivalent,
            "resolution": statistics.median(resolution(e) or 0.0 for e in envelopes.values()),
            "closest": max(closest, default=0.0), "one_run_s": one,
            "ulp_x": ulp_cost, "thread_x": thread_cost, "misses": misses}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10 and 40 steps only")
    parser.add_argument("--runs", type=int, default=None,
                        help="one-ULP runs per envelope (default: DEFAULT_RUNS)")
    parser.add_argument("--kinds", default="cnn,transformer,gru")
    parser.add_argument("--lengths", default=None, help="e.g. 10,40,200")
    args = parser.parse_args()
    import torch

    from manifest.numeric.calibration import ALPHA, DEFAULT_RUNS

    torch.set_num_threads(1)
    runs = args.runs or DEFAULT_RUNS
    lengths = [int(x) for x in (args.lengths or ("10,40" if args.quick else "10,40,200"))
               .split(",")]
    print(f"torch {torch.__version__}, 1 thread; envelopes of {runs} one-ULP runs + one "
          f"thread count, modelled for a false-differs rate of {ALPHA:g}")
    print(f"{'family':<12}{'steps':>6}{'false differs':>15}{'false equiv.':>14}"
          f"{'resolution':>12}{'closest':>9}{'1 run s':>9}{'1-ULP runs ×':>14}"
          f"{'threads 2 ×':>12}")
    totals = [0, 0, 0, 0]
    for kind in args.kinds.split(","):
        for steps in lengths:
            r = cell(kind, steps, runs)
            totals = [totals[0] + r["false_differs"], totals[1] + r["honest"],
                      totals[2] + r["false_equivalent"], totals[3] + r["planted"]]
            print(f"{kind:<12}{steps:>6}{r['false_differs']:>8} of {r['honest']:<3}"
                  f"{r['false_equivalent']:>7} of {r['planted']:<3}{r['resolution']:>12.2g}"
                  f"{r['closest']:>9.2f}{r['one_run_s']:>9.2f}{r['ulp_x']:>13.1f}×"
                  f"{r['thread_x']:>11.1f}×",
                  flush=True)
            for miss in r["misses"]:
                print(f"    {miss}")
    print(f"false differs: {totals[0]} of {totals[1]} honest re-runs; false equivalent: "
          f"{totals[2]} of {totals[3]} planted changes and hostile envelopes")


if __name__ == "__main__":
    main()
