"""What recording costs (issue 40): the step fingerprint and the numeric sketch, cheaply
and with the same guarantees.

* The exact fingerprint reads each parameter once into a reused int32 buffer: no int64
  copy of a tensor (an op-level spy shows the old squared-int64 way made one), the same
  digest whatever the buffer size (the size a GPU uses is the CPU twin of the CUDA
  branch), and it still catches the compensating ±1-ULP plant that a plain bit sum
  misses.
* The numeric sketch is linear, its mean square estimates |Δθ|² with the variance of
  SKETCH projections (measured over random Δ), it does not depend on the chunk size
  beyond float64 rounding, and a point of the old 4-value format is refused rather than
  compared.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from manifest.launch.boot import _manifest_trail as trail  # noqa: E402
from manifest.models import NumericPoint  # noqa: E402
from manifest.numeric.envelope import step_distance  # noqa: E402

# ---------------------------------------------------------------- fingerprint


class _Spy(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the dtype and size of every new tensor an aten op returns (views of its
    inputs' storage, and results written into a given ``out``, are not new memory)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.outputs: list[tuple[Any, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [*args, *(kwargs or {}).values()]
        flat = [x for a in inputs for x in (a if isinstance(a, (list, tuple)) else [a])]
        seen = {x.untyped_storage().data_ptr() for x in flat if isinstance(x, torch.Tensor)}
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.outputs.append((t.dtype, t.numel()))
        return out


def _old_squares(opt: Any) -> None:
    """The fingerprint's old second sum: an int64 copy of every parameter, squared."""
    for group in opt.param_groups:
        for p in group["params"]:
            p.detach().view(-1).view(torch.int32).to(torch.int64).square_().sum()


def _groups(*params: Any) -> Any:
    return type("Opt", (), {"param_groups": [{"params": list(params)}]})()


def test_fingerprint_makes_no_int64_copy_of_a_parameter() -> None:
    weight = torch.nn.Parameter(torch.randn(300, 200))
    opt = _groups(weight)
    unsafe = _Spy()
    with unsafe:
        _old_squares(opt)
    # positive control: the spy sees the old way's int64 copy of all 60,000 elements
    assert any(d == torch.int64 and n == weight.numel() for d, n in unsafe.outputs)
    trail.optimizer_fingerprint(opt)  # the first call makes the reused buffer
    spy = _Spy()
    with spy:
        trail.optimizer_fingerprint(opt)
    assert not any(d == torch.int64 and n > 2 for d, n in spy.outputs), spy.outputs
    # nor any other copy: the one int32 buffer, made at the first call, is reused
    assert max(n for _, n in spy.outputs) <= 2, spy.outputs


def _mixed_model() -> list[Any]:
    torch.manual_seed(3)
    return [torch.nn.Parameter(torch.randn(257, 31)),
            torch.nn.Parameter(torch.randn(999).to(torch.bfloat16)),  # odd count of 2-byte
            torch.nn.Parameter(torch.randn(5, 7, dtype=torch.float64)),
            torch.nn.Parameter(torch.randn(3, 4).t()),  # not contiguous
            torch.nn.Parameter(torch.empty(0))]


def test_fingerprint_is_the_same_for_every_buffer_size_the_cpu_twin_of_a_gpu() -> None:
    params = _mixed_model()
    opt = type("Opt", (), {"param_groups": [{"params": params[:2]}, {"params": params[2:]}]})()
    digests = {size: trail.optimizer_fingerprint(opt, words=size)
               for size in (1, 7, 1000, trail.WORDS, trail.FUSED_WORDS)}
    assert len(set(digests.values())) == 1, digests
    assert trail.optimizer_fingerprint(opt) == digests[1]
    with torch.no_grad():
        params[1].view(torch.int16)[998] += 1  # the last bf16 element, one ULP
    assert trail.optimizer_fingerprint(opt, words=7) != digests[1]
    assert trail.optimizer_fingerprint(opt, words=trail.FUSED_WORDS) \
        == trail.optimizer_fingerprint(opt, words=7)


def test_an_in_place_update_is_seen_through_kept_plans_even_of_a_transposed_parameter() -> None:
    params = _mixed_model()
    opt = _groups(*params)
    first = trail.optimizer_fingerprint(opt), _point(params)
    assert (trail.optimizer_fingerprint(opt), _point(params)) == first  # plans kept
    for p in params[:4]:
        with torch.no_grad():
            before = trail.optimizer_fingerprint(opt), _point(params)
            p.mul_(1.5)  # in place, as an optimizer step (params[3] is not contiguous)
        after = trail.optimizer_fingerprint(opt), _point(params)
        assert after[0] != before[0] and after[1] != before[1], p.shape


def _plain_sum_digest(p: Any) -> int:
    return int(p.detach().view(-1).view(torch.int32).sum(dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fingerprint_catches_the_compensating_one_ulp_plant(dtype: Any) -> None:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4096).to(dtype))
    opt = _groups(p)
    before_digest = trail.optimizer_fingerprint(opt)
    ints = p.detach().view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
    plain_before = int(ints.sum(dtype=torch.int64))
    with torch.no_grad():
        ints[100] += 1  # +1 ULP here …
        ints[2000] -= 1  # … -1 ULP there: what a planted ULP's gradients did
    # positive control: the plain bit sum, the fingerprint's first half, misses it
    assert int(ints.sum(dtype=torch.int64)) == plain_before
    assert trail.optimizer_fingerprint(opt) != before_digest
    with torch.no_grad():
        ints[100] -= 1
        ints[2000] += 1
    assert trail.optimizer_fingerprint(opt) == before_digest


