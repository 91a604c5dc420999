"""One judge: only ``manifest/judge/`` writes a verdict.

Read from the source with ``ast`` (nothing is imported): a module outside
``manifest/judge/`` that assigns an attribute named ``verdict`` (``report.verdict = …``,
in a tuple too) or passes ``verdict=`` to a call is deciding a verdict itself, and fails
here with its file and line. A report gets its verdict from a
``manifest.judge.rules.Judgement`` through ``manifest.judge.rules.record``.
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
                  if isinstance(e, ast.Attribute) and e.attr == "verdict"]
    return sorted(lines)


def test_no_module_outside_the_judge_writes_a_verdict() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py")) if JUDGE not in path.parents
             for line in verdict_writes(path.read_text(encoding="utf-8"))]
    assert not found, ("a verdict is written outside manifest/judge/ (make a Judgement "
                       "there and record() it): " + ", ".join(found))


def test_the_judge_writes_verdicts_itself() -> None:
    """The walk sees the one writer, so an empty result elsewhere means something."""
    assert verdict_writes((JUDGE / "rules.py").read_text(encoding="utf-8"))


def test_the_check_flags_every_way_of_writing_one() -> None:
    snippet = ("report.verdict = 'identical'\n"
               "report.verdict, report.reason = 'differs', 'x'\n"
               "Explained(verdict='parted')\n"
               "self.verdict: str = 'agree'\n"
               "if report.verdict == 'identical':\n    pass\n"
               "print(report.verdict)\n")
    assert verdict_writes(snippet) == [1, 2, 3, 4]
