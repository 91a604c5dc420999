"""Markdown renderings (``--format markdown``) of every report: for a pull-request comment
or a job summary. Only the CLI calls these.

Each is plain GitHub-flavoured Markdown: a heading with the verdict, one table,
folded details. Text from a manifest is untrusted, so every cell goes through
:func:`cell` (pipes, backslashes, newlines, ``<``) and code spans through
:func:`code`.

``verify`` (and ``verify --explain``), ``explain`` and ``diff`` end with a small
plot of the step trail where one exists (:class:`StepTrail`, :func:`trail_markdown`):
per optimizer step, whether run A and run B agree. A trail stores one parameter
fingerprint per step, so agree or part is all a step can say; what each report
knows is plotted as it is. ``diff`` has both trails and compares every step;
verify and explain stop at the first step where the runs part, so the steps
after it are drawn as "not compared". The plot is a PNG embedded as a data URI
(one file that travels, like lab's report) when matplotlib is installed
(``pip install 'torch-manifest[plot]'``), else a text sparkline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from manifest.cli.text import printable
from manifest.judge import Verdict

if TYPE_CHECKING:
    from manifest.diff.result import ManifestDiff
    from manifest.diff.rules import Impact
    from manifest.models import Manifest
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


def verify_markdown(report: VerifyReport, *, trail: StepTrail | None = None,
                    plots: bool = True) -> str:
    out = [f"## Verify: {report.verdict}", "",
           f"{code(report.file)} · run_id {code(report.run_id[:23] + '…')}", ""]
    if report.reason:
        out += [f"> {cell(report.reason)}", ""]
    if report.verdict != Verdict.CHECKED:
        out += [f"Compared: {cell(report.basis_text)}", ""]
    if report.drift:
        out += [*table(("drift", "reason"), [(d.impact, d.reason) for d in report.drift]), ""]
    for change in report.data:
        out.append(f"- data{'' if change.checked else ' not checked'}: {cell(change.detail)}")
    rows: list[tuple[str, ...]] = []
    for art in report.artifacts:
        if art.identical or not art.tensors:
            rows.append((art.path, "", Verdict.IDENTICAL if art.identical
                         else art.detail or Verdict.DIFFERS,
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
    if trail is not None:
        out += ["", *trail_markdown(trail, plots=plots)]
    return "\n".join(out).rstrip() + "\n"


def diff_markdown(result: ManifestDiff, *, a_file: str, b_file: str,
                  only: Impact | None = None, trail: StepTrail | None = None,
                  plots: bool = True, code_lines: list[str] | None = None) -> str:
    """The diff for a pull-request comment; ``code_lines``: what changed in the code
    (``manifest.nodes.patches.code_report``), in a text block under the table."""
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
    if code_lines and (only is None or only.value == "bits"):
        text = [printable(line) for line in code_lines]
        fence = "````" if any("```" in line for line in text) else "```"
        out += [f"{fence}text", *text, fence, ""]
    out.append(f"{n_bits} can change the bits, {len(result.benign)} cannot.")
    if trail is not None:
        out += ["", *trail_markdown(trail, plots=plots)]
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


# ------------------------------------------------------------------- the step trail

AGREE, PART, UNKNOWN = "agree", "part", "not compared"
"""What one step of a trail says about two runs."""
SPARK = {AGREE: "▁", PART: "█", UNKNOWN: "·"}
SPARK_WIDTH = 60
"""A longer trail is drawn in this many characters, each a run of steps (█ if any parts)."""
_COLOURS = {AGREE: "tab:green", PART: "tab:red", UNKNOWN: "lightgrey"}


@dataclass(frozen=True)
class TrailRow:
    """One rank's trail (or every rank's, when a report knows only where they part)."""

    label: str
    points: tuple[tuple[int, str], ...]
    """(optimizer step, :data:`AGREE`, :data:`PART` or :data:`UNKNOWN`), by step."""


@dataclass(frozen=True)
class StepTrail:
    """Run A against run B, step by step: what a report's plot shows."""

    title: str
    """What was compared: ``run A vs run B``, ``the recorded run vs the re-run`` …"""
    rows: tuple[TrailRow, ...]

    @property
    def first_part(self) -> int | None:
        parted = [step for row in self.rows for step, state in row.points if state == PART]
        return min(parted) if parted else None


def _steps(manifest: Manifest) -> dict[int, dict[int, str]]:
    """Each rank's recorded trail: {rank: {step: digest}}."""
    if manifest.outputs is None:
        return {}
    return {p.rank: {t.step: t.digest for t in p.trail}
            for p in manifest.outputs.processes if p.trail}


def trail_between(a: Manifest, b: Manifest, title: str = "A vs B") -> StepTrail | None:
    """Both recorded trails, compared at every step they share (``diff``); None without one."""
    trails_a, trails_b = _steps(a), _steps(b)
    rows = []
    for rank in sorted(set(trails_a) & set(trails_b)):
        one, other = trails_a[rank], trails_b[rank]
        shared = sorted(set(one) & set(other))
        if shared:
            rows.append(TrailRow(f"rank {rank}", tuple(
                (step, AGREE if one[step] == other[step] else PART) for step in shared)))
    return StepTrail(title, tuple(rows)) if rows else None


