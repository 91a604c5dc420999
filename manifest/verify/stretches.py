"""Which stretches of a long run ``verify --segments`` replays, and what a check of them is worth.

**Choosing.** A run is cut at its recorded checkpoints into stretches
(:func:`stretches_of`). ``--at STEP…`` names the ones to replay (chosen by the
user). ``--segments N`` draws N of them, uniformly without replacement, with
``random.Random(seed)``. The seed is a fresh nonce the verifier makes
(53 bits of ``os.urandom``, so ``--seed`` can repeat it and JSON keeps it exact),
printed in the report; ``--seed S`` repeats a choice. Nothing the run's author
controls enters the draw: not the run_id, the argv or any manifest field, only
how many stretches there are and which of them can be replayed (below; an
author who drops a checkpoint does not steer the draw off its stretch, the
report names that stretch as never caught). Why not a seed taken from the run
(the run_id's first 64 bits, say): everyone who checks the run would replay the
same stretches and its author would know them before publishing; adding an
ignored argv word and re-sealing moved such a draw off a planted bad stretch in
1 to 4 tries.
Proof-of-Learning's spoofing attacks (Fang et al. 2023) rely on exactly such
a predictable choice.

**What can be replayed.** A stretch starts from its checkpoint, so one whose
checkpoint was not kept (``Checkpoint.artifact`` None: the script saved every
checkpoint to one file, ``ckpt/latest.pt``, and only the last survived) can
never be replayed: a tampered stretch there is never caught, whatever the draw.
The draw is made among the stretches that can be replayed
(:attr:`Choice.replayable`), and the report names how many cannot ("3 of 4
stretches start from a checkpoint that was not kept"). Counting them in the
draw and the chance would overstate it: on a run of 4 stretches with only the
last checkpoint kept, a draw of 3 replays at most one, and the chance of
catching a tampered stretch would read 25% where no tampering of 3 of the 4
stretches could ever be seen.

**What a check is worth** (:func:`chances`). Only a draw from a fresh nonce has a
chance. A choice made by the user (``--at``) has none, and neither has a draw
repeated from ``--seed S``: whoever gave S (the run's author, perhaps) chose
the stretches, so the report says the choice was repeated and claims nothing.
Two numbers, each with its assumption:

* *a single bad step*, at a uniformly random step and independent of the draw:
  caught when it lies in a replayed stretch, so the chance is the share of all
  the run's steps replayed with a verdict (the steps of a stretch that cannot
  be replayed are never checked, and count against it);
* *a tampered stretch*: an adversary who cannot predict the nonce tampers one
  whole stretch that can be replayed. The draw picks each such stretch with
  the same chance, whatever its length, so a short stretch is no safer: n
  replayed of k replayable gives n/k. This is the number an adversary faces
  there; a stretch that cannot be replayed is named apart, never caught. The
  step share can be far higher: one 200-step stretch of three can hold 90% of
  the steps.

**Weak evidence** (:func:`weigh`). A replay proves that the stretch's updates
were computed as recorded. If the stretch barely moved the parameters, it
proves little that rounding alone could not also produce. For each replayed
stretch, the recorded numeric trail gives the parameters' relative change
from the stretch's start to its end (``manifest.numeric.envelope.step_distance``,
per parameter group). That change is set against the envelope's bound at the
stretch's end (``manifest.numeric.envelope.bounds``), which is how far runs
that differ only by rounding are apart by then. A stretch whose largest ratio
is below :data:`WELL_ABOVE` is named as weak evidence. So is a stretch whose
trail fingerprint did not change at all. The label changes no verdict; the
report prints the ratio. The envelope is the one the manifest carries, so it
is the author's. A widened one makes more stretches look weak (the safe side);
a narrowed one makes them look stronger, and the docs say so.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from pathlib import PurePosixPath

from manifest.errors import UsageError
from manifest.models import Checkpoint, Envelope, Manifest, NumericPoint

NONCE_BITS = 53
"""A nonce that ``--seed`` can repeat: ``--seed`` takes 0 … 2**53-1 (a JSON reader keeps it
exact), and 53 bits leave an author about 1 chance in 9e15 of guessing it."""

WELL_ABOVE = 10.0
"""A stretch's parameter change must exceed the envelope's bound at its end by one decade
to count as strong evidence. This is a label on the evidence, not a tolerance of any
verdict: it changes no exit status, and the report prints the ratio itself. The bound is
fitted to a handful of rounding-only runs (``manifest.numeric.calibration``: their log
excesses have a standard deviation of 0.27 to 0.64 nats, and one-ULP runs of a CNN part
by 5× where a max-pool tie flips), so a change within a decade of it is not clearly
beyond rounding."""


@dataclass(frozen=True)
class Stretch:
    start: int
    end: int
    checkpoint: Checkpoint | None
    """Where it resumes from; None for a stretch from step 0."""

    @property
    def replayable(self) -> bool:
        """Whether its start is there to resume from: step 0, or a checkpoint that was kept."""
        return self.checkpoint is None or self.checkpoint.artifact is not None


def resume_name(checkpoint: Checkpoint) -> str:
    """What a stretch resumes from, as the user knows it. A Hugging Face Trainer checkpoint
    is its ``checkpoint-N`` directory, placed whole (``manifest.verify.placing``), not
    whichever of its files (``optimizer.pt``) the stretch's digest check used."""
    from manifest.capture.checkpoints import HF_CHECKPOINT

    path = PurePosixPath(checkpoint.path)
    if HF_CHECKPOINT.fullmatch(path.parent.name):
        return str(path.parent)
    return checkpoint.path


