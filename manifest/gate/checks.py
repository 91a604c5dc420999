"""Running the gate: the determinism and hygiene checks, and the order of all three."""


from __future__ import annotations

import glob
import os
from pathlib import Path

from manifest.errors import (
    ConfigError,
    ManifestError,
    UsageError,
)
from manifest.gate.baseline import check_baseline, update_baseline
from manifest.gate.policy import CHECK_NAMES, Project, load_project
from manifest.gate.report import UPDATE_HINT, CheckResult, GateOptions, GateReport, Status
from manifest.judge import gate_status
from manifest.models import Manifest

# Flag values the deterministic recipe sets (manifest.launch.boot.apply_flags).
_RECIPE_FLAGS: dict[str, object] = {
    "deterministic_algorithms": True,
    "deterministic_warn_only": False,
    "cudnn_deterministic": True,
    "cudnn_benchmark": False,
    "allow_tf32_matmul": False,
    "allow_tf32_cudnn": False,
    "float32_matmul_precision": "highest",
}

# Code fields whose differences are replaced by the file-level comparison:

# ------------------------------------------------------------------- gate


def run_gate(cwd: Path, options: GateOptions) -> GateReport:
    """Run the gate for the project at or above ``cwd``; never raises for a failed check."""
    if options.files and not options.no_rerun:
        raise UsageError("manifest files can only be given with --no-rerun.")
    if options.no_rerun and options.update_baseline:
        raise UsageError("--update-baseline needs a training run; drop --no-rerun.")
    project = load_project(cwd)
    from manifest.store import sweep_temp

    sweep_temp(project.baseline_path)  # a killed --update-baseline leaves its temp file
    mode = "no-rerun" if options.no_rerun else (
        "update-baseline" if options.update_baseline else "full")
    report = GateReport(project=project.rel(project.dir), mode=mode, policy=project.policy,
                        baseline=project.rel(project.baseline_path))
    ignored = baseline_ignored(project)
    if ignored is not None:
        report.warnings.append(ignored)
    if not _threads_pinned(project):
        report.warnings.append(
            "the thread count is not pinned ([tool.manifest] threads): runs follow the "
            "runner's CPU count, and a different count changes the weights on CPU.")
    if options.no_rerun:
        _gate_committed(project, options, report)
    else:
        _gate_run(project, options, report)
    if options.warn_hygiene:
        kept: list[CheckResult] = []
        for c in report.checks:
            if c.name == "hygiene" and c.status is Status.FAIL:
                report.warnings.extend(c.details or (c.reason,))
                c = CheckResult(c.name, Status.PASS, "problems reported as warnings "
                                "(--warn-hygiene)", c.details, c.hint)
            kept.append(c)
        report.checks = kept
    return report


def baseline_ignored(project: Project) -> str | None:
    """The warning for a baseline that git ignores (and does not track): CI's checkout
    would not have it, so the gate there would find no baseline. None when git would
    carry it, or git cannot say (no repository, no git)."""
    from manifest.gitrun import GitMissingError, run_git

    rel = project.rel(project.baseline_path)
    try:
        done = run_git(["check-ignore", "-v", "--", rel], project.root, check=False)
    except (GitMissingError, OSError):
        return None
    if done.returncode != 0:  # 1: not ignored (or tracked), 128: not a repository
        return None
    source, _, _ = done.stdout.decode(errors="replace").partition("\t")
    rule = source.strip()
    return (f"the baseline {rel} is ignored by git ({rule}): it will not be committed, so "
            f"the gate in CI will not find it; add '!{rel}' to .gitignore (or "
            f"'git add -f {rel}') and commit it.")


def _enabled(project: Project, name: str) -> bool:
    return name in project.policy.checks


def _threads_pinned(project: Project) -> bool:
    value = project.config.get("threads")
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _smoke_command(project: Project) -> list[str]:
    if project.policy.command is not None:
        return list(project.policy.command)
    configured = project.config.get("command")
    if isinstance(configured, str):
        import shlex

        configured = shlex.split(configured)
    if not isinstance(configured, list) or not configured or not all(
            isinstance(a, str) for a in configured):
        raise ConfigError(
            f"no training command to run: set [tool.manifest.gate] command or "
            f"[tool.manifest] command in {project.origin}.",
            hint="The gate captures and re-runs it; size it for CI (a few seconds).")
    return list(configured)


