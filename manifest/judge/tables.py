"""Every verdict each verb gives, with its exit status and meaning: the tables.

verify's :data:`VERDICTS`, the gate's :data:`GATE_VERDICTS`, the lab's
:data:`LAB_OUTCOMES`, explain's and diff's: verdict → (exit status, meaning). Each verb's
report takes its exit status from its table, the concepts page's table of verdicts is
generated from :func:`verb_verdicts` at every docs build (``docs/gen_ref.py``), and
``tests/test_verdicts.py`` checks every row against the report's own ``exit_code``.
The gate maps verify's verdict to its status (:func:`gate_status`) and the lab to its
outcome (:func:`lab_outcome`); the rules that reach a verdict are
``manifest.judge.rules``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from manifest.errors import EXIT_EQUIVALENT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK

Row = tuple[str, int, str]
"""(verdict, exit status, meaning)."""


# ------------------------------------------------------------------- verify

class Verdict(StrEnum):
    """Every verdict verify gives; :data:`VERDICTS` holds each one's exit status and meaning."""

    IDENTICAL = "identical"
    EQUIVALENT = "equivalent"
    DIFFERS = "differs"
    CHANGED_TOPOLOGY = "changed-topology"
    NOTHING_COMPARED = "nothing-compared"
    NO_VERDICT = "no-verdict"
    CHECKED = "checked"


VERDICTS: dict[Verdict, tuple[int, str]] = {
    Verdict.IDENTICAL: (EXIT_OK, "every declared output tensor has the recorded dtype, shape "
                        "and raw bytes, and every step trail point in common agrees; the "
                        "recorded data was checked and is unchanged"),
    Verdict.EQUIVALENT: (EXIT_EQUIVALENT, "not the same bits, but the same run up to "
                         "rounding: the environment drifted only in hardware, driver, library "
                         "build or thread count, every step of the re-run's numeric trail "
                         "lies inside a noise envelope the verifier measured (verify "
                         "--envelope N) or can vouch for (sealed here, or signed by a trusted "
                         "identity), and every declared output lies inside its last step"),
    Verdict.DIFFERS: (EXIT_FAILED, "a tensor's bytes differ (one flipped bit is enough), the "
                      "step trails part, or recorded data (local or remote) changed since "
                      "capture; the changed data is named, and this holds with or without a "
                      "re-run"),
    Verdict.CHANGED_TOPOLOGY: (EXIT_FAILED, "outputs differ on another world size (expected; "
                               "the report gives the size of the difference)"),
    Verdict.NOTHING_COMPARED: (EXIT_NO_VERDICT, "the re-run finished but there was nothing to "
                               "compare: no output declared (or none written) and no optimizer "
                               "step in the trail; the fix is to capture with --artifact PATH"),
    Verdict.NO_VERDICT: (EXIT_NO_VERDICT, "the re-run could not be compared: drift under "
                         "--strict, the command failed, a declared output is missing, or the "
                         "step trails lie inside the envelope but the recorded outputs did not "
                         "travel with the run (verify --outputs DIR, pack --with-outputs)"),
    Verdict.CHECKED: (EXIT_OK, "--no-rerun: integrity, drift and data checked and unchanged, "
                      "nothing re-run, no output compared"),
}
"""Verdict → (exit status, what it means): the one table the CLI and the docs read."""


BASES: dict[str, str] = {
    "tensors": "the declared outputs, tensor by tensor (dtype, shape, raw bytes)",
    "tensors and trail": "the declared outputs tensor by tensor, and the step trail",
    "trail": "the step trail only: per kept optimizer step, two sums over each parameter "
             "group's bits (every step to 1000); strong evidence of the same training, but "
             "not a byte comparison of the weights (declare --artifact PATH for that)",
    "nothing": "nothing: no output tensor to compare, and no optimizer step was seen (the "
               "reason says why)",
}
"""What a verdict was based on → the words every report prints beside it."""


# ------------------------------------------------------------------- gate and lab

class GateStatus(StrEnum):
    """Every verdict the gate gives (and each check's status)."""

    PASS = "pass"  # noqa: S105
    FAIL = "fail"
    SKIP = "skip"
    NO_VERDICT = "no-verdict"
    NOTHING_COMPARED = "nothing-compared"
    """The re-run finished but there was nothing to compare (no output, no step trail)."""


GATE_VERDICTS: dict[GateStatus, tuple[int, str]] = {
    GateStatus.PASS: (EXIT_OK, "every enabled check passed (determinism: the re-run's outputs "
                  "are bit-identical, and the report says whether tensors or only the step "
                  "trail were compared; baseline: identical, or equivalent where "
                  "allow_equivalent is set)"),
    GateStatus.FAIL: (EXIT_FAILED, "a check failed: the re-run differs, the baseline moved, a "
                  "hygiene problem, or recorded data changed"),
    GateStatus.NO_VERDICT: (EXIT_NO_VERDICT, "a check could not be made: the training failed, or "
                        "its re-run did, or the weights moved from a baseline recorded on "
                        "another environment and 'equivalent' was not (or could not be) "
                        "judged"),
    GateStatus.NOTHING_COMPARED: (EXIT_NO_VERDICT, "the determinism re-run finished but compared "
                              "nothing: the smoke command declares no output and takes no "
                              "optimizer step; declare outputs in [tool.manifest]"),
    GateStatus.SKIP: (EXIT_OK, "a check that this mode does not run (--no-rerun trains nothing); "
                  "as a check's status only"),
}
"""The gate's verdict (and each check's status) → (exit status, meaning), read by the docs."""


