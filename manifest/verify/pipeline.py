"""``manifest verify run.json``: re-run a recorded training and compare the bits.

Steps, in order; each one can end the verification with a result:

1. Integrity: schema and ``digest`` (``load_manifest``); tampered → exit 2.
2. Drift: today's env and hardware against the recorded ones, labelled by
   the diff impact table (``manifest.diff.engine``); ``--strict`` refuses on any
   ``bits`` drift (no verdict).
3. Data: each recorded dataset is re-digested; a changed one is reported by
   file, from the listing blob stored at capture.
4. Isolation: the recorded commit is materialised in a scratch clone
   (``git clone --shared --no-checkout`` + checkout: the user's repository,
   working tree, index, stash and branches are not written), the stored
   patch blob is applied with ``git apply --binary``; datasets that live
   outside git are linked in. ``--in-place`` runs in the current tree.
5. Trust: the command is shown; a manifest whose commit is not reachable
   from a local ref, or whose patch is not in the local store, is refused
   unless ``--trust``.
6. Re-run under the launcher with the recorded seed, derivation, thread count,
   determinism switch and numerics environment variables.
7. Compare outputs tensor by tensor (``manifest.weights.compare``) and the step
   trails, if any: verdict ``identical``, ``differs`` or ``no-verdict``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.canonical import load_manifest, seal, to_document
from manifest.errors import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, UntrustedManifestError
from manifest.gitrun import GitFailedError, GitMissingError, run_git
from manifest.models import Manifest
from manifest.store import STORE_DIRNAME, BlobStore
from manifest.weights.compare import ArtifactDelta, compare_artifacts

if TYPE_CHECKING:
    from manifest.probes.hardware import NvmlFacts

Machine = tuple[dict[str, Any], dict[str, Any], "NvmlFacts | None"]
"""(env section, hardware section, raw NVML facts) as ``capture.probe_machine`` returns."""


@dataclass(frozen=True)
class Drift:
    path: str
    impact: str
    reason: str


@dataclass(frozen=True)
class DataChange:
    name: str
    path: str
    detail: str
    files: list[str]


@dataclass
class VerifyReport:
    """What verify found. ``verdict`` decides the exit status."""

    file: str
    run_id: str
    command: list[str]
    verdict: str = "no-verdict"
    """``identical``, ``differs``, ``no-verdict``, or ``checked`` (--no-rerun)."""
    reason: str | None = None
    drift: list[Drift] = field(default_factory=list)
    data: list[DataChange] = field(default_factory=list)
    artifacts: list[ArtifactDelta] = field(default_factory=list)
    first_divergent_step: int | None = None
    trail_compared: bool = False
    rerun_exit_code: int | None = None
    workdir: str | None = None

    @property
    def bits_drift(self) -> list[Drift]:
        return [d for d in self.drift if d.impact == "bits"]

    @property
    def exit_code(self) -> int:
        if self.verdict in ("identical", "checked"):
            return EXIT_OK
        if self.verdict == "differs":
            return EXIT_FAILED
        return EXIT_NO_VERDICT

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "manifest-verify/v1",
            "file": self.file,
            "run_id": self.run_id,
            "command": self.command,
            "verdict": self.verdict,
            "reason": self.reason,
            "drift": [d.__dict__ for d in self.drift],
            "data": [d.__dict__ for d in self.data],
            "artifacts": [
                {"path": a.path, "identical": a.identical, "detail": a.detail,
                 "tensors": [t.__dict__ for t in a.tensors]}
                for a in self.artifacts
            ],
            "first_divergent_step": self.first_divergent_step,
            "rerun_exit_code": self.rerun_exit_code,
        }


@dataclass(frozen=True)
class VerifyOptions:
    strict: bool = False
    trust: bool = False
    in_place: bool = False
    no_rerun: bool = False
    threads: int | None = None
    keep: bool = False
    no_cache: bool = False
    quiet: bool = False


# ------------------------------------------------------------------- drift


def environment_drift(recorded: Manifest, machine: Machine) -> list[Drift]:
    """Differences between the recorded env/hardware and today's (``machine``), with impact."""
    from manifest.diff.engine import diff_manifests

    doc = to_document(recorded)
    doc["env"], doc["hardware"], _ = machine
    today = seal(doc)
    return [
        Drift(d.path, d.impact.value, d.reason)
        for d in diff_manifests(recorded, today).differences
        if d.section in ("env", "hardware")
    ]


