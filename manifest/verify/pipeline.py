"""``manifest verify run.json``: re-run a recorded training and compare the bits.

Steps, in order; each one can end the verification with a result (a
``manifest.verify.report.VerifyReport``):

1. Integrity: schema and ``digest`` (``load_manifest``); tampered → exit 2.
2. Drift: today's env and hardware against the recorded ones, labelled by
   the diff impact table (``manifest.diff.engine``); ``--strict`` refuses on any
   ``bits`` drift (no verdict).
3. Data: each recorded dataset is re-digested; a changed one is reported by
   file, from the listing blob stored at capture.
4. The plan (``manifest.rerun``, the one re-run engine every verb uses):
   every path the manifest names is validated, the trust decision is made
   (sealed here, a trusted signer, or ``--trust`` after the plan was shown
   escaped) and confinement is chosen. A dataset outside the repository is
   read only with that same trust. A refusal comes before "re-running".
5. Workspace (``manifest.rerun.workspace``): the recorded commit in a scratch
   clone with the stored patch applied, inputs where the command looks;
   ``--in-place`` runs in the current tree.
6. Re-run (``manifest.verify.rerun`` through ``manifest.rerun.executor``)
   under the launcher with the recorded seed, derivation, thread count,
   determinism switch and numerics environment variables, confined by
   bubblewrap where available.
7. Compare outputs tensor by tensor (``manifest.weights.compare``) and the step
   trails, if any: verdict ``identical``, ``differs``, ``nothing-compared`` or
   ``no-verdict`` (``manifest.verify.report.Verdict``).
8. One rule after every mode (``judge_data``): recorded data found changed makes the
   verdict ``differs``, whatever the outputs said, so ``--no-rerun``, ``--strict``
   and a full re-run agree. Data that could not be checked (another endpoint, no
   access) is named as not checked; it changes no verdict.

This module holds steps 1–3 and the order of them all; what decides whether
and how a command runs (4–6) lives in ``manifest.rerun``, and the comparison
(7) in ``manifest.verify.rerun``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from manifest.canonical import load_manifest
from manifest.errors import UntrustedManifestError
from manifest.judge import ReasonCode, current, record, rules
from manifest.models import Manifest
from manifest.rerun.environment import argv_to_run
from manifest.rerun.plan import plan_from_manifest, plan_inputs
from manifest.rerun.workspace import repo_root_of, store_for
from manifest.store import BlobStore, OverlayStore
from manifest.trust import check_trust, escape_text
from manifest.verify.drift import environment_drift
from manifest.verify.report import (
    DataChange,
    Drift,
    VerifyOptions,
    VerifyReport,
)
from manifest.verify.rerun import rerun_and_compare

# ------------------------------------------------------------------- drift


def threads_drift(recorded: Manifest, threads: int | None) -> list[Drift]:
    """``--threads N`` against the recorded count (verify, explain): a ``bits`` drift."""
    if threads is None or threads == recorded.determinism.num_threads:
        return []
    return [Drift("determinism.num_threads", "bits",
                  f"threads {recorded.determinism.num_threads} → {threads} (--threads): "
                  "CPU reduction order changes")]


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
            from manifest.data.remote import recheck_pins

            found = recheck_pins(ds, store)
            if found.unchecked is not None:
                changes.append(DataChange(ds.name, ds.path, f"remote dataset {ds.name} "
                                          f"({ds.path}) not checked: {found.unchecked}", [],
                                          checked=False))
            elif found.changed:
                changes.append(DataChange(ds.name, ds.path, f"remote dataset {ds.name} "
                                          f"({ds.path}) no longer matches its pins",
                                          found.changed))
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


def judge_data(report: VerifyReport) -> VerifyReport:
    """Step 8: recorded data that changed is never ``identical``, in any mode.

    Outputs can match while data changed (the script read only part of a
    dataset, or a changed object never reached the weights), so a match proves
    nothing about the changed files: the verdict is ``differs`` with them named.
    """
    unchecked = [d for d in report.data if not d.checked]
    if unchecked:
        report.notes.append(f"{len(unchecked)} recorded dataset(s) not checked (named under "
                            "data): the verdict says nothing about them")
    record(report, rules.data(current(report),
                              [f"{d.name} ({d.path})" for d in report.changed_data]))
    return report


def verify_run(data: bytes, *, file: str, cwd: Path, options: VerifyOptions,
               announce: Any = None, show_plan: Any = None, note: Any = None) -> VerifyReport:
    """Verify a manifest or a pack (bytes of the file); never raises for a mismatch.

    ``show_plan(plan, drift)`` is called with what would run (a
    ``manifest.rerun.plan.RerunPlan``) and the environment drift before the trust
    decision is enforced
    (unless the manifest was sealed here); ``announce(argv)`` only once the
    command is allowed to run; ``note(sentence)`` with progress the user should see before
    any training (the rebuilt environment's proof, ``--env run``).
    """
    return judge_data(_verify(data, file=file, cwd=cwd, options=options, announce=announce,
                              show_plan=show_plan, note=note))


def _verify(data: bytes, *, file: str, cwd: Path, options: VerifyOptions,
            announce: Any, show_plan: Any, note: Any = None) -> VerifyReport:
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
    from manifest.rerun.environment import environment_for

    # The trust decision, asked once on this path (a signature is checked at most once) and
    # only where something needs it: the rebuild, a dataset outside the tree, the plan.
    decide = cache(lambda: check_trust(recorded, user_trusted=options.trust,
                                       signer=options.signer))
    # --env run: the re-run and the drift are the rebuilt environment's
    used, machine = environment_for(
        recorded, machine, options.rebuild, tree=root, note=note, trust=decide,
        cluster=options.cluster)  # with --on, each node rebuilds it (the job says which)
    report.environment = used.to_json()
    if options.rebuild is not None and used.python is None and used.request is None:
        record(report, rules.refused(ReasonCode.ENVIRONMENT_NOT_BUILT, used.line))
        return report
    report.drift = environment_drift(recorded, machine)
    rerun_options = options.rerun_options(cluster=used.on_cluster(options.cluster))
    # Before hashing: a crafted "/" would read the whole disk, and a dataset
    # outside the repository is read only with the trust its command would need.
    inputs = plan_inputs(root, [(ds.path, ds.from_repo) for ds in recorded.data])
    if any(i.outside for i in inputs) and not decide().allowed:
        if show_plan is not None and recorded.command is not None:
            show_plan(plan_from_manifest(recorded, verb="verify", root=root,
                                         options=rerun_options, trust=decide()),
                      report.drift)
        outside = ", ".join(escape_text(i.path) for i in inputs if i.outside)
        raise UntrustedManifestError(
            f"refusing to read the datasets outside the repository that the manifest "
            f"names ({outside}): it was not sealed on this machine by manifest and "
            "carries no signature you trust.",
            hint="Read the plan (above) and pass --trust to read them anyway.")
    report.data = check_data(recorded, root, blobs, no_cache=options.no_cache,
                             quiet=options.quiet)
    report.drift.extend(threads_drift(recorded, options.threads))

    if options.no_rerun:
        # judge_data makes changed data ``differs``
        record(report, rules.checked(strict_drift=options.strict and bool(report.bits_drift)))
        return report
    if options.strict and (report.bits_drift or report.changed_data):
        record(report, rules.refused(ReasonCode.STRICT_DRIFT, "environment or data drift "
                                     "under --strict; refusing to re-run"))
        return report
    if recorded.command is None or recorded.outputs is None:
        record(report, rules.refused(ReasonCode.NO_COMMAND,
                                     "the manifest records no command to re-run"))
        return report
    if recorded.outputs.status != "ok":
        record(report, rules.refused(ReasonCode.RECORDED_RUN_FAILED, "the recorded run "
                                     f"itself failed ({recorded.outputs.error})"))
        return report

    if options.in_place:
        from manifest.rerun.inputs import in_place_code_problem

        problem = in_place_code_problem(recorded, root, store)
        if problem is not None and not problem.startswith("cannot check"):
            record(report, rules.refused(ReasonCode.IN_PLACE_CODE, f"--in-place: {problem}"))
            return report
        report.code_check = "not checked: " + problem.removeprefix(
            "cannot check the code: ") if problem else "the recorded code"

    plan = plan_from_manifest(recorded, verb="verify", root=root, options=rerun_options,
                              trust=decide(),
                              runs=("once, outputs compared tensor by tensor",),
                              unconfined_because=options.unconfined_because)
    report.plan = plan.to_json()
    report.trust = plan.trust.reason if plan.trust.allowed else None
    report.confinement = plan.confinement
    if show_plan is not None and plan.trust.basis != "sealed":
        show_plan(plan, report.drift)  # the drift too: it weighs in the decision to run
    plan.require()
    argv_to_run(plan.argv)  # a missing MANIFEST_SECRET_N is refused before any work

    from manifest.rerun.workspace import open_workspace

    with open_workspace(plan, root, recorded=None if options.in_place else recorded,
                        store=blobs, keep=options.keep) as workspace:
        report.notes.extend(workspace.notes)
        if options.keep:
            report.notes.append(f"the scratch tree is kept (--keep): {workspace.scratch}")
        report.workdir = str(workspace.cwd)
        if announce is not None:  # every check passed: only now does anything run
            for shown in [list(n.argv) for n in plan.nodes] or [argv]:  # each node's launch
                announce(shown)
        return rerun_and_compare(recorded, report, plan, workspace, options, machine, blobs,
                                 packed.outputs if packed else None,
                                 used if options.rebuild is not None else None)
