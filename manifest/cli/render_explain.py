"""The human ``explain`` report: the step, then the op, module and line, then the numbers."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from manifest.cli.text import plain_confinement
from manifest.judge import ExplainVerdict, NumericVerdict

if TYPE_CHECKING:
    from manifest.cli.render_markdown import StepTrail
    from manifest.explain.pipeline import ExplainReport
    from manifest.models import Manifest
    from manifest.ops.findings import Finding

_CAUSES = {
    "nondeterminism": "the two fresh runs part under the same settings: a nondeterministic "
                      "computation",
    "outside-input": "a value entered from outside torch (Python or numpy data, os.urandom, "
                     "a clock, a file): seeding torch cannot fix it",
    "threads": "the thread count ({threads}): a CPU kernel splits its sums over the threads, "
               "so the same op adds in another order",
    "environment": "the environment or the inputs differ from the recorded run's",
}


def _number(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _finding_lines(f: Finding) -> list[str]:
    if f.module in ("", "(backward)") and f.module_type:
        module = f"{f.module_type} (the top module)"
    elif f.module_type:
        module = f"{f.module} ({f.module_type})"
    else:
        module = f.module or "(outside any module)"
    lines = [f"  rank {f.rank}, step {f.step}: {_what(f)}",
             f"    op       {f.op} on {f.device}",
             f"    module   {module}",
             f"    line     {f.where or '(no user frame)'}",
             f"    tensor   {f.tensor}"]
    if f.elements is not None:
        total = f"/{f.total}" if f.total else ""
        lines.append(f"    differs  {f.elements}{total} elements, max |Δ| {_number(f.max_abs)}, "
                     f"max ULP {_number(f.max_ulp)}")
    if f.kind == "op-differs":
        listed = ("yes: torch documents it as nondeterministic there with "
                  "use_deterministic_algorithms off" if f.listed_nondeterministic else
                  "no: torch does not list it as nondeterministic on this device")
        lines.append(f"    listed   {listed}")
    lines.append(f"    compared {f.compared}")
    return lines


def _what(f: Finding) -> str:
    if f.kind == "op-differs":
        return "first op whose inputs matched and whose outputs differ"
    if f.kind == "input-from-outside":
        return "an input differs that no torch op produced: it came from outside torch"
    if f.kind == "paths-differ":
        return f"the runs took different paths (the other ran {f.other or 'another op'})"
    return f"one run ran ops the other did not ({f.other or 'extra ops'})"


EXPLAIN_HEAD: dict[ExplainVerdict, str] = {
    ExplainVerdict.PARTED: "the runs part", ExplainVerdict.AGREE: "the runs do not part",
    ExplainVerdict.NO_VERDICT: "no verdict"}
"""What explain's terminal report says for each verdict; every :class:`ExplainVerdict` has
one."""


def render_explain(report: ExplainReport, file: TextIO | None = None, *,
                   verbose: bool = False) -> None:
    out = file or sys.stdout
    head = EXPLAIN_HEAD[ExplainVerdict(report.verdict)]
    out.write(f"explain  {report.file}  run_id {report.run_id[:23]}…\n")
    for run in report.runs:
        out.write(f"  {run}\n")
    if report.first_step is not None:
        out.write(f"{head} at step {report.first_step}")
        out.write(f" (recorded trail parts at step {report.recorded_step})\n"
                  if report.recorded_step is not None else "\n")
    else:
        out.write(f"{head}\n")
    if report.cause:
        counts = " → ".join(map(str, report.threads or [])) or "see runs"
        cause = _CAUSES.get(report.cause, report.cause).replace("{threads}", counts)
        out.write(f"cause: {cause}\n")
    for f in report.findings:
        out.write("\n".join(_finding_lines(f)) + "\n")
    if report.reason:
        out.write(f"{report.reason}\n")
    if report.numeric is not None:
        kind = {NumericVerdict.EQUIVALENT: "rounding only",
                NumericVerdict.DIFFERS: "more than rounding"}.get(
            report.numeric["verdict"], "not judged")
        out.write(f"against the noise envelope: {kind}: {report.numeric['sentence']}\n")
    if report.environment is not None and report.runs:
        out.write(f"environment: {report.environment['line']}\n")
    from manifest.cli.render import folded_environment
    from manifest.cli.text import folded_drift

    # verify's folding: a torch build's CUDA libraries under torch's line, each fact once,
    # packages the run never imported in one line (--env run lists ~200 of them otherwise)
    for impact, reason in folded_drift(folded_environment(report.drift, verbose=verbose),
                                       verbose=verbose):
        out.write(f"drift ({impact}): {reason}\n")
    if report.confinement is not None:  # None: explain stopped before planning a re-run
        out.write(f"re-runs: {plain_confinement(report.confinement)}\n")
    if report.timings:
        spent = ", ".join(f"{k} {v:.1f} s" for k, v in report.timings.items())
        out.write(f"runs: {spent}\n")


def explain_trail(report: ExplainReport, recorded: Manifest | None) -> StepTrail | None:
    """What explain knows of the trail, step by step (None when it located no step).

    explain compares run A with run B at every step up to the first where they
    part (or, when A and B agree, the fresh runs with the recorded trail), so
    the steps after that one are "not compared". The steps drawn are the
    recorded trail's, or the ``steps_run`` the fresh runs made.
    """
    from manifest.cli.render_markdown import recorded_steps, trail_to_first

    if report.steps_run is None or report.verdict not in (ExplainVerdict.PARTED,
                                                          ExplainVerdict.AGREE):
        return None  # --step N: no step was located, nothing is known before N
    steps = recorded_steps(recorded) if recorded is not None else []
    steps = steps or list(range(1, report.steps_run + 1))
    if report.cause == "environment":
        return trail_to_first(steps, report.recorded_step or report.first_step,
                              "the fresh runs vs the recorded trail")
    return trail_to_first(steps, report.first_step, "run A vs run B")


def explain_markdown(report: ExplainReport, *, title: str | None = None,
                     trail: StepTrail | None = None, plots: bool = True) -> str:
    """The report as Markdown: the terminal text in a fence, then the step-trail plot."""
    import io

    from manifest.cli.render_markdown import text_markdown, trail_markdown

    text = io.StringIO()
    render_explain(report, text)
    out = text_markdown(title or f"Explain: {report.verdict}", text.getvalue())
    if trail is not None:
        out += "\n" + "\n".join(trail_markdown(trail, plots=plots)) + "\n"
    return out
