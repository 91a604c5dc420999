"""Steps 6 and 7 of ``manifest.verify.pipeline``: re-run the recorded command, compare.

Everything before this stage only reads (the manifest, today's machine, the
data, the trust decision, the scratch tree); this is the one stage that runs
someone else's command, so it is held apart from the checks that decide
whether it may run:

* The launcher (``manifest.capture.launcher``) prepares every Python process
  with the recorded seed, seed derivation, thread count, determinism switch
  and ``PYTHONHASHSEED``; the recorded numerics variables (``numerics_env``)
  and code variables (``PYTHONPATH`` …, ``manifest.verify.inputs``) are put
  back; withheld argv values come from ``MANIFEST_SECRET_N`` (``argv_to_run``),
  never from the manifest. Confined, the command line is wrapped by
  bubblewrap (``manifest.verify.sandbox``).
* The re-run is recorded like a capture (``build_run_manifest``), then
  compared with the recorded one: every declared output tensor by tensor
  (``manifest.weights.compare``), the step trails by first divergent step,
  and, when the capture stored an op stream (``--fingerprint-ops``), the
  first op that computes differently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Manifest
from manifest.store import BlobStore
from manifest.verify.report import Drift, Machine, VerifyOptions, VerifyReport
from manifest.verify.tree import store_for
from manifest.weights.compare import compare_artifacts

if TYPE_CHECKING:
    from manifest.verify.sandbox import SandboxSpec


def argv_to_run(argv: list[str]) -> list[str]:
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


def _recorded_ops_window(recorded: Manifest) -> dict[str, Any] | None:
    """Record the same steps' op stream as the capture stored (``--fingerprint-ops``)."""
    refs = [p.ops for p in recorded.outputs.processes if p.ops is not None] if (
        recorded.outputs is not None) else []
    if not refs:
        return None
    return {"from": min(r.steps[0] for r in refs), "to": max(r.steps[-1] for r in refs)}


def _first_op_difference(recorded: Manifest, result: Any, store: BlobStore) -> Any:
    """The first op where the re-run computes differently from the stored stream."""
    from manifest.capture.launcher import stream_ranks
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


def rerun_and_compare(recorded: Manifest, report: VerifyReport, run_cwd: Path, root: Path,
                      scratch: Path, options: VerifyOptions,
                      machine: Machine, run_argv: list[str],
                      spec: SandboxSpec | None = None,
                      run_root: Path | None = None,
                      blobs: BlobStore | None = None) -> VerifyReport:
    from manifest.capture.launcher import LaunchSettings, run_under_launcher
    from manifest.capture.run import build_run_manifest
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