def _gate_run(project: Project, options: GateOptions, report: GateReport) -> None:
    from manifest.canonical import dumps
    from manifest.capture.run import CaptureOptions, capture_from_cli

    command = _smoke_command(project)
    report.command = command
    manifest, _ = capture_from_cli(project.dir, CaptureOptions(
        command=command, quiet=options.quiet,
        # A baseline that other runner types may be 'equivalent' to carries its envelope.
        envelope=ENVELOPE_RUNS if options.update_baseline and project.policy.allow_equivalent
        else 0))
    report.run_id = manifest.run_id
    assert manifest.outputs is not None
    if manifest.outputs.status != "ok":
        reason = f"the training did not complete: {manifest.outputs.error}"
        for name in CHECK_NAMES:
            if name == "hygiene" and _enabled(project, name):
                report.checks.append(hygiene_of_run(project, manifest, data_changes=[]))
            elif _enabled(project, name):
                report.checks.append(CheckResult(name, Status.NO_VERDICT, reason))
        return

    determinism, data_changes = _check_determinism(project, manifest, dumps(manifest), report,
                                                   options)
    if determinism is not None:
        report.checks.append(determinism)
    deterministic = determinism is None or determinism.status is Status.PASS
    if options.update_baseline:
        report.checks.append(update_baseline(project, manifest, deterministic, report))
    elif _enabled(project, "baseline"):
        report.checks.append(check_baseline(project, manifest))
    if _enabled(project, "hygiene"):
        report.checks.append(hygiene_of_run(project, manifest, data_changes=data_changes))


ENVELOPE_RUNS = 3
"""One-ULP runs of the baseline's envelope (plus one under another thread count)."""

GATE_UNCONFINED = ("the gate's own capture ran this command unconfined a moment ago, and "
                   "its re-run must see the same world to be compared with it")


def _check_determinism(project: Project, manifest: Manifest, data: bytes,
                       report: GateReport, options: GateOptions,
                       ) -> tuple[CheckResult | None, list[str]]:
    """Verify the fresh capture once; (result or None when disabled, data changes).
    The re-run's plan, and the environment it ran in, go into ``report``; with ``--env
    run`` (``options.rebuild``) each result also says the environment in a line."""
    if not _enabled(project, "determinism"):
        return None, []
    from manifest.verify.pipeline import verify_run
    from manifest.verify.report import VerifyOptions

    try:
        # The gate captured this manifest itself a moment ago: its code is ours.
        verdict = verify_run(data, file="<gate run>", cwd=project.dir, note=options.note,
                             options=VerifyOptions(trust=True, quiet=True,
                                                   unconfined_because=GATE_UNCONFINED,
                                                   rebuild=options.rebuild))
    except ManifestError as exc:
        return CheckResult("determinism", Status.NO_VERDICT,
                           f"the re-run could not be done: {exc.diagnostics()}"), []
    report.plan = verdict.plan
    report.reason_code = verdict.reason_code
    report.environment = verdict.environment
    used = ((f"environment: {verdict.environment['line']}",)
            if options.rebuild is not None and verdict.environment else ())
    data_changes = [f"{d.detail}" + (f" ({', '.join(d.files[:5])})" if d.files else "")
                    for d in verdict.changed_data]
    argv = " ".join(manifest.command.argv) if manifest.command else "the command"
    status = gate_status(verdict.verdict)
    if status is Status.NOTHING_COMPARED:
        return CheckResult("determinism", Status.NOTHING_COMPARED, verdict.reason or "",
                           (f"compared: {verdict.basis_text}", *used),
                           hint="Declare the weights file the smoke command writes: outputs "
                                "= [\"model.safetensors\"] in [tool.manifest]."), data_changes
    if status is Status.PASS:
        assert manifest.outputs is not None
        tensors = sum(len(a.tensors or {}) for a in manifest.outputs.artifacts)
        what = (f"bit-identical outputs ({len(verdict.artifacts)} artifact(s), {tensors} "
                "tensor(s) compared)" if verdict.artifacts else
                "the same step trail (no output declared: the trail only, not the weights' "
                "bytes)")
        return CheckResult(
            "determinism", Status.PASS, f"two runs of `{argv}` gave {what}",
            (f"compared: {verdict.basis_text}", f"re-run: {verdict.confinement}", *used)
        ), data_changes
    if status is Status.FAIL:
        details: list[str] = []
        for art in verdict.artifacts:
            for t in art.tensors:
                details.append(f"{art.path}: tensor {t.name} differs in {t.elements} of "
                               f"{t.total} elements (max |Δ| {t.max_abs:.3g})"
                               if t.elements is not None and t.total is not None
                               and t.max_abs is not None
                               else f"{art.path}: tensor {t.name}: {t.change}")
            if not art.tensors and not art.identical:
                details.append(f"{art.path}: {art.detail}")
        if verdict.first_divergent_step is not None:
            details.append(f"first divergent step: {verdict.first_divergent_step}")
        details.extend(data_changes)
        details[:0] = used
        return CheckResult(
            "determinism", Status.FAIL,
            "non-deterministic: the same commit, seed and flags gave different weights in "
            "two runs",
            tuple(details[:20]),
            hint="Look for randomness that the seed does not reach: a generator seeded from "
                 "the clock or the OS (time.time(), torch.Generator().seed(), "
                 "numpy.random.default_rng() with no seed, random.SystemRandom), or input "
                 "that changes between runs."), data_changes
    return CheckResult("determinism", Status.NO_VERDICT,
                       f"no verdict: {verdict.reason or 'the re-run did not finish'}",
                       used), data_changes


