"""Feasibility of exact CPU replay of an H100 tensor-core matmul (issue 37, item 4).

A bit-exact CPU verify of a GPU run would have to compute each matmul as the tensor core
does. Three published models, each stated by its authors to be bit-accurate against real
GPUs, agree on Hopper's numerics (read from their code, not from memory):

* Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004
  (github north-numerical-computing/MATLAB-tensor-core, ``models/H100TC.m``:
  ``fma = 16`` for BF16 and ``fma = 8`` for TF32, ``neab = 2``, ``frmode = 'rz'``,
  ``stkbitenabled = 0``, ``min_exp_limit = -133``; ``GEMM.m`` chains blocks through the
  accumulator and converts TF32 inputs by round-toward-zero);
* Xie et al., MMA-Sim, arXiv 2511.10909 (github microsoft/MMA-Sim,
  ``mmasim/simulator/nv_ptx.py``: 25 fractional bits on Hopper, ``math.trunc`` on
  alignment, round-toward-zero into float32, TF32 inputs ``x >> 13 << 13``);
* Hawkeye, arXiv 2603.20421 (github badasherez/gpu-simulator, ``utils/utils.h``:
  ``HOPPER_ACCUMULATOR_GROUP_SIZE = 17``, ``HOPPER_SIGNIFICAND_WIDTH = 26``).

The model (``h100_mma``): inputs in the format (BF16 as given; FP32 → TF32 rounded to
nearest even, as measured below; the published models truncate); exact products; per
block of B products along K (BF16 16, TF32 8) together with the running float32
accumulator c, every term aligned to the largest exponent among the products (exponent
of a times exponent of b, the product's significand left in [1, 4)) and c, truncated
toward zero to 25 fractional bits below it, no sticky bit, summed exactly, normalised
once and rounded toward zero to float32; that result is c for the next block. Floor of
the alignment exponent: -133. ``split=S``: K cut into S contiguous slices, each such a
chain, the slices' float32 results added in order, to nearest (cuBLAS's split-K).

Measured against an H200's bits (``--dump`` there, ``--replay`` here; the file is kept in
``benchmarks/data/h200-matmuls.pt``, nine shapes from 32x8x32 to 32x1024x32 and
128x256x128, torch 2.11+cu130): **BF16** (``torch.mm`` with a float32 output, and
autocast's ``F.linear``) 100% of output bits with one chain; **TF32** 100% with inputs
rounded to nearest and K split in S = 1–16 slices, S chosen by cuBLAS per shape (read
from the data: it is a heuristic of the library, not predicted here); the published
TF32 model (inputs truncated, one chain) 0%. An H100 computed the same bits as the
H200 for every shape and format (its ``--dump`` compared tensor by tensor). CPU float32
reproduces 13–50% of the GPU's float32 (TF32 off) outputs where cuBLAS splits K there
too, 100% where it does not (32x32x32).

What this prints, on CPU:

* how many outputs of one Linear layer (batch 32, 64 → 32: the Transformer's head) the
  model changes against CPU float32 BLAS on the same rounded inputs: the bits an exact
  replay must get right and plain float32 does not;
* how sensitive those bits are to each parameter (block size, fractional bits, final
  rounding, input rounding, split): a model off by one parameter is wrong on that many
  outputs;
* the model's cost per multiply-add against torch's matmul, and what a whole training
  step of the bundled CNN and the Transformer would cost in matmuls alone.

On a machine with CUDA it also computes the same products on the GPU and prints how
many output bits the model, its rivals and CPU float32 each reproduce.

    python benchmarks/tensor_core.py --replay     # the H200's kept bits, here
    python benchmarks/tensor_core.py [--rounds 5] [--k 64]
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

FRACTION_BITS = 25
"""Hopper keeps 25 fractional bits below the block's largest exponent (MMA-Sim
``"Hopper": 25``; K&M ``neab = 2`` over float32's 23)."""
BLOCK = {"bf16": 16, "tf32": 8}
"""Products per fused block on Hopper: BF16 mma k16 / wgmma k16; TF32 mma k8 / wgmma k8."""
EXPONENT_FLOOR = -133


