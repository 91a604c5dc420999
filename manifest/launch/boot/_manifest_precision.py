"""A device's matmul precision, emulated on CPU: TF32 tensor cores or bf16 autocast.

Why: a re-run on another device type does not start one ULP away from the recorded run.
TF32 keeps 10 mantissa bits of a matmul's inputs and bf16 7, against float32's 23, so a
TF32 re-run starts about 2^13 times further away than a one-ULP perturbation (measured
here on tests/numeric_runs.py's Transformer: 2e-7 → 1e-4 relative at step 1 in TF32,
1e-3 in bf16; ``benchmarks/precision.py``). Where the device is not present, the
envelope that judges such a re-run is measured by runs under this emulation.

What it does (``install(precision)``, before user code, only when the launcher's config
names ``emulate``; off otherwise): a ``TorchDispatchMode`` sees every aten op, forward and
backward, below autograd. For the matmul family (mm, addmm, bmm, baddbmm, addbmm, mv,
addmv, dot), convolution (and its backward) and CPU flash attention (and its backward),
the float32 inputs are rounded round-to-nearest-even to the precision's mantissa and the
op then runs in float32 (float32 accumulation). Under a dispatch mode,
``scaled_dot_product_attention`` runs its math path (bmm, softmax, bmm): both of its
matmuls are rounded. For ``bf16`` (autocast's rules): the bias of addmm/convolution is
cast too, and the op's outputs are rounded to bf16, as autocast's lower-precision ops
return bf16; softmax, layer norm and losses (autocast's float32 list) stay float32.
Float64 tensors are never touched (autocast and TF32 leave them alone), so the numeric
trail's float64 projections stay exact.

Every run rounds to nearest even, envelope runs included: that is what a device does
(PyTorch's float→bf16 casts round to nearest; TF32 conversion too, up to ties). Seeded
stochastic rounding (``seed``) is kept as a measured alternative, not used by the boot:
envelope runs that each round differently covered every honest re-run (0 of 6 outside,
the Transformer in bf16 over 20 steps, where nearest-rounding envelopes of seeds 1–6 let
3 of 6 out at 1.01× the bound: a discrete flip those 6 runs happened not to make), but
their bound is 3× wider and let lr ×1.01 through as ``equivalent`` on the CNN in bf16 —
the one error the verdict must not make (benchmarks/precision.py).

Not emulated (said in docs/guides/devices.md): elementwise ops on bf16 activations run
in float32 here (a GPU rounds each to bf16); the accumulation order and group size of a
tensor core (Hawkeye's model, ``benchmarks/precision.py``); fp16 loss scaling.

Cost: every aten op becomes a Python call (about 2× a small model's step on CPU,
``benchmarks/precision.py``). Standard library at import; torch is the process's own.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

PRECISIONS = ("fp32", "tf32", "bf16")
MANTISSA_BITS = {"fp32": 23, "tf32": 10, "bf16": 7}
"""Explicit mantissa bits each precision keeps of a matmul's inputs."""

_MATMUL = {"mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1),
           "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "addmv": (1, 2)}
"""Rounded inputs (argument positions); position 0 of the add* ops is the bias."""
_OTHER = {"convolution": (0, 1), "convolution_backward": (0, 1, 2),
          "_scaled_dot_product_flash_attention_for_cpu": (0, 1, 2),
          "_scaled_dot_product_flash_attention_for_cpu_backward": (0, 1, 2, 3)}
_BIAS = {"addmm": 0, "baddbmm": 0, "addbmm": 0, "addmv": 0, "convolution": 2}
"""Autocast casts the bias too (bf16); TF32 adds it in float32."""

_state: dict[str, Any] = {"mode": None, "precision": None, "ops": 0}


def round_mantissa(tensor: Any, precision: str, generator: Any = None) -> Any:
    """``tensor`` (float32) rounded to nearest even at ``precision``'s mantissa; other
    dtypes and ``fp32`` unchanged. Infinities and NaNs pass through. With ``generator``:
    rounded stochastically instead (up with the probability of the dropped fraction),
    each call its own draw: another rounding at the same precision."""
    torch = sys.modules["torch"]
    if precision == "fp32" or not isinstance(tensor, torch.Tensor) \
            or tensor.dtype != torch.float32:
        return tensor
    if precision == "bf16" and generator is None:
        return tensor.to(torch.bfloat16).to(torch.float32)
    drop = 23 - MANTISSA_BITS[precision]
    bits = tensor.contiguous().view(torch.int32)
    if generator is None:
        add = (1 << (drop - 1)) - 1 + ((bits >> drop) & 1)
    else:
        add = torch.randint(0, 1 << drop, tensor.shape, generator=generator,
                            dtype=torch.int32).to(bits.device)
    rounded = ((bits + add) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(tensor), rounded, tensor)


def _mode_class() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class PrecisionMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self, precision: str, seed: int | None = None) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.precision = precision
            self.paused = False
            self.generator = None if seed is None else \
                sys.modules["torch"].Generator().manual_seed(seed)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            rounded = _MATMUL.get(name) or _OTHER.get(name)
            if rounded is None or self.paused:
                return func(*args, **kwargs)
            _state["ops"] += 1
            wanted = set(rounded)
            bf16 = self.precision == "bf16"
            if bf16 and name in _BIAS:
                wanted.add(_BIAS[name])
            gen = self.generator
            args = tuple(round_mantissa(a, self.precision, gen) if i in wanted else a
                         for i, a in enumerate(args))
            out = func(*args, **kwargs)
            if bf16:
                if isinstance(out, tuple):
                    return tuple(round_mantissa(o, "bf16", gen) for o in out)
                return round_mantissa(out, "bf16", gen)
            return out

    return PrecisionMode


def install(precision: str, seed: int | None = None) -> None:
    """Emulate ``precision`` from now until the process exits (the launcher's boot);
    ``seed``: an envelope run, rounding stochastically with that seed."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if _state["mode"] is not None or precision == "fp32":
        return
    mode = _mode_class()(precision, seed)
    mode.__enter__()
    _state.update(mode=mode, precision=precision)


@contextlib.contextmanager
def emulating(precision: str, seed: int | None = None) -> Iterator[None]:
    """In-process twin of ``install``: ``precision`` inside the block only."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        yield
        return
    with _mode_class()(precision, seed):
        yield


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The installed emulation off inside the block (the launcher's own bookkeeping)."""
    mode = _state["mode"]
    if mode is None:
        yield
        return
    before, mode.paused = mode.paused, True
    try:
        yield
    finally:
        mode.paused = before


def installed() -> str | None:
    """The precision this process emulates (None: none)."""
    return _state["precision"]  # type: ignore[no-any-return]