# ---------------------------------------------------------------- hygiene


def flag_problems(manifest: Manifest) -> list[str]:
    """Determinism flags that were not in force (recorded at each process's exit)."""
    problems: list[str] = []
    det = manifest.determinism
    if not det.requested:
        problems.append("the deterministic recipe was not requested (deterministic = false)")
    if det.pythonhashseed is None:
        problems.append("PYTHONHASHSEED was not set")
    for p in det.processes:
        if p.flags is None:
            continue
        for name, wanted in _RECIPE_FLAGS.items():
            value = getattr(p.flags, name)
            if value is not None and value != wanted:
                problems.append(f"rank {p.rank}: {name} was {value} at exit "
                                f"(the recipe sets {wanted}); the script changed it")
        if p.flags.autocast:
            problems.append(f"rank {p.rank}: autocast was on at exit")
    from manifest.nodes.topology import collective_problems

    problems.extend(collective_problems(manifest))
    return problems


def hygiene_findings(project: Project, manifest: Manifest) -> list[str]:
    """Every hygiene problem of one manifest under the project's policy."""
    policy = project.policy
    found: list[str] = []
    code = manifest.code
    if code.dirty:
        if not policy.allow_dirty:
            found.append("the working tree has uncommitted changes (allow_dirty = false)")
        elif code.diff_digest is None:
            found.append("the working tree has uncommitted changes that were not recorded")
    if policy.require_lockfile and not code.lockfiles:
        found.append("no lockfile digested (uv.lock, poetry.lock, requirements*.txt, "
                     "environment.yml, Pipfile.lock): dependencies are not pinned")
    if policy.require_data and not manifest.data:
        found.append("no dataset declared ([tool.manifest] data): data changes go unrecorded")
    found.extend(flag_problems(manifest))
    if not _threads_pinned(project):
        found.append("thread count not pinned ([tool.manifest] threads): it follows the "
                     f"runner's CPU count ({manifest.determinism.num_threads} here)")
    return found


def hygiene_of_run(project: Project, manifest: Manifest, *, data_changes: list[str]
                   ) -> CheckResult:
    found = hygiene_findings(project, manifest)
    found.extend(f"data changed while the gate ran: {c}" for c in data_changes)
    return _hygiene_result(found, manifest)


def _hygiene_result(found: list[str], manifest: Manifest | None) -> CheckResult:
    if found:
        return CheckResult("hygiene", Status.FAIL, f"{len(found)} problem(s): {found[0]}",
                           tuple(found),
                           hint="Fix these so that a manifest records everything that "
                                "decides the weights.")
    notes = []
    if manifest is not None and manifest.code.dirty:
        notes.append("uncommitted changes recorded as a patch")
    if manifest is not None:
        from manifest.nodes.topology import collective_summary

        collectives = collective_summary(manifest)
        if collectives is not None:
            notes.append(f"collectives: {collectives}")
    return CheckResult("hygiene", Status.PASS,
                       "tree, lockfile, datasets, flags and thread count in order"
                       + (f" ({'; '.join(notes)})" if notes else ""))


# --------------------------------------------------------------- no-rerun