def to_format(torch: Any, x: Any, fmt: str, tf32: str = "rn") -> Any:
    """float32 ``x`` as the tensor core reads it: BF16 rounded to nearest even (a bf16
    tensor is already rounded when made), TF32 rounded to nearest even (measured on an
    H200: ``tf32="rz"``, the published models' truncation, reproduces no output bit;
    ``"rna"``, ties away, loses on the inputs' ties)."""
    if fmt == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    if tf32 == "rna":  # to nearest, ties away from zero (PTX cvt.rna.tf32.f32)
        bits = x.contiguous().view(torch.int32)
        return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)
    if tf32 == "rn":
        from manifest.launch.boot._manifest_precision import round_mantissa

        return round_mantissa(x, "tf32")
    return (x.contiguous().view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)


def _exponent(torch: Any, x: Any) -> Any:
    """floor(log2 |x|) of float64 ``x`` (exact: frexp), a very low value for zeros."""
    _, exponent = torch.frexp(x)
    return torch.where(x == 0, torch.full_like(exponent, -100_000), exponent - 1)


def _round_toward_zero_f32(torch: Any, x: Any) -> Any:
    """float64 ``x`` rounded toward zero to float32 (torch's cast rounds to nearest)."""
    near = x.float()
    over = near.double().abs() > x.abs()
    toward = torch.nextafter(near, torch.zeros_like(near))
    return torch.where(over, toward, near)


def h100_mma(torch: Any, a: Any, b: Any, fmt: str, *, block: int | None = None,
             fraction: int = FRACTION_BITS, final: str = "rz", tf32: str = "rn",
             split: int = 1) -> Any:
    """``a @ b`` (float32 (m, k) and (k, n), float32 out) as the model above computes it;
    ``block``, ``fraction``, ``final`` ('rz' or 'rn') and ``tf32`` (the inputs' rounding:
    'rn' as measured, 'rz' as published) are the model's parameters, for the sensitivity
    rows (defaults: Hopper's). ``split``: K cut into that many contiguous slices, each its
    own chain, the slices' float32 results added in order (cuBLAS's split-K)."""
    if split > 1:
        size = a.shape[1] // split
        if size * split != a.shape[1]:
            raise ValueError(f"k={a.shape[1]} does not split into {split} slices")
        total = None
        for i in range(split):
            part = h100_mma(torch, a[:, i * size:(i + 1) * size],
                            b[i * size:(i + 1) * size], fmt, block=block, fraction=fraction,
                            final=final, tf32=tf32)
            total = part if total is None else total + part  # float32, to nearest
        return total
    block = block or BLOCK[fmt]
    ar = to_format(torch, a, fmt, tf32).double()
    br = to_format(torch, b, fmt, tf32).double()
    m, k = ar.shape
    n = br.shape[1]
    ea = _exponent(torch, ar)
    eb = _exponent(torch, br)
    acc = torch.zeros(m, n, dtype=torch.float32)
    for start in range(0, k, block):
        stop = min(start + block, k)
        products = ar[:, start:stop, None] * br[None, start:stop, :]  # exact in float64
        exps = ea[:, start:stop, None] + eb[None, start:stop, :]
        exps = torch.where(products == 0, torch.full_like(exps, -100_000), exps)
        c = acc.double()
        top = torch.maximum(exps.amax(dim=1), _exponent(torch, c))
        top = top.clamp_min(EXPONENT_FLOOR)
        quantum = torch.pow(2.0, (top - fraction).double())[:, None, :]
        terms = torch.cat([products, c[:, None, :]], dim=1)
        total = (torch.trunc(terms / quantum) * quantum).sum(dim=1)  # exact: < 2^53
        acc = _round_toward_zero_f32(torch, total) if final == "rz" else total.float()
    return acc


