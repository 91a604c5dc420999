"""Human and JSON renderings of a :class:`~manifest.diff.result.ManifestDiff` (CLI only).

The table lists ``bits`` rows first. A long run of rows from one rule (every
tensor of a model differs after a seed change) is folded after
:data:`FOLD_KEEP` rows into one line saying how many more there are;
``--all`` or ``--json`` lists every one.
"""

from __future__ import annotations

from typing import TextIO

from manifest.cli.text import json_text
from manifest.diff.reasons import show_value
from manifest.diff.result import Difference, ManifestDiff
from manifest.diff.rules import Impact
from manifest.judge import NumericVerdict, OutputsOutcome

FOLD_AFTER = 12
"""A run of more rows than this from one rule is folded…"""
FOLD_KEEP = 8
"""…keeping this many."""


def diff_json_bytes(
    result: ManifestDiff, *, a_file: str, b_file: str, only: Impact | None = None
) -> bytes:
    """The ``--json`` document (shape in ``manifest.diff.result``), UTF-8, newline-ended."""
    doc = result.to_json(a_file=a_file, b_file=b_file, only=only)
    # One difference per line: greppable, and json's C encoder (indent= falls
    # back to the pure-Python one, 4x slower on 10,000 differing tensors).
    rows = doc.pop("differences")
    head = json_text(doc, indent=2)
    items = ",\n    ".join(json_text(row, indent=None) for row in rows)
    body = f"\n    {items}\n  " if rows else ""
    return f'{head[:-2]},\n  "differences": [{body}]\n}}\n'.encode()


def _folded(rows: tuple[Difference, ...]) -> list[Difference | tuple[int, str]]:
    """Rows with long same-rule runs cut to FOLD_KEEP plus (hidden count, rule)."""
    out: list[Difference | tuple[int, str]] = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j].rule == rows[i].rule and rows[j].impact is rows[i].impact:
            j += 1
        run = rows[i:j]
        if len(run) > FOLD_AFTER:
            out.extend(run[:FOLD_KEEP])
            out.append((len(run) - FOLD_KEEP, run[0].rule))
        else:
            out.extend(run)
        i = j
    return out


def environment_rows(rows: tuple[Difference, ...], *, no_gpu: bool = False,
                     ) -> tuple[tuple[Difference, ...], int]:
    """(rows, hidden reasons): the CUDA side of a torch build folded into torch's row, a
    package row that repeats ``env.numpy`` or ``env.torch`` left out, and the rows saying
    why a fact was not recorded counted, not listed (``manifest.cli.render
    .folded_environment`` does the same to verify's drift)."""
    from dataclasses import replace

    from manifest.cli.render import NOT_RECORDED, SAME_FACT
    from manifest.verify.drift import cuda_family

    paths = {d.path for d in rows}
    family = [d for d in rows if cuda_family(d.path)]
    packages = [d.path.removeprefix("env.packages[").removesuffix("]") for d in family
                if d.path.startswith("env.packages[")]
    facts = [d.reason.split(":", 1)[0] for d in family if not d.path.startswith("env.packages[")]
    if packages:
        facts.append(f"{len(packages)} package(s): " + ", ".join(packages[:3])
                     + (f" and {len(packages) - 3} more" if len(packages) > 3 else ""))
    with_it = (f"the CUDA libraries with it differ too ({'; '.join(facts)})"
               + ("; neither run used a GPU" if no_gpu else ""))
    out: list[Difference] = []
    hidden = 0
    for d in rows:
        if d.path.startswith(NOT_RECORDED):
            hidden += 1
        elif d.path in SAME_FACT and SAME_FACT[d.path] in paths:
            continue
        elif d.path == "env.torch" and family:
            out.append(replace(d, reason=f"{d.reason}; {with_it}"))
        elif d in family:
            if "env.torch" not in paths and d is family[0]:
                out.append(replace(d, reason=f"torch's build: {with_it}"))
        else:
            out.append(d)
    return tuple(out), hidden


