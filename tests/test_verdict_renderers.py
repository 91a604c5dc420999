"""Every verdict of every verb goes through every renderer and every ``--format``.

A renderer keys its words and styles by the verdict enums (``manifest.judge``), with a
complete table; a verdict added to an enum and missed by one renderer fails here, not
silently at a user's terminal. Each rendering must name the verdict (or its word), and
the JSON must carry it with its exit status and reason code.
"""

from __future__ import annotations

import io
import json
from typing import Any, Literal

import pytest

from manifest.judge import (
    DIFF_OUTCOMES,
    EXPLAIN_VERDICTS,
    GATE_VERDICTS,
    LAB_OUTCOMES,
    VERDICTS,
    DiffOutcome,
    ExplainVerdict,
    GateStatus,
    LabOutcome,
    OutputsOutcome,
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


# ------------------------------------------------------------------- diff


def _bits_row(rule: str = "code.commit") -> Any:
    from manifest.diff.result import ChangeKind, Difference
    from manifest.diff.rules import Impact

    return Difference(location=("code", "commit"), path="code.commit", rule=rule,
                      change=ChangeKind.CHANGED, impact=Impact.BITS, reason="the code changed",
                      before="a" * 40, after="b" * 40)


_NUMERIC: dict[OutputsOutcome, dict[str, Any] | None] = {
    OutputsOutcome.IDENTICAL: None,
    OutputsOutcome.EQUIVALENT: {"verdict": "equivalent", "sentence": "every step inside"},
    OutputsOutcome.DIFFER: {"verdict": "differs", "sentence": "step 3 lies outside"},
}
"""A numeric judgement as ``manifest.diff.engine.weigh_outputs`` leaves it, per outcome."""

_SUMMARY = {
    OutputsOutcome.IDENTICAL: "Here the outputs are identical.",
    OutputsOutcome.EQUIVALENT: "the runs are equivalent (the same run up to rounding): "
                               "every step inside.",
    OutputsOutcome.DIFFER: "Outside the noise envelope: step 3 lies outside.",
}


@pytest.mark.parametrize("outcome", list(OutputsOutcome))
def test_every_diff_outputs_outcome_in_every_format(outcome: OutputsOutcome) -> None:
    """Each weighing of the outputs reaches the summary line, the JSON (with the exit
    status it gives a ``bits`` diff) and the Markdown; ``identical`` settles only a seed."""
    from manifest.cli.render_diff import diff_json_bytes, render_diff
    from manifest.cli.render_markdown import diff_markdown
    from manifest.diff.result import ManifestDiff
    from manifest.errors import EXIT_EQUIVALENT, EXIT_FAILED, EXIT_OK

    assert set(_NUMERIC) == set(_SUMMARY) == set(OutputsOutcome)
    rule = "randomness.seed" if outcome is OutputsOutcome.IDENTICAL else "code.commit"
    result = ManifestDiff(RUN_ID, RUN_ID, "da", "db", differences=(_bits_row(rule),),
                          nondeterminism=None, outputs=outcome, numeric=_NUMERIC[outcome])
    assert result.verdict is DiffOutcome.BITS
    out = io.StringIO()
    render_diff(result, a_file="a.json", b_file="b.json", file=out)
    assert _SUMMARY[outcome] in " ".join(out.getvalue().split()), out.getvalue()
    doc = json.loads(diff_json_bytes(result, a_file="a.json", b_file="b.json"))
    assert (doc["verdict"], doc["outputs"]) == ("bits", str(outcome))
    expected = {OutputsOutcome.IDENTICAL: (EXIT_OK, None),
                OutputsOutcome.EQUIVALENT: (EXIT_EQUIVALENT, "inside-envelope"),
                OutputsOutcome.DIFFER: (EXIT_FAILED, "trail-outside-envelope")}[outcome]
    assert (result.exit_code, doc.get("reason_code")) == expected
    assert diff_markdown(result, a_file="a.json", b_file="b.json").startswith(
        "## Diff: can change the bits\n")


@pytest.mark.parametrize("verdict", list(DiffOutcome))
def test_every_diff_verdict_in_every_format(verdict: DiffOutcome) -> None:
    from dataclasses import replace

    from manifest.cli.render_diff import diff_json_bytes, render_diff
    from manifest.cli.render_markdown import diff_markdown
    from manifest.diff.result import ManifestDiff
    from manifest.diff.rules import Impact

    rows = {DiffOutcome.IDENTICAL: (), DiffOutcome.BITS: (_bits_row(),),
            DiffOutcome.BENIGN: (replace(_bits_row(), impact=Impact.BENIGN),)}[verdict]
    result = ManifestDiff(RUN_ID, RUN_ID, "da", "da", differences=rows, nondeterminism=None)
    assert result.verdict is verdict
    out = io.StringIO()
    render_diff(result, a_file="a.json", b_file="b.json", file=out)
    summary = {DiffOutcome.IDENTICAL: "No differences: the two manifests are the same",
               DiffOutcome.BENIGN: "No difference that can change the bits (1 benign)",
               DiffOutcome.BITS: "1 difference can change the bits, 0 cannot."}[verdict]
    assert summary in " ".join(out.getvalue().split()), out.getvalue()
    head = "can change the bits" if verdict is DiffOutcome.BITS else (
        "no difference that can change the bits")
    assert diff_markdown(result, a_file="a.json", b_file="b.json").startswith(
        f"## Diff: {head}\n")
    doc = json.loads(diff_json_bytes(result, a_file="a.json", b_file="b.json"))
    assert doc["verdict"] == str(verdict)
    assert result.exit_code == DIFF_OUTCOMES[verdict][0]


# ------------------------------------------------------------------- lab


def _mode(mode: Literal["default", "recipe"], outcome: LabOutcome) -> Any:
    from manifest.lab.report import ModeResult, RunResult, WallStats

    runs = [RunResult(index=i, wall_s=1.0, exit_code=0, run_id=RUN_ID, trail_steps=3)
            for i in (1, 2)]
    return ModeResult(mode=mode, deterministic=mode == "recipe", runs=runs,
                      wall=WallStats(median_s=1.0, min_s=1.0, max_s=1.0),
                      bit_identical=outcome is LabOutcome.BIT_IDENTICAL, outcome=outcome,
                      basis="nothing" if outcome is LabOutcome.NOTHING_COMPARED else "trail")


@pytest.mark.parametrize("outcome", list(LabOutcome))
def test_every_lab_outcome_in_every_format(outcome: LabOutcome) -> None:
    from manifest.cli.render_lab import render_lab, render_lab_markdown
    from manifest.lab.report import Catalogue, Cost, Identity, LabReport

    report = LabReport(
        command=["python", "train.py"], seed=0, threads=1, runs_per_mode=2,
        default=_mode("default", outcome), recipe=_mode("recipe", outcome),
        cost=Cost(default_median_s=1.0, recipe_median_s=1.0, determinism_cost_pct=0.0,
                  spread_s=0.0, within_noise=True),
        catalogue=Catalogue(source="the table"),
        identity=Identity(recipe_run_id=RUN_ID, recipe_runs_agree=True, perturbation="seed",
                          perturbed_run_id=RUN_ID, perturbed_differs=True),
        checklist=[])
    word = {LabOutcome.BIT_IDENTICAL: "yes", LabOutcome.DIFFERS: "NO",
            LabOutcome.NOTHING_COMPARED: "NOTHING COMPARED"}[outcome]
    out = io.StringIO()
    render_lab(report, out)
    assert f"bit-identical     {word} (2 runs" in out.getvalue(), out.getvalue()
    assert ("next: capture a recipe run" in out.getvalue()) is (outcome is LabOutcome.DIFFERS)
    assert render_lab_markdown(report, plots=False)
    doc = json.loads(report.model_dump_json())
    assert doc["recipe"]["outcome"] == str(outcome)
    assert report.exit_code == LAB_OUTCOMES[outcome][0]


# ------------------------------------------------------------------- verify --segments


@pytest.mark.parametrize("verdict", [Verdict.IDENTICAL, Verdict.DIFFERS, Verdict.NO_VERDICT])
def test_every_stretch_verdict_in_every_format(verdict: Verdict) -> None:
    """A stretch of ``verify --segments`` is ``identical``, ``differs`` or ``no-verdict``
    (``manifest.judge.rules.stretch``); the report's verdict follows ``rules.segments``."""
    from manifest.cli.verbs_segments import segments_text
    from manifest.verify.segments import SegmentResult, SegmentsReport

    stretch = SegmentResult(start=0, end=4, checkpoint=None, verdict=verdict, steps_compared=4,
                            reason="why it is so", first_divergent_step=3
                            if verdict is Verdict.DIFFERS else None)
    report = SegmentsReport(file="run.json", run_id=RUN_ID, total_steps=8, stretches=2,
                            chosen_by="--at", segments=[stretch])
    assert report.verdict == verdict
    text = segments_text(report)
    assert text.startswith(f"verify --segments: {verdict}\n"), text
    detail = {Verdict.IDENTICAL: ", 4 trail points equal", Verdict.DIFFERS:
              ", first divergent step 3", Verdict.NO_VERDICT: ""}[verdict]
    assert f"steps 1–4 from the start: {verdict}{detail} (why it is so)" in text, text
    doc = json.loads(json.dumps(report.to_json()))
    assert (doc["verdict"], doc["segments"][0]["verdict"]) == (str(verdict), str(verdict))
    assert report.exit_code == VERDICTS[verdict][0]