def _compare(torch: Any, out: Any, reference: Any) -> tuple[float, float]:
    """Share of outputs whose bits differ, and the largest difference in float32 ULPs."""
    eps = torch.finfo(torch.float32).eps
    ulp = ((out.double() - reference.double()).abs()
           / (reference.double().abs().clamp_min(1e-30) * eps))
    return (out != reference).float().mean().item(), ulp.max().item()


VARIANTS = (("block 4", {"block": 4}), ("block 8", {"block": 8}),
            ("block 16", {"block": 16}), ("block 32", {"block": 32}),
            ("24 fractional bits", {"fraction": 24}),
            ("26 fractional bits", {"fraction": 26}),
            ("final rounding to nearest", {"final": "rn"}),
            ("TF32 inputs truncated (published)", {"tf32": "rz"}),
            ("K split in 2 (cuBLAS split-K)", {"split": 2}))
"""The sensitivity rows, and on a GPU the rivals the device's bits choose between."""


def on_cpu(torch: Any, x: Any, w: Any) -> dict[str, Any]:
    print(f"one Linear (32x{x.shape[1]} @ {x.shape[1]}x32), the H100 model against CPU "
          "float32 BLAS on the same rounded inputs:")
    models = {}
    for fmt in ("bf16", "tf32"):
        reference = to_format(torch, x, fmt) @ to_format(torch, w, fmt)
        models[fmt] = h100_mma(torch, x, w, fmt)
        changed, ulp = _compare(torch, models[fmt], reference)
        print(f"  {fmt} (B={BLOCK[fmt]}, {FRACTION_BITS} fractional bits, RZ): {changed:6.1%} "
              f"of outputs differ from CPU float32, up to {ulp:.1f} ULP")
        for label, kwargs in VARIANTS:
            if fmt == "bf16" and "tf32" in kwargs:
                continue
            variant = h100_mma(torch, x, w, fmt, **kwargs)
            off, _ = _compare(torch, variant, models[fmt])
            print(f"    {fmt} with {label:<26}: {off:6.1%} of outputs differ from the model")
    return models


def cost(torch: Any, x: Any, w: Any, rounds: int) -> None:
    timings: dict[str, list[float]] = {"torch": [], "model": []}
    xb, wb = to_format(torch, x, "bf16"), to_format(torch, w, "bf16")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(50):
            xb @ wb
        timings["torch"].append((time.perf_counter() - start) / 50)
        start = time.perf_counter()
        h100_mma(torch, x, w, "bf16")
        timings["model"].append(time.perf_counter() - start)
    macs = x.shape[0] * x.shape[1] * w.shape[1]
    model_ns = statistics.median(timings["model"]) / macs * 1e9
    torch_ns = statistics.median(timings["torch"]) / macs * 1e9
    print(f"cost: the model {model_ns:.1f} ns per multiply-add against torch's "
          f"{torch_ns:.2f} ns ({model_ns / torch_ns:.0f}x), median of {rounds} rounds")
    import importlib.util

    spec = importlib.util.spec_from_file_location("precision_bench",
                                                  REPO / "benchmarks" / "precision.py")
    assert spec is not None and spec.loader is not None
    precision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(precision)  # its multiply-add count of one training step
    for kind in ("cnn", "transformer"):
        macs_step = precision._macs_per_step(torch, kind)
        print(f"  a {kind} training step ({macs_step / 1e6:.1f} M multiply-adds in matmuls "
              f"and convolutions): about {macs_step * model_ns / 1e9:.2f} s in this model, "
              "before the other ops a bit-exact replay would also have to model")


