"""Every verdict each verb can give, with its exit status and what it means.

The concepts page's table of verdicts is generated from :func:`verb_verdicts` at
every docs build (``docs/gen_ref.py``), so it lists what the code gives, not
what someone remembered to type. Each verb keeps its own names next to the
report that gives them (verify: ``manifest.verify.report.VERDICTS``; gate:
``manifest.gate.report.GATE_VERDICTS``; lab: ``manifest.lab.report.LAB_OUTCOMES``);
explain's and diff's few outcomes are listed here, and
``tests/test_verdicts.py`` checks every row against the report's own
``exit_code``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from manifest.errors import EXIT_EQUIVALENT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK

Row = tuple[str, int, str]
"""(verdict, exit status, meaning)."""

EXPLAIN_VERDICTS: dict[str, tuple[int, str]] = {
    "agree": (EXIT_OK, "the fresh runs do not part at any recorded step"),
    "parted": (EXIT_FAILED, "the runs part: the step, the first op whose inputs matched and "
               "outputs differ (op, module, file:line), and the cause"),
    "no-verdict": (EXIT_NO_VERDICT, "no step to explain (no optimizer step, or a run failed); "
                   "the reason says which"),
}
"""``manifest.explain.pipeline.ExplainReport.verdict`` → (exit status, meaning)."""

DIFF_OUTCOMES: dict[str, tuple[int, str]] = {
    "identical": (EXIT_OK, "the two manifests have no difference"),
    "benign": (EXIT_OK, "only differences that cannot change the bits (times, hosts, URLs)"),
    "bits": (EXIT_FAILED, "a difference that can change the bits, each with the reason; exit 0 "
             "instead when only seeds and generator states differ and both runs' outputs are "
             "identical anyway (said on each line), and "
             f"{EXIT_EQUIVALENT} when they are equivalent (rounding only, inside the envelope)"),
}
"""``manifest.diff.result.ManifestDiff.verdict`` → (exit status, meaning)."""


def verb_verdicts() -> dict[str, list[Row]]:
    """Verb → every (verdict, exit status, meaning) it can give, in the verbs' own order."""
    from manifest.gate.report import GATE_VERDICTS
    from manifest.lab.report import LAB_OUTCOMES
    from manifest.verify.report import VERDICTS

    def rows(table: Mapping[Any, tuple[int, str]]) -> list[Row]:
        return [(str(name), code, meaning) for name, (code, meaning) in table.items()]

    return {"verify": rows(VERDICTS), "lab": rows(LAB_OUTCOMES), "gate": rows(GATE_VERDICTS),
            "explain": rows(EXPLAIN_VERDICTS), "diff": rows(DIFF_OUTCOMES)}
