"""Steps 6 and 7 of ``manifest.verify.pipeline``: run the plan once, compare.

The plan, the workspace and the executor come from the re-run engine
(``manifest.rerun``); this module holds what only verify does with a re-run:

* the re-run is recorded like a capture (``build_run_manifest``) on a
  snapshot of the scratch tree, then compared with the recorded one: every
  declared output tensor by tensor (``manifest.weights.compare``), the step
  trails by first divergent step, and, when the capture stored an op stream
  (``--fingerprint-ops``), the first op that computes differently;
* a failed re-run names the files it read that git does not carry;
* where the recorded outputs are on this machine (the tree, a pack, ``--outputs DIR``),
  and the environment the re-run runs in (``--env run``: the run's own, rebuilt).

Longer than 500 lines because the re-run, its comparison and ``judge_numeric`` (a
``differs`` refined by a noise envelope, with the verifier's envelope runs made around
the re-run) share one plan, tree, environment and set of recorded files (``Here``):
split apart, each half would hand all of them back to the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.judge import (
    Findings,
    NumericVerdict,
    ReasonCode,
    current,
    judge,
    nothing_compared_reason,
    record,
    rules,
)
from manifest.judge.rules import worst_numeric
from manifest.models import Envelope, Manifest
from manifest.store import BlobStore
from manifest.verify.report import Drift, Machine, Verdict, VerifyOptions, VerifyReport
from manifest.weights.compare import compare_artifacts

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchResult, LaunchSettings
    from manifest.numeric.measure import Measured
    from manifest.rerun.environment import RunEnvironment
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace
    from manifest.verify.equivalence import RecordedFile


def _recorded_ops_window(recorded: Manifest) -> dict[str, Any] | None:
    """Record the same steps' op stream as the capture stored (``--fingerprint-ops``)."""
    refs = [p.ops for p in recorded.outputs.processes if p.ops is not None] if (
        recorded.outputs is not None) else []
    if not refs:
        return None
    return {"from": min(r.steps[0] for r in refs), "to": max(r.steps[-1] for r in refs)}


def _first_op_difference(recorded: Manifest, result: Any, store: BlobStore) -> Any:
    """The first op where the re-run computes differently from the stored stream."""
    from manifest.launch.runner import stream_ranks
    from manifest.ops.findings import first_op_difference
    from manifest.ops.stream import parse_stream

    assert recorded.outputs is not None
    old = {}
    for process in recorded.outputs.processes:
        blob = store.get(process.ops.digest) if process.ops is not None else None
        if blob is not None:
            old[process.rank] = parse_stream(blob, what="the recorded op stream")
    new = {rank: parse_stream(result.op_streams[name])
           for name, rank in stream_ranks(result).items()}
    return first_op_difference(old, new)


