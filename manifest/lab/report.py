"""The lab report (``manifest-lab/v1``): what ``manifest lab --json`` prints.

Frozen pydantic models like the manifest's, so the JSON Schema checked in as
``schemas/lab.v1.schema.json`` is generated from them (``lab_schema_text``)
and a test keeps the two in sync. Numbers that could not be measured are
``null`` with the reason beside them, never a sentinel.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from manifest.judge import LAB_OUTCOMES, LabOutcome
from manifest.models import Envelope, Model

FORMAT: Literal["manifest-lab/v1"] = "manifest-lab/v1"

Status = Literal["pass", "warn", "fail"]


class TensorDiff(Model):
    """One tensor that differs between run 1 and another run of the same mode (the worst)."""

    artifact: str
    name: str
    change: str
    """``values``, ``dtype``, ``shape``, ``missing`` or ``extra``."""
    elements: int | None = None
    total: int | None = None
    max_abs: float | None = None
    max_ulp: int | None = None
    l2: float | None = None


class RunResult(Model):
    index: int
    """1-based, in the order the runs of this mode were made."""
    wall_s: float
    exit_code: int
    run_id: str
    trail_steps: int
    """Optimizer steps with an automatic trail point (the basis when no output is declared)."""
    final_loss: float | None = None
    """The last ``manifest.log(loss=…)`` of rank 0, if the script logs one."""


class WallStats(Model):
    median_s: float
    min_s: float
    max_s: float


class ModeResult(Model):
    """N same-seed runs under one setting, each compared with the first."""

    mode: Literal["default", "recipe"]
    deterministic: bool
    runs: list[RunResult]
    wall: WallStats
    bit_identical: bool
    """True only when something was compared and it all agreed (see ``outcome``)."""
    outcome: LabOutcome = LabOutcome.BIT_IDENTICAL
    """``nothing-compared``: no output declared or written, and no optimizer step seen."""
    reason_code: str | None = None
    """Why the outcome is not ``bit-identical``, as a stable code
    (``manifest.judge.reasons.ReasonCode``); None when it is."""
    basis: str
    """What was compared, a key of ``manifest.verify.report.BASES``: ``tensors``,
    ``trail``, ``tensors and trail`` or ``nothing``."""
    basis_text: str = ""
    """The basis in words, as every report prints it next to the verdict."""
    differing: list[TensorDiff] = Field(default_factory=list)
    tensors_compared: int = 0
    max_abs: float | None = None
    max_ulp: int | None = None
    weight_l2: float | None = None
    """L2 norm of (weights of run k − weights of run 1) over all float tensors, worst k."""
    loss_gap: float | None = None
    """max |final loss of run k − final loss of run 1|; null when the script logs no loss."""
    max_loss_gap: float | None = None
    """The same over every logged step the runs share."""
    first_divergent_step: int | None = None
    """The first optimizer step whose trail point differs between runs (null: none differ)."""


class Cost(Model):
    default_median_s: float
    recipe_median_s: float
    determinism_cost_pct: float
    """(recipe − default) / default × 100, on the medians."""
    spread_s: float
    """The wider of the two modes' max − min."""
    within_noise: bool
    """True when the spread is wider than the difference: the sign is not established."""
    caveat: str | None = None


class Site(Model):
    module: str
    module_type: str
    where: str
    device: str
    count: int


class CatalogueEntry(Model):
    op: str
    kind: Literal["raises", "switched"]
    """``raises``: no deterministic implementation; ``switched``: nondeterministic default."""
    documented: list[str]
    """The documented names and conditions that cover this op."""
    count: int
    sites: list[Site]


class Catalogue(Model):
    source: str
    """Where the list of nondeterministic ops came from (the installed torch, or the table)."""
    unmapped: list[str] = Field(default_factory=list)
    ops_total: int = 0
    """aten op calls the audit run made (every op, listed or not)."""
    ops_distinct: int = 0
    entries: list[CatalogueEntry] = Field(default_factory=list)
    audit_error: str | None = None


class Identity(Model):
    recipe_run_id: str
    recipe_runs_agree: bool
    """Every recipe run hashed to the same run_id (the config hashed twice gives one hash)."""
    perturbation: str
    perturbed_run_id: str
    perturbed_differs: bool


class Check(Model):
    category: Literal["code", "data", "env", "random state", "hardware", "numerics"]
    name: str
    status: Status
    detail: str
    fix: str | None = None


class ExplainedOp(Model):
    """Where the recipe runs part, per ``manifest explain`` (``manifest.explain.pipeline``)."""

    rank: int
    step: int
    kind: str
    """``op-differs``, ``input-from-outside``, ``paths-differ``, ``missing``."""
    op: str
    module: str
    module_type: str
    where: str
    device: str
    tensor: str
    max_abs: float | None = None
    max_ulp: int | None = None


class Explained(Model):
    verdict: str
    """``parted``, ``agree`` or ``no-verdict`` (then ``reason`` says why)."""
    cause: str | None = None
    reason: str | None = None
    reason_code: str | None = None
    """The reason's stable code (``manifest.judge.reasons.ReasonCode``)."""
    step: int | None = None
    findings: list[ExplainedOp] = Field(default_factory=list)
    environment: str | None = None
    """With ``--env run``: which Python environment explain's runs used ("the run's
    environment (rebuilt, files identical)", or why not), as verify says it."""


class LabReport(Model):
    format: Literal["manifest-lab/v1"] = FORMAT
    command: list[str]
    seed: int
    threads: int
    runs_per_mode: int
    default: ModeResult
    recipe: ModeResult
    cost: Cost
    catalogue: Catalogue
    identity: Identity
    checklist: list[Check]
    explained: Explained | None = None
    """Only when the recipe runs differ: the explain machinery's first divergent op."""
    confinement: str | None = None
    """How the runs were confined (``manifest.rerun``), or ``not confined (why)``."""
    plan: dict[str, Any] | None = None
    """What the runs were planned to be (``manifest.rerun.plan.RerunPlan.to_json``)."""
    envelope: Envelope | None = None
    """``--envelope N``: the recipe run's noise envelope (``manifest.numeric.measure``), what
    rounding alone does to its numeric trail step by step; None when not asked."""
    envelope_note: str | None = None
    """Why no envelope was measured, or which of its runs were left out."""

    @property
    def exit_code(self) -> int:
        """0: bit-identical under the recipe; 1: the recipe runs differ; 3: nothing compared."""
        return LAB_OUTCOMES[self.recipe.outcome][0]




def lab_schema_text() -> str:
    schema = LabReport.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://manifest.dev/schemas/lab.v1.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
