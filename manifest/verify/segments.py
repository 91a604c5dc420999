"""``manifest verify --segments N`` / ``--at STEP``: prove a run too long to re-run.

A run that saved checkpoints (``outputs.checkpoints``, each with its step) is
cut at them into stretches; a stretch starts at a checkpoint (or at step 0)
and ends at the next one (or at the run's last step). Each chosen stretch is
replayed through the script's own resume path, in a scratch clone of its own
with the recorded checkpoint placed where the run wrote it:

1. The argv is the recorded one plus the resume template (``[tool.manifest]
   resume = "--resume {checkpoint}"`` or ``--resume-args``), ``{checkpoint}``
   being the checkpoint's path relative to the command's cwd. Without a
   template, a known convention takes it (Lightning's ``Trainer.fit``
   ``ckpt_path``, the Hugging Face ``Trainer.train`` ``resume_from_checkpoint``
   with its whole ``checkpoint-N`` directory placed; given through
   ``MANIFEST_RESUME_FROM``); a replay that did not resume is named. A stretch
   from step 0 runs the command as recorded.
2. The launcher starts its step count at the checkpoint's step and ends the
   process before it would take a step past the stretch's end
   (``MANIFEST_SEGMENT``, read by ``launch/boot/_manifest_checkpoints``), so the
   segment's trail points carry the run's own step numbers.
3. Every recorded trail point inside the stretch must equal the replay's, on
   every rank: the first that does not is the stretch's first divergent step.
   Checkpoints recorded at the stretch's end are compared tensor by tensor.

Which stretches, and what a check of them is worth, is
``manifest.verify.stretches``: ``--at STEP…`` names them; ``--segments N``
draws N from a fresh nonce the verifier makes and prints (``--seed`` repeats
it), never from anything the run's author controls, and only among the
stretches that can be replayed (a stretch whose starting checkpoint was not
kept never can: the report says how many there are). A single bad step (a
flipped bit, a wrong batch) at step ``b`` is caught when ``b`` lies in a
replayed stretch, since the replay starts from the run's own state before ``b``
and recomputes ``b`` honestly. The report gives, for a draw from a fresh nonce
only, the chance of catching one bad step and one tampered stretch, names a
stretch that moved the parameters too little to be strong evidence, and says
what the replays cost against the recorded run's wall time.

A stretch that parts at its very first step is ``differs`` with a hint, never a
cause (``stretches.parts_at_resume``): a checkpoint that forgot some state and a
bad step right after the checkpoint look the same from the stretch alone (the
example with a fault planted at step 5, and one that forgets its momentum,
both part at step 5 from the checkpoint at 4), so it names the resume audit.

A checkpoint that is missing, changed since capture, or was never kept (saved
again at a later step) makes its stretch ``no-verdict`` with the reason
naming it; it is never skipped in silence. Placing it and comparing the ones
at a stretch's end is ``manifest.verify.placing``; the resume template and the
conventions that need none are ``manifest.verify.conventions``.

Here, stretches replay one after another. With ``--on ray|slurm|k8s`` each is a
job of its own: every stretch's clone is prepared and submitted before any job
is waited for (``ClusterExecutor.start``/``finish``), so they run side by side
where the cluster has room; an interrupt or an error cancels every job not yet
finished, and the checkpoints at a stretch's end come back as tensor tables.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from manifest.errors import UsageError
from manifest.judge import VERDICTS, Findings, ReasonCode, Verdict, judge, record, rules
from manifest.launch.boot._manifest_wire import SEGMENT_VAR
from manifest.models import Manifest
from manifest.verify.conventions import (
    NO_TEMPLATE,
    PLACEHOLDER,
    RESUME_VAR,
    resume_argv,
    resume_template,
)
from manifest.verify.stretches import (
    Chances,
    Choice,
    Stretch,
    Weight,
    chances,
    choose,
    not_kept,
    parts_at_resume,
    resume_name,
    total_steps,
    unusable,
    weigh,
)


@dataclass
class SegmentResult:
    start: int
    end: int
    checkpoint: str | None
    verdict: str = Verdict.NO_VERDICT
    """``identical``, ``differs`` or ``no-verdict``."""
    first_divergent_step: int | None = None
    steps_compared: int = 0
    end_checkpoints: dict[str, bool] = field(default_factory=dict)
    """Checkpoints recorded at ``end``: path → identical tensor by tensor."""
    wall_s: float = 0.0
    reason: str | None = None
    reason_code: str | None = None
    """The reason's stable code (``manifest.judge.reasons.ReasonCode``)."""
    job: dict[str, Any] | None = None
    """Where it ran when ``--on`` sent it to a cluster: executor, job id, where to follow it."""
    resume_from: str | None = None
    """What it resumes from as the user knows it (a Hugging Face ``checkpoint-N`` directory,
    not the file of it whose digest was checked); None from step 0."""
    weight: Weight | None = None
    """How far the stretch moved the parameters against the envelope (None: not weighed)."""

    def to_json(self) -> dict[str, Any]:
        weight = None if self.weight is None else {
            "weak": self.weight.weak,
            "ratio": None if self.weight.ratio is None or math.isinf(self.weight.ratio)
            else self.weight.ratio, "reason": self.weight.reason}
        return {"start": self.start, "end": self.end, "checkpoint": self.checkpoint,
                "resume_from": self.resume_from,
                "verdict": self.verdict, "first_divergent_step": self.first_divergent_step,
                "steps_compared": self.steps_compared, "end_checkpoints": self.end_checkpoints,
                "wall_s": round(self.wall_s, 3), "reason": self.reason,
                "reason_code": self.reason_code, "evidence": weight,
                **({"job": self.job} if self.job is not None else {})}


