"""The table of verdicts (``manifest.judge``) against the reports that give them.

The concepts page's table is generated from it at every docs build; these tests
make it fail when a verb gives a verdict the table does not list, or lists one
with another exit status than the report's own ``exit_code``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from manifest.judge import DIFF_OUTCOMES, EXPLAIN_VERDICTS, verb_verdicts
from tests.runs import REPO


def test_every_verify_verdict_is_listed_with_the_reports_exit_status() -> None:
    from manifest.judge import VERDICTS, Verdict
    from manifest.verify.report import VerifyReport

    assert set(VERDICTS) == set(Verdict)  # a new verdict gets a row, or this fails
    for verdict, (code, meaning) in VERDICTS.items():
        assert meaning
        assert VerifyReport(file="f", run_id="r", command=[], verdict=verdict).exit_code == code


def test_gate_lab_and_explain_rows_match_their_reports() -> None:
    from manifest.explain.pipeline import ExplainReport
    from manifest.gate.policy import GatePolicy
    from manifest.gate.report import CheckResult, GateReport, Status
    from manifest.judge import GATE_VERDICTS, LAB_OUTCOMES, LabOutcome
    from manifest.lab.report import ModeResult

    assert set(GATE_VERDICTS) == set(Status)
    for status, (code, _) in GATE_VERDICTS.items():
        if status is Status.SKIP:
            continue  # a check's status only: a gate of skipped checks passes
        report = GateReport(project=".", mode="full", policy=GatePolicy(), baseline="b",
                            checks=[CheckResult("determinism", status, "why")])
        assert (report.verdict, report.exit_code) == (status.value, code)
    outcomes = ModeResult.model_fields["outcome"].annotation
    assert outcomes is LabOutcome and set(LAB_OUTCOMES) == set(LabOutcome)
    for verdict, (code, _) in EXPLAIN_VERDICTS.items():
        assert ExplainReport(file="f", run_id="r", command=[], verdict=verdict).exit_code == code


def test_diff_rows_are_the_diff_verdicts() -> None:
    from manifest.diff.result import ManifestDiff
    from manifest.diff.rules import Impact

    # ManifestDiff.verdict: an Impact's value, or "identical" when nothing differs.
    assert set(DIFF_OUTCOMES) == {i.value for i in Impact} | {"identical"}
    same = ManifestDiff("a", "b", "da", "db", differences=(), nondeterminism=None)
    assert same.verdict == "identical" and same.verdict in DIFF_OUTCOMES


@pytest.fixture(scope="module")
def gen_ref() -> object:
    spec = importlib.util.spec_from_file_location("gen_ref", REPO / "docs" / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_concepts_page_gets_every_verdict_of_every_verb(gen_ref: object) -> None:
    page = (REPO / "docs" / "concepts" / "verdicts.md").read_text(encoding="utf-8")
    marker: str = gen_ref.VERDICTS_MARKER  # type: ignore[attr-defined]
    assert marker in page
    built: str = gen_ref.on_page_markdown(page, None, None, None)  # type: ignore[attr-defined]
    assert marker not in built
    for verb, rows in verb_verdicts().items():
        for name, code, _ in rows:
            assert f"| {verb} | `{name}` | {code} |" in built, (verb, name)
    # The exit-status reference names every status the verbs give.
    exits: str = gen_ref.render_exit_status()  # type: ignore[attr-defined]
    for code in {c for rows in verb_verdicts().values() for _, c, _ in rows}:
        assert f"\n| {code} | `manifest.errors." in exits, code
    assert "verify: `identical`, `checked`" in exits


def test_the_verdicts_page_types_no_verdict_table_of_its_own() -> None:
    page = Path(REPO / "docs" / "concepts" / "verdicts.md").read_text(encoding="utf-8")
    assert "| `checked` | verify" not in page  # the hand table this replaced