# -------------------------------------------------------------------- data


def check_data(recorded: Manifest, root: Path, store: BlobStore, *, no_cache: bool,
               quiet: bool) -> list[DataChange]:
    if not recorded.data:
        return []
    from manifest.data.datasets import compare_listing, digest_datasets
    from manifest.errors import DataError

    changes: list[DataChange] = []
    for ds in recorded.data:
        path = Path(ds.path)
        full = path if path.is_absolute() else root / path
        try:
            [today] = digest_datasets([f"{ds.name}={full}"], repo_root=root, store=store,
                                      no_cache=no_cache, quiet=quiet)
        except DataError as exc:
            changes.append(DataChange(ds.name, ds.path, exc.message, []))
            continue
        if today.root == ds.root:
            continue
        files: list[str] = []
        listing = store.get(ds.listing) if ds.listing else None
        if listing is not None:
            try:
                files = compare_listing(listing, full, store=store, no_cache=no_cache)
            except DataError as exc:
                files = [exc.message]
        detail = (f"dataset {ds.name} changed: root {ds.root[:19]}… → {today.root[:19]}…, "
                  f"{today.files} files ({ds.files} recorded)")
        changes.append(DataChange(ds.name, ds.path, detail, files))
    return changes


# --------------------------------------------------------------- isolation


def repo_root_of(cwd: Path) -> Path | None:
    try:
        proc = run_git(["rev-parse", "--show-toplevel"], cwd, check=False)
    except GitMissingError:
        return None
    return Path(os.fsdecode(proc.stdout.strip())) if proc.returncode == 0 else None


def store_for(recorded: Manifest, root: Path) -> BlobStore:
    rel = recorded.observed.store or STORE_DIRNAME
    path = Path(rel)
    return BlobStore(path if path.is_absolute() else root / path)


def trust_problem(recorded: Manifest, root: Path, store: BlobStore) -> str | None:
    """Why this manifest's code is not known locally, or None if it is."""
    commit = recorded.code.commit
    if commit is None:
        return "the manifest records no commit, so its code cannot be checked against this repo"
    refs = run_git(["for-each-ref", "--contains", commit, "--format=%(refname)"], root,
                   check=False)
    if refs.returncode != 0 or not refs.stdout.strip():
        return f"commit {commit[:12]} is not in the history of any local branch or tag"
    if recorded.code.diff_digest and store.get(recorded.code.diff_digest) is None:
        return "its uncommitted patch is not in the local store (it came from elsewhere)"
    return None


def materialise(recorded: Manifest, root: Path, store: BlobStore, scratch: Path) -> Path:
    """A scratch tree at the recorded commit with the recorded patch applied."""
    from manifest.errors import NoVerdictError

    commit = recorded.code.commit
    if commit is None:
        raise NoVerdictError("the manifest records no commit, so there is no tree to rebuild.",
                             hint="Use --in-place to run it in the current directory.")
    tree = scratch / "tree"
    try:
        run_git(["clone", "--quiet", "--shared", "--no-checkout", str(root), str(tree)], scratch)
        run_git(["checkout", "--quiet", "--detach", commit], tree)
        if recorded.code.diff_digest:
            patch = store.get(recorded.code.diff_digest)
            if patch is None:
                raise NoVerdictError(
                    f"the recorded patch {recorded.code.diff_digest} is missing from the store "
                    f"{store.root}; cannot rebuild the recorded tree.")
            run_git(["apply", "--binary", "--whitespace=nowarn", "-"], tree, input_bytes=patch)
    except GitFailedError as exc:
        raise NoVerdictError(f"could not materialise the recorded code: {exc.message}.") from exc
    return tree


