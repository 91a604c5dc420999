"""The baseline check: same weights as the committed baseline, or a recorded cause for the move."""


from __future__ import annotations

import glob
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.gate.policy import Project
from manifest.gate.report import UPDATE_HINT, CheckResult, GateReport, Status
from manifest.judge.rules import worst_numeric
from manifest.judge.tables import NumericVerdict
from manifest.models import Manifest

if TYPE_CHECKING:
    from manifest.travel.sign import InputSignature

# the commit always moves between a baseline and a pull request.
_CODE_IDENTITY = {"code.commit", "code.dirty", "code.diff_digest", "code.untracked_files"}


# --------------------------------------------------------------- baseline


def update_baseline(project: Project, manifest: Manifest, deterministic: bool,
                     report: GateReport) -> CheckResult:
    from manifest.canonical import dumps
    from manifest.store import atomic_write

    path = project.baseline_path
    if not deterministic:
        return CheckResult("baseline", Status.SKIP,
                           f"baseline not written: the run is not reproducible, so "
                           f"{report.baseline} was left as it was")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps(manifest))
    report.baseline_written = True
    return CheckResult("baseline", Status.PASS,
                       f"baseline {report.baseline} rewritten (run_id {manifest.run_id[:19]}…); "
                       "commit it")


def load_baseline(path: Path) -> Manifest | None:
    """The baseline manifest, or None when the file does not exist."""
    loaded = load_signed_baseline(path, cwd=path.parent)
    return None if loaded is None else loaded[0]


def load_signed_baseline(path: Path, *,
                         cwd: Path) -> tuple[Manifest, InputSignature | None] | None:
    """The baseline and the signature that came with it (a signed pack's, or
    ``baseline.json.sig``), or None when there is no baseline.

    A signature that does not cover the baseline (or fails its check) is
    refused, exit 2, as ``verify`` and ``diff`` refuse it: someone changed the
    committed baseline after it was signed, and comparing against it would
    pass off their weights as the signer's.
    """
    from manifest.canonical import load_manifest, read_manifest_file
    from manifest.errors import InvalidManifestError

    if not os.path.lexists(path):
        return None
    data = read_manifest_file(path, what="baseline manifest")
    try:
        from manifest.travel.pack import manifest_bytes_of

        manifest = load_manifest(manifest_bytes_of(data))
    except InvalidManifestError as exc:
        raise type(exc)(f"the baseline {path} is not a valid manifest: {exc.message}",
                        hint=f"Restore it from git, or {UPDATE_HINT}.") from exc
    from manifest.errors import SignatureError
    from manifest.travel.sign import input_signature

    try:
        return manifest, input_signature(str(path), data, cwd=cwd)
    except SignatureError as exc:
        raise SignatureError(f"the baseline {path}: {exc.message}",
                             hint=" ".join(filter(None, (exc.hint, f"Re-sign it, or "
                                                          f"{UPDATE_HINT}.")))) from exc


def signature_line(signature: InputSignature | None) -> str:
    """The baseline check's line about the signature, said whether or not there is one."""
    if signature is None:
        return "baseline signature: none (not a signed pack, no .sig beside it): not checked"
    return f"baseline signature: {signature.describe()} ({signature.source})"


def weights_of(manifest: Manifest) -> dict[str, Any]:
    """Artifact path → the identity of its weights (tensor table, else file digest)."""
    assert manifest.outputs is not None
    out: dict[str, Any] = {}
    for a in manifest.outputs.artifacts:
        if a.tensors is not None:
            out[a.path] = {k: (t.dtype, tuple(t.shape), t.digest) for k, t in a.tensors.items()}
        else:
            out[a.path] = a.digest
    return out


def weight_changes(old: Manifest, new: Manifest) -> list[str]:
    """One line per artifact or tensor whose bytes differ."""
    a, b = weights_of(old), weights_of(new)
    lines: list[str] = []
    for path in sorted(set(a) | set(b)):
        if path not in b:
            lines.append(f"{path}: in the baseline only")
        elif path not in a:
            lines.append(f"{path}: not in the baseline")
        elif a[path] != b[path]:
            if isinstance(a[path], dict) and isinstance(b[path], dict):
                names = sorted(k for k in set(a[path]) | set(b[path])
                               if a[path].get(k) != b[path].get(k))
                shown = ", ".join(names[:6]) + (" …" if len(names) > 6 else "")
                lines.append(f"{path}: {len(names)} tensor(s) differ ({shown})")
            else:
                lines.append(f"{path}: file bytes differ")
    return lines