@dataclass
class SegmentsReport:
    file: str
    run_id: str
    total_steps: int
    stretches: int
    chosen_by: str
    """``nonce`` (a fresh one the verifier made), ``--seed`` or ``--at`` (the user's choice)."""
    seed: int | None = None
    """What a random draw was made from: ``--seed`` with it repeats the choice."""
    unreplayable: tuple[Stretch, ...] = ()
    """The run's stretches whose starting checkpoint was not kept: never replayed."""
    segments: list[SegmentResult] = field(default_factory=list)
    recorded_wall_s: float | None = None
    notes: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    """Environment drift that can change bits (bit-exactness is then not expected)."""
    changed_data: list[str] = field(default_factory=list)
    """Recorded datasets changed since capture: never ``identical``, as in a full verify."""
    executor: str | None = None
    """Where the stretches ran (``--on``: each a job of its own); None: here, one by one."""
    elapsed_s: float = 0.0
    """From the first replay's start to the last one's verdict (jobs on a cluster overlap:
    less than ``spent_wall_s``)."""

    @property
    def steps_checked(self) -> int:
        return sum(s.end - s.start for s in self.segments if s.verdict != Verdict.NO_VERDICT)

    @property
    def share(self) -> float:
        return self.steps_checked / self.total_steps if self.total_steps else 0.0

    @property
    def chances(self) -> Chances | None:
        """For a draw from a fresh nonce only (see ``manifest.verify.stretches.chances``)."""
        checked = [Stretch(s.start, s.end, None) for s in self.segments
                   if s.verdict != Verdict.NO_VERDICT]
        return chances(Choice([], self.stretches, self.chosen_by, self.seed,
                              self.unreplayable), checked, self.total_steps)

    @property
    def replayable(self) -> int:
        return self.stretches - len(self.unreplayable)

    @property
    def weak(self) -> list[SegmentResult]:
        return [s for s in self.segments if s.weight is not None and s.weight.weak]

    @property
    def spent_wall_s(self) -> float:
        return sum(s.wall_s for s in self.segments)

    @property
    def verdict(self) -> str:
        return rules.segments([s.verdict for s in self.segments],
                              changed_data=bool(self.changed_data))

    @property
    def exit_code(self) -> int:
        return VERDICTS[Verdict(self.verdict)][0]

    def to_json(self) -> dict[str, Any]:
        odds = self.chances
        return {"file": self.file, "run_id": self.run_id, "verdict": self.verdict,
                "total_steps": self.total_steps, "stretches": self.stretches,
                "chosen_by": self.chosen_by, "seed": self.seed,
                "steps_checked": self.steps_checked,
                "share_checked": round(self.share, 6),
                "p_catch_single_bad_step": None if odds is None
                else round(odds.single_bad_step, 6),
                "p_catch_tampered_stretch": None if odds is None
                else round(odds.tampered_stretch, 6),
                "replayable_stretches": self.replayable,
                "unreplayable_stretches": [
                    {"start": s.start, "end": s.end,
                     "checkpoint": s.checkpoint.path if s.checkpoint else None}
                    for s in self.unreplayable],
                "weak_evidence": [s.start for s in self.weak],
                "recorded_wall_s": self.recorded_wall_s,
                "spent_wall_s": round(self.spent_wall_s, 3),
                "elapsed_s": round(self.elapsed_s, 3),
                "segments": [s.to_json() for s in self.segments], "drift": self.drift,
                "changed_data": self.changed_data, "notes": self.notes,
                **({"executor": self.executor} if self.executor else {})}