# ------------------------------------------------------------------- numeric sketch


def _point(params: list[Any], chunk: int | None = None) -> list[list[float]]:
    out = trail.numeric_point([params], None, chunk=chunk)
    assert out is not None
    groups: list[list[float]] = out["groups"]
    return groups


def _flat_bound(params: list[Any]) -> float:
    """Float64 summation's error bound for these elements: n · eps · Σ|x|."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in params])
    return float(flat.numel() * torch.finfo(torch.float64).eps * flat.abs().sum())


def test_sketch_does_not_depend_on_the_chunk_size_beyond_float64_rounding() -> None:
    torch.manual_seed(1)
    params = [torch.randn(70_000), torch.randn(3).double(), torch.randn(200_001).bfloat16()]
    ref = _point(params, chunk=trail.FUSED_CHUNK)[0]
    bound = _flat_bound(params) * math.sqrt(trail.SKETCH)
    for chunk in (trail.BLOCK, 3 * trail.BLOCK, None):
        got = _point(params, chunk=chunk)[0]
        assert len(got) == trail.SKETCH + 1
        assert max(abs(a - b) for a, b in zip(ref[1:], got[1:], strict=True)) <= bound
        assert got[0] == pytest.approx(ref[0], rel=math.sqrt(bound))


def test_sketch_is_linear_and_one_changed_weight_is_measured_exactly() -> None:
    torch.manual_seed(2)
    a = torch.randn(150_000, dtype=torch.float64)
    delta = torch.zeros_like(a)
    delta[123_457] = 0.25
    va, vb = _point([a])[0], _point([a + delta])[0]
    estimate = math.sqrt(statistics.fmean((x - y) ** 2
                                          for x, y in zip(va[1:], vb[1:], strict=True)))
    vd = _point([delta])[0]
    assert vd[0] == 0.25
    # one element lands in one bucket, times sqrt(SKETCH): mean square = 0.25²
    assert math.sqrt(statistics.fmean(x * x for x in vd[1:])) == pytest.approx(0.25, rel=1e-12)
    assert estimate == pytest.approx(0.25, abs=_flat_bound([a, a]) * trail.SKETCH)


def test_sketch_estimates_the_distance_with_the_variance_of_its_size() -> None:
    """Over random Δ, mean_m v_m(Δ)² / |Δ|² has mean 1 and variance about 2/SKETCH."""
    gen = torch.Generator().manual_seed(5)
    ratios = []
    for _ in range(200):
        delta = torch.randn(80_000, generator=gen, dtype=torch.float64) \
            * torch.rand(80_000, generator=gen, dtype=torch.float64)
        v = _point([delta])[0]
        ratios.append(statistics.fmean(x * x for x in v[1:]) / float(delta.dot(delta)))
    expected_sd = math.sqrt(2 / trail.SKETCH)
    # the mean of 200 draws is within 4 standard errors of 1
    assert abs(statistics.fmean(ratios) - 1) < 4 * expected_sd / math.sqrt(len(ratios))
    assert 0.5 * expected_sd < statistics.stdev(ratios) < 1.5 * expected_sd


def test_a_point_of_the_old_four_projection_format_is_refused_not_compared() -> None:
    torch.manual_seed(4)
    new = _point([torch.randn(1000)])[0]
    old = NumericPoint(step=1, loss=1.0, groups=[[new[0], 1.0, 2.0, 3.0, 4.0]])
    now = NumericPoint(step=1, loss=1.0, groups=[new])
    assert step_distance(now, now) is not None  # positive control: same format compares
    assert step_distance(old, now) is None


# ------------------------------------------------------------- recording's share


@pytest.mark.slow
def test_each_process_records_its_recording_share_and_show_prints_it(tmp_path: Any) -> None:
    from tests.runs import capture, make_repo, manifest_cli

    repo = make_repo(tmp_path / "r", {})
    path, doc = capture(repo, "--seed", "0", "--threads", "1")
    [cost] = doc["observed"]["recording"]
    assert cost["rank"] == 0
    wall_s = (doc["observed"]["compute"]["wall_s"] if doc["observed"].get("compute")
              else None)
    assert cost["seconds"] > 0 and 0 < cost["share"] < 1
    if wall_s:
        assert cost["seconds"] < wall_s
    shown = manifest_cli("show", str(path), cwd=repo)
    assert shown.returncode == 0, shown.stderr.decode()
    assert "recording, rank 0" in shown.stdout.decode()
    # positive control: without the trails nothing is recorded, and show says nothing
    path, doc = capture(repo, "--seed", "0", "--threads", "1", "--no-trail", name="bare.json")
    assert "recording" not in doc["observed"]
    shown = manifest_cli("show", str(path), cwd=repo)
    assert "recording, rank" not in shown.stdout.decode()