def code_changes(project: Project, baseline: Manifest, current: Manifest) -> list[str]:
    """Source files changed since the baseline's code, one cause line each."""
    from manifest.gitrun import GitMissingError, run_git

    old, new = baseline.code, current.code
    if old.commit == new.commit and old.diff_digest == new.diff_digest:
        return []
    if old.commit is None:
        return ["code: the baseline records no commit, so changed files cannot be listed"]
    try:
        known = run_git(["cat-file", "-e", f"{old.commit}^{{commit}}"], project.root,
                        check=False).returncode == 0
        if not known:
            return [f"code: the baseline's commit {old.commit[:12]} is not in this repository's "
                    "history (a shallow clone? fetch with fetch-depth: 0), so changed files "
                    "cannot be listed"]
        specs = [project.rel(project.dir / p) for p in project.policy.code_paths]
        specs = ["." if s in ("", ".") else s for s in specs]
        tracked = run_git(["diff", "--name-only", "-z", old.commit, "--", *specs],
                          project.root).stdout
        untracked = run_git(["ls-files", "--others", "--exclude-standard", "-z", "--", *specs],
                            project.root).stdout
    except GitMissingError:
        return ["code: git is not available, so changed files cannot be listed"]
    names = {os.fsdecode(n) for n in (tracked + untracked).split(b"\0") if n}
    excluded = _excluded_paths(project, current)
    files = sorted(n for n in names if not any(
        n == e or n.startswith(e.rstrip("/") + "/") for e in excluded))
    lines = [f"code: {f} changed since the baseline's commit {old.commit[:12]}" for f in files]
    if old.dirty:
        lines.append("code: the baseline was captured with uncommitted changes; what they "
                     "touched is not listed")
    return lines


def _excluded_paths(project: Project, current: Manifest) -> set[str]:
    """Repo-relative paths that are not code: the baseline, committed manifests, datasets."""
    excluded = {project.rel(project.baseline_path)}
    for pattern in project.policy.manifests:
        for m in glob.glob(pattern, root_dir=project.dir, recursive=True):
            excluded.add(project.rel(project.dir / m))
    for ds in current.data:
        p = Path(ds.path)
        if not p.is_absolute():
            excluded.add(p.as_posix())
    return excluded


def input_causes(project: Project, baseline: Manifest, current: Manifest,
                 *, include_env: bool) -> list[str]:
    """Every recorded input that differs in a way that can change the bits."""
    from manifest.diff.engine import diff_manifests

    causes: list[str] = []
    sections = {"code", "data", "command", "randomness", "determinism"}
    if include_env:
        sections |= {"env", "hardware"}
    for d in diff_manifests(baseline, current).bits:
        if d.section not in sections or d.rule in _CODE_IDENTITY:
            continue
        causes.append(f"{d.section}: {d.reason}")
    causes.extend(code_changes(project, baseline, current))
    return causes


def env_drift(baseline: Manifest, current: Manifest) -> list[str]:
    from manifest.diff.engine import diff_manifests

    return [f"{d.section}: {d.reason}" for d in diff_manifests(baseline, current).bits
            if d.section in ("env", "hardware")]


def _weigh_across_runners(project: Project, baseline: Manifest, current: Manifest,
                          where: str, drift: list[str], changed: list[str]) -> CheckResult:
    """``allow_equivalent``: weights that differ from a baseline recorded on another
    environment, judged as verify judges a re-run: ``fail`` when an input beyond rounding
    moved (code, data, seed, command) or the step trails leave the baseline's noise
    envelope, ``pass`` when every step lies inside it, ``no-verdict`` when it cannot be
    judged (no envelope, no trail, other devices). Never a skip: the weights were compared.
    Unlike verify and diff, the gate has only the fresh run's weights (the baseline's are
    not committed), so its ``equivalent`` stands on the step trails and says so.

    The envelope and the trail are the baseline's own numbers, and the gate lets them
    decide, unlike ``diff`` (which trusts only envelopes sealed on its machine): the
    baseline is the repository's committed reference, and whoever could edit its envelope
    could as well replace it with their run (``--update-baseline``, then commit). Its
    envelope is still held to the plausibility checks (``numeric.calibration``)."""
    from manifest.diff.engine import diff_manifests
    from manifest.numeric.envelope import judge, rounding_only
    from manifest.numeric.precision import device_change

    shown = tuple(["weights: " + c for c in changed[:10]] + drift[:20])
    inputs = [d for d in diff_manifests(baseline, current).bits
              if d.section != "outputs" and d.rule not in _CODE_IDENTITY]
    beyond = [f"{d.section}: {d.reason}" for d in inputs if not rounding_only([d.path])]
    beyond += code_changes(project, baseline, current)
    if beyond:
        return CheckResult(
            "baseline", Status.FAIL,
            f"weights changed from the baseline, and {len(beyond)} recorded input(s) beyond "
            "rounding differ (code, data, seed or command: never 'equivalent')",
            tuple(["weights: " + c for c in changed] + beyond)[:40],
            hint=f"If the change is intended, {UPDATE_HINT}.")
    moved = device_change(baseline, current)
    if moved is not None:
        return CheckResult("baseline", Status.NO_VERDICT, f"the weights differ from the "
                           f"baseline {where} and 'equivalent' cannot be judged: {moved}",
                           shown, hint="Record the baseline on this runner type.")
    assert baseline.outputs is not None and current.outputs is not None
    envelope = baseline.outputs.envelope
    if envelope is None:
        return CheckResult("baseline", Status.NO_VERDICT, f"the weights differ from the "
                           f"baseline {where}, which carries no noise envelope: "
                           "'equivalent' cannot be judged", shown,
                           hint="Run `manifest gate --update-baseline` with allow_equivalent = "
                                "true (it measures the envelope) and commit the baseline.")
    now = {p.rank: p.numeric or [] for p in current.outputs.processes}
    judged = [judge(p.numeric or [], now.get(p.rank, []), envelope)
              for p in baseline.outputs.processes]
    worst = worst_numeric(judged)
    if judged and worst is None:
        sentence = judged[0].to_json()["sentence"]
        return CheckResult("baseline", Status.PASS, f"equivalent to the baseline {where}: the "
                           "same run up to rounding on another environment; " + sentence +
                           "; the baseline's weights are not kept, so the step trails "
                           "decide and the final weights were held to no bound",
                           shown)
    if worst is not None and NumericVerdict(worst.verdict) is NumericVerdict.DIFFERS:
        return CheckResult("baseline", Status.FAIL, "outside the baseline's noise envelope: "
                           f"{worst.to_json()['sentence']}", shown,
                           hint=f"If the change is intended, {UPDATE_HINT}.")
    why = worst.reason if worst is not None else "the baseline records no process"
    return CheckResult("baseline", Status.NO_VERDICT, f"the weights differ from the baseline "
                       f"{where} and 'equivalent' could not be judged: {why}", shown)


