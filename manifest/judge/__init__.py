"""The one judge: every verb's verdict, decided in one place from frozen evidence.

* ``tables``: every verdict each verb gives, its exit status and meaning;
* ``rules``: the ordered rules (failure → nothing compared → comparison → topology →
  numbers → data), one function each, and :func:`~manifest.judge.rules.record`, the only
  code that writes a verdict into a report;
* ``envelope``: whose noise envelope may decide ``equivalent`` (verify and diff);
* ``reasons``: each reason's stable code.

It sits beside ``numeric/`` (below verify, diff, gate, lab and explain): it imports only
the exit statuses, and lazily the envelope checks and the seal, so every verb stands on
it and none is imported back.
"""

from manifest.judge.reasons import MEANINGS, ReasonCode
from manifest.judge.rules import (
    Findings,
    Judgement,
    current,
    judge,
    nothing_compared_reason,
    record,
)
from manifest.judge.tables import (
    BASES,
    DIFF_OUTCOMES,
    EXPLAIN_VERDICTS,
    GATE_VERDICTS,
    LAB_OUTCOMES,
    VERDICTS,
    DiffOutcome,
    ExplainVerdict,
    GateStatus,
    LabOutcome,
    NumericVerdict,
    OutputsOutcome,
    Verdict,
    gate_status,
    lab_outcome,
    verb_verdicts,
)

__all__ = [
    "BASES",
    "DIFF_OUTCOMES",
    "EXPLAIN_VERDICTS",
    "GATE_VERDICTS",
    "LAB_OUTCOMES",
    "MEANINGS",
    "VERDICTS",
    "DiffOutcome",
    "ExplainVerdict",
    "Findings",
    "GateStatus",
    "Judgement",
    "LabOutcome",
    "NumericVerdict",
    "OutputsOutcome",
    "ReasonCode",
    "Verdict",
    "current",
    "gate_status",
    "judge",
    "lab_outcome",
    "nothing_compared_reason",
    "record",
    "verb_verdicts",
]