def _summary(result: ManifestDiff) -> str:
    n_bits, n_benign = len(result.bits), len(result.benign)
    if not result.differences:
        if result.a_digest == result.b_digest:
            return "No differences: the two manifests are the same document."
        return "No differences: the manifests list some entries in another order."
    if not n_bits:
        return f"No difference that can change the bits ({n_benign} benign)."
    can = "difference can" if n_bits == 1 else "differences can"
    line = f"{n_bits} {can} change the bits, {n_benign} cannot."
    if result.settled_by_outputs:
        line += " Here the outputs are identical."
    elif result.outputs == OutputsOutcome.EQUIVALENT and result.numeric is not None:
        line += (" The outputs differ, but the runs are equivalent (the same run up to "
                 f"rounding): {result.numeric['sentence']}.")
    elif (result.numeric is not None
          and result.numeric.get("verdict") == NumericVerdict.NOT_COMPARED):
        from manifest.cli.text import markup  # device names are the manifests' authors'

        line += f" No numeric verdict: {markup(result.numeric['sentence'])}."
    elif (result.numeric is not None
          and result.numeric.get("outputs_verdict") == NumericVerdict.OUTSIDE):
        from manifest.cli.text import markup  # output paths are the manifests' authors'

        line += f" The outputs differ beyond rounding: {markup(result.numeric['sentence'])}."
    elif result.numeric is not None:
        line += f" Outside the noise envelope: {result.numeric['sentence']}."
    return line


def render_diff(
    result: ManifestDiff,
    *,
    a_file: str,
    b_file: str,
    only: Impact | None = None,
    fold: bool = True,
    file: TextIO | None = None,
    code: tuple[str, ...] | list[str] = (),
    verbose: bool = True,
    no_gpu: bool = False,
) -> None:
    """A readable report: the non-determinism note, a header, the table, what changed in
    the code (``code``: ``manifest.nodes.patches.code_report``'s lines), a summary line.
    Without ``verbose`` the environment rows are folded as verify folds its drift
    (:func:`environment_rows`; ``no_gpu``: neither run recorded a CUDA device)."""
    from rich.table import Table

    from manifest.cli.text import make_console
    from manifest.cli.text import markup as escape

    console = make_console(file, soft_wrap=False)
    nd = result.nondeterminism
    if nd is not None:
        console.print(f"[bold red]{escape(nd.message)}[/bold red]")
        if nd.tensors:
            shown = ", ".join(f"{t} ({a})" for a, t in nd.tensors[:FOLD_KEEP])
            more = f" and {len(nd.tensors) - FOLD_KEEP} more" if len(nd.tensors) > FOLD_KEEP else ""
            console.print(f"  differing tensors: {escape(shown)}{more}", soft_wrap=True)
        elif nd.artifacts:
            console.print(f"  differing artifacts: {escape(', '.join(nd.artifacts))}",
                          soft_wrap=True)
        if nd.first_divergent_step is not None:
            console.print(f"  first divergent step: {nd.first_divergent_step}")
    same = "same run_id" if result.same_run_id else "different run_id"
    console.print(f"[bold]a[/bold] {escape(a_file)}  run_id {escape(show_value(result.a_run_id))}",
                  soft_wrap=True)
    console.print(f"[bold]b[/bold] {escape(b_file)}  run_id {escape(show_value(result.b_run_id))}"
                  f"  ({same})", soft_wrap=True)
    rows = result.selected(only)
    hidden = 0
    if not verbose:
        rows, hidden = environment_rows(rows, no_gpu=no_gpu)
    if rows:
        table = Table(show_header=True, header_style="bold", show_lines=False)
        table.add_column("impact", no_wrap=True)
        table.add_column("section", no_wrap=True)
        table.add_column("difference", overflow="fold")
        previous: tuple[Impact, str] | None = None
        for row in _folded(rows) if fold else list(rows):
            if isinstance(row, tuple):
                hidden, rule = row
                table.add_row("", "", f"[dim]… {hidden} more like this ({escape(rule)}); "
                              "--all or --json lists every one[/dim]")
                continue
            impact = ("[bold red]bits[/bold red]" if row.impact is Impact.BITS
                      else "[green]benign[/green]")
            section = row.section if (row.impact, row.section) != previous else ""
            previous = (row.impact, row.section)
            table.add_row(impact, escape(section), escape(row.reason))
        if hidden:
            table.add_row("", "", f"[dim]{hidden} fact(s) not recorded on one side, each with "
                          "its reason: --verbose lists them[/dim]")
        console.print(table)
    elif only is not None and result.differences:
        console.print(f"No {only.value} differences.")
    for line in code if only is not Impact.BENIGN else ():  # code rows are bits rows
        console.print(escape(line), soft_wrap=True)
    console.print(_summary(result))