def link_data(recorded: Manifest, root: Path, tree: Path) -> None:
    """Datasets that git does not carry are linked into the scratch tree."""
    for ds in recorded.data:
        path = Path(ds.path)
        if path.is_absolute():
            continue
        target = tree / path
        if not target.exists() and (root / path).exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to((root / path).resolve())


def _argv_to_run(argv: list[str]) -> list[str]:
    """The recorded argv with withheld values filled from ``MANIFEST_SECRET_N``."""
    from manifest.errors import UsageError
    from manifest.redact import MissingSecretsError, restore_argv

    try:
        return restore_argv(argv, os.environ)
    except MissingSecretsError as exc:
        raise UsageError(f"cannot re-run: {exc}.",
                         hint="Values are never read from the manifest.") from exc


def numerics_env(recorded: Manifest) -> dict[str, str]:
    """Today's environment with the recorded numerics variables put back
    (and without the ``MANIFEST_SECRET_N`` values, which went into the argv)."""
    from manifest.probes.env import NUMERICS_VARIABLES
    from manifest.redact import SECRET_ENV_PREFIX

    env = {k: v for k, v in os.environ.items()
           if k not in NUMERICS_VARIABLES and not k.startswith(SECRET_ENV_PREFIX)}
    env.update(recorded.env.variables)
    return env


# ----------------------------------------------------------------- compare


def first_divergent_step(recorded: Manifest, new: Manifest) -> tuple[bool, int | None]:
    """(whether trails could be compared, first step whose fingerprint differs)."""
    assert recorded.outputs is not None
    assert new.outputs is not None
    old = {p.rank: {t.step: t.digest for t in p.trail} for p in recorded.outputs.processes}
    now = {p.rank: {t.step: t.digest for t in p.trail} for p in new.outputs.processes}
    compared = False
    first: int | None = None
    for rank, steps in old.items():
        other = now.get(rank, {})
        for step in sorted(set(steps) & set(other)):
            compared = True
            if steps[step] != other[step]:
                first = step if first is None else min(first, step)
                break
    return compared, first


# -------------------------------------------------------------------- main