# ----------------------------------------------------------------- comparing


def _trails(outcomes: list[Any]) -> dict[int, dict[int, str]]:
    return {o.rank: {p.step: p.digest for p in o.trail} for o in outcomes}


def compare_trails(recorded: Manifest, new: list[Any], start: int,
                   end: int) -> tuple[int, int | None]:
    """(recorded points compared, first step where a rank's point differs or is absent)."""
    assert recorded.outputs is not None
    schemes = {o.rank: o.trail_scheme for o in new}  # another way (older) never agrees
    old = _trails([o for o in recorded.outputs.processes
                   if o.trail_scheme == schemes.get(o.rank, o.trail_scheme)])
    again = _trails(new)
    compared = 0
    first: int | None = None
    for rank, points in old.items():
        for step in sorted(s for s in points if start < s <= end):
            compared += rank == min(old)
            if again.get(rank, {}).get(step) != points[step]:
                first = step if first is None else min(first, step)
                break
    return compared, first


# ---------------------------------------------------------------------- main


def verify_segments(data: bytes, *, file: str, cwd: Path, options: Any,
                    segments: int | None, at: list[int] | None, resume: str | None,
                    seed: int | None = None, announce: Any = None,
                    show_plan: Any = None) -> SegmentsReport:
    """Replay the chosen stretches of a recorded run; never raises for a mismatch."""
    from manifest.canonical import load_manifest
    from manifest.rerun.plan import plan_from_manifest
    from manifest.rerun.workspace import repo_root_of, store_for
    from manifest.travel.pack import is_pack, read_pack

    packed = read_pack(data) if is_pack(data) else None
    recorded = load_manifest(packed.manifest if packed else data)
    if recorded.command is None or recorded.outputs is None:
        raise UsageError("the manifest records no command to re-run.")
    if options.layout is not None:
        raise UsageError("verify --segments replays on the recorded layout.",
                         hint="Leave out --layout.")
    root = repo_root_of(cwd) or cwd
    template = resume_template(root, resume)
    choice = choose(recorded, segments=segments, at=at, seed=seed)
    chosen = choice.stretches
    report = SegmentsReport(file=file, run_id=recorded.run_id,
                            total_steps=total_steps(recorded), stretches=choice.of,
                            chosen_by=choice.chosen_by, seed=choice.seed,
                            unreplayable=choice.unreplayable)
    lost = not_kept(choice)
    if lost is not None:
        report.notes.append(lost)
    compute = recorded.observed.compute
    report.recorded_wall_s = compute.wall_s if compute is not None else recorded.observed.duration_s
    if recorded.outputs.status != "ok":
        report.notes.append(f"the recorded run itself failed ({recorded.outputs.error})")
        return report
    store = store_for(recorded, root)
    from manifest.store import OverlayStore

    blobs = OverlayStore(store.root, packed.blobs) if packed else store
    # Steps 2 and 3 of a full verify, as there: drift that can change bits is named
    # (--strict refuses on it), and changed data makes the verdict ``differs``.
    from manifest.capture.snapshot import probe_machine
    from manifest.verify.drift import environment_drift
    from manifest.verify.pipeline import check_data, threads_drift

    drift = [*environment_drift(recorded, probe_machine()),
             *threads_drift(recorded, options.threads)]
    report.drift = [f"{d.path}: {d.reason}" for d in drift if d.impact == "bits"]
    changed = [d for d in check_data(recorded, root, blobs, no_cache=False, quiet=True)
               if d.checked]
    report.changed_data = [d.detail for d in changed]
    if options.strict and (report.drift or report.changed_data):
        report.notes.append("environment or data drift under --strict; refusing to re-run")
        return report
    rerun_options = options.rerun_options(in_place=False, layout=None)
    plan = plan_from_manifest(
        recorded, verb="verify", root=root, options=rerun_options,
        runs=tuple(f"segment steps {s.start + 1}–{s.end}"
                   + (f" from {resume_name(s.checkpoint)}" if s.checkpoint
                      else " from the start")
                   for s in chosen), unconfined_because=options.unconfined_because)
    shown = replace(plan, argv=tuple(resume_argv(list(plan.argv), template, PLACEHOLDER)))
    if show_plan is not None and plan.trust.basis != "sealed":
        show_plan(shown)
    plan.require()
    original_cwd = root / recorded.command.cwd
    context = _Context(recorded, plan, template, original_cwd, root, blobs, options, announce)
    began = time.monotonic()
    if plan.cluster is not None:
        report.segments.extend(_replay_on_cluster(context, chosen))
        report.executor = plan.cluster.describe()
    else:
        for stretch in chosen:
            with contextlib.ExitStack() as stack:
                result, ready = _prepare(context, stretch, stack)
                if ready is not None:
                    from manifest.rerun.dispatch import executor_for

                    ran = executor_for(ready.plan).run(ready.plan, ready.workspace,
                                                       ready.settings, ready.env)
                    _judge(context, ready, ran)
            report.segments.append(result)
    report.elapsed_s = time.monotonic() - began
    envelope = recorded.outputs.envelope
    if report.segments and (envelope is None or unusable(envelope)):
        why = ("the run has no noise envelope (capture --envelope N measures one)"
               if envelope is None else f"its envelope is unusable: {unusable(envelope)}")
        report.notes.append("how far each stretch moved the parameters was not weighed "
                            f"against rounding: {why}")
    return report