def rerun_and_compare(recorded: Manifest, report: VerifyReport, plan: RerunPlan,
                      workspace: Workspace, options: VerifyOptions, machine: Machine,
                      blobs: BlobStore, received: Mapping[str, bytes] | None = None,
                      run_env: RunEnvironment | None = None) -> VerifyReport:
    """Run the plan once in ``workspace`` and compare what it wrote with the record.
    ``received``: the output files a pack carried, by recorded digest; ``run_env``: the
    rebuilt environment to run in (``--env run``; None: this machine's)."""
    from manifest.capture.run import build_run_manifest
    from manifest.capture.snapshot import take_snapshot
    from manifest.rerun.dispatch import executor_for
    from manifest.rerun.environment import rerun_env
    from manifest.rerun.executor import confined_hint
    from manifest.rerun.inputs import missing_inputs_hint

    assert recorded.command is not None
    assert recorded.outputs is not None
    settings = replace(plan.settings, ops=_recorded_ops_window(recorded),
                       root=str(workspace.mount_at), emulate=options.emulate)
    base_env, absent = rerun_env(recorded, workspace.mount_at)
    if run_env is not None and run_env.venv is not None:
        from manifest.rerun.environment import in_environment

        base_env, workspace = in_environment(run_env, base_env, workspace)
        if plan.argv and Path(plan.argv[0]).is_absolute():
            report.notes.append(f"the command names its interpreter by path ({plan.argv[0]}): "
                                "it runs that one, not the rebuilt environment's")
    report.drift.extend(Drift("command.code_env", "bits",
                              f"{entry} (on a code path variable at capture) does not exist "
                              "here: other code may be imported") for entry in absent)
    snap = take_snapshot(workspace.cwd, store_dir=str(workspace.scratch / "store"),
                         machine=machine)
    if not options.in_place and snap.code.code.diff_digest != recorded.code.diff_digest:
        report.drift.append(Drift(
            "code.diff_digest", "bits",
            "the scratch tree does not reproduce the recorded uncommitted changes exactly"))
    early = _interleaved(recorded, plan, workspace, settings, base_env, options) if (
        options.envelope) else None  # verify --envelope N: the re-run among its runs
    result = early.real if early is not None and early.real is not None else (
        executor_for(plan).run(plan, workspace, settings, base_env))
    if result.job is not None and result.job.get("printed"):  # k8s --dry-run: nothing ran
        report.job = result.job
        return report
    report.rerun_exit_code = result.exit_code
    report.job = result.job
    if result.job is not None:  # what the host that ran it applied, not the plan's guess
        from manifest.rerun.cluster.remote_run import confinement_line

        report.confinement = confinement_line(plan, result.job)
        if result.job.get("environment"):  # --env run: what each node's re-run used
            report.environment = result.job["environment"]
        if result.job.get("probes"):  # the drift is the environment the nodes' re-run used
            from manifest.verify.drift import drift_on_nodes

            drift_on_nodes(recorded, report, machine, result.job.pop("probes"))
    new = build_run_manifest(snap, cwd=workspace.cwd, argv=list(plan.argv),
                             settings=settings, result=result, datasets=[],
                             output_globs=[g if options.in_place else _any_version(g)
                                           for g in recorded.command.outputs],
                             malformed_ok=True)
    assert new.outputs is not None
    from manifest.capture.environ import read_changes, reads_not_compared

    # A variable the script read with another value now: a cause, named as such.
    report.drift.extend(Drift(path, "bits", text) for path, text in read_changes(recorded, new))
    report.drift.extend(Drift(path, "benign", text)
                        for path, text in reads_not_compared(recorded, new))
    from manifest.launch.outside import outside_recipe

    # A process outside the recipe, then or now: the verdict cannot speak for it.
    report.outside_recipe = list(dict.fromkeys(
        [f"recorded run: {s}" for s in outside_recipe(recorded)]
        + [f"re-run: {s}" for s in outside_recipe(new)]))
    if result.exit_code != 0:
        why = f"the re-run failed: {new.outputs.error}{confined_hint(plan)}"
        if result.job is not None and result.job.get("log_tail"):
            why += (f"; the {result.job['executor']} job {result.job['job_id']} "
                    f"log ends with:\n{result.job['log_tail']}")
        elif not options.in_place:
            hint = missing_inputs_hint(result.opened, workspace.tree, workspace.mount_at,
                                       workspace.root)
            if hint:
                why += f"; {hint}"
        record(report, rules.failed(why))
        return report
    new_by_path = {a.path: a for a in new.outputs.artifacts}
    matched = match_outputs([a.path for a in recorded.outputs.artifacts], list(new_by_path))
    original_cwd = workspace.root / recorded.command.cwd
    located = _locate(recorded, report, options, original_cwd, received, workspace.scratch)
    for artifact in recorded.outputs.artifacts:
        again = new_by_path.get(matched.get(artifact.path, artifact.path))
        if again is None:
            record(report, rules.failed(f"the re-run did not produce {artifact.path}",
                                        ReasonCode.OUTPUTS_MISSING))
            return report
        if again.path != artifact.path:
            report.notes.append(f"the re-run wrote {again.path} where the recorded run wrote "
                                f"{artifact.path} (a logger picks the next free version_N "
                                "directory): compared as the same output")
        held = located[artifact.path]
        delta = compare_artifacts(artifact, again, recorded_file=held.path,
                                  new_file=workspace.cwd / again.path)
        if not held.travelled and delta.detail is not None:  # say why, not only "not here"
            delta = replace(delta, detail=f"{held.problem}: differences named by digest only")
        if result.tables is not None and delta.detail is not None:
            # Compared by the tables that came back: the re-run's file stayed where it ran.
            where = result.job["executor"] if result.job else "the cluster"
            delta = replace(delta, detail=(
                f"the re-run's file stayed on {where}: differing tensors named by digest "
                "(--fetch-outputs for max |Δ|)"))
        report.artifacts.append(delta)
    report.trail_compared, report.first_divergent_step = first_divergent_step(recorded, new)
    if unlike_trails(recorded, new):
        report.notes.append("the recorded step trail was fingerprinted another way (an older "
                            "manifest version) than the re-run's, so the trails were not "
                            "compared point for point; the outputs decide")
    if result.op_streams:
        # ``blobs``: the local store, overlaid with a pack's op streams when verifying one.
        report.first_divergent_op = _first_op_difference(recorded, result, blobs)
    judged = judge(Findings(outputs=[a.identical for a in report.artifacts],
                            trail_steps=1 if report.trail_compared else 0,
                            trail_parts_at=report.first_divergent_step),
                   nothing=nothing_compared_reason(list(recorded.command.outputs)))
    record(report, judged)
    if judged.verdict == Verdict.NOTHING_COMPARED:
        return report
    _judge_topology(recorded, new, report)
    judge_numeric(recorded, new, report, Here(plan, workspace, settings, base_env, options,
                                              result, original_cwd, matched, located,
                                              measured=early))
    return report