def verify_run(data: bytes, *, file: str, cwd: Path, options: VerifyOptions,
               announce: Any = None) -> VerifyReport:
    """Verify a manifest (bytes of the file); never raises for a mismatch."""
    recorded = load_manifest(data)
    argv = list(recorded.command.argv) if recorded.command else []
    report = VerifyReport(file=file, run_id=recorded.run_id, command=argv)
    repo = repo_root_of(cwd)
    root = repo or cwd
    store = store_for(recorded, root)

    from manifest.capture.snapshot import probe_machine

    machine = probe_machine()  # probed once: for the drift report and the re-run's record
    report.drift = environment_drift(recorded, machine)
    report.data = check_data(recorded, root, store, no_cache=options.no_cache,
                             quiet=options.quiet)
    if options.threads is not None and options.threads != recorded.determinism.num_threads:
        report.drift.append(Drift(
            "determinism.num_threads", "bits",
            f"threads {recorded.determinism.num_threads} → {options.threads} (--threads): "
            "CPU reduction order changes"))

    if options.no_rerun:
        report.verdict = "checked" if not report.data else "differs"
        if report.data:
            report.reason = "recorded data changed"
        elif options.strict and report.bits_drift:
            report.verdict, report.reason = "no-verdict", "environment drift under --strict"
        return report
    if options.strict and (report.bits_drift or report.data):
        report.reason = "environment or data drift under --strict; refusing to re-run"
        return report
    if recorded.command is None or recorded.outputs is None:
        report.reason = "the manifest records no command to re-run"
        return report
    if recorded.outputs.status != "ok":
        report.reason = f"the recorded run itself failed ({recorded.outputs.error})"
        return report

    escaping = [g for g in recorded.command.outputs
                if os.path.isabs(g) or ".." in Path(g).parts]
    if escaping and not options.in_place:
        from manifest.errors import NoVerdictError

        raise NoVerdictError(
            f"declared output {escaping[0]} lies outside the repository: a re-run would "
            "overwrite the original there.",
            hint="Capture with outputs inside the tree, or use --in-place knowingly.")
    if not options.in_place:
        problem = trust_problem(recorded, root, store) if repo else (
            "not inside a git repository (use --in-place to run in this directory)")
        if problem and not options.trust:
            raise UntrustedManifestError(
                f"refusing to run the manifest's command: {problem}.",
                hint="Inspect the command and pass --trust to run it anyway.")
    run_argv = _argv_to_run(argv)
    if announce is not None:
        announce(argv)

    scratch = Path(tempfile.mkdtemp(prefix="manifest-verify-"))
    try:
        if options.in_place:
            run_root = root
        else:
            run_root = materialise(recorded, root, store, scratch)
            link_data(recorded, root, run_root)
        run_cwd = run_root / recorded.command.cwd
        report.workdir = str(run_cwd)
        return _rerun_and_compare(recorded, report, run_cwd, root, scratch, options, machine,
                                  run_argv)
    finally:
        if not options.keep:
            shutil.rmtree(scratch, ignore_errors=True)


def _rerun_and_compare(recorded: Manifest, report: VerifyReport, run_cwd: Path, root: Path,
                       scratch: Path, options: VerifyOptions,
                       machine: Machine, run_argv: list[str]) -> VerifyReport:
    from manifest.capture.run import LaunchSettings, build_run_manifest, run_under_launcher
    from manifest.capture.snapshot import take_snapshot

    assert recorded.command is not None
    assert recorded.outputs is not None
    settings = LaunchSettings(
        seed=recorded.randomness.seed or 0,
        derivation=recorded.randomness.derivation or "same",
        threads=options.threads or recorded.determinism.num_threads or 1,
        deterministic=recorded.determinism.requested,
    )
    snap = take_snapshot(run_cwd, store_dir=str(scratch / "store"), machine=machine)
    if not options.in_place and snap.code.code.diff_digest != recorded.code.diff_digest:
        report.drift.append(Drift(
            "code.diff_digest", "bits",
            "the scratch tree does not reproduce the recorded uncommitted changes exactly"))
    result = run_under_launcher(run_argv, run_cwd, settings, base_env=numerics_env(recorded))
    report.rerun_exit_code = result.exit_code
    new = build_run_manifest(snap, cwd=run_cwd, argv=run_argv,
                             settings=settings, result=result, datasets=[],
                             output_globs=list(recorded.command.outputs))
    assert new.outputs is not None
    if result.exit_code != 0:
        report.reason = f"the re-run failed: {new.outputs.error}"
        return report
    new_by_path = {a.path: a for a in new.outputs.artifacts}
    original_cwd = root / recorded.command.cwd
    for artifact in recorded.outputs.artifacts:
        again = new_by_path.get(artifact.path)
        if again is None:
            report.reason = f"the re-run did not produce {artifact.path}"
            return report
        report.artifacts.append(compare_artifacts(
            artifact, again, recorded_file=original_cwd / artifact.path,
            new_file=run_cwd / artifact.path))
    report.trail_compared, report.first_divergent_step = first_divergent_step(recorded, new)
    identical = all(a.identical for a in report.artifacts)
    report.verdict = "identical" if identical else "differs"
    if identical and report.first_divergent_step is not None:
        report.verdict = "differs"
        report.reason = "outputs match but the step trails part"
    return report
