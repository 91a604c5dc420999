"""What recording costs per training step (issue 40): paired, interleaved, medians and spread.

Trains three models in this process, each three ways (four with ``--before``), interleaved
by round with the order rotating so the machine's load hits every mode alike:

* ``bare``: no recording (the peer);
* ``trail``: the launcher's step fingerprint after every optimizer step
  (``optimizer_fingerprint``), as every capture records;
* ``numeric``: the fingerprint plus the numeric trail's point (``numeric_point``), what
  every capture records by default;
* ``before`` (``--before FILE``): fingerprint plus numeric point of another copy of
  ``_manifest_trail.py``, e.g. the one before issue 40:
  ``git show 9fa212d:manifest/launch/boot/_manifest_trail.py > /tmp/before_trail.py``.

Models: the bundled example's SmallCNN (``examples/train.py``: batch 32, SGD with
momentum), and two nanoGPT-shaped models (pre-LN blocks, causal self-attention, GELU
MLP, tied head, AdamW): ``gpt1m`` (d=128, 5 layers, context 64, batch 16: 1.06 M
parameters) and ``gpt25m`` (d=512, 8 layers, context 128, batch 8: 25.5 M).
Printed per model and mode: the median ms per step, the per-round ratio to bare
(median, min, max), and the recording's own time measured around its calls, as a share
of the step (what ``manifest show`` prints per process).

``--sketch-error`` instead measures the numeric sketch against the dense projections it
replaced, on the calibration models of ``tests/numeric_runs.py``: each step's estimated
relative distance between a base run and a rounding-only or planted run, over the
exact distance computed from both runs' parameters.

    python benchmarks/step_cost.py [--models cnn,gpt1m,gpt25m] [--steps 5] [--rounds 5]
                                   [--threads 1] [--before /tmp/before_trail.py]
    python benchmarks/step_cost.py --device cuda --dtype bfloat16 --models gpt25m   # a GPU
    python benchmarks/step_cost.py --sketch-error
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO))

SHAPES = {"gpt1m": dict(d=128, layers=5, context=64, batch=16, vocab=512),
          "gpt25m": dict(d=512, layers=8, context=128, batch=8, vocab=512)}


def _gpt(torch: Any, d: int, layers: int, context: int, vocab: int) -> Any:
    nn = torch.nn
    F = torch.nn.functional

    class Block(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, 4, d // 4).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln_2(x))

    class GPT(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied, as nanoGPT

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.ln_f(self.blocks(self.wte(idx) + self.wpe(pos))))

    return GPT()


class Setup:
    """One model, its optimizer and data, kept across rounds (so each mode trains on)."""

    def __init__(self, torch: Any, kind: str, device: str, dtype: Any) -> None:
        self.torch, self.kind, self.device = torch, kind, device
        torch.manual_seed(0)
        if kind == "cnn":
            from train import SmallCNN  # type: ignore[import-not-found]

            self.model = SmallCNN()
            self.data = torch.randn(512, 1, 16, 16)
            self.targets = (self.data.mean(dim=(1, 2, 3)) * 10).long().clamp(-4, 5) + 4
            self.opt: Any = None
            self.batch = 32
        else:
            shape = SHAPES[kind]
            self.model = _gpt(torch, shape["d"], shape["layers"], shape["context"],
                              shape["vocab"])
            self.data = torch.randint(0, shape["vocab"], (256, shape["context"]))
            self.targets = torch.roll(self.data, -1, 1)
            self.batch = shape["batch"]
        self.model = self.model.to(device=device, dtype=dtype)
        self.data = self.data.to(device) if kind != "cnn" else self.data.to(device, dtype)
        self.targets = self.targets.to(device)
        params = list(self.model.parameters())
        self.opt = (torch.optim.SGD(params, lr=0.05, momentum=0.9) if kind == "cnn"
                    else torch.optim.AdamW(params, lr=3e-4))
        self.parameters = sum(p.numel() for p in params)

    def run(self, steps: int, record: Any, clock: Any) -> tuple[float, float]:
        """(seconds per step, seconds of recording per step) by ``clock``."""
        torch = self.torch
        F = torch.nn.functional
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        recording = 0.0
        sync()
        start = clock()
        for _ in range(steps):
            idx = torch.randint(0, self.data.shape[0], (self.batch,), device=self.device)
            out = self.model(self.data[idx])
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(),
                                   self.targets[idx].reshape(-1))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if record is not None:
                began = clock()
                record(self.opt, loss)
                recording += clock() - began
        sync()
        return (clock() - start) / steps, recording / steps


def _recorders(before: str | None) -> dict[str, Any]:
    from manifest.launch.boot import _manifest_trail as trail

    def numeric(module: Any) -> Any:
        def record(opt: Any, loss: Any) -> None:
            module.optimizer_fingerprint(opt)
            module.numeric_point(module.optimizer_groups(opt), loss)
        return record

    modes: dict[str, Any] = {"bare": None,
                             "trail": lambda opt, loss: trail.optimizer_fingerprint(opt),
                             "numeric": numeric(trail)}
    if before:
        spec = importlib.util.spec_from_file_location("_before_trail", before)
        if spec is None or spec.loader is None:
            raise SystemExit(f"--before {before}: not a Python file")
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        modes["before"] = numeric(old)
    return modes


def overhead(kinds: list[str], steps: int, rounds: int, device: str, dtype_name: str,
             before: str | None, wall: bool) -> None:
    import torch

    # On a shared CPU the thread's own CPU time is what recording adds to a step; the
    # wall clock also counts the time other processes held the core (--wall to use it).
    clock = time.perf_counter if wall or device != "cpu" else time.thread_time

    dtype = getattr(torch, dtype_name)
    modes = _recorders(before)
    names = list(modes)
    print(f"torch {torch.__version__}, {device}, {dtype_name}, threads "
          f"{torch.get_num_threads()}; {steps} steps × {rounds} rounds, order rotating; "
          f"clock: {'wall' if clock is time.perf_counter else 'thread CPU time'}")
    for kind in kinds:
        setup = Setup(torch, kind, device, dtype)
        for name in names:
            setup.run(1, modes[name], clock)  # warm-up: allocator, kernels, cached buffers
        times: dict[str, list[float]] = {m: [] for m in names}
        shares: dict[str, list[float]] = {m: [] for m in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                per_step, recording = setup.run(steps, modes[name], clock)
                times[name].append(per_step)
                shares[name].append(recording / per_step)
        bare = statistics.median(times["bare"])
        print(f"{kind} ({setup.parameters:,} parameters): bare "
              f"{bare * 1e3:.1f} ms/step")
        for name in names[1:]:
            ratios = sorted(t / b for t, b in zip(times[name], times["bare"], strict=True))
            print(f"  {name:<8} {statistics.median(times[name]) * 1e3:9.1f} ms/step  paired "
                  f"ratio median {statistics.median(ratios):.3f} (min {ratios[0]:.3f}, max "
                  f"{ratios[-1]:.3f})  recording's own share {statistics.median(shares[name]):.2%}")


def _dense(torch: Any, flat: Any, k: int = 4) -> list[float]:
    """The numeric trail before issue 40: k rank-1 Gaussian directions over the group seen
    as a rows × cols matrix, float64 (its ``_directions`` and projection, for one bucket)."""
    size = flat.numel()
    cols = math.isqrt(size - 1) + 1
    rows = -(-size // cols)
    gen = torch.Generator().manual_seed(0x6D616E69 + 1)
    a = torch.randn(rows, k, generator=gen, dtype=torch.float64)
    b = torch.randn(cols, k, generator=gen, dtype=torch.float64)
    padded = torch.nn.functional.pad(flat, (0, rows * cols - size))
    return [float(x) for x in ((padded.view(rows, cols) @ b) * a).sum(0)]


def sketch_error() -> None:
    """Estimated over exact relative distance, per step, dense (4) against the sketch."""
    import torch

    from manifest.launch.boot import _manifest_trail as trail
    from tests import numeric_runs

    real = trail.numeric_point

    def run(kind: str, **kw: Any) -> list[tuple[Any, list[float], list[float]]]:
        kept: list[tuple[Any, list[float], list[float]]] = []

        def spy(groups: list[list[Any]], loss: Any, **more: Any) -> Any:
            flat = torch.cat([p.detach().reshape(-1).double() for g in groups for p in g
                              if p.is_floating_point()])
            point = real(groups, loss, **more)
            sketch = [v for g in point["groups"] for v in g[1:]] if point else []
            kept.append((flat, _dense(torch, flat), sketch))
            return point

        trail.numeric_point = spy
        try:
            numeric_runs.train(kind, **{"steps": 20, "threads": 1, **kw})
        finally:
            trail.numeric_point = real
        return kept

    print(f"dense: 4 projections per model; sketch: {trail.SKETCH} values per parameter "
          "group (pooled over groups here)")
    errors: dict[str, list[float]] = {"dense": [], "sketch": []}
    for kind in numeric_runs.KINDS:
        base = run(kind)
        for label, kw in (("1 ULP (seed 1)", {"perturb": 1}), ("threads 3", {"threads": 3}),
                          ("lr ×1.001", {"plant": "lr1e-3"}), ("bias@5", {"plant": "bias@5"})):
            other = run(kind, **kw)
            mine: dict[str, list[float]] = {"dense": [], "sketch": []}
            for (fa, da, sa), (fb, db, sb) in zip(base, other, strict=True):
                exact = float((fa - fb).norm())
                if exact == 0:
                    continue
                for name, x, y in (("dense", da, db), ("sketch", sa, sb)):
                    estimate = math.sqrt(statistics.fmean((p - q) ** 2 for p, q in zip(x, y,
                                                                                     strict=True)))
                    mine[name].append(estimate / exact)
            for name, values in mine.items():
                errors[name].extend(abs(v - 1) for v in values)
            print(f"{kind:<11} {label:<15} estimate/exact over {len(mine['dense'])} steps: "
                  + "; ".join(f"{n} median {statistics.median(v):.3f} "
                              f"[{min(v):.3f}, {max(v):.3f}]" for n, v in mine.items() if v))
    for name, values in errors.items():
        values.sort()
        print(f"{name}: |estimate/exact - 1| median {statistics.median(values):.3f}, "
              f"90th percentile {values[int(0.9 * (len(values) - 1))]:.3f}, "
              f"max {values[-1]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="cnn,gpt1m,gpt25m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--before", metavar="FILE", help="another _manifest_trail.py to time")
    parser.add_argument("--sketch-error", action="store_true")
    parser.add_argument("--wall", action="store_true", help="time by the wall clock on a CPU too")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.sketch_error:
        sketch_error()
        return
    kinds = [k for k in args.models.split(",") if k]
    unknown = [k for k in kinds if k != "cnn" and k not in SHAPES]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)} (cnn, gpt1m, gpt25m)")
    overhead(kinds, args.steps, args.rounds, args.device, args.dtype, args.before, args.wall)


if __name__ == "__main__":
    main()
