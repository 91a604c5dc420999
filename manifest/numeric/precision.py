"""Which noise envelope covers a re-run at another matmul precision.

A re-run on another device type starts as far from the recorded run as its precision
rounds a matmul's inputs: float32 keeps 23 mantissa bits, TF32 10, bf16 7. One-ULP
envelope runs start 2^13 (TF32) to 2^16 (bf16) times closer than that, so a TF32 re-run
judged against them is ``differs`` from step 1 (measured on an H100: 9.6× the bound for
the bundled example). An envelope therefore says which precision its runs used
(``Envelope.precision``) and how (``Envelope.how``: on the device, or emulated on CPU by
``launch/boot/_manifest_precision``), and a re-run is judged against an envelope at the
coarser of the two runs' precisions (``choose``), or against none.

Envelope at a precision (``at_precision``): its runs are the run under that precision's
emulation (rounding to nearest, as a device does), each with its own one-ULP seed,
measured against the run's emulated twin (``numeric.twin``; against the float32 base in
envelopes made before it, whose margins were thin). Why not each run its own stochastic
rounding: wider by 3×, and it let a planted change through (``_manifest_precision``). Measured
on CPU (tests/numeric_runs.py, 20 steps): first-step distance 1.4e-4 (Transformer, TF32)
and 2.2e-4 (bf16) against 4.7e-8 for one ULP: 3,000–4,700× further (``benchmarks/
precision.py``). The bound is A1's calibrated one (``calibration.calibrate``) on those runs.

What it costs (``resolution_sentence``): the smallest first-step change the coarser
envelope still sees; a change smaller than the precision's own rounding is not seen.

Across device types no envelope decides (``device_change``). Measured on an H100 and an
H200 (``benchmarks/device_pairs.py``, the three calibration models, 20 steps): honest GPU
re-runs of a CPU run were outside the CPU envelope at their precision in 56 of 63
distinct trails (up to 2,160× its bound at step 1, TF32 and bf16 every time), and where
an envelope wide enough to hold them was tried (each envelope run rounding the matmul
inputs stochastically at the precision), lr ×1.001 and a 1e-3 bias fell inside it, and
lr ×1.01 in bf16: a device's own rounding moves the run as far as those changes do. So a
re-run on other devices gets ``not-compared``, with that reason, never a ``differs`` that
only says the device changed, nor an ``equivalent`` that could hide a change. Two GPU
models of one architecture (H100 ↔ H200, same torch) trained bit-identically (126 of 126
runs): verify says ``identical`` there before any envelope is needed. Other GPU models
(another architecture, another vendor) are held to the same rule, unmeasured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from manifest.models import Envelope, Manifest, NumericPoint
from manifest.numeric.calibration import resolution
from manifest.numeric.envelope import measure_envelope

Precision = Literal["fp32", "tf32", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16")
"""Finest first: each keeps fewer mantissa bits of a matmul's inputs than the one before."""
MANTISSA_BITS = {"fp32": 23, "tf32": 10, "bf16": 7}


def precision_of(envelope: Envelope) -> Precision:
    """The precision ``envelope`` covers (an envelope that does not say: float32)."""
    return envelope.precision or "fp32"


def coarser(a: str, b: str) -> Precision:
    """The coarser of two precisions (fewer mantissa bits)."""
    for name in (a, b):
        if name not in MANTISSA_BITS:
            raise ValueError(f"unknown precision {name!r}: one of {', '.join(PRECISIONS)}")
    return cast(Precision, a if MANTISSA_BITS[a] <= MANTISSA_BITS[b] else b)


@dataclass
class Choice:
    """The envelope that judges a re-run, or why none does."""

    envelope: Envelope | None
    needed: Precision
    """The coarser of the recorded run's and the re-run's precisions."""
    reason: str

    def to_json(self) -> dict[str, object]:
        chosen = self.envelope
        return {"needed": self.needed, "reason": self.reason,
                "precision": None if chosen is None else precision_of(chosen),
                "how": None if chosen is None else chosen.how}