@dataclass(frozen=True)
class _Context:
    """What every stretch's replay shares."""

    recorded: Manifest
    plan: Any
    template: list[str] | None
    original_cwd: Path
    root: Path
    blobs: Any
    options: Any
    announce: Any


@dataclass
class _Ready:
    """A stretch whose workspace holds its checkpoint: what its run needs."""

    stretch: Stretch
    result: SegmentResult
    plan: Any
    workspace: Any
    settings: Any
    env: dict[str, str]
    began: float


def _prepare(ctx: _Context, stretch: Stretch, stack: contextlib.ExitStack[Any]
             ) -> tuple[SegmentResult, _Ready | None]:
    """Open the stretch's scratch workspace (closed with ``stack``) and place its
    checkpoint; None (the result says why) when it cannot be replayed."""
    from manifest.rerun.environment import rerun_env
    from manifest.rerun.workspace import open_workspace

    recorded = ctx.recorded
    assert recorded.command is not None and recorded.outputs is not None
    ck = stretch.checkpoint
    result = SegmentResult(stretch.start, stretch.end, ck.path if ck else None,
                           resume_from=resume_name(ck) if ck else None,
                           weight=weigh(recorded, stretch))
    argv = (list(ctx.plan.argv) if ck is None
            else resume_argv(list(ctx.plan.argv), ctx.template, ck.path))
    # The checkpoints recorded at the stretch's end are outputs of the replay: where it runs
    # elsewhere, their tensor tables come back with its records (at most MAX_AT_ONE_STEP).
    from manifest.verify.placing import end_outputs

    ends, too_many = end_outputs(recorded, stretch.end)
    if too_many is not None:
        record(result, rules.failed(too_many, ReasonCode.REPLAY_NOT_STARTED))
        return result, None
    seg_plan = replace(ctx.plan, argv=tuple(argv),
                       outputs=tuple(dict.fromkeys([*ctx.plan.outputs, *ends])))
    began = time.monotonic()
    workspace = stack.enter_context(open_workspace(seg_plan, ctx.root, recorded=recorded,
                                                   store=ctx.blobs, keep=ctx.options.keep))
    if ck is not None and ctx.template is None:
        # A convention that needs no template but an argument: nanoGPT's init_from=resume
        # (its checkpoint at the fixed path the run saved it to, where it is placed).
        from manifest.verify.conventions import resume_convention_argv

        found = resume_convention_argv(workspace.cwd, argv, ck.path)
        if found is not None:
            argv = found
            seg_plan = replace(seg_plan, argv=tuple(argv))
    if ck is not None:
        from manifest.verify.placing import place

        problem = place(ck, ctx.original_cwd, workspace.tree, workspace.cwd)
        if problem is not None:
            record(result, rules.failed(problem, ReasonCode.REPLAY_NOT_STARTED))
            return result, None
    if ctx.announce is not None:
        ctx.announce(argv)
    env, _ = rerun_env(recorded, workspace.mount_at)
    env[SEGMENT_VAR] = json.dumps({"step_offset": stretch.start, "stop_after": stretch.end})
    if ck is not None and ctx.template is None:
        env[RESUME_VAR] = ck.path
    settings = replace(seg_plan.settings, root=str(workspace.mount_at))
    return result, _Ready(stretch, result, seg_plan, workspace, settings, env, began)