# ------------------------------------------------------------------ choosing


def total_steps(recorded: Manifest) -> int:
    """The run's last optimizer step: its last trail point or checkpoint."""
    assert recorded.outputs is not None
    steps = [p.step for proc in recorded.outputs.processes for p in proc.trail]
    steps += [c.step for c in recorded.outputs.checkpoints or []]
    return max(steps, default=0)


def _start_checkpoint(found: list[Checkpoint], outputs: set[str]) -> Checkpoint:
    """Of the checkpoints saved at one step, the one to resume from: a kept one first,
    and one that is not also a declared final output."""
    return sorted(found, key=lambda c: (c.artifact is None, c.path in outputs, c.path))[0]


def stretches_of(recorded: Manifest) -> list[Stretch]:
    """The run cut at every recorded checkpoint (kept or not: a lost one is named)."""
    assert recorded.outputs is not None
    total = total_steps(recorded)
    outputs = {a.path for a in recorded.outputs.artifacts}
    at: dict[int, list[Checkpoint]] = {}
    for c in recorded.outputs.checkpoints or []:
        if 0 < c.step < total:
            at.setdefault(c.step, []).append(c)
    starts = [0, *sorted(at)]
    ends = [*starts[1:], total]
    return [Stretch(s, e, _start_checkpoint(at[s], outputs) if s else None)
            for s, e in zip(starts, ends, strict=True) if e > s]


def fresh_nonce() -> int:
    """A seed nobody can know before the verifier makes it."""
    return int.from_bytes(os.urandom(8), "big") >> (64 - NONCE_BITS)


def drawn(seed: int, count: int, n: int) -> list[int]:
    """``n`` of ``count`` stretch indexes, uniformly without replacement, from ``seed`` alone."""
    return sorted(random.Random(seed).sample(range(count), min(n, count)))


@dataclass(frozen=True)
class Choice:
    stretches: list[Stretch]
    of: int
    """How many stretches the run has."""
    chosen_by: str
    """``nonce`` (a fresh one), ``--seed`` or ``--at``."""
    seed: int | None
    """What the draw was made from (None for ``--at``)."""
    unreplayable: tuple[Stretch, ...] = ()
    """The run's stretches that start from a checkpoint that was not kept."""

    @property
    def random(self) -> bool:
        """Drawn from a fresh nonce: the only choice a chance of catching is claimed for."""
        return self.chosen_by == "nonce" and self.seed is not None

    @property
    def replayable(self) -> int:
        """How many of the run's stretches can be replayed (what a draw is made among)."""
        return self.of - len(self.unreplayable)


def not_kept(choice: Choice) -> str | None:
    """The sentence a report gives when some stretches can never be replayed."""
    lost = choice.unreplayable
    if not lost:
        return None
    steps = sum(s.end - s.start for s in lost)
    return (f"{len(lost)} of {choice.of} stretches start from a checkpoint that was not kept: "
            f"a tampered stretch there is never caught, and their {steps} steps are never "
            f"checked (those starting at step {', '.join(str(s.start) for s in lost[:8])}"
            + (f" and {len(lost) - 8} more" if len(lost) > 8 else "") + ")")


def choose(recorded: Manifest, *, segments: int | None, at: list[int] | None,
           seed: int | None = None) -> Choice:
    """The stretches to replay and how they were chosen (see the module docstring)."""
    if segments is not None and at:
        raise UsageError("--segments draws the stretches and --at names them: give one of "
                         "the two.")
    all_stretches = stretches_of(recorded)
    if not all_stretches:
        raise UsageError("the manifest records no optimizer steps to replay (no step trail).")
    if len(all_stretches) == 1:
        raise UsageError(
            f"the run recorded no checkpoint before its last step ({total_steps(recorded)}), "
            "so it has no stretches to replay, only the whole run.",
            hint="Verify it whole (leave out --segments/--at), or capture a run that saves "
                 "checkpoints as it trains.")
    lost = tuple(s for s in all_stretches if not s.replayable)
    if at:
        total = total_steps(recorded)
        chosen: list[Stretch] = []
        for step in at:
            if not 0 < step <= total:
                raise UsageError(f"--at {step}: the run's steps are 1 to {total}.")
            hit = next(s for s in all_stretches if s.start < step <= s.end)
            if hit not in chosen:
                chosen.append(hit)
        return Choice(sorted(chosen, key=lambda s: s.start), len(all_stretches), "--at", None,
                      lost)
    how = "--seed" if seed is not None else "nonce"
    seed = fresh_nonce() if seed is None else seed
    # Drawn among the stretches that can be replayed (step 0's always can): a pick of one
    # whose checkpoint is gone would only be a no-verdict.
    among = [s for s in all_stretches if s.replayable]
    picks = drawn(seed, len(among), segments or 3)
    return Choice([among[i] for i in picks], len(all_stretches), how, seed, lost)