def _gpu_matmul(torch: Any, xc: Any, wc: Any, tf32: bool) -> Any:
    """``xc @ wc`` on the GPU with TF32 allowed or not, back on CPU; the switch restored."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return (xc @ wc).cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def on_gpu(torch: Any, x: Any, w: Any, models: dict[str, Any]) -> None:
    if not torch.cuda.is_available():
        print("GPU: none here; the model's bits against an H100's: NOT measured")
        return
    name = torch.cuda.get_device_name()
    xc, wc = x.cuda(), w.cuda()
    tf32 = _gpu_matmul(torch, xc, wc, True)
    outputs = {"tf32": tf32}
    try:
        outputs["bf16"] = torch.mm(xc.bfloat16(), wc.bfloat16(),
                                   out_dtype=torch.float32).cpu()
    except (TypeError, RuntimeError) as exc:
        print(f"GPU bf16 with a float32 output: not available in this torch ({exc})")
    for fmt, gpu in outputs.items():
        reference = to_format(torch, x, fmt) @ to_format(torch, w, fmt)
        off_model, ulp_model = _compare(torch, models[fmt], gpu)
        off_cpu, ulp_cpu = _compare(torch, reference, gpu)
        print(f"{name} {fmt}: the model differs from the GPU on {off_model:.1%} of outputs "
              f"(up to {ulp_model:.1f} ULP); CPU float32 on {off_cpu:.1%} "
              f"(up to {ulp_cpu:.1f} ULP)")
        for label, kwargs in VARIANTS:
            if fmt == "bf16" and "tf32" in kwargs:
                continue
            off, ulp = _compare(torch, h100_mma(torch, x, w, fmt, **kwargs), gpu)
            print(f"    {fmt} model with {label:<30}: differs from the GPU on {off:6.1%} "
                  f"(up to {ulp:.1f} ULP)")
    full = _gpu_matmul(torch, xc, wc, False)
    off_full, _ = _compare(torch, full, tf32)
    off_cpu32, ulp_cpu32 = _compare(torch, x @ w, full)
    print(f"{name} float32 (TF32 off): the TF32 result differs from it on {off_full:.1%} of "
          f"outputs; CPU float32 differs from it on {off_cpu32:.1%} (up to {ulp_cpu32:.1f} ULP)")
    tf32_search(torch, x, w, tf32, name)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        linear = torch.nn.functional.linear(xc, wc.t()).float().cpu()
    modelled = models["bf16"].to(torch.bfloat16).float()
    print(f"{name} autocast bf16 Linear (bf16 output): the model's bits differ on "
          f"{(modelled != linear).float().mean().item():.1%} of outputs")


def tf32_search(torch: Any, x: Any, w: Any, gpu: Any, name: str) -> None:
    """Which TF32 model the device's bits choose: every input rounding (toward zero, to
    nearest even, to nearest away), block size and kept fraction, both final roundings;
    the closest five."""
    rows = []
    for inputs in ("rz", "rn", "rna"):
        for block in (4, 8, 16, 32, x.shape[1]):
            for fraction in (23, 24, 25, 26, 27, 30):
                for final in ("rz", "rn"):
                    model = h100_mma(torch, x, w, "tf32", block=block, fraction=fraction,
                                     final=final, tf32=inputs)
                    off, ulp = _compare(torch, model, gpu)
                    rows.append((off, ulp, f"inputs {inputs}, block {block}, "
                                           f"{fraction} fractional bits, final {final}"))
    rows.sort()
    for off, ulp, label in rows[:5]:
        print(f"    {name} tf32 closest: {label}: {off:.1%} of outputs differ "
              f"(up to {ulp:.1f} ULP)")


SHAPES = ((32, 8, 32), (32, 16, 32), (32, 32, 32), (32, 64, 32), (32, 128, 32),
          (32, 256, 32), (32, 1024, 32), (128, 64, 128), (128, 256, 128))
"""(m, k, n) of the products ``--dump`` keeps, from one block to split-K sizes."""


def dump(torch: Any, path: Path) -> None:
    """On a GPU: the inputs and the device's outputs (TF32 on, off; BF16 with a float32
    output) of ``SHAPES``, as ``x @ w`` and as ``F.linear``, for searching a model offline."""
    rows = []
    for m, k, n in SHAPES:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k * 1000 + m))
        w = torch.randn(k, n, generator=torch.Generator().manual_seed(k * 1000 + n + 1)) / 8
        xc, wc = x.cuda(), w.cuda()
        row = {"x": x, "w": w}
        for tf32 in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            key = "tf32" if tf32 else "fp32"
            row[key] = (xc @ wc).cpu()
            row[key + "_linear"] = torch.nn.functional.linear(xc, wc.t().contiguous()).cpu()
        torch.backends.cuda.matmul.allow_tf32 = False
        row["bf16"] = torch.mm(xc.bfloat16(), wc.bfloat16(), out_dtype=torch.float32).cpu()
        rows.append(row)
    torch.save({"device": torch.cuda.get_device_name(), "torch": str(torch.__version__),
                "rows": rows}, path)
    print(f"wrote {path}: {len(rows)} shapes")


SPLITS = (1, 2, 4, 8, 16, 32)
"""The split-K slice counts a replay tries (cuBLAS picks one per shape)."""


def replay(torch: Any, path: Path) -> list[dict[str, Any]]:
    """The model against a GPU's kept outputs (``--dump``): per shape, the share of
    output bits it reproduces in BF16 (one chain), in TF32 as published (inputs
    truncated, one chain) and in TF32 as measured (inputs to nearest, K split into the
    first slice count of ``SPLITS`` that reproduces every bit, else the best), and CPU
    float32 against the GPU's float32 (TF32 off)."""
    data = torch.load(path, weights_only=True)
    print(f"replay of {data['device']}'s matmuls (torch {data['torch']}), share of output "
          "bits reproduced:")
    results = []
    for row in data["rows"]:
        x, w = row["x"], row["w"]
        (m, k), n = x.shape, w.shape[1]

        def same(out: Any, ref: Any) -> float:
            return float((out == ref).float().mean().item())

        bf16 = same(h100_mma(torch, x, w, "bf16"), row["bf16"])
        published = same(h100_mma(torch, x, w, "tf32", tf32="rz"), row["tf32"])
        tried = [(same(h100_mma(torch, x, w, "tf32", split=s), row["tf32"]), -s)
                 for s in SPLITS if k % s == 0 and k // s >= 4]
        exact = [t for t in tried if t[0] == 1.0]
        tf32, split = max(exact, key=lambda t: t[1]) if exact else max(tried)
        cpu = same(x @ w, row["fp32"])
        results.append({"shape": (m, k, n), "bf16": bf16, "tf32_published": published,
                        "tf32": tf32, "split": -split, "cpu_fp32": cpu})
        print(f"  {m}x{k}x{n}: BF16 {bf16:6.1%}; TF32 as published {published:6.1%}, "
              f"inputs to nearest and K in {-split:>2} slices {tf32:6.1%}; "
              f"CPU float32 against the GPU's float32 {cpu:6.1%}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--k", type=int, default=64, help="the inner dimension (default 64)")
    parser.add_argument("--dump", type=Path, help="on a GPU: keep inputs and the device's "
                        "outputs of several shapes in this file (torch.save) and stop")
    parser.add_argument("--replay", type=Path, nargs="?", const=REPO / "benchmarks" / "data"
                        / "h200-matmuls.pt", help="the model against a kept --dump file "
                        "(default: the H200's, benchmarks/data/h200-matmuls.pt) and stop")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.dump:
        dump(torch, args.dump)
        return
    if args.replay:
        replay(torch, args.replay)
        return

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(32, args.k)
    w = torch.randn(args.k, 32) / 8
    models = on_cpu(torch, x, w)
    cost(torch, x, w, args.rounds)
    on_gpu(torch, x, w, models)


if __name__ == "__main__":
    main()