def _replay_on_cluster(ctx: _Context, chosen: list[Stretch]) -> list[SegmentResult]:
    """Every stretch as a job of its own, all submitted before any is waited for: they run
    side by side where the cluster has room. Ctrl-C, SIGTERM or an error while waiting
    cancels every job not yet finished (each cancel confirmed by the engine)."""
    from manifest.errors import NoVerdictError
    from manifest.rerun.cluster import executor_for_cluster
    from manifest.rerun.cluster.remote_run import ClusterExecutor, Started

    results: list[SegmentResult] = []
    with contextlib.ExitStack() as stack:
        executor = executor_for_cluster(ctx.plan)
        assert isinstance(executor, ClusterExecutor)
        started: list[tuple[_Ready, Started]] = []
        try:
            for stretch in chosen:
                result, ready = _prepare(ctx, stretch, stack)
                results.append(result)
                if ready is None:
                    continue
                try:
                    started.append((ready, executor.start(ready.plan, ready.workspace,
                                                          ready.settings, ready.env)))
                except NoVerdictError as exc:
                    record(result, rules.failed(str(exc), ReasonCode.REPLAY_NOT_STARTED))
            while started:
                # Out of the list before the wait: finish cancels its own job when the wait
                # is interrupted, and the handler below cancels the ones left.
                ready, job = started.pop(0)
                try:
                    ran = executor.finish(job)
                except NoVerdictError as exc:
                    record(ready.result, rules.failed(str(exc), ReasonCode.REPLAY_FAILED))
                else:
                    ready.result.job = ran.job
                    _judge(ctx, ready, ran)
        except BaseException:
            for _, job in started:
                executor.abandon(job)
            raise
    return results


def _judge(ctx: _Context, ready: _Ready, ran: Any) -> None:
    """The stretch's verdict from its replay's records (and end checkpoints)."""
    from manifest.capture.run import merge_records
    from manifest.rerun.executor import confined_hint
    from manifest.verify.placing import end_checkpoints

    result, stretch = ready.result, ready.stretch
    ck = stretch.checkpoint
    result.wall_s = time.monotonic() - ready.began
    if ran.exit_code != 0:
        error = next((str(r["exception"]) for r in ran.records if r.get("exception")),
                     f"exit status {ran.exit_code}")
        why = f"the replay failed: {error[:500]}{confined_hint(ready.plan)}"
        if ran.job is not None and ran.job.get("log_tail"):
            why += (f"; the {ran.job['executor']} job {ran.job['job_id']} log ends "
                    f"with:\n{ran.job['log_tail']}")
        record(result, rules.failed(why, ReasonCode.REPLAY_FAILED))
        return
    if ck is not None and ctx.template is None and not any(
            r.get("resumed_from") for r in ran.records):
        record(result, rules.failed(f"{NO_TEMPLATE[0]} ({NO_TEMPLATE[1]})",
                                    ReasonCode.NO_TEMPLATE))
        return
    outcomes = merge_records(ran.records)[2]
    result.steps_compared, result.first_divergent_step = compare_trails(
        ctx.recorded, outcomes, stretch.start, stretch.end)
    result.end_checkpoints = end_checkpoints(ctx.recorded, stretch.end, ctx.original_cwd,
                                              ready.workspace.cwd, ran.tables)
    judged = judge(Findings(outputs=list(result.end_checkpoints.values()),
                            trail_steps=result.steps_compared,
                            trail_parts_at=result.first_divergent_step),
                   nothing="nothing compared: no trail point or checkpoint in the stretch")
    at_resume = ck is not None and result.first_divergent_step == stretch.start + 1
    record(result, rules.stretch(judged, parts_at_resume=parts_at_resume(
        ctx.recorded, stretch.start) if at_resume else None))
