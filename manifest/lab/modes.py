"""The lab's two modes compared: each run against the mode's first, tensor by tensor and
by the trail, then the cost of the recipe against the defaults.

A mode's outcome is the judge's (``manifest.judge``): the outputs compared and the
trail points, as verify's re-run is judged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from manifest.judge import (
    BASES,
    Findings,
    LabOutcome,
    judge,
    lab_outcome,
    nothing_compared_reason,
)
from manifest.lab.report import Cost, ModeResult, RunResult, TensorDiff, WallStats
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Manifest


@dataclass
class LabRun:
    """One run of a mode: its wall time, sealed manifest, process records and where its
    declared outputs were copied aside."""

    mode: str
    index: int
    wall_s: float
    manifest: Manifest
    records: list[ProcessRecord]
    saved: Path


def kept(saved: Path, path: str) -> Path:
    """Where a run's output is copied aside: below ``saved`` even when it was recorded by
    its absolute path (``saved / "/abs"`` would be the output itself)."""
    return saved / path.lstrip("/")


def final_loss(records: list[ProcessRecord]) -> tuple[float | None, dict[int, float]]:
    """The last logged loss of rank 0 and its loss by step."""
    rank0 = next((r for r in records if r.get("rank") == 0), None)
    by_step: dict[int, float] = {}
    last = None
    for point in (rank0 or {}).get("log") or []:
        value = point.get("loss")
        if isinstance(value, (int, float)) and math.isfinite(value):
            by_step[int(point.get("step") or 0)] = float(value)
            last = float(value)
    return last, by_step


def trail_of(records: list[ProcessRecord]) -> list[tuple[int, str]]:
    rank0 = next((r for r in records if r.get("rank") == 0), None)
    points = (rank0 or {}).get("trail") or (rank0 or {}).get("auto_trail") or []
    return [(int(p["step"]), str(p["digest"])) for p in points]


def _l2(a: Path, b: Path, names: list[str]) -> dict[str, float]:
    """L2 norm of b − a per float tensor (numbers only: the bytes already decided)."""
    from manifest.weights.compare import _as_float64, _tensors

    out: dict[str, float] = {}
    ta, tb = _tensors(a), _tensors(b)
    try:
        if ta is None or tb is None:
            return out
        for name in names:
            x, y = ta[1].get(name), tb[1].get(name)
            if x is None or y is None or x.dtype != y.dtype or x.shape != y.shape:
                continue
            fa, fb = _as_float64(x.data, x.dtype), _as_float64(y.data, y.dtype)
            if fa is not None and fb is not None:
                out[name] = float(math.sqrt(float(((fa - fb) ** 2).sum())))
    finally:
        for t in (ta, tb):
            if t is not None:
                t[1].clear()
                t[0].close()
    return out


def _compare(first: LabRun, other: LabRun) -> tuple[list[TensorDiff], int]:
    from manifest.weights.compare import compare_artifacts

    assert first.manifest.outputs is not None and other.manifest.outputs is not None
    theirs = {a.path: a for a in other.manifest.outputs.artifacts}
    diffs: list[TensorDiff] = []
    compared = 0
    for art in first.manifest.outputs.artifacts:
        new = theirs.get(art.path)
        if new is None:
            diffs.append(TensorDiff(artifact=art.path, name="", change="missing"))
            continue
        compared += len(art.tensors or {}) or 1
        delta = compare_artifacts(art, new, recorded_file=kept(first.saved, art.path),
                                  new_file=kept(other.saved, art.path))
        if delta.identical:
            continue
        if not delta.tensors:
            diffs.append(TensorDiff(artifact=art.path, name="", change="file bytes"))
            continue
        norms = _l2(kept(first.saved, art.path), kept(other.saved, art.path),
                    [t.name for t in delta.tensors if t.change == "values"])
        diffs.extend(TensorDiff(artifact=art.path, name=t.name, change=t.change,
                                elements=t.elements, total=t.total, max_abs=t.max_abs,
                                max_ulp=t.max_ulp, l2=norms.get(t.name))
                     for t in delta.tensors)
    return diffs, compared


def mode_result(mode: str, runs: list[LabRun]) -> ModeResult:
    first = runs[0]
    worst: dict[tuple[str, str], TensorDiff] = {}
    compared = 0
    weight_l2: float | None = None
    loss_gap: float | None = None
    max_loss_gap: float | None = None
    first_step: int | None = None
    trail_same = True
    loss0, curve0 = final_loss(first.records)
    trail0 = dict(trail_of(first.records))
    for other in runs[1:]:
        diffs, compared = _compare(first, other)
        for d in diffs:
            key = (d.artifact, d.name)
            if key not in worst or (d.max_abs or 0.0) > (worst[key].max_abs or 0.0):
                worst[key] = d
        if first.manifest.outputs and first.manifest.outputs.artifacts:
            l2 = math.sqrt(sum((d.l2 or 0.0) ** 2 for d in diffs))
            weight_l2 = max(weight_l2 or 0.0, l2)
        loss, curve = final_loss(other.records)
        if loss0 is not None and loss is not None:
            loss_gap = max(loss_gap or 0.0, abs(loss - loss0))
            shared = set(curve0) & set(curve)
            if shared:
                gap = max(abs(curve0[s] - curve[s]) for s in shared)
                max_loss_gap = max(max_loss_gap or 0.0, gap)
        trail = trail_of(other.records)
        if trail != sorted(trail0.items()):
            trail_same = False
        for step, digest in trail:
            if trail0.get(step) != digest:
                first_step = step if first_step is None else min(first_step, step)
                break
    differing = sorted(worst.values(), key=lambda d: (d.artifact, d.name))
    has_outputs = bool(first.manifest.outputs and first.manifest.outputs.artifacts)
    judged = judge(Findings(outputs=[not differing] if has_outputs else [],
                            trail_steps=len(trail0), trail_agrees=trail_same),
                   nothing=nothing_compared_reason(
                       list(first.manifest.command.outputs) if first.manifest.command else []))
    basis, outcome = judged.basis, lab_outcome(judged.verdict)
    values = [d.max_abs for d in differing if d.max_abs is not None]
    ulps = [d.max_ulp for d in differing if d.max_ulp is not None]
    walls = [r.wall_s for r in runs]
    return ModeResult(
        mode="recipe" if mode == "recipe" else "default",
        deterministic=mode == "recipe",
        runs=[RunResult(index=r.index, wall_s=round(r.wall_s, 4), exit_code=0,
                        run_id=r.manifest.run_id, trail_steps=len(trail_of(r.records)),
                        final_loss=final_loss(r.records)[0]) for r in runs],
        wall=WallStats(median_s=round(statistics.median(walls), 4), min_s=round(min(walls), 4),
                       max_s=round(max(walls), 4)),
        bit_identical=outcome == LabOutcome.BIT_IDENTICAL,
        outcome=outcome,
        reason_code=None if judged.code is None else str(judged.code),
        basis=basis,
        basis_text=BASES[basis],
        differing=differing,
        tensors_compared=compared,
        max_abs=max(values, default=0.0 if has_outputs else None),
        max_ulp=max(ulps, default=0 if has_outputs else None),
        weight_l2=weight_l2 if len(runs) > 1 else None,
        loss_gap=loss_gap,
        max_loss_gap=max_loss_gap,
        first_divergent_step=first_step,
    )


def cost(default: ModeResult, recipe: ModeResult) -> Cost:
    d, r = default.wall.median_s, recipe.wall.median_s
    pct = (r - d) / d * 100.0 if d > 0 else 0.0
    spread = max(default.wall.max_s - default.wall.min_s, recipe.wall.max_s - recipe.wall.min_s)
    noisy = spread > abs(r - d)
    caveat = None
    if noisy:
        caveat = (f"the runs' spread ({spread:.3f} s) is wider than the difference of the "
                  f"medians ({abs(r - d):.3f} s): the sign of the cost is not established; "
                  "use more --runs")
    return Cost(default_median_s=d, recipe_median_s=r, determinism_cost_pct=round(pct, 2),
                spread_s=round(spread, 4), within_noise=noisy, caveat=caveat)
