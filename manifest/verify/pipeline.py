"""``manifest verify run.json``: re-run a recorded training and compare the bits.

Steps, in order; each one can end the verification with a result (a
``manifest.verify.report.VerifyReport``):

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
5. Isolation (``manifest.verify.tree``): the recorded commit is materialised
   in a scratch clone (``git clone --shared --no-checkout`` + checkout: the
   user's repository, working tree, index, stash and branches are not
   written), the stored patch blob (from the local store only) is applied
   with ``git apply --binary``; datasets that live outside git are linked in.
   ``--in-place`` runs in the current tree.
6. Re-run (``manifest.verify.rerun``) under the launcher with the recorded
   seed, derivation, thread count, determinism switch and numerics
   environment variables, confined by bubblewrap where available
   (``manifest.verify.sandbox``).
7. Compare outputs tensor by tensor (``manifest.weights.compare``) and the step
   trails, if any: verdict ``identical``, ``differs`` or ``no-verdict``.

This module holds steps 1–4 and the order of them all; the stages that
write (5) and run (6, 7) live in their own modules, so what decides whether a
command may run reads apart from what runs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from manifest.canonical import load_manifest, seal, to_document
from manifest.errors import UntrustedManifestError
from manifest.models import Manifest
from manifest.store import BlobStore, OverlayStore
from manifest.verify.report import DataChange, Drift, Machine, VerifyOptions, VerifyReport
from manifest.verify.rerun import argv_to_run, rerun_and_compare
from manifest.verify.tree import dataset_binds, link_data, materialise, repo_root_of, store_for
from manifest.verify.trust import RunPlan, check_trust

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
        if ds.remote is not None:  # a bucket or the Hub: re-listed, no body read
            from manifest.data.remote import recheck

            objects = recheck(ds, store)
            if objects:
                changes.append(DataChange(ds.name, ds.path, f"remote dataset {ds.name} "
                                          f"({ds.path}) no longer matches its pins", objects))
            continue
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
    run_argv = argv_to_run(argv)

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
        return rerun_and_compare(recorded, report, run_cwd, root, scratch, options, machine,
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