def _locate(recorded: Manifest, report: VerifyReport, options: VerifyOptions,
            original_cwd: Path, received: Mapping[str, bytes] | None,
            scratch: Path) -> dict[str, RecordedFile]:
    """Where each recorded output's bytes are here (``equivalence.locate_recorded``), with a
    note for each that came from elsewhere than the user's tree."""
    from manifest.verify.equivalence import locate_recorded

    assert recorded.outputs is not None
    located = locate_recorded(recorded.outputs.artifacts, tree_cwd=original_cwd,
                              outputs_dir=options.outputs, packed=received, scratch=scratch)
    came = {"pack": "carried by the pack", "outputs": f"read from {options.outputs} (--outputs)"}
    for path, held in located.items():
        if held.source in came:
            report.notes.append(f"the recorded {path} was {came[held.source]}, checked against "
                                "its recorded digest")
        if held.note is not None:
            report.notes.append(held.note)
    return located


@dataclass(frozen=True)
class Here:
    """What the verifier's own envelope runs need: the re-run's plan, tree and settings."""

    plan: RerunPlan
    workspace: Workspace
    settings: LaunchSettings
    env: dict[str, str]
    options: VerifyOptions
    result: LaunchResult
    original_cwd: Path
    matched: dict[str, str]
    recorded_files: dict[str, RecordedFile] | None = None
    """Where each recorded output's bytes are here (``equivalence.locate_recorded``); None:
    in the user's tree at ``original_cwd``."""
    measured: Measured | None = None
    """``verify --envelope N``: the envelope runs, made around the re-run (``_interleaved``)."""

    def recorded_file(self, path: str) -> RecordedFile:
        from manifest.verify.equivalence import RecordedFile

        if self.recorded_files is not None and path in self.recorded_files:
            return self.recorded_files[path]
        return RecordedFile(self.original_cwd / path, "tree")