def _committed_manifests(project: Project, options: GateOptions) -> list[Path]:
    if options.files:
        return [Path(f) if Path(f).is_absolute() else Path.cwd() / f for f in options.files]
    found = [project.baseline_path] if project.baseline_path.exists() else []
    for pattern in project.policy.manifests:
        for m in sorted(glob.glob(pattern, root_dir=project.dir, recursive=True)):
            path = project.dir / m
            if path.is_file() and path not in found:
                found.append(path)
    return found


def _gate_committed(project: Project, options: GateOptions, report: GateReport) -> None:
    """Validate committed manifests without training (``--no-rerun``)."""
    from manifest.canonical import load_manifest, read_manifest_file
    from manifest.errors import UntrustedManifestError
    from manifest.rerun.paths import UnsafePathError
    from manifest.travel.pack import manifest_bytes_of
    from manifest.travel.sign import input_signature
    from manifest.verify.pipeline import verify_run
    from manifest.verify.report import VerifyOptions

    for name in ("determinism", "baseline"):
        if _enabled(project, name):
            report.checks.append(CheckResult(name, Status.SKIP, "--no-rerun: nothing is trained"))
    paths = _committed_manifests(project, options)
    if not paths:
        report.checks.append(CheckResult(
            "manifests", Status.FAIL if not options.files else Status.SKIP,
            f"no committed manifest found (baseline {report.baseline})",
            hint=f"Run `manifest gate --update-baseline` and commit {report.baseline}."))
        return
    problems: list[str] = []
    missing: list[str] = []
    drift: list[str] = []
    hygiene: list[str] = []
    signed: list[str] = []
    manifests: list[Manifest] = []
    for path in paths:
        shown = project.rel(path)
        data = read_manifest_file(path)
        try:
            verdict = verify_run(data, file=shown, cwd=project.dir,
                                 options=VerifyOptions(no_rerun=True, quiet=options.quiet))
        except (UnsafePathError, UntrustedManifestError) as exc:
            # A dataset path it may not read: a failed check, not the end of the gate
            # (a tampered or invalid file still ends it: exit 2).
            problems.append(f"{shown}: {exc.message}")
            continue
        for change in verdict.data:
            files = f" ({', '.join(change.files[:5])})" if change.files else ""
            recorded = Path(change.path)
            if change.checked and not recorded.is_absolute() and "://" not in change.path \
                    and not os.path.lexists(project.root / recorded):
                missing.append(f"{shown}: dataset {change.name} is missing: nothing at "
                               f"{change.path}")
            elif change.checked:
                problems.append(f"{shown}: {change.detail}{files}")
            else:
                drift.append(f"{shown}: {change.detail}")
        drift.extend(f"{shown}: drift: {d.path}: {d.reason}" for d in verdict.bits_drift)
        # A signature that came with it must cover it (else exit 2, as diff and verify).
        signature = input_signature(str(path), data, cwd=project.dir)
        signed.append(f"{shown}: signature: " + (
            f"{signature.describe()} ({signature.source})" if signature is not None
            else "none (not a signed pack, no .sig beside it): not checked"))
        manifest = load_manifest(manifest_bytes_of(data))
        manifests.append(manifest)
        hygiene.extend(f"{shown}: {p}" for p in hygiene_findings(project, manifest)
                       if not p.startswith("thread count"))
    if missing:
        # Not a change to accept: updating the baseline would record a run without its data.
        report.checks.append(CheckResult(
            "manifests", Status.FAIL,
            f"{len(missing)} recorded dataset(s) missing"
            + (f", {len(problems)} changed since capture" if problems else ""),
            tuple(missing + problems),
            hint="Put the data at its recorded path before the gate (a CI checkout may need "
                 "a download or `git lfs pull` step)"
                 + (f"; for a changed dataset, if the change is intended, {UPDATE_HINT}."
                    if problems else ".")))
    elif problems:
        report.checks.append(CheckResult(
            "manifests", Status.FAIL,
            f"{len(problems)} recorded dataset(s) changed since capture", tuple(problems),
            hint=f"If the data change is intended, {UPDATE_HINT}."))
    else:
        report.checks.append(CheckResult(
            "manifests", Status.PASS,
            f"{len(paths)} manifest(s) intact, recorded data unchanged",
            tuple(drift[:20] + signed[:20])))
    if _enabled(project, "hygiene"):
        if not _threads_pinned(project):
            hygiene.append("thread count not pinned ([tool.manifest] threads): it follows the "
                           "runner's CPU count")
        # None: every committed manifest was refused above (its datasets may not be read).
        report.checks.append(_hygiene_result(hygiene, manifests[0] if manifests else None))
