"""Cost of the numeric trail per training step, and the verdict's calibration counts.

Part 1, overhead. Trains two models in this process, three ways each, interleaved by
round (the order rotates) so the machine's load hits all three alike:

* bare: no trail (the peer);
* digest: the launcher's per-step bit-sum fingerprint (``optimizer_fingerprint``);
* numeric: the fingerprint plus the numeric trail (``numeric_point``: loss, float64
  norm and 4 projections per parameter group), what every capture records now.

Models: the bundled example's SmallCNN (``examples/train.py``, batch 32, SGD) and a
third-party-style GPT block stack (nanoGPT's shape: 2 pre-LN layers, d=128, 4 heads,
context 64, batch 16, AdamW), on CPU. Printed: ms per step and numeric/bare, paired by
round (median, min, max).

Part 2, calibration (``--calibrate``): the planted set of ``tests/test_numeric.py`` (two
models on one thread, envelope from DEFAULT_RUNS one-ULP runs and threads 1 → 3, 4 rounding-only
re-runs and 12 planted changes each); prints false ``equivalent`` (must be 0), false
``differs`` and the step each planted change was caught at.

    python benchmarks/numeric_trail.py [--steps 40] [--rounds 7] [--threads 1] [--calibrate]
    python benchmarks/numeric_trail.py --plot docs/concepts/envelope.png
    CUBLAS_WORKSPACE_CONFIG=:4096:8 python benchmarks/numeric_trail.py --devices   # on a GPU
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


def _gpt(torch: Any) -> Any:
    nn = torch.nn

    class Block(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(128), nn.LayerNorm(128)
            self.attn = nn.MultiheadAttention(128, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))

        def forward(self, x: Any) -> Any:
            h = self.ln1(x)
            mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(256, 128), nn.Embedding(64, 128)
            self.blocks = nn.Sequential(Block(), Block())
            self.head = nn.Linear(128, 256)

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1])
            return self.head(self.blocks(self.wte(idx) + self.wpe(pos)))

    return GPT()


def train(kind: str, steps: int, mode: str) -> float:
    import torch
    import torch.nn.functional as F

    from manifest.launch.boot import _manifest_trail as trail

    torch.manual_seed(0)
    if kind == "cnn":
        from train import SmallCNN  # type: ignore[import-not-found]

        model = SmallCNN()
        data = torch.randn(512, 1, 16, 16)
        targets = (data.mean(dim=(1, 2, 3)) * 10).long().clamp(-4, 5) + 4
        opt: Any = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        batch = 32
    else:
        model = _gpt(torch)
        data = torch.randint(0, 256, (256, 64))
        targets = torch.roll(data, -1, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        batch = 16
    start = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, data.shape[0], (batch,))
        out = model(data[idx])
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), targets[idx].reshape(-1))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if mode != "bare":
            trail.optimizer_fingerprint(opt)
        if mode == "numeric":
            trail.numeric_point(trail.optimizer_groups(opt), loss)
    return (time.perf_counter() - start) / steps


def point_alone(kind: str, calls: int = 50) -> tuple[float, float]:
    """(digest, numeric point) ms per call in a tight loop: what each adds to a step when
    the machine is not busy with anything else."""
    import torch

    from manifest.launch.boot import _manifest_trail as trail

    if kind == "cnn":
        from train import SmallCNN

        model = SmallCNN()
    else:
        model = _gpt(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(1.0)
    out = []
    for fn in (lambda: trail.optimizer_fingerprint(opt),
               lambda: trail.numeric_point(trail.optimizer_groups(opt), loss)):
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e3)
    return out[0], out[1]


def overhead(steps: int, rounds: int) -> None:
    modes = ("bare", "digest", "numeric")
    for kind in ("cnn", "gpt"):
        for mode in modes:
            train(kind, 3, mode)  # warm-up: allocator, kernels, directions cached per model
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes[r % 3:] + modes[:r % 3]:
                times[mode].append(train(kind, steps, mode))
        bare = statistics.median(times["bare"])
        print(f"{kind}: {'mode':<8} {'median ms/step':>15} {'vs bare':>8}")
        for mode in modes:
            med = statistics.median(times[mode])
            print(f"{kind}: {mode:<8} {med * 1e3:>15.3f} {med / bare:>7.3f}x")
        for mode in ("digest", "numeric"):
            ratios = sorted(t / b for t, b in zip(times[mode], times["bare"], strict=True))
            print(f"{kind}: {mode}/bare paired by round: median {statistics.median(ratios):.3f}x"
                  f" (min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x)")
        digest, numeric = point_alone(kind)
        print(f"{kind}: alone, in a tight loop: digest {digest:.3f} ms, numeric point "
              f"{numeric:.3f} ms = {numeric / (bare * 1e3) * 100:.1f}% of the median bare step")


def calibrate() -> None:
    from manifest.models import NumericPoint
    from manifest.numeric.calibration import DEFAULT_RUNS
    from manifest.numeric.envelope import judge, measure_envelope
    from tests.numeric_runs import train as run
    from tests.test_numeric import BASE_THREADS, PLANTED, ROUNDING_ONLY

    false_equivalent = false_differs = planted = rounding = 0
    for kind in ("cnn", "transformer"):
        def points(kind: str = kind, **kw: Any) -> list[NumericPoint]:
            kw.setdefault("threads", BASE_THREADS)
            return [NumericPoint.model_validate(p) for p in run(kind, **kw)]

        base = points()
        env = measure_envelope(base, [(f"1 ULP (seed {s})", points(perturb=s))
                                      for s in range(1, DEFAULT_RUNS + 1)]
                               + [("threads 1 → 3", points(threads=3))])
        for name, kw in ROUNDING_ONLY.items():
            rounding += 1
            verdict = judge(base, points(**kw), env)
            false_differs += verdict.verdict != "equivalent"
            print(f"{kind:<11} rounding  {name:<18} {verdict.verdict:<10} {verdict.sentence()}")
        for plant, start in PLANTED.items():
            planted += 1
            verdict = judge(base, points(plant=plant), env)
            false_equivalent += verdict.verdict == "equivalent"
            print(f"{kind:<11} planted   {plant:<18} {verdict.verdict:<10} starts at step "
                  f"{start}, caught at {verdict.first_step}: {verdict.sentence()}")
    print(f"false equivalent: {false_equivalent} of {planted} planted changes; "
          f"false differs: {false_differs} of {rounding} rounding-only re-runs")


def plot(path: str) -> None:
    """The docs' figure: the Transformer's envelope, a rounding-only re-run it never saw,
    and three planted changes (docs/concepts/equivalent.md)."""
    from manifest.cli.render_envelope import envelope_png
    from manifest.models import NumericPoint
    from manifest.numeric.calibration import DEFAULT_RUNS
    from manifest.numeric.envelope import measure_envelope, step_distance
    from tests.numeric_runs import train as run

    def points(**kw: Any) -> list[NumericPoint]:
        return [NumericPoint.model_validate(p) for p in run("transformer", **kw)]

    base = points()
    env = measure_envelope(base, [(f"1 ULP (seed {s})", points(perturb=s))
                                      for s in range(1, DEFAULT_RUNS + 1)]
                           + [("threads 2 → 1", points(threads=1))])
    curves = {}
    for label, kw in (("threads 4 (rounding only, not in the envelope)", {"threads": 4}),
                      ("learning rate ×1.01 from step 1", {"plant": "lr"}),
                      ("another batch at step 5", {"plant": "swap@5"}),
                      ("1e-3 added to one weight at step 20", {"plant": "bias@20"})):
        other = points(**kw)
        curves[label] = [(a.step, max((step_distance(a, b) or (0.0, [0.0]))[1]))
                         for a, b in zip(base, other, strict=True)]
    png = envelope_png(env, curves, title="Transformer encoder layer, Adam, CPU: rounding "
                       "vs real changes")
    if png is None:
        raise SystemExit("the plot needs matplotlib (pip install 'torch-manifest[plot]')")
    Path(path).write_bytes(png)
    print(f"wrote {path}")


def devices() -> None:
    """A GPU against the CPU (``--devices``): each side's envelope measured on its own
    device, the other device's run judged against it, and planted changes made on the GPU
    judged against the CPU's envelope. Dropout is 0 here: masks come from each device's
    own generator, a different random stream, which is not rounding."""
    import torch

    from manifest.models import NumericPoint
    from manifest.numeric.calibration import DEFAULT_RUNS
    from manifest.numeric.envelope import judge, measure_envelope
    from tests.numeric_runs import train as run

    gpu = "cuda" if torch.cuda.is_available() else None
    print(f"torch {torch.__version__}; GPU: "
          f"{torch.cuda.get_device_name(0) if gpu else 'none (CPU twin: CPU against CPU)'}")
    other = gpu or "cpu"
    planted = ("lr", "loss", "shard", "wd", "swap@5", "bias@5", "labels@5", "bias@20")
    false_equivalent = 0
    for kind in ("cnn", "transformer"):
        def points(kind: str = kind, **kw: Any) -> list[NumericPoint]:
            kw.setdefault("threads", 1)
            kw.setdefault("dropout", 0.0)
            return [NumericPoint.model_validate(p) for p in run(kind, **kw)]

        for home, away in (("cpu", other), (other, "cpu")):
            base = points(device=home)
            runs = [(f"1 ULP (seed {s})", points(device=home, perturb=s))
                    for s in range(1, DEFAULT_RUNS + 1)]
            if home == "cpu":
                runs.append(("threads 1 → 3", points(device=home, threads=3)))
            env = measure_envelope(base, runs)
            verdict = judge(base, points(device=away), env)
            print(f"{kind:<11} {away} run vs {home} envelope: {verdict.verdict:<10} "
                  f"{verdict.sentence()}")
        base = points()
        env = measure_envelope(base, [(f"1 ULP (seed {s})", points(perturb=s))
                                      for s in range(1, DEFAULT_RUNS + 1)]
                               + [("threads 1 → 3", points(threads=3))])
        for plant in planted:
            verdict = judge(base, points(device=other, plant=plant), env)
            false_equivalent += verdict.verdict == "equivalent"
            print(f"{kind:<11} {other} planted {plant:<9} vs cpu envelope: {verdict.verdict:<10}"
                  f" {verdict.sentence()}")
    print(f"false equivalent across devices: {false_equivalent} of {2 * len(planted)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--plot", metavar="PNG", help="only draw the docs' envelope figure")
    parser.add_argument("--devices", action="store_true",
                        help="only the GPU-against-CPU verdicts (CPU against CPU without one)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.plot:
        plot(args.plot)
        return
    if args.devices:
        devices()
        return
    overhead(args.steps, args.rounds)
    if args.calibrate:
        calibrate()


if __name__ == "__main__":
    main()