def judge_numeric(recorded: Manifest, new: Manifest, report: VerifyReport,
                  here: Here | None = None) -> None:
    """Outputs differ and the environment drifted only in ways that change rounding: judge
    the numeric trails against a noise envelope (``manifest.verify.equivalence``: the
    verifier's own with ``--envelope N``, else the run's where it is vouched for), then hold
    every declared output to the bound's last step. ``equivalent`` only when every rank's
    every step and every output lies inside; otherwise still ``differs``, with the first
    step outside (how far, in which parameter group) or the output that was not compared."""
    from manifest.numeric.envelope import Judgement, judge, rounding_only
    from manifest.verify.equivalence import OutputDistance, choose_envelope, output_distance

    asked = here is not None and here.options.envelope
    if report.verdict != Verdict.DIFFERS or report.changed_data:
        if asked and report.verdict == Verdict.IDENTICAL:
            report.notes.append("the envelope (--envelope) is not used: the bits are the same")
        return
    emulate = here.options.emulate if here is not None else None
    drift = [d.path for d in report.bits_drift]
    from manifest.numeric.precision import device_change

    moved = device_change(recorded, new)  # other devices: no envelope decides
    # only where nothing but rounding drifted besides (a change of code, data or seed is
    # not rounding whatever the device, and says so below)
    if moved is not None and (not drift or rounding_only(drift)):
        _not_compared(report, moved)
        if asked:
            report.notes.append("the envelope (--envelope) is not used: the re-run ran on "
                                "other devices, where no envelope decides")
        return
    if not rounding_only(drift) and not (emulate and not drift):  # emulation is rounding
        if asked:
            report.notes.append("the envelope (--envelope) is not used: what changed is not "
                                "only rounding (hardware, driver, library build, threads), so "
                                "the run cannot be equivalent")
        return
    assert recorded.outputs is not None
    assert new.outputs is not None
    if not any(p.numeric for p in recorded.outputs.processes):
        report.notes.append("no numeric trail was recorded: whether the difference is "
                            "rounding cannot be judged (capture records one by default now)")
        return
    outputs: list[OutputDistance] = []
    if here is not None and here.result.tables is not None:  # the files stayed on a cluster
        outputs = [OutputDistance(a.path, problem="the re-run's file stayed where it ran: "
                                  "the outputs were not compared numerically")
                   for a in recorded.outputs.artifacts]
    elif here is not None:  # before any envelope run writes over the re-run's outputs
        outputs = [output_distance(a, here.recorded_file(a.path).path,
                                   here.workspace.cwd / here.matched.get(a.path, a.path),
                                   absent=here.recorded_file(a.path).problem)
                   for a in recorded.outputs.artifacts]
    own, runs = None, 0
    if here is not None and here.options.envelope:
        own, runs = _envelope_here(new, here, report)
    basis = getattr(here.plan.trust, "basis", None) if here is not None else None
    reason = getattr(here.plan.trust, "reason", None) if here is not None else None
    trail = next((p.numeric for p in sorted(recorded.outputs.processes, key=lambda p: p.rank)
                  if p.numeric), None) or []
    eps = max((p.loss_eps for p in trail if p.loss_eps), default=0.0)
    carried = recorded.outputs.envelope
    if carried is not None and (emulate or carried.precision not in (None, "fp32")):
        from manifest.numeric.precision import choose  # which precision must be covered

        choice = choose([carried], "fp32", emulate or "fp32")
        if choice.envelope is None:
            _not_compared(report, choice.reason, precision=choice.to_json())
            return
    twin = carried.twin if emulate and carried is not None and carried.twin else None
    if twin is not None and carried is not None:
        from manifest.numeric.twin import check_twin  # a carried twin is the author's numbers

        problems = check_twin(carried, trail)
        if problems:
            _twin_refused(report, carried.precision, problems[0])
            return
    decision = choose_envelope(carried, own, runs, basis, reason, eps)
    report.notes.extend(decision.notes)
    if decision.calibration is None:
        assert decision.refusal is not None
        _not_compared(report, decision.refusal)
        return
    if twin is not None and carried is not None:
        from manifest.numeric.twin import trail_apart  # the recorded trail, step by step

        held = trail_apart(trail, twin, decision.calibration)
        if held.problem is not None:
            _twin_refused(report, carried.precision, held.problem)
            return
    again = {p.rank: p.numeric or [] for p in new.outputs.processes}
    # With a twin, the rank whose trail the twin is (numeric.measure.numeric_of: the lowest
    # with a trail) is judged against it; another rank has no twin and is not judged.
    ranked = sorted((p for p in recorded.outputs.processes if p.numeric), key=lambda p: p.rank)
    verdicts = [judge(twin if twin is not None else p.numeric or [], again.get(p.rank, []),
                      decision.envelope, calibration=decision.calibration)
                if twin is None or p is ranked[0] else
                Judgement("not-compared", reason=f"rank {p.rank} has no emulated twin (the "
                          f"twin is rank {ranked[0].rank}'s): it was not judged")
                for p in ranked]
    # every rank equivalent: the one closest to the envelope's edge stands for them
    worst = worst_numeric(verdicts) or max(verdicts, key=lambda v: v.closest or 0.0)
    from manifest.verify.equivalence import bind_outputs, numeric_json

    files = {a.path: found for a in recorded.outputs.artifacts
             if here is not None and (found := here.recorded_file(a.path).path) is not None}
    against = (f"judged against the run's {emulate} twin (the recorded recipe run under the "
               f"same emulation)" if twin is not None else None)
    report.numeric = numeric_json(worst, decision, trail, outputs, files, against)
    if decision.envelope is carried and carried is not None and carried.precision:
        from manifest.numeric.precision import resolution_sentence

        report.numeric["precision"] = {"covers": carried.precision, "how": carried.how,
                                       "resolution": resolution_sentence(carried),
                                       "twin": twin is not None}
    causes = ", ".join(sorted({d.path for d in report.bits_drift}))
    sentence = report.numeric["sentence"]
    if NumericVerdict(worst.verdict) is NumericVerdict.EQUIVALENT:
        problem = bind_outputs(report.numeric, outputs, decision.calibration,
                               compared=here is not None, twin_offsets=None if twin is None
                               or carried is None else dict(carried.twin_outputs or {}))
        stuck = [o for o in outputs if o.problem is not None]
        if problem is None:
            record(report, rules.inside_envelope(current(report), (
                f"not the same bits (drift: {causes}), but the same run up to "
                f"rounding: {report.numeric['sentence']}")))
        elif (report.numeric.get("outputs_verdict") == NumericVerdict.NOT_COMPARED and stuck
              and not any(o.travelled for o in stuck)):
            # Nothing was found to differ: the recorded outputs are simply not here.
            from manifest.verify.equivalence import DID_NOT_TRAVEL

            named = here is not None and here.options.outputs is not None
            missing = problem if named else (
                f"{DID_NOT_TRAVEL} ({', '.join(o.path for o in stuck)})")
            record(report, rules.did_not_travel(
                current(report), f"the step trails lie inside the envelope, but {missing}"))
        else:
            record(report, rules.outputs_outside(
                current(report), f"the step trails lie inside the envelope, but {problem}",
                compared=report.numeric.get("outputs_verdict") == NumericVerdict.OUTSIDE))
    elif NumericVerdict(worst.verdict) is NumericVerdict.DIFFERS:
        record(report, rules.trail_outside(current(report),
                                           f"outside the noise envelope at {sentence}"))
    else:
        report.notes.append(f"whether the difference is rounding could not be judged: "
                            f"{sentence}")