def choose(envelopes: Sequence[Envelope], recorded_precision: str,
           rerun_precision: str) -> Choice:
    """The envelope covering the coarser precision of the two runs: one measured at that
    precision (a device measurement before an emulation), else none. An envelope at a
    finer precision starts too close (2^13× for float32 against TF32) and would call the
    precision's rounding a change; one at a coarser precision would hide changes the
    re-run's precision can see, so neither stands in."""
    needed = coarser(recorded_precision, rerun_precision)
    matching = [e for e in envelopes if precision_of(e) == needed]
    if not matching:
        have = sorted({precision_of(e) for e in envelopes}, key=PRECISIONS.index)
        listed = ", ".join(have) if have else "none"
        return Choice(None, needed, (
            f"no envelope covers {needed}: the run's envelopes are at {listed}, and a "
            f"{needed} re-run starts {2 ** (23 - MANTISSA_BITS[needed])}× further away than "
            f"float32's one ULP (capture --envelope N --precision {needed} measures one)"
            if needed != "fp32" else
            f"no envelope covers fp32: the run's envelopes are at {listed}"))
    chosen = sorted(matching, key=lambda e: 0 if e.how == "measured" else 1)[0]
    how = chosen.how or "measured"
    return Choice(chosen, needed, f"the {needed} envelope ({how}) covers a "
                  f"{recorded_precision} run re-run at {rerun_precision}")


def at_precision(base: Sequence[NumericPoint],
                 runs: Sequence[tuple[str, Sequence[NumericPoint]]],
                 precision: str, how: Literal["measured", "emulated"],
                 twin: Sequence[NumericPoint] | None = None) -> Envelope:
    """The envelope of ``runs`` (made at ``precision``) against the float32 ``base``, or,
    given the run's ``twin`` at that precision (``numeric.twin``), against the twin, which
    the envelope then carries."""
    if precision not in MANTISSA_BITS:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(PRECISIONS)}")
    envelope = measure_envelope(base if twin is None else twin, runs)
    return envelope.model_copy(update={"precision": precision, "how": how,
                                       "twin": None if twin is None else list(twin)})


def resolution_sentence(envelope: Envelope) -> str:
    """What the envelope's precision costs: the smallest first-step change it sees."""
    seen = resolution(envelope)
    name = precision_of(envelope)
    if seen is None:
        return f"the {name} envelope has no parameter bound at its first step"
    said = (f"at {name} ({envelope.how or 'measured'}), the smallest change this envelope "
            f"sees at its first step is {seen:.2g} of the parameters (relative L2)")
    if envelope.twin is None:
        return said
    from manifest.numeric.calibration import calibrate

    # A re-run that parted from the twin before a change (a device's re-run does, at its
    # first rounding flip) sees it only above the bound at that step, not the first one.
    last = calibrate(envelope).bounds[-1]
    return (f"{said}; at its last step (step {last.step}), {max(last.groups):.2g}: a re-run "
            "already apart from the twin sees a change only above the bound where it is")


SHOWN_DEVICES = 4
"""Device names a reason quotes (the rest counted): a manifest's names are its author's."""


def device_kinds(manifest: Manifest) -> frozenset[str]:
    """The CUDA devices a run's processes could compute on: the names of the devices
    visible to each process that initialised CUDA (``determinism.processes[*].devices``;
    a process that only asked for a device's name counts too), empty for a run that
    never initialised CUDA (CPU; also MPS and XPU, which record no devices)."""
    processes = manifest.determinism.processes if manifest.determinism is not None else []
    return frozenset(name for p in processes for name in p.devices)


def _said(kinds: frozenset[str]) -> str:
    if not kinds:
        return "CPU"
    names = sorted(kinds)
    quoted = ", ".join(repr(n[:64]) for n in names[:SHOWN_DEVICES])
    more = len(names) - SHOWN_DEVICES
    return quoted + (f" and {more} more" if more > 0 else "")


def device_change(recorded: Manifest, rerun: Manifest) -> str | None:
    """Why the numeric trails cannot judge ``rerun`` against ``recorded``: one ran on CPU
    and the other on a GPU, or on other GPU models (None: the same devices). Measured for
    CPU ↔ H100/H200; two GPU models whose kernels differ are held to the same rule
    unmeasured (an H100 and an H200 computed the same bits, so verify never judged them)."""
    was, now = device_kinds(recorded), device_kinds(rerun)
    if was == now:
        return None
    return (f"the run computed on {_said(was)} and the re-run on {_said(now)}: on other "
            "devices a re-run's own rounding moves it as far as small real changes do "
            "(measured on an H100 and an H200: honest re-runs up to 2,160x a CPU envelope's "
            "bound at step 1), so the numeric trails cannot tell rounding from a change here "
            "and decide nothing (docs/guides/devices.md)")
