"""The ``lab`` report for people: the terminal text and a self-contained Markdown file.

The Markdown report embeds its plots as PNG data URIs, so it is one file
that travels; they are drawn with matplotlib when the optional extra is
installed (``pip install 'torch-manifest[plot]'``), and the same numbers are
always there as tables, so without it nothing but the pictures is lost.
Text from the run (module paths, file names, op names) is escaped before it
goes into Markdown, so a hostile name cannot add markup or HTML.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from manifest.judge import LabOutcome

if TYPE_CHECKING:
    from manifest.lab.report import CatalogueEntry, LabReport, ModeResult

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def _num(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    return f"{value:.3g}{unit}" if value else f"0{unit}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _verdict(m: ModeResult) -> str:
    """``yes`` / ``NO`` / ``NOTHING COMPARED``: never a yes that rests on nothing."""
    return ("NOTHING COMPARED" if m.outcome == LabOutcome.NOTHING_COMPARED
            else _yes(m.bit_identical))


def _mode_lines(m: ModeResult) -> list[str]:
    lines = [f"  bit-identical     {_verdict(m)} ({len(m.runs)} runs, "
             f"{m.tensors_compared} tensors)",
             f"  compared          {m.basis_text or m.basis}"]
    lines.append(f"  max |Δ|           {_num(m.max_abs)}    max ULP {_num(m.max_ulp)}    "
                 f"weight L2 {_num(m.weight_l2)}")
    if m.loss_gap is not None:
        lines.append(f"  loss gap          {_num(m.loss_gap)} (final loss), "
                     f"{_num(m.max_loss_gap)} (any logged step)")
    else:
        lines.append("  loss gap          - (the script logs no loss: manifest.log(loss=…))")
    if m.first_divergent_step is not None:
        lines.append(f"  first divergent   optimizer step {m.first_divergent_step}")
    for d in m.differing[:10]:
        where = f"{d.artifact}:{d.name}" if d.name else d.artifact
        lines.append(f"    {where}  {d.change}: {_num(d.elements)}/{_num(d.total)} elements, "
                     f"max |Δ| {_num(d.max_abs)}, max ULP {_num(d.max_ulp)}, L2 {_num(d.l2)}")
    if len(m.differing) > 10:
        lines.append(f"    … and {len(m.differing) - 10} more tensors (--json lists all)")
    return lines


def _documented(entry: CatalogueEntry, module_type: str) -> str:
    """The documented entry naming this site's module (``torch.nn.Conv2d``), else the first."""
    kind = module_type.split(",", 1)[0].strip()
    for text in entry.documented:
        if kind and text.split(" ", 1)[0].endswith("." + kind):
            return text
    return entry.documented[0]


def _explained_lines(r: LabReport) -> list[str]:
    e = r.explained
    assert e is not None
    head = f"  explain: {e.verdict}" + (f" ({e.cause})" if e.cause else "")
    lines = [head + (f": {e.reason}" if e.reason else "")]
    if e.environment:
        lines.append(f"    environment: {e.environment}")
    for f in e.findings:
        module = f.module or f.module_type or "(no module)"
        lines.append(f"    rank {f.rank}, step {f.step}: {f.kind} at {f.op} in {module}, "
                     f"{f.where or '(no user frame)'} ({f.tensor}, max |Δ| {_num(f.max_abs)})")
    return lines