# ------------------------------------------------------------------ chances


@dataclass(frozen=True)
class Chances:
    single_bad_step: float
    """A bad step at a uniformly random step of the whole run: the share of its steps
    replayed with a verdict."""
    tampered_stretch: float
    """One whole stretch that can be replayed, tampered by someone who cannot predict the
    draw: replayed with a verdict / replayable."""
    replayable: int
    """Of how many stretches ``tampered_stretch`` is a share."""
    unchecked_steps: int
    """Steps in stretches that cannot be replayed: a bad step there is never caught."""


def chances(choice: Choice, checked: list[Stretch], total: int) -> Chances | None:
    """What a draw from a fresh nonce is worth (None for a choice the user made, ``--at``, or
    repeated from a seed the user gave, ``--seed``). ``checked``: the chosen stretches that
    reached a verdict."""
    if not choice.random or total <= 0 or choice.replayable <= 0:
        return None
    steps = sum(s.end - s.start for s in checked)
    return Chances(steps / total, len(checked) / choice.replayable, choice.replayable,
                   sum(s.end - s.start for s in choice.unreplayable))


# ------------------------------------------------------------------ weighing


@dataclass(frozen=True)
class Weight:
    """How far a stretch moved the parameters, against rounding."""

    weak: bool
    ratio: float | None
    """Largest (change / bound) over the parameter groups; None when not measured."""
    reason: str


def unusable(envelope: Envelope) -> str | None:
    """Why the manifest's envelope cannot weigh anything (NaN, negative, mismatched lists, a
    first step that is not rounding: ``manifest.numeric.calibration.check_envelope``)."""
    from manifest.numeric.calibration import check_envelope

    problems = check_envelope(envelope)
    return problems[0] if problems else None


def _at_or_before(points: list[NumericPoint], step: int) -> NumericPoint | None:
    found = [p for p in points if p.step <= step]
    return max(found, key=lambda p: p.step) if found else None


def weigh(recorded: Manifest, stretch: Stretch) -> Weight | None:
    """Whether ``stretch`` is weak evidence (see the module docstring); None when the
    manifest holds nothing to weigh it with (no numeric trail, no envelope)."""
    from manifest.numeric.envelope import bounds, step_distance

    assert recorded.outputs is not None
    procs = sorted(recorded.outputs.processes, key=lambda p: p.rank)
    if not procs:
        return None
    first = procs[0]
    trail = {p.step: p.digest for p in first.trail}
    if stretch.start in trail and trail.get(stretch.end) == trail[stretch.start]:
        return Weight(True, 0.0, f"its parameters did not change from step {stretch.start} to "
                      f"{stretch.end} (the same trail fingerprint)")
    envelope = recorded.outputs.envelope
    points = sorted(first.numeric or [], key=lambda p: p.step)
    if envelope is None or not envelope.steps or not points or unusable(envelope):
        return None
    begin = _at_or_before(points, stretch.start) or points[0]
    finish = _at_or_before(points, stretch.end)
    if finish is None or finish.step <= begin.step:
        return None
    measured = step_distance(begin, finish)
    limit = [b for b in bounds(envelope, points) if b.step <= finish.step]
    if measured is None or not limit:
        return None
    bound = limit[-1]
    ratios = [math.inf if b <= 0 < d else (d / b if b > 0 else 0.0)
              for d, b in zip(measured[1], bound.groups, strict=False)]
    if not ratios:
        return None
    ratio = max(ratios)
    span = f"steps {begin.step}–{finish.step}"
    if ratio < WELL_ABOVE:
        return Weight(True, ratio, f"weak evidence: over {span} the parameters moved "
                      f"{ratio:.3g}× the envelope's bound at step {bound.step}, not "
                      f"{WELL_ABOVE:g}× above what rounding alone does")
    return Weight(False, ratio, f"over {span} the parameters moved {ratio:.3g}× the "
                  f"envelope's bound at step {bound.step}")


# ------------------------------------------------------------------ reading


def parts_at_resume(recorded: Manifest, step: int) -> str:
    """A hint, never a cause, for a replay that parts at its first step: a checkpoint that
    forgot some state and a bad step right after the checkpoint both do
    (``manifest.verify.segments``); the resume audit (``manifest.lab.resume``) tells them
    apart."""
    import shlex

    assert recorded.command is not None
    return (f"the runs part at the resume point (step {step}): if the whole run re-runs "
            "identically, the checkpoint forgot some state (optimizer, RNG, sampler, "
            f"scheduler) — manifest lab --resume-at {step} -- "
            f"{shlex.join(recorded.command.argv)} names it")
