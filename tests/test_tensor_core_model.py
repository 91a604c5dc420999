"""The H100 tensor-core model of ``benchmarks/tensor_core.py`` (issue 37, feasibility).

The model is a benchmark, not a product path, but its arithmetic is checked here so the
feasibility numbers it prints stand on a model that does what its docstring says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_SPEC = importlib.util.spec_from_file_location(
    "tensor_core_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "tensor_core.py")
assert _SPEC is not None and _SPEC.loader is not None
tc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(tc)


def test_without_truncation_the_model_is_the_exact_sum_rounded_to_nearest() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(8, 48, generator=gen)
    b = torch.randn(48, 8, generator=gen)
    out = tc.h100_mma(torch, a, b, "bf16", block=48, fraction=60, final="rn")
    exact = (tc.to_format(torch, a, "bf16").double()
             @ tc.to_format(torch, b, "bf16").double()).float()
    assert torch.equal(out, exact)
    # the Hopper parameters do change bits against that exact sum (the control)
    assert not torch.equal(tc.h100_mma(torch, a, b, "bf16"), exact)


def test_the_block_sum_is_rounded_toward_zero_and_tf32_inputs_are_rounded() -> None:
    # 1 + 3·2^-25 is kept whole by 25 fractional bits; rounding it to float32 toward zero
    # gives 1, to nearest 1 + 2^-23 (0.75 of an ULP), which is what CPU float32 gives.
    a = torch.tensor([[1.0, 3 * 2.0 ** -25]])
    b = torch.tensor([[1.0], [1.0]])
    assert tc.h100_mma(torch, a, b, "bf16").item() == 1.0
    assert tc.h100_mma(torch, a, b, "bf16", final="rn").item() == 1.0 + 2.0 ** -23
    assert (tc.to_format(torch, a, "bf16") @ b).item() == 1.0 + 2.0 ** -23
    x = torch.tensor([1.0 + 2.0 ** -11 + 2.0 ** -12])  # TF32 keeps 10 fraction bits
    assert tc.to_format(torch, x, "tf32").item() == 1.0 + 2.0 ** -10  # to nearest (measured)
    assert tc.to_format(torch, x, "tf32", "rz").item() == 1.0  # truncated (published)
    assert tc.to_format(torch, x, "bf16").item() == 1.0


def test_terms_below_the_blocks_25_fractional_bits_are_dropped() -> None:
    # 2^-27 is below 2^(0-25): truncated away when it shares a block with 1, kept when the
    # block holds it alone (the block then aligns to its own exponent).
    a = torch.tensor([[1.0, 2.0 ** -27]])
    b = torch.tensor([[1.0], [1.0]])
    assert tc.h100_mma(torch, a, b, "bf16", final="rn").item() == 1.0
    alone = tc.h100_mma(torch, a[:, 1:], b[1:], "bf16")
    assert alone.item() == 2.0 ** -27


def test_split_k_is_slices_added_in_order() -> None:
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(4, 32, generator=gen)
    b = torch.randn(32, 4, generator=gen)
    halves = (tc.h100_mma(torch, a[:, :16], b[:16], "tf32")
              + tc.h100_mma(torch, a[:, 16:], b[16:], "tf32"))
    assert torch.equal(tc.h100_mma(torch, a, b, "tf32", split=2), halves)
    assert not torch.equal(tc.h100_mma(torch, a, b, "tf32"), halves)  # the control
    with pytest.raises(ValueError, match="does not split"):
        tc.h100_mma(torch, a, b, "tf32", split=3)


def test_the_model_reproduces_an_h200s_matmul_bits() -> None:
    """Against the outputs an H200 computed (torch 2.11+cu130, cuBLAS; ``tensor_core.py
    --dump``, kept in benchmarks/data): BF16 bit for bit with one chain over K; TF32 bit
    for bit with its inputs rounded to nearest and K split as cuBLAS split it; the
    published TF32 model (inputs truncated, one chain) reproduces no output bit."""
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h200-matmuls.pt"
    results = tc.replay(torch, data)
    assert len(results) == 9 and max(r["shape"][1] for r in results) == 1024
    for r in results:
        assert r["bf16"] == 1.0 and r["tf32"] == 1.0, r
        assert r["tf32_published"] < 0.01, r
    assert sorted({r["split"] for r in results}) == [1, 2, 4, 8, 16]
    # CPU float32 is not the GPU's float32 where cuBLAS split K (the other control)
    assert all(r["cpu_fp32"] < 0.5 for r in results if r["split"] > 1)
