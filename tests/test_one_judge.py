"""One judge: only ``manifest/judge/`` writes a verdict, or decides one from another.

Read from the source with ``ast`` (nothing is imported): a module outside
``manifest/judge/`` that assigns an attribute named ``verdict`` (``report.verdict = …``,
in a tuple too), a key ``verdict`` (``doc["verdict"] = …``) or passes ``verdict=`` to a
call is deciding a verdict itself, and fails here with its file and line. A report gets
its verdict from a ``manifest.judge.rules.Judgement`` through
``manifest.judge.rules.record``. A module that compares a verdict (or an outcome) with a
verdict's string literal (``report.verdict == "differs"``) decides by a spelling the
judge's tables do not own: it compares with the enum (``Verdict.DIFFERS``) instead, so a
renamed verdict fails at import, not silently in a branch never taken.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "manifest"
JUDGE = PACKAGE / "judge"


def verdict_writes(source: str) -> list[int]:
    """The lines of ``source`` that assign an attribute ``verdict`` or pass ``verdict=``."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call):
            lines += [node.lineno for k in node.keywords if k.arg == "verdict"]
        lines += [e.lineno for t in targets for e in ast.walk(t)
                  if (isinstance(e, ast.Attribute) and e.attr == "verdict")
                  or (isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant)
                      and e.slice.value == "verdict")]
    return sorted(lines)


def _verdict_words() -> set[str]:
    """Every verdict, outcome and status spelling the judge's tables own."""
    from manifest import judge

    enums = (judge.Verdict, judge.GateStatus, judge.LabOutcome, judge.ExplainVerdict,
             judge.DiffOutcome, judge.OutputsOutcome, judge.NumericVerdict)
    return {str(member) for enum in enums for member in enum}


_JUDGED = ("verdict", "outcome", "outputs")
"""A name that holds a verdict contains one of these (``report.verdict``,
``recipe.outcome``, ``result.outputs``, ``doc.get("outputs_verdict")``)."""


def _names_a_verdict(node: ast.expr) -> bool:
    name = None
    if isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        name = str(node.slice.value)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "get" and node.args
          and isinstance(node.args[0], ast.Constant)):
        name = str(node.args[0].value)
    return name is not None and any(word in name for word in _JUDGED)


def verdict_comparisons(source: str) -> list[int]:
    """The lines of ``source`` that compare a verdict with a verdict's string literal."""
    words = _verdict_words()
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literal = any(isinstance(e, ast.Constant) and e.value in words for e in sides)
        if literal and any(_names_a_verdict(e) for e in sides):
            lines.append(node.lineno)
    return sorted(lines)


STILL_BY_STRING = {
    "manifest/numeric/envelope.py": 2,
}
"""Modules that still compare by string, each with how many places: numeric/envelope
words its own judgement's sentence and sits beside the judge (importing its enums would
be a circle). A new one anywhere (or one more here) fails."""


def test_no_module_outside_the_judge_writes_a_verdict() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py")) if JUDGE not in path.parents
             for line in verdict_writes(path.read_text(encoding="utf-8"))]
    assert not found, ("a verdict is written outside manifest/judge/ (make a Judgement "
                       "there and record() it): " + ", ".join(found))