def check_baseline(project: Project, current: Manifest) -> CheckResult:
    """Compare a fresh run with the committed baseline (see the module docstring); the
    details end with what the baseline's signature says (or that it has none)."""
    where = project.rel(project.baseline_path)
    loaded = load_signed_baseline(project.baseline_path, cwd=project.dir)
    if loaded is None:
        return CheckResult("baseline", Status.FAIL, f"no baseline manifest at {where}",
                           hint=f"Run `manifest gate --update-baseline` and commit {where}.")
    baseline, signature = loaded
    result = _compare_with_baseline(project, baseline, current, where)
    line = signature_line(signature).replace(f"{project.dir}{os.sep}", "")  # as `where`
    return replace(result, details=(*result.details, line))


def _compare_with_baseline(project: Project, baseline: Manifest, current: Manifest,
                           where: str) -> CheckResult:
    if baseline.outputs is None or baseline.outputs.status != "ok":
        return CheckResult("baseline", Status.FAIL,
                           f"the baseline {where} records no successful run", hint=UPDATE_HINT)
    drift = env_drift(baseline, current)
    changed = weight_changes(baseline, current)
    if not changed:
        if drift:
            return CheckResult("baseline", Status.PASS, f"weights identical to the baseline "
                               f"{where}, recorded on another environment", tuple(drift[:20]))
        return CheckResult("baseline", Status.PASS,
                           f"weights identical to the baseline {where}")
    if drift and not project.policy.same_env:
        if project.policy.allow_equivalent:
            return _weigh_across_runners(project, baseline, current, where, drift, changed)
        # Compared, and different; but the environment moved too, so whether the change is
        # the pull request's or the runner's is not known: no verdict, never a pass.
        return CheckResult(
            "baseline", Status.NO_VERDICT,
            f"the weights differ from the baseline {where}, which was recorded on another "
            f"environment ({len(drift)} difference(s) that can change bits): whether the "
            "change is this one's was not judged",
            tuple(["weights: " + c for c in changed[:10]] + drift[:20]),
            hint="Record the baseline on this runner type, set allow_equivalent = true to "
                 "judge it against the baseline's noise envelope, or same_env = true to "
                 "compare the weights alone.")
    causes = input_causes(project, baseline, current, include_env=project.policy.same_env)
    if causes:
        return CheckResult(
            "baseline", Status.FAIL,
            f"weights changed from the baseline, and {len(causes)} recorded input(s) differ",
            tuple(["weights: " + c for c in changed] + causes)[:40],
            hint=f"If the change is intended, {UPDATE_HINT}.")
    return CheckResult(
        "baseline", Status.FAIL,
        "non-reproducible: weights changed from the baseline with no recorded cause "
        "(same code, data, seed, flags and environment)",
        tuple("weights: " + c for c in changed),
        hint="An input the manifest does not record moved the weights: a file read from "
             "outside the declared datasets, a download, or the clock. Declare it under "
             "[tool.manifest] data, or remove it.")


