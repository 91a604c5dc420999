"""Renderings of a gate report: human text (stderr), JSON (stdout), Markdown (job summary).

Only the CLI calls these. The Markdown is what ``manifest gate`` appends to
``$GITHUB_STEP_SUMMARY`` on GitHub Actions: one table row per check, then
the lines behind each failed or skipped check, folded.
"""

from __future__ import annotations

from typing import TextIO

from manifest.cli.text import json_text, shell_join
from manifest.cli.text import printable as _p
from manifest.gate.report import CheckResult, GateReport, Status

_MARK = {Status.PASS: "✅", Status.FAIL: "❌", Status.SKIP: "⏭️", Status.NO_VERDICT: "⚠️",
         Status.NOTHING_COMPARED: "⚠️"}
_TITLE = {Status.PASS: "✅ passed", Status.FAIL: "❌ failed", Status.NO_VERDICT: "⚠️ no verdict",
          Status.NOTHING_COMPARED: "⚠️ nothing compared", Status.SKIP: "⏭️ skipped"}
"""The Markdown title of each gate verdict (``skip`` is a check's status only)."""
_WORD = {Status.PASS: "PASSED", Status.FAIL: "FAILED", Status.NO_VERDICT: "NO VERDICT",
         Status.NOTHING_COMPARED: "NOTHING COMPARED", Status.SKIP: "SKIPPED"}


def render_gate(report: GateReport, file: TextIO) -> None:
    """The human report: one line per check, its details indented, then the verdict."""
    head = f"manifest gate ({report.mode}) in {_p(report.project)}"
    if report.command:
        head += f": {shell_join(list(report.command))}"
    file.write(head + "\n")
    width = max((len(c.name) for c in report.checks), default=0)
    for c in report.checks:
        file.write(f"  {c.status.value.upper():<10} {c.name:<{width}}  {_p(c.reason)}\n")
        for line in c.details:
            file.write(f"  {'':<10} {'':<{width}}    - {_p(line)}\n")
        if c.hint and c.status in (Status.FAIL, Status.NO_VERDICT, Status.SKIP,
                                   Status.NOTHING_COMPARED):
            file.write(f"  {'':<10} {'':<{width}}    → {_p(c.hint)}\n")
    for w in report.warnings:
        file.write(f"  warning: {_p(w)}\n")
    file.write(f"gate {_WORD[Status(report.verdict)]} (exit {report.exit_code})\n")


def gate_json_bytes(report: GateReport) -> bytes:
    return (json_text(report.to_json()) + "\n").encode()


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return _p(text).replace("\\", "\\\\").replace("|", "\\|")


def _code(text: str) -> str:
    text = _p(text)
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _detail_block(c: CheckResult) -> str:
    lines = [f"<details><summary>{c.name}: {len(c.details)} line(s)</summary>", ""]
    lines += [f"- {_p(line).replace('<', '&lt;')}" for line in c.details]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def gate_markdown(report: GateReport) -> str:
    """The job summary: verdict, a table of checks, folded details, hints."""
    out = [f"## Reproducibility gate: {_TITLE[Status(report.verdict)]}", ""]
    facts = [f"project {_code(report.project)}"]
    if report.command:
        facts.append(f"command {_code(shell_join(list(report.command)))}")
    facts.append(f"baseline {_code(report.baseline)}")
    if report.run_id:
        facts.append(f"run_id {_code(report.run_id[:19] + '…')}")
    out += [" · ".join(facts), "", "| check | result | reason |", "|---|---|---|"]
    for c in report.checks:
        out.append(f"| {c.name} | {_MARK[c.status]} {c.status.value} | {_cell(c.reason)} |")
    out.append("")
    for c in report.checks:
        if c.status is Status.PASS:
            continue
        if c.details:
            out.append(_detail_block(c))
        if c.hint:
            out += [f"> **{c.name}**: {_p(c.hint)}", ""]
    for w in report.warnings:
        out += [f"> ⚠️ {_p(w)}", ""]
    return "\n".join(out).rstrip() + "\n"