def test_no_module_outside_the_judge_decides_by_a_verdict_string() -> None:
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if JUDGE in path.parents:
            continue
        lines = verdict_comparisons(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    beyond = {f"{name}:{lines}" for name, lines in found.items()
              if len(lines) > STILL_BY_STRING.get(name, 0)}
    assert not beyond, ("a verdict is decided by comparing with a string outside "
                        "manifest/judge/ (compare with the enum in manifest.judge.tables): "
                        + ", ".join(sorted(beyond)))


def test_the_judge_writes_verdicts_itself() -> None:
    """The walk sees the one writer, so an empty result elsewhere means something."""
    assert verdict_writes((JUDGE / "rules.py").read_text(encoding="utf-8"))


def test_the_check_flags_every_way_of_writing_one() -> None:
    snippet = ("report.verdict = 'identical'\n"
               "report.verdict, report.reason = 'differs', 'x'\n"
               "Explained(verdict='parted')\n"
               "self.verdict: str = 'agree'\n"
               "if report.verdict == 'identical':\n    pass\n"
               "print(report.verdict)\n"
               "doc['verdict'] = 'differs'\n"
               "doc['trail_verdict'] = doc['verdict']\n")
    assert verdict_writes(snippet) == [1, 2, 3, 4, 8]


def test_the_check_flags_every_way_of_deciding_by_string() -> None:
    snippet = ("if report.verdict == 'differs':\n    pass\n"
               "ok = recipe.outcome != 'nothing-compared'\n"
               "x = numeric.get('outputs_verdict') == 'outside'\n"
               "y = 'equivalent' == result.outputs\n"
               "z = doc['verdict'] == 'not-compared'\n"
               "if report.verdict == Verdict.DIFFERS:\n    pass\n"
               "w = d.impact == 'bits'\n"
               "v = report.verdict == 'no such verdict'\n")
    assert verdict_comparisons(snippet) == [1, 3, 4, 5, 6]


def test_the_concepts_page_lists_every_reason_code() -> None:
    import importlib.util

    from manifest.judge.reasons import MEANINGS, ReasonCode

    assert set(MEANINGS) == set(ReasonCode)
    spec = importlib.util.spec_from_file_location("gen_ref", ROOT / "docs" / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    gen_ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_ref)
    page = (ROOT / "docs" / "concepts" / "verdicts.md").read_text(encoding="utf-8")
    assert gen_ref.REASONS_MARKER in page
    built = gen_ref.on_page_markdown(page, None, None, None)
    for code in ReasonCode:
        assert f"| `{code}` |" in built, code


def test_the_rules_in_order_each_with_its_code() -> None:
    """Failure before nothing-compared before the comparison; changed data is never
    ``identical``; another world size refines only a ``differs``."""
    from manifest.judge import Findings, ReasonCode, Verdict, judge, rules

    nothing = "nothing to compare"
    failed = judge(Findings(outputs=[False], failure="boom"), nothing=nothing)
    assert (failed.verdict, failed.code) == (Verdict.NO_VERDICT, ReasonCode.RERUN_FAILED)
    empty = judge(Findings(), nothing=nothing)
    assert (empty.verdict, empty.reason, empty.code) == (
        Verdict.NOTHING_COMPARED, nothing, ReasonCode.NOTHING_COMPARED)
    same = judge(Findings(outputs=[True], trail_steps=3), nothing=nothing)
    assert (same.verdict, same.basis, same.code) == (Verdict.IDENTICAL, "tensors and trail",
                                                     None)
    moved = judge(Findings(outputs=[True, False]), nothing=nothing)
    assert (moved.verdict, moved.code) == (Verdict.DIFFERS, ReasonCode.OUTPUTS_DIFFER)
    parts = judge(Findings(outputs=[True], trail_steps=2, trail_parts_at=7), nothing=nothing)
    assert (parts.verdict, parts.code) == (Verdict.DIFFERS, ReasonCode.TRAIL_PARTS)

    changed = rules.data(same, ["train (data/)"])
    assert (changed.verdict, changed.code) == (Verdict.DIFFERS, ReasonCode.DATA_CHANGED)
    assert "train (data/)" in (changed.reason or "")
    assert rules.data(same, []) == same  # positive control: unchanged data changes nothing
    assert rules.topology(moved, world_size_changed=True, reason="2 → 4").verdict is (
        Verdict.CHANGED_TOPOLOGY)
    assert rules.topology(same, world_size_changed=True, reason="2 → 4") == same


def test_a_report_carries_the_code_in_its_json() -> None:
    from manifest.judge import ReasonCode, record, rules
    from manifest.verify.report import VerifyReport

    report = VerifyReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"])
    assert report.to_json()["reason_code"] is None
    record(report, rules.refused(ReasonCode.NO_COMMAND, "no command"))
    doc = report.to_json()
    assert (doc["verdict"], doc["reason"], doc["reason_code"]) == (
        "no-verdict", "no command", "no-command")
    assert report.exit_code == 3


def test_the_gate_and_diff_take_their_verdicts_from_the_judge() -> None:
    from manifest.judge import GateStatus, ReasonCode, rules

    assert rules.gate([GateStatus.PASS, GateStatus.SKIP]) is GateStatus.PASS
    assert rules.gate([GateStatus.NOTHING_COMPARED, GateStatus.NO_VERDICT]) is (
        GateStatus.NO_VERDICT)
    assert rules.gate([GateStatus.NO_VERDICT, GateStatus.FAIL]) is GateStatus.FAIL
    assert rules.diff_reason("identical", None) is None
    assert rules.diff_reason("differ", None) is ReasonCode.OUTPUTS_DIFFER
    assert rules.diff_reason("equivalent", {"verdict": "equivalent"}) is (
        ReasonCode.INSIDE_ENVELOPE)
    assert rules.diff_reason("differ", {"verdict": "not-compared"}) is (
        ReasonCode.ENVELOPE_NOT_COMPARED)


def test_diffs_weighing_of_the_outputs_is_the_judges() -> None:
    """Only a numeric judgement still ``equivalent`` after the outputs were held makes
    diff's outputs ``equivalent``; no judgement, or any other, is ``differ``."""
    from types import SimpleNamespace

    from manifest.judge import DiffOutcome, OutputsOutcome, rules

    weigh = rules.diff_outputs
    assert weigh(produced=False, numeric=None) is OutputsOutcome.IDENTICAL
    assert weigh(produced=True, numeric={"verdict": "equivalent"}) is OutputsOutcome.EQUIVALENT
    assert weigh(produced=True, numeric=None) is OutputsOutcome.DIFFER
    doc = {"verdict": "equivalent", "outputs_verdict": "outside"}
    rules.outputs_not_held(doc, "the output w.pt is 3× the bound")
    assert doc["verdict"] == "differs" and "3× the bound" in doc["sentence"]
    assert weigh(produced=True, numeric=doc) is OutputsOutcome.DIFFER
    held = {"verdict": "equivalent", "outputs_verdict": "not-compared"}
    rules.outputs_not_held(held, "B's repository is not known")
    assert held["verdict"] == "not-compared"

    ranks = [SimpleNamespace(verdict="equivalent"), SimpleNamespace(verdict="differs")]
    assert rules.worst_numeric(ranks) is ranks[1]
    assert rules.worst_numeric(ranks[:1]) is None  # positive control: all inside
    assert rules.diff_verdict(bits=True, differences=True) is DiffOutcome.BITS
    assert rules.diff_verdict(bits=False, differences=True) is DiffOutcome.BENIGN
    assert rules.diff_verdict(bits=False, differences=False) is DiffOutcome.IDENTICAL


def test_verify_and_diff_ask_the_one_envelope_rule() -> None:
    """Both verbs' envelope choice goes through ``manifest.judge.envelope.may_decide``."""
    for module in ("verify/equivalence.py", "diff/engine.py"):
        assert "may_decide(" in (PACKAGE / module).read_text(encoding="utf-8"), module
    from manifest.judge.envelope import may_decide

    refused = may_decide(None, basis="sealed")
    assert refused.envelope is None and refused.refusal is not None
