"""``manifest lab -- CMD``: noise floor, bit-exactness, cost, op catalogue, checklist.

Steps, in order (2N + 1 runs of the command, all in the current tree):

1. One snapshot of code, environment and hardware, and the datasets
   digested once, as ``manifest capture`` does; every run is then sealed as
   a run manifest on that snapshot, so their run_ids are comparable.
2. N runs under PyTorch's default switches (the launcher seeds, pins the
   thread count and records, but enforces nothing: capture's
   ``--no-deterministic``) and N under the full recipe, interleaved
   (default 1, recipe 1, default 2, …) so a machine that speeds up or slows
   down during the lab does not bias one mode. After each run its declared
   outputs are copied aside; run k of a mode is compared with run 1
   tensor by tensor (``manifest.weights.compare``: bytes decide, max |Δ| and
   ULP describe), and by the automatic trail (the optimizer state at every
   step), which also works when no output is declared.
3. Cost: the medians of the wall times, ``determinism_cost_pct`` =
   (recipe − default) / default × 100, flagged "within noise" when either
   mode's spread (max − min) is wider than the difference.
4. One more run under the defaults with the op audit
   (``launch/boot/_manifest_audit.py``), not timed: every aten op with its
   module path and line, kept if ``manifest.ops.catalogue`` lists it.
5. When the recipe runs differ at a step: ``manifest explain``'s machinery
   re-runs run 1 up to that step twice, in place, and names the first op
   whose inputs matched and outputs differ (2 short runs more).
6. Identity: the recipe runs' run_ids (one config hashed N times), and the
   default run's as the perturbed config (one switch changed).
7. The checklist (``manifest.lab.checklist``) on the first recipe run.

Measured on the bundled example (60 steps, 2 threads, CPU): each run takes
about 2 s, the audit run about 3×.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from manifest.capture.run import _config_int, build_run_manifest
from manifest.config import load_config, string_list
from manifest.errors import ConfigError, NoVerdictError, UsageError
from manifest.judge import LabOutcome, current, rules
from manifest.judge.rules import carry
from manifest.lab.checklist import checklist
from manifest.lab.modes import LabRun, cost, kept, mode_result
from manifest.lab.report import (
    Catalogue,
    CatalogueEntry,
    Explained,
    ExplainedOp,
    Identity,
    LabReport,
    Site,
)
from manifest.launch.boot._manifest_wire import AUDIT_VAR
from manifest.launch.runner import LaunchSettings, default_threads
from manifest.models import Manifest
from manifest.ops.catalogue import base_name, load_table
from manifest.redact import redact_argv
from manifest.rerun.plan import RerunOptions

if TYPE_CHECKING:
    from manifest.capture.snapshot import Snapshot
    from manifest.launch.runner import LaunchResult
    from manifest.rerun.environment import RebuildOptions
    from manifest.rerun.executor import Executor
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace



@dataclass(frozen=True)
class LabOptions:
    rerun: RerunOptions = field(default_factory=RerunOptions)
    """Confinement (``--no-sandbox``, ``--require-sandbox``, ``--network``): as every verb."""
    runs: int = 2
    seed: int | None = None
    threads: int | None = None
    data: list[str] | None = None
    outputs: list[str] | None = None
    store_dir: str | None = None
    no_cache: bool = False
    quiet: bool = False
    envelope: int = 0
    """``--envelope N``: after the recipe runs, N one-ULP runs and one under another thread
    count, measured against recipe run 1 (``manifest.numeric.measure``)."""
    rebuild: RebuildOptions | None = None
    """``--env run``: where the recipe runs part, explain re-runs recipe run 1 in its own
    environment, rebuilt from its records and proven (the lab's own runs use this
    machine's, which they record); None: this machine's."""


def _command(command: list[str], table: dict[str, Any], origin: Path | None) -> list[str]:
    if command:
        return command
    configured = table.get("command")
    if isinstance(configured, str):
        import shlex

        configured = shlex.split(configured)
    if configured is None:
        raise UsageError("no command: give one after '--' or set command in [tool.manifest].")
    if not isinstance(configured, list) or not all(isinstance(a, str) for a in configured):
        raise ConfigError(f"[tool.manifest] command in {origin} must be a list of strings.")
    return list(configured)


def run_lab(cwd: Path, command: list[str], options: LabOptions,
            progress: Callable[[str], None] | None = None,
            show_plan: Callable[[RerunPlan], None] | None = None) -> LabReport:
    """Run the lab for ``command`` in ``cwd`` and return its report.

    The runs go through the re-run engine (``manifest.rerun``) in place: the
    plan is the command the user typed, confined like every re-run when
    bubblewrap works (the user's tree writable, the rest of the system
    read-only, private ``/tmp``, no network unless ``--network``).
    """
    from manifest.capture.snapshot import take_snapshot
    from manifest.rerun.dispatch import executor_for
    from manifest.rerun.executor import confined_hint
    from manifest.rerun.plan import plan_command
    from manifest.rerun.workspace import open_workspace
    from manifest.trust import TrustDecision

    say = progress or (lambda _: None)
    table, origin = load_config(cwd)
    command = _command(command, table, origin)
    data_base = origin.parent if options.data is None and origin is not None else None
    data = options.data if options.data is not None else string_list(table, "data", origin) or []
    outputs = (options.outputs if options.outputs is not None
               else string_list(table, "outputs", origin) or [])
    seed = options.seed if options.seed is not None else (_config_int(table, "seed", origin) or 0)
    threads = options.threads or _config_int(table, "threads", origin) or default_threads()
    snap = take_snapshot(cwd, store_dir=options.store_dir or table.get("store"))
    datasets: list[dict[str, Any]] = []
    if data:
        from manifest.data.datasets import digest_datasets

        found = digest_datasets(data, repo_root=snap.code.root, store=snap.store,
                                no_cache=options.no_cache, quiet=options.quiet, base=data_base)
        datasets = [d.model_dump(mode="json") for d in sorted(found, key=lambda d: d.name)]

    root = Path(snap.code.root) if snap.code.root else cwd
    recipe_settings = LaunchSettings(seed=seed, derivation="same", threads=threads,
                                     deterministic=True)
    plan = plan_command(
        verb="lab", root=root, argv=command, cwd=os.path.relpath(cwd, root),
        outputs=[_in_tree(glob, cwd, root) for glob in outputs],
        data=[(str(d["path"]), d.get("from_repo")) for d in datasets],
        settings=recipe_settings, variables={"OMP_NUM_THREADS": str(threads),
                                             "MKL_NUM_THREADS": str(threads)},
        options=replace(options.rerun, in_place=True),
        trust=TrustDecision(True, "the command you typed", "typed"),
        runs=(f"{options.runs} under PyTorch's default switches and {options.runs} under the "
              "recipe, interleaved", "1 more under the op audit"))
    if show_plan is not None:
        show_plan(plan)
    plan.require()
    executor = executor_for(plan)

    with open_workspace(plan, root) as workspace:
        work = workspace.scratch
        runs: dict[str, list[LabRun]] = {"default": [], "recipe": []}
        for i in range(1, options.runs + 1):
            for mode in ("default", "recipe"):
                say(f"run {i}/{options.runs} under the {mode} switches")
                settings = replace(recipe_settings, deterministic=mode == "recipe",
                                   root=str(workspace.mount_at))
                started = time.perf_counter()
                result = executor.run(plan, workspace, settings, dict(os.environ))
                wall = time.perf_counter() - started
                manifest = build_run_manifest(snap, cwd=cwd, argv=command, settings=settings,
                                              result=result, datasets=datasets,
                                              output_globs=outputs)
                _remember_writes(snap, result)
                assert manifest.outputs is not None
                if manifest.outputs.status != "ok":
                    raise NoVerdictError(f"{mode} run {i} failed: {manifest.outputs.error}"
                                         f"{confined_hint(plan)}.")
                saved = work / f"{mode}-{i}"
                for art in manifest.outputs.artifacts:
                    aside = kept(saved, art.path)
                    aside.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(cwd / art.path, aside)
                runs[mode].append(LabRun(mode, i, wall, manifest, result.records, saved))
        envelope = envelope_note = None
        if options.envelope:
            from manifest.numeric.measure import measure, numeric_of

            measured = measure(
                numeric_of(runs["recipe"][0].records),
                replace(recipe_settings, root=str(workspace.mount_at)), options.envelope,
                lambda planned: executor.run(plan, workspace, planned, dict(os.environ)),
                cwd=cwd, outputs=outputs, say=say)
            envelope = measured.envelope
            envelope_note = "; ".join(filter(None, [measured.reason, *(
                f"left out: {f}" for f in measured.failed)])) or None
        say("audit run: every aten op, its module and line")
        catalogue = _audit(plan, workspace, executor, seed, threads, work / "audit")
        default = mode_result("default", runs["default"])
        recipe = mode_result("recipe", runs["recipe"])

    first = runs["recipe"][0].manifest
    explained = None
    if recipe.outcome == LabOutcome.DIFFERS and recipe.first_divergent_step is not None:
        say(f"the recipe runs part at step {recipe.first_divergent_step}: explaining")
        explained = _explain(first, cwd, recipe.first_divergent_step, options.rerun,
                             options.rebuild)
    identity = Identity(
        recipe_run_id=first.run_id,
        recipe_runs_agree=len({r.manifest.run_id for r in runs["recipe"]}) == 1,
        perturbation="use_deterministic_algorithms off (the default runs: one switch changed)",
        perturbed_run_id=runs["default"][0].manifest.run_id,
        perturbed_differs=runs["default"][0].manifest.run_id != first.run_id,
    )
    return LabReport(
        command=redact_argv(command), seed=seed, threads=threads, runs_per_mode=options.runs,
        default=default, recipe=recipe, cost=cost(default, recipe), catalogue=catalogue,
        identity=identity,
        checklist=checklist(first, threads=threads, default=default, recipe=recipe),
        explained=explained, confinement=plan.confinement, plan=plan.to_json(),
        envelope=envelope, envelope_note=envelope_note,
    )


def _remember_writes(snap: Snapshot, result: LaunchResult) -> None:
    """What a lab run wrote in the user's tree is never code (capture does the same):
    without it, a log or bytecode cache became code for the next lab of that tree."""
    from manifest.capture.observed import remember_run_writes

    if snap.code.root is not None:
        remember_run_writes(snap.store, snap.code.root, result.opened, result.started_ns)


def _in_tree(glob: str, cwd: Path, root: Path) -> str:
    """An output glob as the plan takes it: relative to ``cwd``. capture records an
    absolute one as typed; the lab runs in place, so one inside the tree is the same
    files, and one outside it is refused (the lab compares what the run writes here)."""
    if not os.path.isabs(glob):
        return glob
    real_root = os.path.realpath(root)
    if not os.path.realpath(glob).startswith(real_root.rstrip("/") + "/"):
        raise UsageError(f"--artifact {glob} lies outside the tree the lab runs in "
                         f"({root}); give a path inside it.")
    return os.path.relpath(glob, cwd)


def _explain(manifest: Manifest, cwd: Path, step: int, rerun: RerunOptions,
             rebuild: RebuildOptions | None = None) -> Explained:
    """Hand the recipe's divergence to the explain machinery (in place, the known step;
    with ``rebuild``, in the run's rebuilt environment, which the result names)."""
    from manifest.canonical import dumps
    from manifest.errors import ManifestError
    from manifest.explain.pipeline import ExplainOptions, explain_run

    try:
        # The user typed this command to the lab a moment ago: no trust question to ask.
        report = explain_run(dumps(manifest), file="(lab: recipe run 1)", cwd=cwd,
                             options=ExplainOptions(
                                 rerun=replace(rerun, trust=True, in_place=True), step=step,
                                 code_checked=True, rebuild=rebuild))
    except ManifestError as exc:
        return Explained(**carry(rules.explain_failed(str(exc))), step=step)
    return Explained(
        **carry(current(report)), cause=report.cause, step=report.first_step,
        environment=str(report.environment["line"])
        if rebuild is not None and report.environment else None,
        findings=[ExplainedOp(rank=f.rank, step=f.step, kind=f.kind, op=f.op, module=f.module,
                              module_type=f.module_type, where=f.where, device=f.device,
                              tensor=f.tensor, max_abs=f.max_abs, max_ulp=f.max_ulp)
                  for f in report.findings])


# -------------------------------------------------------------------- audit


def _audit(plan: RerunPlan, workspace: Workspace, executor: Executor, seed: int, threads: int,
           directory: Path) -> Catalogue:
    table = load_table()
    directory.mkdir(parents=True, exist_ok=True)
    settings = LaunchSettings(seed=seed, derivation="same", threads=threads,
                              deterministic=False, trail="off", root=str(workspace.mount_at))
    env = dict(os.environ)
    env[AUDIT_VAR] = str(directory)
    result = executor.run(plan, workspace, settings, env, writable=[directory])
    error = None if result.exit_code == 0 else f"the audit run exited with {result.exit_code}"
    counts: dict[tuple[str, str, str, str, str], int] = {}
    for path in sorted(directory.glob("audit-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            for op, module, module_type, where, device, n in doc["ops"]:
                key = (str(op), str(module), str(module_type), str(where), str(device))
                counts[key] = counts.get(key, 0) + int(n)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            error = f"unreadable audit file {path.name}: {exc}"
    if not counts and error is None:
        error = "the audit saw no aten op (torch never imported, or python -I/-S)"
    by_op: dict[str, list[Site]] = {}
    for (op, module, module_type, where, device), n in sorted(counts.items()):
        name = base_name(op)
        if name in table.rules:
            by_op.setdefault(name, []).append(Site(module=module, module_type=module_type,
                                                   where=where, device=device, count=n))
    entries = []
    for name, sites in sorted(by_op.items()):
        rules = table.rules[name]
        kind: Literal["raises", "switched"] = (
            "raises" if any(r.kind == "raises" for r in rules) else "switched")
        merged: dict[tuple[str, str, str, str], int] = {}
        for s in sites:
            k = (s.module, s.module_type, s.where, s.device)
            merged[k] = merged.get(k, 0) + s.count
        entries.append(CatalogueEntry(
            op=f"aten::{name}", kind=kind,
            documented=[f"{r.documented} {r.when}".strip() for r in rules],
            count=sum(merged.values()),
            sites=[Site(module=m, module_type=t, where=w, device=d, count=c)
                   for (m, t, w, d), c in sorted(merged.items(), key=lambda kv: -kv[1])],
        ))
    return Catalogue(source=table.source, unmapped=table.unmapped,
                     ops_total=sum(counts.values()),
                     ops_distinct=len({base_name(k[0]) for k in counts}),
                     entries=sorted(entries, key=lambda e: (e.kind != "raises", -e.count)),
                     audit_error=error)
