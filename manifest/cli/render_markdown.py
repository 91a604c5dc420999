"""Markdown renderings (``--format markdown``) of every report: for a pull-request comment
or a job summary. Only the CLI calls these.

Each is plain GitHub-flavoured Markdown: a heading with the verdict, one table,
folded details. Text from a manifest is untrusted, so every cell goes through
:func:`cell` (pipes, backslashes, newlines, ``<``) and code spans through
:func:`code`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from manifest.cli.text import printable

if TYPE_CHECKING:
    from manifest.diff.result import ManifestDiff
    from manifest.diff.rules import Impact
    from manifest.verify.report import VerifyReport


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell (and on a terminal: ``printable``)."""
    return (printable(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;"))


def code(text: str) -> str:
    """A code span that survives a backtick inside ``text``."""
    text = printable(text)
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def show_markdown(rows: list[tuple[str, str, str]], *, run_id: str, digest: str) -> str:
    out = [f"## Manifest {code(run_id)}", "", f"digest {code(digest)}", ""]
    out += table(("section", "fact", "value"), rows)
    return "\n".join(out) + "\n"


def verify_markdown(report: VerifyReport) -> str:
    out = [f"## Verify: {report.verdict}", "",
           f"{code(report.file)} · run_id {code(report.run_id[:23] + '…')}", ""]
    if report.reason:
        out += [f"> {cell(report.reason)}", ""]
    if report.drift:
        out += [*table(("drift", "reason"), [(d.impact, d.reason) for d in report.drift]), ""]
    for change in report.data:
        out.append(f"- data: {cell(change.detail)}")
    rows: list[tuple[str, ...]] = []
    for art in report.artifacts:
        if art.identical or not art.tensors:
            rows.append((art.path, "", "identical" if art.identical else art.detail or "differs",
                         "", ""))
            continue
        for t in art.tensors:
            count = "-" if t.elements is None else (
                f"{t.elements}/{t.total}" if t.total else str(t.elements))
            rows.append((art.path, t.name, t.change, count,
                         "-" if t.max_abs is None else f"{t.max_abs:.3g}"))
    if rows:
        out += table(("artifact", "tensor", "change", "elements", "max |Δ|"), rows)
    if report.first_divergent_step is not None:
        out += ["", f"First divergent step: {report.first_divergent_step}"]
    return "\n".join(out).rstrip() + "\n"


def diff_markdown(result: ManifestDiff, *, a_file: str, b_file: str,
                  only: Impact | None = None) -> str:
    from manifest.diff.reasons import show_value

    n_bits = len(result.bits)
    head = "can change the bits" if n_bits else "no difference that can change the bits"
    out = [f"## Diff: {head}", "",
           f"a {code(a_file)} run_id {code(show_value(result.a_run_id))}  ",
           f"b {code(b_file)} run_id {code(show_value(result.b_run_id))}", ""]
    if result.nondeterminism is not None:
        out += [f"> **{cell(result.nondeterminism.message)}**", ""]
    rows = [(r.impact.value, r.section, r.reason) for r in result.selected(only)]
    if rows:
        out += [*table(("impact", "section", "difference"), rows), ""]
    out.append(f"{n_bits} can change the bits, {len(result.benign)} cannot.")
    return "\n".join(out) + "\n"


def hash_markdown(entry_json: str) -> str:
    entry = json.loads(entry_json)
    rows = [(str(k), str(v)) for k, v in entry.items() if v is not None]
    return "\n".join(table(("field", "value"), rows)) + "\n"


def text_markdown(title: str, text: str) -> str:
    """A heading and a plain-text report in a fence (for verbs whose report is prose)."""
    text = "\n".join(printable(line) for line in text.rstrip().split("\n"))
    fence = "````" if "```" in text else "```"
    return f"## {title}\n\n{fence}text\n{text}\n{fence}\n"
