"""Cost of the automatic step trail and of op-level fingerprints, per training step.

Trains the bundled example's model (``examples/train.py``: SmallCNN, batch
32, SGD with momentum) in this process three ways, interleaved so the
machine's load hits all three alike, and prints the median time per step:

* bare: the peer;
* trail: with the launcher's per-optimizer-step parameter fingerprint
  (``optimizer_fingerprint``: two int32 sums over each parameter group's bits
  on its device, one transfer per step), as every capture now records;
* ops: inside the op recorder (``_manifest_ops``), fingerprinting every aten
  op's inputs and outputs, as ``manifest explain`` does for one step.

    python benchmarks/trail_overhead.py [--steps 60] [--rounds 7] [--threads 1]

The trail's cost on larger models (1 M and 25 M parameters), with the numeric trail and
against the implementation before issue 40, is ``benchmarks/step_cost.py``.
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


def train(steps: int, mode: str) -> float:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from train import SmallCNN  # type: ignore[import-not-found]

    from manifest.launch.boot import _manifest_ops, _manifest_trail

    torch.manual_seed(0)
    images = torch.randn(512, 1, 16, 16)
    labels = (images.mean(dim=(1, 2, 3)) * 10).long().clamp(-4, 5) + 4
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    points: list[Any] = []
    handle = None
    if mode == "trail":
        handle = register_optimizer_step_post_hook(
            lambda o, a, k: points.append(_manifest_trail.optimizer_fingerprint(o)))
    recorder = _manifest_ops.OpRecorder(points.append) if mode == "ops" else None
    start = time.perf_counter()
    if recorder is not None:
        recorder.__enter__()
    for _ in range(steps):
        idx = torch.randint(0, images.shape[0], (32,))
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    if recorder is not None:
        recorder.__exit__(None, None, None)
    elapsed = time.perf_counter() - start
    if handle is not None:
        handle.remove()
    return elapsed / steps


def fingerprint_alone(calls: int = 2000) -> float:
    import torch
    from train import SmallCNN

    from manifest.launch.boot import _manifest_trail

    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _manifest_trail.optimizer_fingerprint(opt)
    start = time.perf_counter()
    for _ in range(calls):
        _manifest_trail.optimizer_fingerprint(opt)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    modes = ("bare", "trail", "ops")
    for mode in modes:
        train(5, mode)  # warm-up: allocator, kernels, imports
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        # The order rotates every round: whichever runs first after another mode
        # pays for allocator and cache state, and must not always be the same one.
        for mode in modes[r % 3:] + modes[:r % 3]:
            times[mode].append(train(args.steps, mode))
    # min is the least disturbed by other load on the machine; median for the record.
    bare_min, bare_med = min(times["bare"]), statistics.median(times["bare"])
    print(f"{'mode':<6} {'min ms/step':>12} {'ratio':>7} {'median ms/step':>15} {'ratio':>7}")
    for mode in modes:
        lo, med = min(times[mode]), statistics.median(times[mode])
        print(f"{mode:<6} {lo * 1e3:>12.3f} {lo / bare_min:>6.3f}x {med * 1e3:>15.3f} "
              f"{med / bare_med:>6.3f}x")
    ratios = sorted(t / b for t, b in zip(times["trail"], times["bare"], strict=True))
    print(f"trail/bare paired by round: median {statistics.median(ratios):.3f}x "
          f"(min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x)")
    # The fingerprint alone, timed in a tight loop: what the trail adds to a step
    # when the machine is not busy with anything else.
    alone = fingerprint_alone()
    print(f"trail fingerprint alone: {alone * 1e3:.3f} ms/step = "
          f"{alone / bare_min * 100:.1f}% of the fastest bare step")


if __name__ == "__main__":
    main()
