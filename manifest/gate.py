"""``manifest gate``: the pre-merge reproducibility check.

The gate answers one question for a pull request: does the training still
reproduce, and if its weights moved, is there a recorded reason? It runs
three checks, in order, each ending ``pass``, ``fail``, ``skip`` or
``no-verdict`` with one sentence of reason:

* **determinism**: capture the smoke training (``[tool.manifest.gate]
  command``, else ``[tool.manifest] command``) in the project, then verify
  that manifest once in a scratch clone (``manifest.verify``): the two runs
  must give bit-identical weights. On CPU this is what catches a generator
  seeded from the clock or the OS, whatever op it feeds.
* **baseline** (snapshot-test style): compare the run with the committed
  baseline manifest. Same weights: pass. Different weights: the causes are
  the ``bits`` differences of the inputs (``manifest.diff``) plus the source
  files changed since the baseline's commit (``git diff`` against that
  commit, limited to ``code_paths``, leaving out the baseline, committed
  manifests and declared datasets, which are compared by digest under
  ``data``). Causes found: fail, "accept with ``--update-baseline``". No
  cause: fail as non-reproducible (an undeclared input moved the weights).
  When env or hardware differ from the baseline's in a way that can change
  bits (another runner type), the drift is reported and the weights are not
  compared, unless ``same_env = true``, which turns that drift into causes.
* **hygiene**: tree clean or its patch recorded, a lockfile digested,
  datasets declared and unchanged between the two runs, every determinism
  flag still in force when each process exited, the thread count pinned in
  the configuration (else it follows the runner's CPU count).

``--no-rerun`` trains nothing: it validates committed manifests (integrity,
data; ``manifest verify --no-rerun``) and their hygiene; the pre-commit hook
runs it with ``warn_hygiene`` so problems are shown without blocking.

Policy, ``[tool.manifest.gate]`` in pyproject.toml (paths relative to the
pyproject's directory; every key optional)::

    [tool.manifest.gate]
    baseline = "manifests/baseline.json"   # the committed baseline manifest
    command = ["python", "train.py", "--steps", "20"]   # default: [tool.manifest] command
    checks = ["determinism", "baseline", "hygiene"]     # which checks run
    same_env = false        # compare weights even when env/hardware drifted
    code_paths = ["."]      # what counts as code when looking for causes
    manifests = []          # more committed manifests (globs) for --no-rerun
    allow_dirty = true      # a dirty tree passes hygiene when its patch is recorded
    require_lockfile = true # hygiene: a lockfile (uv.lock, requirements*.txt, ...) is digested
    require_data = true     # hygiene: at least one dataset is declared

Exit status: 0 every check passed or was skipped, 1 a check failed, 2 bad
configuration or input, 3 no verdict (the training failed, an output went
missing). This module never prints; ``manifest.render_gate`` renders.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from manifest.config import string_list
from manifest.errors import (
    EXIT_FAILED,
    EXIT_NO_VERDICT,
    EXIT_OK,
    ConfigError,
    ManifestError,
    UsageError,
)
from manifest.models import Manifest

JSON_FORMAT = "manifest-gate/v1"
CHECK_NAMES = ("determinism", "baseline", "hygiene")
UPDATE_HINT = "run `manifest gate --update-baseline` and commit it to accept this change"

# Flag values the deterministic recipe sets (manifest._launch.apply_flags).
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
# the commit always moves between a baseline and a pull request.
_CODE_IDENTITY = {"code.commit", "code.dirty", "code.diff_digest", "code.untracked_files"}


class Status(StrEnum):
    PASS = "pass"  # noqa: S105
    FAIL = "fail"
    SKIP = "skip"
    NO_VERDICT = "no-verdict"


# ------------------------------------------------------------------ policy


@dataclass(frozen=True)
class GatePolicy:
    """``[tool.manifest.gate]`` with its defaults (see the module docstring)."""

    baseline: str = "manifests/baseline.json"
    command: tuple[str, ...] | None = None
    checks: tuple[str, ...] = CHECK_NAMES
    same_env: bool = False
    code_paths: tuple[str, ...] = (".",)
    manifests: tuple[str, ...] = ()
    allow_dirty: bool = True
    require_lockfile: bool = True
    require_data: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "command": None if self.command is None else list(self.command),
            "checks": list(self.checks),
            "same_env": self.same_env,
            "code_paths": list(self.code_paths),
            "manifests": list(self.manifests),
            "allow_dirty": self.allow_dirty,
            "require_lockfile": self.require_lockfile,
            "require_data": self.require_data,
        }


_POLICY_KEYS = frozenset(GatePolicy.__dataclass_fields__)


def parse_policy(table: Any, origin: Path | None) -> GatePolicy:
    """Validate ``[tool.manifest.gate]``; unknown keys and wrong types are ConfigError."""
    if table is None:
        return GatePolicy()
    where = f"[tool.manifest.gate] in {origin}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table.")
    unknown = sorted(set(table) - _POLICY_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s): {', '.join(unknown)}.",
                          hint=f"Known keys: {', '.join(sorted(_POLICY_KEYS))}.")

    def strings(key: str) -> tuple[str, ...] | None:
        value = string_list(table, key, origin, section="[tool.manifest.gate]")
        return None if value is None else tuple(value)

    def flag(key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false.")
        return value

    baseline = table.get("baseline", GatePolicy.baseline)
    if not isinstance(baseline, str) or not baseline:
        raise ConfigError(f"{where}: baseline must be a path (a string).")
    command = table.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    checks = strings("checks")
    if checks is not None:
        bad = sorted(set(checks) - set(CHECK_NAMES))
        if bad:
            raise ConfigError(f"{where}: unknown check(s) {', '.join(bad)}.",
                              hint=f"Checks: {', '.join(CHECK_NAMES)}.")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(a, str) for a in command)):
        raise ConfigError(f"{where}: command must be a non-empty list of strings.")
    defaults = GatePolicy()
    return GatePolicy(
        baseline=baseline,
        command=None if command is None else tuple(command),
        checks=checks if checks is not None else defaults.checks,
        same_env=flag("same_env", defaults.same_env),
        code_paths=strings("code_paths") or defaults.code_paths,
        manifests=strings("manifests") or defaults.manifests,
        allow_dirty=flag("allow_dirty", defaults.allow_dirty),
        require_lockfile=flag("require_lockfile", defaults.require_lockfile),
        require_data=flag("require_data", defaults.require_data),
    )


# ------------------------------------------------------------------ result


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: a status, one sentence, and the lines behind it."""

    name: str
    status: Status
    reason: str
    details: tuple[str, ...] = ()
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "reason": self.reason,
                "details": list(self.details), "hint": self.hint}