def trail_to_first(steps: Iterable[int], first: int | None, title: str) -> StepTrail | None:
    """A trail compared up to its first parting step only (verify, explain).

    ``steps``: the steps the trail holds; ``first``: the first step where the
    runs part (None: they agree at every step). Steps after it were not
    compared one by one, and are drawn so.
    """
    found = set(steps)
    if first is not None:
        found.add(first)
    if not found:
        return None
    points = tuple((step, AGREE if first is None or step < first else
                    PART if step == first else UNKNOWN) for step in sorted(found))
    return StepTrail(title, (TrailRow("every rank", points),))


def verify_trail(report: VerifyReport, recorded: bytes) -> StepTrail | None:
    """verify's trail: the recorded run against the re-run, up to the first divergent step.

    ``recorded``: the manifest's bytes (verify compared its trail with the re-run's).
    """
    if not report.trail_compared:
        return None
    from manifest.canonical import load_manifest

    return trail_to_first(recorded_steps(load_manifest(recorded)),
                          report.first_divergent_step, "the recorded run vs the re-run")


def recorded_steps(manifest: Manifest) -> list[int]:
    """The steps of a manifest's trail, all ranks together."""
    return sorted({step for steps in _steps(manifest).values() for step in steps})


def sparkline(points: Sequence[tuple[int, str]], width: int = SPARK_WIDTH) -> str:
    """One character per step, or per run of steps when there are more than ``width``."""
    states = [state for _, state in points]
    if len(states) > width:
        size = -(-len(states) // width)
        states = [_bucket(states[i:i + size]) for i in range(0, len(states), size)]
    return "".join(SPARK[state] for state in states)


def _bucket(states: Sequence[str]) -> str:
    if PART in states:
        return PART
    return AGREE if all(s == AGREE for s in states) else UNKNOWN


def _summary(trail: StepTrail) -> str:
    points = [p for row in trail.rows for p in row.points]
    compared = {step for step, state in points if state != UNKNOWN}
    agree = {step for step, state in points if state == AGREE} - {
        step for step, state in points if state == PART}
    first = trail.first_part
    if first is None:
        return f"The runs agree at every one of the {len(compared)} step(s) compared."
    text = f"The runs part first at step {first}"
    if agree:
        text += f", after agreeing at {len(agree)} step(s)"
    text += f"; {len(compared - agree)} of {len(compared)} step(s) compared part."
    unknown = {step for step, state in points if state == UNKNOWN}
    if unknown:
        text += (f" The {len(unknown)} step(s) after step {first} were not compared one by "
                 "one.")
    return text


def trail_png(trail: StepTrail) -> bytes | None:
    """The trail as a strip per row (green agree, red part, grey not compared);
    None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return None
    import io

    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.35 * len(trail.rows)))
    for y, row in enumerate(trail.rows):
        steps = [step for step, _ in row.points]
        for i, (step, state) in enumerate(row.points):
            left = (steps[i - 1] + step) / 2 if i else step - 0.5
            right = (step + steps[i + 1]) / 2 if i + 1 < len(steps) else step + 0.5
            ax.broken_barh([(left, right - left)], (y - 0.4, 0.8), color=_COLOURS[state],
                           linewidth=0)
    ax.set_yticks(range(len(trail.rows)), [row.label for row in trail.rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("optimizer step")
    ax.set_title(f"step trail: {trail.title}", fontsize=9)
    shown = {state for row in trail.rows for _, state in row.points}
    ax.legend(handles=[Patch(color=_COLOURS[s], label=s) for s in (AGREE, PART, UNKNOWN)
                       if s in shown],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def trail_markdown(trail: StepTrail, *, plots: bool = True) -> list[str]:
    """The step-trail section: a heading, the plot (image or sparkline), one summary line."""
    import base64

    out = [f"### Step trail: {cell(trail.title)}", ""]
    png = trail_png(trail) if plots else None
    if png is not None:
        out += [f"![step trail, {cell(trail.title)}](data:image/png;base64,"
                f"{base64.b64encode(png).decode()})", ""]
    else:
        steps = [step for row in trail.rows for step, _ in row.points]
        label = max(len(row.label) for row in trail.rows)
        out.append("```text")
        out += [f"{printable(row.label):<{label}}  {sparkline(row.points)}" for row in trail.rows]
        out += [f"{'':<{label}}  steps {min(steps)}–{max(steps)}; "
                f"{SPARK[AGREE]} agree  {SPARK[PART]} part  {SPARK[UNKNOWN]} not compared",
                "```", ""]
    out.append(_summary(trail))
    if plots and png is None:
        out += ["", "(The image needs the optional extra: pip install 'torch-manifest[plot]'.)"]
    return out
