"""Every verdict of every verb goes through every renderer and every ``--format``.

A renderer keys its words and styles by the verdict enums (``manifest.judge``), with a
complete table; a verdict added to an enum and missed by one renderer fails here, not
silently at a user's terminal. Each rendering must name the verdict (or its word), and
the JSON must carry it with its exit status and reason code.
"""

from __future__ import annotations

import io
import json

import pytest

from manifest.judge import (
    EXPLAIN_VERDICTS,
    GATE_VERDICTS,
    VERDICTS,
    ExplainVerdict,
    GateStatus,
    ReasonCode,
    Verdict,
)

RUN_ID = "blake3:" + "0" * 64


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verify_verdict_in_every_format(verdict: Verdict) -> None:
    from manifest.cli.render import VERDICT_STYLE, render_verify
    from manifest.cli.render_markdown import verify_markdown
    from manifest.verify.report import VerifyReport

    assert set(VERDICT_STYLE) == set(Verdict)
    report = VerifyReport(file="run.json", run_id=RUN_ID, command=["python", "train.py"],
                          verdict=verdict, reason="why it is so",
                          reason_code=str(ReasonCode.OUTPUTS_DIFFER))
    out = io.StringIO()
    render_verify(report, out)
    assert out.getvalue().startswith(str(verdict)), out.getvalue()[:80]
    assert "why it is so" in out.getvalue()
    assert verify_markdown(report).startswith(f"## Verify: {verdict}\n")
    doc = json.loads(json.dumps(report.to_json()))
    assert (doc["verdict"], doc["reason_code"]) == (str(verdict), "outputs-differ")
    assert report.exit_code == VERDICTS[verdict][0]


@pytest.mark.parametrize("status", [s for s in GateStatus if s is not GateStatus.SKIP])
def test_every_gate_verdict_in_every_format(status: GateStatus) -> None:
    from manifest.cli.render_gate import _TITLE, _WORD, gate_json_bytes, gate_markdown, render_gate
    from manifest.gate.policy import GatePolicy
    from manifest.gate.report import CheckResult, GateReport

    assert set(_TITLE) == set(_WORD) == set(GateStatus)
    report = GateReport(project="demo", mode="full", policy=GatePolicy(),
                        baseline="manifests/baseline.json",
                        checks=[CheckResult("determinism", status, "why it is so")])
    assert report.verdict == status
    out = io.StringIO()
    render_gate(report, out)
    assert f"gate {_WORD[status]} (exit {GATE_VERDICTS[status][0]})" in out.getvalue()
    assert gate_markdown(report).startswith(f"## Reproducibility gate: {_TITLE[status]}")
    doc = json.loads(gate_json_bytes(report))
    assert (doc["verdict"], doc["exit_code"]) == (str(status), GATE_VERDICTS[status][0])


@pytest.mark.parametrize("verdict", list(ExplainVerdict))
def test_every_explain_verdict_in_every_format(verdict: ExplainVerdict) -> None:
    from manifest.cli.render_explain import EXPLAIN_HEAD, explain_markdown, render_explain
    from manifest.explain.pipeline import ExplainReport

    assert set(EXPLAIN_HEAD) == set(ExplainVerdict)
    report = ExplainReport(file="run.json", run_id=RUN_ID, command=["python"],
                           verdict=verdict, reason="why it is so", first_step=3,
                           reason_code=str(ReasonCode.RUNS_PARTED))
    out = io.StringIO()
    render_explain(report, out)
    assert f"{EXPLAIN_HEAD[verdict]} at step 3" in out.getvalue()
    assert "why it is so" in explain_markdown(report)
    doc = json.loads(json.dumps(report.to_json()))
    assert (doc["verdict"], doc["reason_code"]) == (str(verdict), "runs-parted")
    assert report.exit_code == EXPLAIN_VERDICTS[verdict][0]


def test_a_verdict_no_renderer_knows_fails_loudly() -> None:
    """Positive control: a verdict missing from the tables is an error, not a default."""
    from manifest.cli.render import render_verify
    from manifest.verify.report import VerifyReport

    report = VerifyReport(file="run.json", run_id=RUN_ID, command=["python"],
                          verdict="brand-new")
    with pytest.raises(ValueError, match="brand-new"):
        render_verify(report, io.StringIO())