def _twin_refused(report: VerifyReport, precision: str | None, problem: str) -> None:
    """The run's envelope does not decide: its carried twin was refused (never equivalent)."""
    refused = f"the run's {precision} envelope does not decide: its twin is refused ({problem})"
    report.notes.append(refused)
    _not_compared(report, refused)


def _not_compared(report: VerifyReport, reason: str, **extra: Any) -> None:
    """No numeric verdict, with the reason: the bits differ and nothing says by how much."""
    report.numeric = {"verdict": "not-compared", "envelope_from": None, "reason": reason,
                      "sentence": reason, **extra}
    record(report, rules.envelope_not_compared(current(report), reason))


def _interleaved(recorded: Manifest, plan: RerunPlan, workspace: Workspace,
                 settings: LaunchSettings, env: dict[str, str],
                 options: VerifyOptions) -> Measured:
    """``verify --envelope N``: the re-run and the verifier's envelope runs (one-ULP runs
    with fresh seeds, one thread-count run) in an order drawn from the operating system's
    generator, each starting from the tree the re-run starts from (``numeric.measure``:
    what a run wrote is moved out before the next; the re-run's files are what the tree
    holds afterwards). No run can tell from its place, or from what it finds, whether it
    is the one judged. Measured before knowing whether the bits differ: when they do not,
    the envelope is not used."""
    from manifest.numeric.measure import listing, measure
    from manifest.rerun.dispatch import executor_for

    assert recorded.command is not None
    executor = executor_for(plan)
    return measure(
        [], settings, options.envelope,
        lambda planned: executor.run(plan, workspace, planned, env),
        cwd=workspace.cwd, outputs=list(recorded.command.outputs), tree=workspace.tree,
        start=listing(workspace.tree), owned=not options.in_place,
        real=lambda: executor.run(plan, workspace, settings, env))


