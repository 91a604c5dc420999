"""``manifest verify run.json``: re-run a recorded training and compare the bits.

Steps, in order; each one can end the verification with a result:

1. Integrity: schema and ``digest`` (``load_manifest``); tampered → exit 2.
2. Drift: today's env and hardware against the recorded ones, labelled by
   the diff impact table (``manifest.diff.engine``); ``--strict`` refuses on any
   ``bits`` drift (no verdict).
3. Data: each recorded dataset is re-digested; a changed one is reported by
   file, from the listing blob stored at capture.
4. Trust (``manifest.verify.trust``): the command runs only if this tool
   sealed the manifest here, a trusted identity signed it, or ``--trust``
   after the plan (argv, cwd, variables, datasets) was shown escaped; every
   path the manifest names is validated as data first
   (``manifest.verify.paths``). A refusal comes before "re-running".
5. Isolation: the recorded commit is materialised in a scratch clone
   (``git clone --shared --no-checkout`` + checkout: the user's repository,
   working tree, index, stash and branches are not written), the stored
   patch blob (from the local store only) is applied with ``git apply
   --binary``; datasets that live outside git are linked in. ``--in-place``
   runs in the current tree.
6. Re-run under the launcher with the recorded seed, derivation, thread count,
   determinism switch and numerics environment variables, confined by
   bubblewrap where available (``manifest.verify.sandbox``).
7. Compare outputs tensor by tensor (``manifest.weights.compare``) and the step
   trails, if any: verdict ``identical``, ``differs`` or ``no-verdict``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.canonical import load_manifest, seal, to_document
from manifest.errors import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, UntrustedManifestError
from manifest.gitrun import GitFailedError, GitMissingError, run_git
from manifest.models import Manifest
from manifest.store import STORE_DIRNAME, BlobStore, OverlayStore
from manifest.verify.trust import RunPlan, check_trust
from manifest.weights.compare import ArtifactDelta, compare_artifacts

if TYPE_CHECKING:
    from manifest.probes.hardware import NvmlFacts
    from manifest.verify.sandbox import SandboxSpec

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
    first_divergent_op: Any = None
    """Where the re-run's op stream parts from the one stored at capture (a
    ``manifest.explain.findings.Finding``), when the capture stored one."""
    trail_compared: bool = False
    rerun_exit_code: int | None = None
    workdir: str | None = None
    trust: str | None = None
    """Why the command was allowed to run: ``sealed here``, ``signed by …``, ``--trust``."""
    confinement: str | None = None
    """How the re-run was confined, or ``not confined (why)``."""
    notes: list[str] = field(default_factory=list)
    """What the user should know about how the re-run was set up."""
    code_check: str | None = None
    """``--in-place``: ``the recorded code`` or ``not checked: …`` (no git)."""

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
            **({"first_divergent_op": dict(self.first_divergent_op.__dict__)}
               if self.first_divergent_op is not None else {}),
            "rerun_exit_code": self.rerun_exit_code,
            "trust": self.trust,
            "code_check": self.code_check,
            "confinement": self.confinement,
            "notes": self.notes,
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
    signer: str | None = None
    """Identity of a signature over the manifest that the user's policy trusts (see trust.py)."""
    network: bool = False
    sandbox: bool = True
    """Confine the re-run when bubblewrap works here (``--no-sandbox`` turns it off)."""
    require_sandbox: bool = False


# ------------------------------------------------------------------- drift