class LabOutcome(StrEnum):
    """The lab's outcome of its recipe runs: the runs agree bit for bit, they differ, or
    they compared nothing (no output declared or written, and no optimizer step seen)."""

    BIT_IDENTICAL = "bit-identical"
    DIFFERS = "differs"
    NOTHING_COMPARED = "nothing-compared"


LAB_OUTCOMES: dict[LabOutcome, tuple[int, str]] = {
    LabOutcome.BIT_IDENTICAL: (
        EXIT_OK, "the recipe runs agree on every declared output tensor and every step trail "
        "point; the report says whether tensors or only the trail were compared"),
    LabOutcome.DIFFERS: (
        EXIT_FAILED, "the recipe runs differ: a tensor or a trail point (the first divergent "
        "step and op are named)"),
    LabOutcome.NOTHING_COMPARED: (
        EXIT_NO_VERDICT, "the runs finished but compared nothing: no --artifact declared (or "
        "none written) and no optimizer step seen; the checklist flags it with the fix"),
}
"""The lab's outcome (of the recipe runs) → (exit status, meaning), read by the docs."""


# ------------------------------------------------------------------- explain and diff

class ExplainVerdict(StrEnum):
    """Every verdict explain gives."""

    AGREE = "agree"
    PARTED = "parted"
    NO_VERDICT = "no-verdict"


EXPLAIN_VERDICTS: dict[str, tuple[int, str]] = {
    ExplainVerdict.AGREE: (EXIT_OK, "the fresh runs do not part at any recorded step"),
    ExplainVerdict.PARTED: (EXIT_FAILED, "the runs part: the step, the first op whose "
                            "inputs matched and outputs differ (op, module, file:line), "
                            "and the cause"),
    ExplainVerdict.NO_VERDICT: (EXIT_NO_VERDICT, "no step to explain (no optimizer step, or "
                                "a run failed); the reason says which"),
}
"""``manifest.explain.pipeline.ExplainReport.verdict`` → (exit status, meaning)."""

class DiffOutcome(StrEnum):
    """diff's verdict on two manifests (``manifest.diff.result.ManifestDiff.verdict``): the
    worst impact among the differences, or none."""

    IDENTICAL = "identical"
    BENIGN = "benign"
    BITS = "bits"


class OutputsOutcome(StrEnum):
    """diff's weighing of what the two runs produced (``ManifestDiff.outputs``), which can
    turn a ``bits`` verdict's exit status to 0 (``identical``) or 4 (``equivalent``)."""

    IDENTICAL = "identical"
    """No output, step-trail state or ending differs."""
    EQUIVALENT = "equivalent"
    """Rounding only: the trails and every declared output lie inside a vouched envelope."""
    DIFFER = "differ"
    """Anything else, a numeric judgement that could not be made included."""


class NumericVerdict(StrEnum):
    """The verdict of a numeric judgement (``manifest.numeric.envelope``'s, one rank's step
    trail against an envelope, then the outputs held to its last step), and the outputs'
    part of it (``outputs_verdict``: ``outside`` or ``not-compared``)."""

    EQUIVALENT = "equivalent"
    DIFFERS = "differs"
    NOT_COMPARED = "not-compared"
    OUTSIDE = "outside"


DIFF_OUTCOMES: dict[DiffOutcome, tuple[int, str]] = {
    DiffOutcome.IDENTICAL: (EXIT_OK, "the two manifests have no difference"),
    DiffOutcome.BENIGN: (
        EXIT_OK, "only differences that cannot change the bits (times, hosts, URLs)"),
    DiffOutcome.BITS: (
        EXIT_FAILED, "a difference that can change the bits, each with the reason; exit 0 "
        "instead when only seeds and generator states differ and both runs' outputs are "
        "identical anyway (said on each line), and "
        f"{EXIT_EQUIVALENT} when they are equivalent (rounding only, inside the envelope)"),
}
"""``manifest.diff.result.ManifestDiff.verdict`` → (exit status, meaning)."""


_GATE: Mapping[Verdict, GateStatus] = {
    Verdict.IDENTICAL: GateStatus.PASS, Verdict.DIFFERS: GateStatus.FAIL,
    Verdict.CHANGED_TOPOLOGY: GateStatus.FAIL, Verdict.NOTHING_COMPARED:
    GateStatus.NOTHING_COMPARED}


def gate_status(verdict: Verdict | str) -> GateStatus:
    """The gate's determinism check from verify's verdict of its re-run (anything else,
    ``equivalent`` included, is no verdict: the gate's re-run is on the same machine)."""
    return _GATE.get(Verdict(verdict), GateStatus.NO_VERDICT)


def lab_outcome(verdict: str) -> LabOutcome:
    """The lab's outcome of its recipe runs (which never fail to compare: a failed run
    stops the lab before)."""
    if verdict == Verdict.IDENTICAL:
        return LabOutcome.BIT_IDENTICAL
    if verdict == Verdict.NOTHING_COMPARED:
        return LabOutcome.NOTHING_COMPARED
    return LabOutcome.DIFFERS


def verb_verdicts() -> dict[str, list[Row]]:
    """Verb → every (verdict, exit status, meaning) it can give, in the verbs' own order."""

    def rows(table: Mapping[Any, tuple[int, str]]) -> list[Row]:
        return [(str(name), code, meaning) for name, (code, meaning) in table.items()]

    return {"verify": rows(VERDICTS), "lab": rows(LAB_OUTCOMES), "gate": rows(GATE_VERDICTS),
            "explain": rows(EXPLAIN_VERDICTS), "diff": rows(DIFF_OUTCOMES)}