def render_lab(report: LabReport, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    r = report
    lines = [f"manifest lab: {' '.join(r.command)}",
             f"  seed {r.seed}, {r.threads} threads, {r.runs_per_mode} runs per mode", "",
             "1. noise floor: same seed, PyTorch's default switches",
             *_mode_lines(r.default), "",
             "2. the recipe: every determinism switch on",
             *_mode_lines(r.recipe)]
    if r.explained is not None:
        lines += _explained_lines(r)
    elif r.recipe.outcome == LabOutcome.DIFFERS:
        lines.append("  next: capture a recipe run and run 'manifest explain run.json' for the "
                     "first op where the runs part")
    if r.envelope is not None or r.envelope_note:
        from manifest.cli.render_envelope import envelope_lines

        lines += ["", *(["  " + x for x in envelope_lines(r.envelope)] if r.envelope else []),
                  *([f"  envelope: {r.envelope_note}"] if r.envelope_note else [])]
    c = r.cost
    lines += ["", "3. cost (wall time per run)",
              f"  default           median {c.default_median_s:.3f} s  "
              f"(min {r.default.wall.min_s:.3f}, max {r.default.wall.max_s:.3f})",
              f"  recipe            median {c.recipe_median_s:.3f} s  "
              f"(min {r.recipe.wall.min_s:.3f}, max {r.recipe.wall.max_s:.3f})",
              f"  determinism_cost_pct  {c.determinism_cost_pct:+.1f}%"]
    if c.caveat:
        lines.append(f"  caveat: {c.caveat}")
    cat = r.catalogue
    lines += ["", f"4. op catalogue: {len(cat.entries)} nondeterministic op(s) of "
              f"{cat.ops_distinct} distinct ({cat.ops_total} calls audited)",
              f"  list from: {cat.source}"]
    if cat.audit_error:
        lines.append(f"  audit: {cat.audit_error}")
    for e in cat.entries:
        kind = e.sites[0].module_type if e.sites else ""
        lines.append(f"  {e.kind:<8} {e.op}  ×{e.count}  ({_documented(e, kind)})")
        for s in e.sites[:5]:
            module = s.module or "(no module)"
            kind = f" ({s.module_type})" if s.module_type else ""
            lines.append(f"             {module}{kind}  {s.where or '(no user frame)'}  "
                         f"×{s.count} on {s.device}")
    i = r.identity
    lines += ["", "5. config identity",
              f"  recipe run_id     {i.recipe_run_id}  "
              f"({'same' if i.recipe_runs_agree else 'DIFFERENT'} for all {r.runs_per_mode} runs)",
              f"  perturbed run_id  {i.perturbed_run_id}  "
              f"({'differs' if i.perturbed_differs else 'SAME'}: {i.perturbation})",
              "", "6. checklist"]
    for check in r.checklist:
        lines.append(f"  {_MARK[check.status]}  {check.category + ' / ' + check.name:<32} "
                     f"{check.detail}")
        if check.fix:
            lines.append(f"        fix: {check.fix}")
    out.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------- markdown


def _md(text: object) -> str:
    """Text safe in a table cell or a line (the one escaping rule of ``render_markdown``)."""
    from manifest.cli.render_markdown import cell

    return cell(str(text))


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def plot_png(report: LabReport) -> bytes | None:
    """Run times of both modes and the noise floor per tensor, as PNG; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for x, mode in enumerate((report.default, report.recipe)):
        walls = [run.wall_s for run in mode.runs]
        left.scatter([x] * len(walls), walls, color=("tab:orange", "tab:blue")[x], zorder=3)
        left.hlines(mode.wall.median_s, x - 0.2, x + 0.2, color="black")
    left.set_xticks([0, 1], ["PyTorch defaults", "recipe"])
    left.set_xlim(-0.6, 1.6)
    left.set_ylabel("wall time per run (s)")
    left.set_title(f"determinism_cost_pct {report.cost.determinism_cost_pct:+.1f}%")
    diffs = [d for d in report.default.differing if d.max_abs]
    if diffs:
        names = [d.name or d.artifact for d in diffs][:30]
        right.barh(range(len(names)), [d.max_abs or 0.0 for d in diffs][:30],
                   color="tab:orange")
        right.set_yticks(range(len(names)), names, fontsize=7)
        right.set_xscale("log")
        right.set_xlabel("max |Δ| between same-seed default runs")
        right.invert_yaxis()
    else:
        right.text(0.5, 0.5, "default runs bit-identical:\nno tensor differs",
                   ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    right.set_title("noise floor per tensor (PyTorch defaults)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _mode_rows(m: ModeResult) -> list[list[object]]:
    return [["bit-identical", _verdict(m)], ["compared", m.basis_text or m.basis],
            ["tensors compared", m.tensors_compared], ["max |Δ|", _num(m.max_abs)],
            ["max ULP", _num(m.max_ulp)], ["weight L2", _num(m.weight_l2)],
            ["loss gap (final)", _num(m.loss_gap)], ["loss gap (any step)", _num(m.max_loss_gap)],
            ["first divergent step", _num(m.first_divergent_step)]]


def render_lab_markdown(report: LabReport, *, plots: bool = True) -> str:
    """The whole report as one self-contained Markdown document."""
    import base64

    r = report
    lines = ["# manifest lab", "", f"Command: {_md(' '.join(r.command))}  ",
             f"Seed {r.seed}, {r.threads} threads, {r.runs_per_mode} runs per mode.", ""]
    png = plot_png(r) if plots else None
    if png is not None:
        lines += [f"![run times and noise floor](data:image/png;base64,"
                  f"{base64.b64encode(png).decode()})", ""]
    else:
        lines += ["(Plots need the optional extra: pip install 'torch-manifest[plot]'.)", ""]
    lines += ["## 1. Noise floor (PyTorch defaults, same seed)", "",
              *_table(["", "value"], _mode_rows(r.default)), ""]
    if r.default.differing:
        lines += _table(["tensor", "change", "elements", "max abs", "max ULP", "L2"],
                        [[f"{d.artifact}:{d.name}", d.change, f"{_num(d.elements)}/"
                          f"{_num(d.total)}", _num(d.max_abs), _num(d.max_ulp), _num(d.l2)]
                         for d in r.default.differing])
        lines.append("")
    lines += ["## 2. The recipe (every determinism switch on)", "",
              *_table(["", "value"], _mode_rows(r.recipe)), ""]
    if r.recipe.differing:
        lines += _table(["tensor", "change", "elements", "max abs", "max ULP"],
                        [[f"{d.artifact}:{d.name}", d.change, _num(d.elements),
                          _num(d.max_abs), _num(d.max_ulp)] for d in r.recipe.differing])
        lines.append("")
    if r.explained is not None:
        lines += [f"Explain: {_md(' '.join(x.strip() for x in _explained_lines(r)))}", ""]
    if r.envelope is not None:
        from manifest.cli.render_envelope import envelope_lines, envelope_png

        lines += ["### Noise envelope (rounding only, step by step)", "",
                  *[f"    {x}" for x in envelope_lines(r.envelope)], ""]
        drawn = envelope_png(r.envelope) if plots else None
        if drawn is not None:
            lines += [f"![noise envelope](data:image/png;base64,"
                      f"{base64.b64encode(drawn).decode()})", ""]
    if r.envelope_note:
        lines += [f"Envelope: {_md(r.envelope_note)}", ""]
    c = r.cost
    lines += ["## 3. Cost", "",
              *_table(["mode", "median s", "min s", "max s", "runs (s)"],
                      [[m.mode, f"{m.wall.median_s:.3f}", f"{m.wall.min_s:.3f}",
                        f"{m.wall.max_s:.3f}", ", ".join(f"{x.wall_s:.3f}" for x in m.runs)]
                       for m in (r.default, r.recipe)]),
              "", f"determinism_cost_pct = {c.determinism_cost_pct:+.2f}%"
              + (f" ({_md(c.caveat)})" if c.caveat else ""), ""]
    cat = r.catalogue
    lines += ["## 4. Op catalogue", "",
              f"{len(cat.entries)} nondeterministic op(s) among {cat.ops_distinct} distinct aten "
              f"ops ({cat.ops_total} calls audited). List from: {_md(cat.source)}.", ""]
    if cat.audit_error:
        lines += [f"Audit: {_md(cat.audit_error)}", ""]
    rows: list[list[object]] = []
    for e in cat.entries:
        for s in e.sites:
            module = s.module + (f" ({s.module_type})" if s.module_type else "")
            rows.append([e.op, e.kind, s.count, module, s.where, s.device,
                         _documented(e, s.module_type)])
    if rows:
        lines += _table(["op", "kind", "count", "module", "line", "device", "documented"],
                        rows)
        lines.append("")
    i = r.identity
    lines += ["## 5. Config identity", "",
              *_table(["run", "run_id", ""],
                      [["recipe", i.recipe_run_id,
                        f"same for all {r.runs_per_mode} runs" if i.recipe_runs_agree
                        else "DIFFERENT between runs"],
                       ["perturbed", i.perturbed_run_id,
                        ("differs: " if i.perturbed_differs else "SAME: ") + i.perturbation]]),
              "", "## 6. Checklist", "",
              *_table(["", "category", "check", "detail", "fix"],
                      [[_MARK[k.status], k.category, k.name, k.detail, k.fix or ""]
                       for k in r.checklist]), ""]
    return "\n".join(lines)