def environment_drift(recorded: Manifest, machine: Machine) -> list[Drift]:
    """Differences between the recorded env/hardware and today's (``machine``), with impact."""
    from manifest.diff.engine import diff_manifests

    doc = to_document(recorded)
    doc["env"], doc["hardware"], _ = machine
    if recorded.env.imported is not None:  # what the run imported is not a fact of today
        doc["env"] = dict(doc["env"], imported=recorded.env.imported)
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
            # A fixed NAME: a discovered input is named by its path, which has slashes.
            [today] = digest_datasets([f"dataset={full}"], repo_root=root, store=store,
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
    """The local blob store of the repository at ``root``.

    ``observed.store`` is informational: a manifest that named a write
    location (or a directory of the repository holding committed "blobs")
    would choose where verify reads patches and writes. The store is the
    one this repository's ``[tool.manifest] store`` names, else ``.manifest``.
    """
    del recorded
    from manifest.config import load_config
    from manifest.errors import ManifestError

    try:
        configured = load_config(root)[0].get("store")
    except ManifestError:  # a broken pyproject is reported by the verbs that read it
        configured = None
    if isinstance(configured, str) and configured:
        return BlobStore(root / configured)
    return BlobStore(root / STORE_DIRNAME)


def materialise(recorded: Manifest, root: Path, store: BlobStore, scratch: Path) -> Path:
    """A scratch tree at the recorded commit with the recorded patch applied.

    It sits as deep in ``scratch`` as recorded inputs outside the repository
    climb (``manifest.verify.inputs``), so their relative paths land inside it.
    """
    from manifest.errors import NoVerdictError
    from manifest.verify.inputs import scratch_depth, tree_base

    commit = recorded.code.commit
    if commit is None:
        raise NoVerdictError("the manifest records no commit, so there is no tree to rebuild.",
                             hint="Use --in-place to run it in the current directory.")
    tree = tree_base(scratch, scratch_depth(recorded))[1]
    tree.parent.mkdir(parents=True, exist_ok=True)
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


def dataset_binds(recorded: Manifest, root: Path, tree: Path) -> list[tuple[Path, Path]]:
    """(real dataset, where the scratch tree wants it) for each recorded dataset.

    Relative datasets that git does not carry come from the same path in the
    user's repository; absolute ones stay where they were recorded. Paths are
    validated first (``manifest.verify.paths``): nothing outside ``tree`` is
    named as a destination.
    """
    from manifest.verify.paths import dataset_link

    binds: list[tuple[Path, Path]] = []
    for ds in recorded.data:
        rel = dataset_link(root, ds.path)
        if rel is None:
            if os.path.exists(ds.path):
                binds.append((Path(os.path.realpath(ds.path)), Path(ds.path)))
            continue
        target = tree / rel
        if os.path.isdir(target) and not os.path.islink(target) and (root / rel).is_dir():
            from manifest.verify.inputs import missing_entries

            binds.extend(missing_entries(root / rel, target))  # git carries part of it
            continue
        if os.path.lexists(target) or not (root / rel).exists():
            continue  # git carries it (or there is nothing to link)
        binds.append((Path(os.path.realpath(root / rel)), target))
    return binds


COPY_DATA_MAX = 256 << 20
"""Unconfined, a dataset up to this size (as recorded) is copied into the scratch tree
rather than linked, so the re-run cannot write into the user's files through the link."""


def link_data(binds: list[tuple[Path, Path]], tree: Path, *, confined: bool,
              sizes: dict[Path, int] | None = None) -> list[str]:
    """Put each dataset in the scratch tree; return notes for the report.

    Confined: an empty mount point that the sandbox binds read-only. Unconfined:
    a copy when the dataset is small (``COPY_DATA_MAX``), else a symlink, named
    in a note (the re-run could write through it). Parents are created one
    component at a time, never through a link that leaves the tree.
    """
    from manifest.verify.paths import make_parents

    notes: list[str] = []
    for source, target in binds:
        if not target.is_relative_to(tree):
            continue  # absolute dataset: the sandbox binds it where it was recorded
        rel = target.relative_to(tree)
        make_parents(tree, rel.parent, f"the dataset {rel}")
        if confined:
            if source.is_dir():
                target.mkdir()
            else:
                target.touch()
        elif (sizes or {}).get(target, COPY_DATA_MAX + 1) <= COPY_DATA_MAX:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=False)
            else:
                shutil.copyfile(source, target)
        else:
            target.symlink_to(source)
            notes.append(f"dataset {rel} is linked, not copied, and the re-run is not "
                         "confined: it could write into it")
    return notes


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
               announce: Any = None, show_plan: Any = None) -> VerifyReport:
    """Verify a manifest or a pack (bytes of the file); never raises for a mismatch.

    ``show_plan(plan, decision)`` is called with what would run before the
    trust decision is enforced (unless the manifest was sealed here);
    ``announce(argv)`` only once the command is allowed to run.
    """
    from manifest.travel.pack import is_pack, read_pack

    packed = read_pack(data) if is_pack(data) else None
    recorded = load_manifest(packed.manifest if packed else data)
    argv = list(recorded.command.argv) if recorded.command else []
    report = VerifyReport(file=file, run_id=recorded.run_id, command=argv)
    repo = repo_root_of(cwd)
    root = repo or cwd
    store = store_for(recorded, root)
    # A pack's blobs, each checked against its name, are read from memory and
    # never written to the store; the local store is still the only place written.
    blobs = OverlayStore(store.root, packed.blobs) if packed else store

    from manifest.capture.snapshot import probe_machine

    machine = probe_machine()  # probed once: for the drift report and the re-run's record
    report.drift = environment_drift(recorded, machine)
    from manifest.verify.paths import dataset_link

    for ds in recorded.data:  # before hashing: a crafted "/" would read the whole disk
        dataset_link(root, ds.path)
    report.data = check_data(recorded, root, blobs, no_cache=options.no_cache,
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

    if options.in_place:
        from manifest.verify.inputs import in_place_code_problem

        problem = in_place_code_problem(recorded, root, store)
        if problem is not None and not problem.startswith("cannot check"):
            report.reason = f"--in-place: {problem}"
            return report
        report.code_check = "not checked: " + problem.removeprefix(
            "cannot check the code: ") if problem else "the recorded code"

    from manifest.verify.paths import tree_relative

    for glob in recorded.command.outputs:
        tree_relative(glob, "declared output")
    tree_relative(recorded.command.cwd, "the recorded working directory")
    linked = []
    for ds in recorded.data:
        rel = dataset_link(root, ds.path)
        linked.append((ds.path, os.path.realpath(root / rel if rel is not None else ds.path)))
    sandbox_reason = _sandbox_reason(options)
    decision = check_trust(recorded, user_trusted=options.trust, signer=options.signer)
    report.trust = decision.reason if decision.allowed else None
    report.confinement = _confinement_text(sandbox_reason, options)
    plan = RunPlan(argv=argv, cwd=recorded.command.cwd,
                   variables=_plan_variables(recorded, options), datasets=linked,
                   confinement=report.confinement, network=options.network)
    if show_plan is not None and decision.basis != "sealed":
        show_plan(plan, decision)
    if not decision.allowed:
        raise UntrustedManifestError(
            f"{decision.reason}.",
            hint="Read what it would run (above) and pass --trust to run it anyway.")
    if sandbox_reason is not None and options.require_sandbox:
        from manifest.errors import NoVerdictError

        raise NoVerdictError(f"--require-sandbox: the re-run cannot be confined: "
                             f"{sandbox_reason}.",
                             hint="Install bubblewrap (apt-get install bubblewrap).")
    run_argv = _argv_to_run(argv)

    from manifest.verify.scratch import scratch_dir

    with scratch_dir(keep=options.keep) as scratch:
        binds: list[tuple[Path, Path]] = []
        if options.in_place:
            run_root = root
            binds = [(Path(os.path.realpath(ds.path)), Path(ds.path)) for ds in recorded.data
                     if os.path.isabs(ds.path) and os.path.exists(ds.path)]
        else:
            run_root = materialise(recorded, root, blobs, scratch)
            binds = dataset_binds(recorded, root, run_root)
            sizes = {run_root / ds.path: ds.bytes for ds in recorded.data
                     if not os.path.isabs(ds.path)}
            report.notes.extend(link_data(binds, run_root, confined=sandbox_reason is None,
                                          sizes=sizes))
            if sandbox_reason is not None:
                # Confined, the clone is mounted at the repository's path and
                # relative paths resolve as at capture; here they land in scratch.
                from manifest.verify.inputs import link_outside, outside_links, tree_base

                link_outside(outside_links(recorded, run_root), tree_base(scratch, 0)[0])
        from manifest.verify.paths import check_cwd, check_outputs

        run_cwd = check_cwd(run_root, recorded.command.cwd)
        check_outputs(run_root, run_cwd, list(recorded.command.outputs))
        report.workdir = str(run_cwd)
        if announce is not None:  # every check passed: only now does anything run
            announce(argv)
        spec = None
        if sandbox_reason is None:
            from manifest.verify.sandbox import SandboxSpec

            ro = [(src, root / dst.relative_to(run_root)) if dst.is_relative_to(run_root)
                  else (src, dst) for src, dst in binds]
            spec = SandboxSpec(scratch=run_root, mount_at=root, ro_binds=ro,
                               network=options.network)
        return _rerun_and_compare(recorded, report, run_cwd, root, scratch, options, machine,
                                  run_argv, spec, run_root, blobs)


def _sandbox_reason(options: VerifyOptions) -> str | None:
    """None when the re-run will be confined, else why not."""
    if not options.sandbox:
        return "--no-sandbox"
    from manifest.verify.sandbox import unavailable_reason

    return unavailable_reason()


def _confinement_text(reason: str | None, options: VerifyOptions) -> str:
    if reason is not None:
        return f"not confined ({reason})"
    return "bubblewrap: system read-only, only the scratch tree writable, private /tmp, " + (
        "network allowed (--network)" if options.network else "no network")


def _plan_variables(recorded: Manifest, options: VerifyOptions) -> dict[str, str]:
    """The variables the re-run sets: recorded numerics variables and the launcher's."""
    threads = options.threads or recorded.determinism.num_threads or 1
    variables = dict(recorded.env.variables)
    if recorded.command is not None and recorded.command.code_env:
        variables.update(recorded.command.code_env)
    variables.update({
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "MANIFEST_LAUNCH": (f"seed={recorded.randomness.seed or 0} "
                            f"derivation={recorded.randomness.derivation or 'same'} "
                            f"deterministic={recorded.determinism.requested}"),
    })
    return variables


def _recorded_ops_window(recorded: Manifest) -> dict[str, Any] | None:
    """Record the same steps' op stream as the capture stored (``--fingerprint-ops``)."""
    refs = [p.ops for p in recorded.outputs.processes if p.ops is not None] if (
        recorded.outputs is not None) else []
    if not refs:
        return None
    return {"from": min(r.steps[0] for r in refs), "to": max(r.steps[-1] for r in refs)}


def _first_op_difference(recorded: Manifest, result: Any, store: BlobStore) -> Any:
    """The first op where the re-run computes differently from the stored stream."""
    from manifest.capture.run import stream_ranks
    from manifest.explain.findings import first_op_difference
    from manifest.explain.stream import parse_stream

    assert recorded.outputs is not None
    old = {}
    for process in recorded.outputs.processes:
        blob = store.get(process.ops.digest) if process.ops is not None else None
        if blob is not None:
            old[process.rank] = parse_stream(blob, what="the recorded op stream")
    new = {rank: parse_stream(result.op_streams[name])
           for name, rank in stream_ranks(result).items()}
    return first_op_difference(old, new)


def _rerun_and_compare(recorded: Manifest, report: VerifyReport, run_cwd: Path, root: Path,
                       scratch: Path, options: VerifyOptions,
                       machine: Machine, run_argv: list[str],
                       spec: SandboxSpec | None = None,
                       run_root: Path | None = None,
                       blobs: BlobStore | None = None) -> VerifyReport:
    from manifest.capture.run import LaunchSettings, build_run_manifest, run_under_launcher
    from manifest.capture.snapshot import take_snapshot

    assert recorded.command is not None
    assert recorded.outputs is not None
    run_root = run_root or root
    settings = LaunchSettings(
        seed=recorded.randomness.seed or 0,
        derivation=recorded.randomness.derivation or "same",
        threads=options.threads or recorded.determinism.num_threads or 1,
        deterministic=recorded.determinism.requested,
        ops=_recorded_ops_window(recorded),
        root=str(spec.mount_at if spec is not None else run_root),
        hashseed=recorded.determinism.pythonhashseed,
    )
    from manifest.verify.inputs import code_env, missing_inputs_hint

    base_env = numerics_env(recorded)
    replay, absent = code_env(recorded, spec.mount_at if spec is not None else run_root)
    if replay is not None:
        from manifest.capture.observed import CODE_ENV_VARS

        base_env = {k: v for k, v in base_env.items() if k not in CODE_ENV_VARS}
        base_env.update(replay)
    report.drift.extend(Drift("command.code_env", "bits",
                              f"{entry} (on a code path variable at capture) does not exist "
                              "here: other code may be imported") for entry in absent)
    snap = take_snapshot(run_cwd, store_dir=str(scratch / "store"), machine=machine)
    if not options.in_place and snap.code.code.diff_digest != recorded.code.diff_digest:
        report.drift.append(Drift(
            "code.diff_digest", "bits",
            "the scratch tree does not reproduce the recorded uncommitted changes exactly"))
    wrap = None
    if spec is not None:
        from manifest.verify.sandbox import SandboxSpec
        from manifest.verify.sandbox import wrap as sandbox_wrap

        cwd_inside = spec.mount_at / run_cwd.relative_to(spec.scratch)
        sandbox = spec

        def wrap(argv: list[str], records: Path) -> list[str]:
            confined = SandboxSpec(sandbox.scratch, sandbox.mount_at, sandbox.ro_binds,
                                   [*sandbox.rw_paths, records], sandbox.network)
            return sandbox_wrap(confined, argv, cwd_inside)
    result = run_under_launcher(run_argv, run_cwd, settings, base_env=base_env, wrap=wrap)
    report.rerun_exit_code = result.exit_code
    new = build_run_manifest(snap, cwd=run_cwd, argv=run_argv,
                             settings=settings, result=result, datasets=[],
                             output_globs=list(recorded.command.outputs), malformed_ok=True)
    assert new.outputs is not None
    if result.exit_code != 0:
        report.reason = f"the re-run failed: {new.outputs.error}"
        if not options.in_place:
            hint = missing_inputs_hint(result.opened, run_root,
                                       spec.mount_at if spec is not None else run_root, root)
            if hint:
                report.reason += f"; {hint}"
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
    if result.op_streams:
        # ``blobs``: the local store, overlaid with a pack's op streams when verifying one.
        report.first_divergent_op = _first_op_difference(
            recorded, result, blobs if blobs is not None else store_for(recorded, root))
    identical = all(a.identical for a in report.artifacts)
    report.verdict = "identical" if identical else "differs"
    if identical and report.first_divergent_step is not None:
        report.verdict = "differs"
        report.reason = "outputs match but the step trails part"
    return report