def _envelope_here(new: Manifest, here: Here, report: VerifyReport) -> tuple[Envelope | None,
                                                                              int]:
    """``verify --envelope N``: the verifier's own envelope, from one-ULP runs (fresh seeds)
    and a thread-count run of the recorded command, made around the re-run in the scratch
    tree (``_interleaved``), against this re-run's trail."""
    measured = here.measured
    if measured is None:
        report.notes.append("no envelope was measured here: the re-run was not made among "
                            "the envelope runs")
        return None, 0
    report.notes.extend(measured.notes)
    report.notes.extend(f"envelope run left out: {f}" for f in measured.failed)
    if measured.envelope is None:
        report.notes.append(f"no envelope was measured here: {measured.reason}")
        return None, 0
    return measured.envelope, len(measured.envelope.runs)


_VERSION_DIR = re.compile(r"(?<![^/])version_\d+(?=/)")
"""A ``version_N`` directory component: Lightning's CSV and TensorBoard loggers (and many
research scripts) write into the first free N, so the same run can get another N."""


def _any_version(glob: str) -> str:
    """``lightning_logs/version_0/checkpoints/*.ckpt`` → ``…/version_*/…``."""
    return _VERSION_DIR.sub("version_*", glob)


def match_outputs(recorded: list[str], written: list[str]) -> dict[str, str]:
    """Recorded output path → the re-run's path for the same output.

    The same path when the re-run wrote it; else the one path the re-run wrote
    that differs from it only in a ``version_N`` directory (and that no other
    recorded output claims). Anything else stays unmatched: "did not produce".
    """
    matched = {path: path for path in recorded if path in written}
    free = [path for path in written if path not in matched.values()]
    for path in recorded:
        if path in matched:
            continue
        same = [w for w in free if _any_version(w) == _any_version(path)]
        if len(same) == 1:
            matched[path] = same[0]
            free.remove(same[0])
    return matched


def _judge_topology(recorded: Manifest, new: Manifest, report: VerifyReport) -> None:
    """Say which layout case the re-run is in (``manifest.nodes.layout.relation``); on
    another world size, a difference is reported with its size, never as a bare differs."""
    old_t = recorded.command.topology if recorded.command else None
    new_t = new.command.topology if new.command else None
    if old_t is None or new_t is None:
        return
    from manifest.nodes.layout import relation

    rel = relation(old_t, new_t)
    report.topology = rel.to_json()
    if rel.kind == "same":
        return
    report.notes.append(rel.text)
    if rel.kind == "changed-world-size" and report.verdict == Verdict.DIFFERS:
        record(report, rules.topology(current(report), world_size_changed=True,
                                      reason=f"{rel.text}; {_size_of_difference(report)}"))


def _size_of_difference(report: VerifyReport) -> str:
    tensors = [t for a in report.artifacts for t in a.tensors]
    deltas = [t.max_abs for t in tensors if t.max_abs is not None]
    ulps = [t.max_ulp for t in tensors if t.max_ulp is not None]
    parts = [f"{len(tensors)} tensor(s) differ"]
    parts.append(f"max |Δ| {max(deltas):.3g}" if deltas else "max |Δ| not measured")
    parts.append(f"max ULP {max(ulps)}" if ulps else "max ULP not measured")
    step = report.first_divergent_step
    if step is not None:
        parts.append(f"first divergent step {step}")
    else:
        parts.append("step trails agree" if report.trail_compared
                     else "first divergent step not found (no step trail in common)")
    return ", ".join(parts)


# ----------------------------------------------------------------- compare


def unlike_trails(recorded: Manifest, new: Manifest) -> bool:
    """Whether some rank's trail was fingerprinted another way in the re-run."""
    assert recorded.outputs is not None and new.outputs is not None
    schemes = {p.rank: p.trail_scheme for p in new.outputs.processes if p.trail}
    return any(p.trail and p.rank in schemes and schemes[p.rank] != p.trail_scheme
               for p in recorded.outputs.processes)


def first_divergent_step(recorded: Manifest, new: Manifest) -> tuple[bool, int | None]:
    """(whether trails could be compared, first step whose fingerprint differs). A rank
    whose two trails were fingerprinted differently (``trail_scheme``: a manifest made by
    an older launcher) is not compared: its points cannot agree, whatever the weights."""
    assert recorded.outputs is not None
    assert new.outputs is not None
    schemes = {p.rank: p.trail_scheme for p in new.outputs.processes}
    old = {p.rank: {t.step: t.digest for t in p.trail} for p in recorded.outputs.processes
           if p.trail_scheme == schemes.get(p.rank, p.trail_scheme)}
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