@dataclass
class GateReport:
    """What the gate found; ``exit_code`` is the CLI's exit status."""

    project: str
    mode: str
    """``full``, ``update-baseline`` or ``no-rerun``."""
    policy: GatePolicy
    baseline: str
    checks: list[CheckResult] = field(default_factory=list)
    run_id: str | None = None
    command: list[str] = field(default_factory=list)
    baseline_written: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` or ``no-verdict``."""
        if self.failed:
            return Status.FAIL.value
        if any(c.status is Status.NO_VERDICT for c in self.checks):
            return Status.NO_VERDICT.value
        return Status.PASS.value

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_OK, "fail": EXIT_FAILED}.get(self.verdict, EXIT_NO_VERDICT)

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": JSON_FORMAT,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "mode": self.mode,
            "project": self.project,
            "command": self.command,
            "run_id": self.run_id,
            "baseline": self.baseline,
            "baseline_written": self.baseline_written,
            "policy": self.policy.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class GateOptions:
    no_rerun: bool = False
    update_baseline: bool = False
    files: tuple[str, ...] = ()
    """Manifests to validate in --no-rerun mode (default: baseline + policy manifests)."""
    warn_hygiene: bool = False
    """Report hygiene problems as warnings that do not fail (the pre-commit hook)."""
    quiet: bool = True


# ------------------------------------------------------------------ project


@dataclass(frozen=True)
class Project:
    """Where the gate runs: the pyproject's directory and its git root."""

    dir: Path
    root: Path
    config: dict[str, Any]
    origin: Path
    policy: GatePolicy

    def rel(self, path: Path) -> str:
        """``path`` relative to the repository root, POSIX style."""
        try:
            return Path(os.path.relpath(path, self.root)).as_posix()
        except ValueError:
            return path.as_posix()

    @property
    def baseline_path(self) -> Path:
        return self.dir / self.policy.baseline


def load_project(cwd: Path) -> Project:
    from manifest.config import load_config
    from manifest.verify import repo_root_of

    table, origin = load_config(cwd)
    if origin is None:
        raise ConfigError(f"no pyproject.toml at or above {cwd}.",
                          hint="The gate reads [tool.manifest] and [tool.manifest.gate] from it.")
    policy = parse_policy(table.get("gate"), origin)
    project_dir = origin.parent.resolve()
    root = repo_root_of(project_dir) or project_dir
    return Project(project_dir, root.resolve(), table, origin, policy)


# ------------------------------------------------------------------- gate


def run_gate(cwd: Path, options: GateOptions) -> GateReport:
    """Run the gate for the project at or above ``cwd``; never raises for a failed check."""
    if options.files and not options.no_rerun:
        raise UsageError("manifest files can only be given with --no-rerun.")
    if options.no_rerun and options.update_baseline:
        raise UsageError("--update-baseline needs a training run; drop --no-rerun.")
    project = load_project(cwd)
    mode = "no-rerun" if options.no_rerun else (
        "update-baseline" if options.update_baseline else "full")
    report = GateReport(project=project.rel(project.dir), mode=mode, policy=project.policy,
                        baseline=project.rel(project.baseline_path))
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
    from manifest.run import capture_from_cli

    command = _smoke_command(project)
    report.command = command
    manifest, _ = capture_from_cli(
        project.dir, command=command, seed=None, data=None, outputs=None, threads=None,
        deterministic=True, store_dir=None, no_cache=False, quiet=options.quiet)
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

    determinism, data_changes = _check_determinism(project, manifest, dumps(manifest))
    if determinism is not None:
        report.checks.append(determinism)
    deterministic = determinism is None or determinism.status is Status.PASS
    if options.update_baseline:
        report.checks.append(_update_baseline(project, manifest, deterministic, report))
    elif _enabled(project, "baseline"):
        report.checks.append(check_baseline(project, manifest))
    if _enabled(project, "hygiene"):
        report.checks.append(hygiene_of_run(project, manifest, data_changes=data_changes))


def _check_determinism(project: Project, manifest: Manifest,
                       data: bytes) -> tuple[CheckResult | None, list[str]]:
    """Verify the fresh capture once; (result or None when disabled, data changes)."""
    if not _enabled(project, "determinism"):
        return None, []
    from manifest.verify import VerifyOptions, verify_run

    try:
        # The gate captured this manifest itself a moment ago: its code is ours.
        verdict = verify_run(data, file="<gate run>", cwd=project.dir,
                             options=VerifyOptions(trust=True, quiet=True))
    except ManifestError as exc:
        return CheckResult("determinism", Status.NO_VERDICT,
                           f"the re-run could not be done: {exc.diagnostics()}"), []
    data_changes = [f"{d.detail}" + (f" ({', '.join(d.files[:5])})" if d.files else "")
                    for d in verdict.data]
    argv = " ".join(manifest.command.argv) if manifest.command else "the command"
    if verdict.verdict == "identical":
        assert manifest.outputs is not None
        tensors = sum(len(a.tensors or {}) for a in manifest.outputs.artifacts)
        return CheckResult(
            "determinism", Status.PASS,
            f"two runs of `{argv}` gave bit-identical outputs "
            f"({len(verdict.artifacts)} artifact(s), {tensors} tensor(s) compared)"), data_changes
    if verdict.verdict == "differs":
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
                       f"no verdict: {verdict.reason or 'the re-run did not finish'}"), data_changes


# --------------------------------------------------------------- baseline


def _update_baseline(project: Project, manifest: Manifest, deterministic: bool,
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
    from manifest.canonical import load_manifest
    from manifest.errors import InvalidManifestError

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the baseline {path}: {exc.strerror or exc}.") from exc
    try:
        return load_manifest(data)
    except InvalidManifestError as exc:
        raise type(exc)(f"the baseline {path} is not a valid manifest: {exc.message}",
                        hint=f"Restore it from git, or {UPDATE_HINT}.") from exc


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
    from manifest.diff import diff_manifests

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
    from manifest.diff import diff_manifests

    return [f"{d.section}: {d.reason}" for d in diff_manifests(baseline, current).bits
            if d.section in ("env", "hardware")]


def check_baseline(project: Project, current: Manifest) -> CheckResult:
    """Compare a fresh run with the committed baseline (see the module docstring)."""
    where = project.rel(project.baseline_path)
    baseline = load_baseline(project.baseline_path)
    if baseline is None:
        return CheckResult("baseline", Status.FAIL, f"no baseline manifest at {where}",
                           hint=f"Run `manifest gate --update-baseline` and commit {where}.")
    if baseline.outputs is None or baseline.outputs.status != "ok":
        return CheckResult("baseline", Status.FAIL,
                           f"the baseline {where} records no successful run", hint=UPDATE_HINT)
    drift = env_drift(baseline, current)
    if drift and not project.policy.same_env:
        return CheckResult(
            "baseline", Status.SKIP,
            f"the baseline was recorded on another environment ({len(drift)} difference(s) "
            "that can change bits); weights not compared",
            tuple(drift[:20]),
            hint="Record the baseline on this runner type, or set same_env = true to "
                 "compare anyway.")
    changed = weight_changes(baseline, current)
    if not changed:
        return CheckResult("baseline", Status.PASS,
                           f"weights identical to the baseline {where}")
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


def _hygiene_result(found: list[str], manifest: Manifest) -> CheckResult:
    if found:
        return CheckResult("hygiene", Status.FAIL, f"{len(found)} problem(s): {found[0]}",
                           tuple(found),
                           hint="Fix these so that a manifest records everything that "
                                "decides the weights.")
    notes = []
    if manifest.code.dirty:
        notes.append("uncommitted changes recorded as a patch")
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
    from manifest.canonical import load_manifest
    from manifest.verify import VerifyOptions, verify_run

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
    drift: list[str] = []
    hygiene: list[str] = []
    manifests: list[Manifest] = []
    for path in paths:
        shown = project.rel(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {shown}: {exc.strerror or exc}.") from exc
        verdict = verify_run(data, file=shown, cwd=project.dir,
                             options=VerifyOptions(no_rerun=True, quiet=options.quiet))
        for change in verdict.data:
            files = f" ({', '.join(change.files[:5])})" if change.files else ""
            problems.append(f"{shown}: {change.detail}{files}")
        drift.extend(f"{shown}: drift: {d.path}: {d.reason}" for d in verdict.bits_drift)
        manifest = load_manifest(data)
        manifests.append(manifest)
        hygiene.extend(f"{shown}: {p}" for p in hygiene_findings(project, manifest)
                       if not p.startswith("thread count"))
    if problems:
        report.checks.append(CheckResult(
            "manifests", Status.FAIL,
            f"{len(problems)} recorded dataset(s) changed since capture", tuple(problems),
            hint=f"If the data change is intended, {UPDATE_HINT}."))
    else:
        report.checks.append(CheckResult(
            "manifests", Status.PASS,
            f"{len(paths)} manifest(s) intact, recorded data unchanged", tuple(drift[:20])))
    if _enabled(project, "hygiene"):
        if not _threads_pinned(project):
            hygiene.append("thread count not pinned ([tool.manifest] threads): it follows the "
                           "runner's CPU count")
        report.checks.append(_hygiene_result(hygiene, manifests[0]))
