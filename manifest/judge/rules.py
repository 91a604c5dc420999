"""The rules that turn what a verb found into its verdict, in order, one function each.

Every verdict any verb gives is a :class:`Judgement` made here, and it reaches a report
only through :func:`record` (``tests/test_one_judge.py`` fails on any other module that
assigns a ``verdict``). The order, as verify applies it:

1. :func:`failed` / :func:`refused`: no comparison could be made (the command failed,
   an output is missing, drift under ``--strict``) → ``no-verdict``;
2. :func:`judge`: what was compared (outputs tensor by tensor, step-trail points) →
   ``nothing-compared`` when nothing was, else ``identical`` or ``differs``;
3. :func:`topology`: a ``differs`` on another world size → ``changed-topology``;
4. the numeric refinements of a ``differs`` (:func:`inside_envelope`,
   :func:`trail_outside`, :func:`outputs_outside`, :func:`did_not_travel`,
   :func:`envelope_not_compared`), where only an envelope that may decide
   (``manifest.judge.envelope``) can make it ``equivalent``;
5. :func:`data`: recorded data that changed is never ``identical``, in any mode →
   ``differs`` with the data named.

The stretches of ``verify --segments`` (:func:`segments`), the lab's recipe runs
(through :func:`judge`), explain (:func:`explain_agree`, :func:`explain_parted`,
:func:`explain_failed`), diff (:func:`diff_verdict`; its weighing of the outputs,
:func:`diff_outputs` and :func:`outputs_not_held`) and the worst rank of a numeric
judgement (:func:`worst_numeric`, for diff and the gate's baseline) are judged here too.
Each reason carries a stable :class:`~manifest.judge.reasons.ReasonCode`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from manifest.judge.reasons import ReasonCode
from manifest.judge.tables import (
    EXPLAIN_VERDICTS,
    VERDICTS,
    DiffOutcome,
    ExplainVerdict,
    GateStatus,
    NumericVerdict,
    OutputsOutcome,
    Verdict,
)


@dataclass(frozen=True)
class Findings:
    """What comparing a run with another (a re-run, a replayed stretch, a recipe run)
    found, before anything is concluded from it."""

    outputs: Sequence[bool] = ()
    """One entry per output compared tensor by tensor: whether it was bit-identical."""
    trail_steps: int = 0
    """Step-trail points compared."""
    trail_parts_at: int | None = None
    """The first step whose fingerprint differs."""
    trail_agrees: bool = True
    """False also when the two trails do not hold the same steps (the lab's recipe runs)."""
    failure: str | None = None
    """Why no comparison could be made (the run failed, an output is missing)."""
    failure_code: ReasonCode = ReasonCode.RERUN_FAILED
    """The code of ``failure``."""


@dataclass(frozen=True)
class Judgement:
    """A verdict, what it was based on, and why (a sentence and its stable code)."""

    verdict: StrEnum
    """A :class:`Verdict`, or explain's :class:`ExplainVerdict`."""
    basis: str = "nothing"
    """A key of :data:`~manifest.judge.tables.BASES`: what the verdict was based on."""
    reason: str | None = None
    code: ReasonCode | None = None
    """The reason's stable code (``--format json``'s ``reason_code``)."""

    @property
    def exit_code(self) -> int:
        table: dict[Any, tuple[int, str]] = (
            EXPLAIN_VERDICTS if isinstance(self.verdict, ExplainVerdict) else VERDICTS)
        return table[self.verdict][0]


class Judged(Protocol):
    """A report that carries a judgement (verify's, a stretch's, explain's)."""

    verdict: Any
    reason: str | None
    reason_code: str | None


def record(report: Judged, judgement: Judgement) -> None:
    """Write ``judgement`` into ``report``: the one place a verdict is assigned."""
    report.verdict = judgement.verdict
    report.reason = judgement.reason
    report.reason_code = None if judgement.code is None else str(judgement.code)
    if hasattr(report, "basis"):
        report.basis = judgement.basis


def current(report: Judged) -> Judgement:
    """The judgement a report holds now, for a later rule to refine."""
    raw = str(report.verdict)
    verdict: StrEnum = (Verdict(raw) if raw in Verdict._value2member_map_
                        else ExplainVerdict(raw))
    code = ReasonCode(report.reason_code) if report.reason_code else None
    return Judgement(verdict, getattr(report, "basis", "nothing"), report.reason, code)


def carry(judgement: Judgement) -> dict[str, Any]:
    """A judgement's fields, for a report that repeats another verb's (the lab's copy of
    explain's)."""
    return {"verdict": str(judgement.verdict), "reason": judgement.reason,
            "reason_code": None if judgement.code is None else str(judgement.code)}


# ------------------------------------------------------------------- 1. no comparison


def refused(code: ReasonCode, reason: str, basis: str = "nothing") -> Judgement:
    """No comparison was made (drift under ``--strict``, no command, the recorded run
    failed, the tree is not the recorded code, the environment was not rebuilt)."""
    return Judgement(Verdict.NO_VERDICT, basis, reason, code)


def failed(reason: str, code: ReasonCode = ReasonCode.RERUN_FAILED,
           basis: str = "nothing") -> Judgement:
    """The re-run (or a replay) failed, or an output it should write is missing."""
    return refused(code, reason, basis)


def checked(*, strict_drift: bool) -> Judgement:
    """``--no-rerun``: integrity, drift and data checked; ``no-verdict`` under ``--strict``
    when the environment drifted in bits (changed data is :func:`data`'s)."""
    if strict_drift:
        return refused(ReasonCode.STRICT_DRIFT, "environment drift under --strict")
    return Judgement(Verdict.CHECKED)


# ------------------------------------------------------------------- 2. the comparison


def _basis(found: Findings) -> str:
    return {(True, True): "tensors and trail", (True, False): "tensors",
            (False, True): "trail"}.get((bool(found.outputs), found.trail_steps > 0),
                                        "nothing")


def _compared(found: Findings, basis: str) -> Judgement:
    trail_same = found.trail_parts_at is None and found.trail_agrees
    if all(found.outputs) and trail_same:
        return Judgement(Verdict.IDENTICAL, basis)
    if found.outputs and all(found.outputs):
        return Judgement(Verdict.DIFFERS, basis, "outputs match but the step trails part",
                         ReasonCode.TRAIL_PARTS)
    return Judgement(Verdict.DIFFERS, basis, None, ReasonCode.OUTPUTS_DIFFER
                     if found.outputs and not all(found.outputs) else ReasonCode.TRAIL_PARTS)


def judge(found: Findings, *, nothing: str) -> Judgement:
    """The verdict from what was compared, by the first rule that applies: a failure →
    ``no-verdict``; nothing compared → ``nothing-compared`` (``nothing`` is the reason,
    with its fix); else ``identical`` or ``differs``."""
    basis = _basis(found)
    if found.failure is not None:
        return failed(found.failure, found.failure_code, basis)
    if basis == "nothing":
        return Judgement(Verdict.NOTHING_COMPARED, basis, nothing, ReasonCode.NOTHING_COMPARED)
    return _compared(found, basis)


def nothing_compared_reason(declared: Sequence[str]) -> str:
    """Why nothing was compared, and the fix (verify, gate and lab say the same)."""
    why = (f"the run wrote nothing that matches its declared outputs ({', '.join(declared)})"
           if declared else "the run declared no output")
    return (f"nothing was compared: {why}, and no optimizer step was seen for a step trail. "
            "Fix: capture again with --artifact PATH naming the weights file the script "
            "writes (or call manifest.trail(model) in the script).")


# ------------------------------------------------------------------- 3. topology


def topology(judged: Judgement, *, world_size_changed: bool, reason: str) -> Judgement:
    """A ``differs`` on another world size is expected: ``changed-topology``, with the size
    of the difference (``reason``), never a bare ``differs``."""
    if not world_size_changed or judged.verdict is not Verdict.DIFFERS:
        return judged
    return replace(judged, verdict=Verdict.CHANGED_TOPOLOGY, reason=reason,
                   code=ReasonCode.TOPOLOGY_CHANGED)


# ------------------------------------------------------------------- 4. numbers


def inside_envelope(judged: Judgement, reason: str) -> Judgement:
    """Every step of every rank and every declared output lies inside an envelope that may
    decide (``manifest.judge.envelope``): ``equivalent``."""
    return replace(judged, verdict=Verdict.EQUIVALENT, reason=reason,
                   code=ReasonCode.INSIDE_ENVELOPE)


def trail_outside(judged: Judgement, reason: str) -> Judgement:
    """A step of the numeric trail lies outside the envelope: still ``differs``."""
    return replace(judged, reason=reason, code=ReasonCode.TRAIL_OUTSIDE_ENVELOPE)


def outputs_outside(judged: Judgement, reason: str, *, compared: bool) -> Judgement:
    """The trails lie inside, an output does not (or could not be compared): ``differs``."""
    return replace(judged, reason=reason, code=ReasonCode.OUTPUTS_OUTSIDE_ENVELOPE
                   if compared else ReasonCode.OUTPUTS_NOT_COMPARED)


def did_not_travel(judged: Judgement, reason: str) -> Judgement:
    """The trails lie inside and nothing was found to differ, but the recorded outputs
    are not here: ``no-verdict``, never ``differs``."""
    return replace(judged, verdict=Verdict.NO_VERDICT, reason=reason,
                   code=ReasonCode.OUTPUTS_DID_NOT_TRAVEL)


def envelope_not_compared(judged: Judgement, reason: str) -> Judgement:
    """No envelope may decide (other devices, none vouched for, a refused twin): the bits
    differ and nothing says by how much."""
    return replace(judged, reason=f"not the same bits; {reason}",
                   code=ReasonCode.ENVELOPE_NOT_COMPARED)


# ------------------------------------------------------------------- 5. data


def data(judged: Judgement, changed: Sequence[str]) -> Judgement:
    """Recorded data that changed (``changed``: each named) is never ``identical``: outputs
    can match while data changed (the script read only part of a dataset), so a match
    proves nothing about the changed files. A ``differs`` stays as it is."""
    if not changed or judged.verdict in (Verdict.DIFFERS, Verdict.CHANGED_TOPOLOGY):
        return judged
    reason = f"recorded data changed since capture: {', '.join(changed)}"
    if judged.verdict is Verdict.IDENTICAL:
        reason += ("; the re-run's outputs match anyway (the script did not read what "
                   "changed, or it did not reach the weights)")
    elif judged.reason:
        reason += f"; {judged.reason}"
    return replace(judged, verdict=Verdict.DIFFERS, reason=reason, code=ReasonCode.DATA_CHANGED)


# ------------------------------------------------------------------- segments, explain


def stretch(judged: Judgement, *, parts_at_resume: str | None) -> Judgement:
    """One stretch of ``verify --segments``: nothing compared is that stretch's
    ``no-verdict`` (with the reason); a ``differs`` at the stretch's first step after a
    resume says the resume, not the training, differs (``parts_at_resume``)."""
    if judged.verdict is Verdict.NOTHING_COMPARED:
        return replace(judged, verdict=Verdict.NO_VERDICT)
    if judged.verdict is Verdict.DIFFERS and parts_at_resume is not None:
        return replace(judged, reason=parts_at_resume, code=ReasonCode.PARTS_AT_RESUME)
    return judged


def segments(verdicts: Sequence[str], *, changed_data: bool) -> Verdict:
    """``verify --segments``: any stretch that differs (or changed data) → ``differs``; no
    stretch, or one without a verdict → ``no-verdict``; else ``identical``."""
    if Verdict.DIFFERS in verdicts or changed_data:
        return Verdict.DIFFERS
    if not verdicts or Verdict.NO_VERDICT in verdicts:
        return Verdict.NO_VERDICT
    return Verdict.IDENTICAL


def gate(statuses: Sequence[GateStatus]) -> GateStatus:
    """The gate's verdict from its checks' statuses: any ``fail`` → ``fail``; else any
    ``no-verdict``; else any ``nothing-compared``; else ``pass`` (``skip`` counts as
    passed: a check that this mode does not run)."""
    for worst in (GateStatus.FAIL, GateStatus.NO_VERDICT, GateStatus.NOTHING_COMPARED):
        if worst in statuses:
            return worst
    return GateStatus.PASS


class _Numeric(Protocol):
    @property
    def verdict(self) -> str: ...


N = TypeVar("N", bound=_Numeric)


def worst_numeric(judged: Sequence[N]) -> N | None:
    """The numeric judgement (one per rank, ``manifest.numeric.envelope.judge``) that
    decides: a rank outside the envelope (the earliest step of those that are), else the
    first that could not be compared; None when every one is ``equivalent`` (or there is
    none). One rank outside is enough: the runs are only as equivalent as their worst rank,
    and a rank that differs outweighs one not compared. verify, diff and the gate use it."""
    differing = [j for j in judged if j.verdict == NumericVerdict.DIFFERS]
    if differing:
        return min(differing, key=lambda j: getattr(j, "first_step", None) or 0)
    return next((j for j in judged if j.verdict != NumericVerdict.EQUIVALENT), None)


def diff_verdict(*, bits: bool, differences: bool) -> DiffOutcome:
    """diff's verdict on two manifests: ``bits`` when a difference can change the bits,
    ``benign`` when every one cannot, ``identical`` when there is none."""
    if bits:
        return DiffOutcome.BITS
    return DiffOutcome.BENIGN if differences else DiffOutcome.IDENTICAL


def diff_outputs(*, produced: bool, numeric: Mapping[str, Any] | None) -> OutputsOutcome:
    """diff's weighing of what the two runs produced (``manifest.diff.engine
    .weigh_outputs``): ``identical`` when no output, trail state or ending differs
    (``produced`` False); ``equivalent`` only when the numeric judgement (``numeric``:
    the trails inside a vouched envelope, then every declared output held to its last
    step) stayed ``equivalent``; anything else, no judgement included, ``differ``."""
    if not produced:
        return OutputsOutcome.IDENTICAL
    if numeric is not None and numeric.get("verdict") == NumericVerdict.EQUIVALENT:
        return OutputsOutcome.EQUIVALENT
    return OutputsOutcome.DIFFER


def outputs_not_held(numeric: dict[str, Any], problem: str) -> None:
    """The trails lie inside the envelope but an output does not (``outputs_verdict``
    ``outside``: ``differs``) or could not be compared (``not-compared``): write that
    verdict and ``problem`` into the numeric judgement ``numeric``."""
    compared = numeric.get("outputs_verdict") == NumericVerdict.OUTSIDE
    numeric["verdict"] = str(NumericVerdict.DIFFERS if compared else NumericVerdict.NOT_COMPARED)
    numeric["reason"] = f"the step trails lie inside the envelope, but {problem}"
    numeric["sentence"] = numeric["reason"]


def diff_reason(outputs: str | None, numeric: Mapping[str, Any] | None) -> ReasonCode | None:
    """The code of diff's weighing of the outputs (``manifest.diff.engine.weigh_outputs``):
    ``equivalent`` → inside the envelope; a numeric judgement that did not decide →
    which part was not compared, or was outside; outputs that differ → ``outputs-differ``;
    None when the outputs are identical or were not weighed."""
    if outputs == OutputsOutcome.EQUIVALENT:
        return ReasonCode.INSIDE_ENVELOPE
    if numeric is not None:
        if numeric.get("outputs_verdict") == NumericVerdict.OUTSIDE:
            return ReasonCode.OUTPUTS_OUTSIDE_ENVELOPE
        if numeric.get("outputs_verdict") == NumericVerdict.NOT_COMPARED:
            return ReasonCode.OUTPUTS_NOT_COMPARED
        if numeric.get("verdict") == NumericVerdict.DIFFERS:
            return ReasonCode.TRAIL_OUTSIDE_ENVELOPE
        return ReasonCode.ENVELOPE_NOT_COMPARED
    return ReasonCode.OUTPUTS_DIFFER if outputs == OutputsOutcome.DIFFER else None


def explain_agree(reason: str) -> Judgement:
    return Judgement(ExplainVerdict.AGREE, reason=reason, code=ReasonCode.RUNS_AGREE)


def explain_parted(reason: str | None = None) -> Judgement:
    return Judgement(ExplainVerdict.PARTED, reason=reason, code=ReasonCode.RUNS_PARTED)


def explain_failed(reason: str, code: ReasonCode = ReasonCode.EXPLAIN_FAILED) -> Judgement:
    return Judgement(ExplainVerdict.NO_VERDICT, reason=reason, code=code)
