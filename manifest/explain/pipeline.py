"""``manifest explain run.json``: re-run twice, find the step, then the op.

Steps, in order:

1. The re-run engine (``manifest.rerun``), as for verify: integrity, drift,
   the plan (paths validated, trust, confinement: shown before an untrusted
   manifest runs), a workspace at the recorded commit with the recorded
   patch and the inputs where the command looks, the same executor.
2. Locate: run the command twice, A under the recorded settings and B under
   the same or the overridden ones (``--threads``), with the automatic
   trail at every optimizer step. The first step where A and B part, or
   else where A parts from the recorded trail, is the step to explain.
   (With a known step, e.g. from ``verify --explain``, this pass is skipped.)
3. Pinpoint: run both again up to and including that step only, recording
   the op stream (``_manifest_ops``) of that step and the ``LOOKBACK`` steps
   before it and keeping their tensors' values, then stop the processes there.
4. Align the two streams (``manifest.ops.align``) per rank and report
   the first op whose inputs matched and outputs differ, or the value that
   entered from outside torch. When A and B agree with each other but not
   with the record, the cause is the environment or the inputs: the drift
   is shown, and a recorded op stream (``capture --fingerprint-ops``) names
   the first op that computes differently here.

Cost on the bundled example (60 steps): about 2 full runs plus 2 short
ones; the op stream of one step costs a few times that step's time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.canonical import load_manifest
from manifest.judge import EXPLAIN_VERDICTS, ReasonCode, record, rules
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Manifest
from manifest.ops.findings import Finding, compare_streams
from manifest.ops.stream import OpStream, parse_stream, streams_in
from manifest.rerun.plan import RerunOptions
from manifest.rerun.workspace import repo_root_of, store_for
from manifest.verify.drift import environment_drift
from manifest.verify.pipeline import threads_drift
from manifest.verify.report import Drift

LOOKBACK = 2
"""Optimizer steps recorded before the explained one. A value step k reads may be
made before step k begins: with two or three optimizers each stepping after one
``backward()``, the gradient the later ones read was made in the earlier steps'
window; a buffer (batch-norm statistics, an EMA) is updated in the step before. Each
extra step costs one recorded step (~4.5x a bare step): two is noise beside the
process start-up of each pinpoint run."""

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchSettings
    from manifest.rerun.environment import RebuildOptions, RunEnvironment
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace


@dataclass(frozen=True)
class ExplainOptions:
    rerun: RerunOptions = field(default_factory=RerunOptions)
    """Trust, confinement and --in-place: the same flags as verify's."""
    threads: int | None = None
    keep: bool = False
    step: int | None = None
    """The first divergent step when already known (``verify --explain``)."""
    values_budget: int = 256 * 2**20
    """Bytes of tensor values each run keeps from the explained step (per process)."""
    code_checked: bool = False
    """The caller knows the tree is the recorded code (the lab, which recorded it a
    moment ago); otherwise ``--in-place`` checks it, as verify does."""
    rebuild: RebuildOptions | None = None
    """``--env run``: both runs in the run's own environment, rebuilt and proven, as verify
    (``manifest.rerun.environment.environment_for``); None: this machine's."""


@dataclass
class ExplainReport:
    file: str
    run_id: str
    command: list[str]
    verdict: str = "no-verdict"
    """``parted`` (a step and a cause were found), ``agree``, ``no-verdict``."""
    cause: str | None = None
    """``nondeterminism``, ``outside-input``, ``threads`` (B's thread count, the one setting
    it changes), ``environment``."""
    threads: list[int] | None = None
    """Run A's and run B's thread counts."""
    reason: str | None = None
    reason_code: str | None = None
    """The reason's stable code (``manifest.judge.reasons.ReasonCode``)."""
    first_step: int | None = None
    recorded_step: int | None = None
    """First step where the fresh runs part from the recorded trail."""
    steps_run: int | None = None
    runs: list[str] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    confinement: str | None = None
    plan: dict[str, Any] | None = None
    """What the re-runs were planned to be (``manifest.rerun.plan.RerunPlan.to_json``)."""
    environment: dict[str, Any] | None = None
    """Which Python environment the runs used (``RunEnvironment.to_json``), as verify says."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """Where a cluster executor (``--on``) ran each run: one entry per run, as verify's ``job``."""
    numeric: dict[str, Any] | None = None
    """Whether the parting is rounding: run B's numeric trail against run A's, judged by the
    recorded run's noise envelope (``manifest.numeric.envelope.Judgement.to_json``)."""

    @property
    def exit_code(self) -> int:
        """From the one table of every verb's verdicts (``manifest.judge``)."""
        return EXPLAIN_VERDICTS.get(self.verdict, EXPLAIN_VERDICTS["no-verdict"])[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "manifest-explain/v1",
            "file": self.file, "run_id": self.run_id, "command": self.command,
            "verdict": self.verdict, "cause": self.cause, "reason": self.reason,
            "reason_code": self.reason_code,
            "threads": self.threads,
            "first_step": self.first_step, "recorded_step": self.recorded_step,
            "steps_run": self.steps_run, "runs": self.runs,
            "drift": [d.__dict__ for d in self.drift],
            "findings": [f.__dict__ for f in self.findings],
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            "confinement": self.confinement,
            "plan": self.plan,
            **({"jobs": self.jobs} if self.jobs else {}),
            **({"environment": self.environment} if self.environment is not None else {}),
            **({"numeric": self.numeric} if self.numeric is not None else {}),
        }


# ------------------------------------------------------------------ trails


def _judge_parting(recorded: Manifest, report: ExplainReport, a: list[ProcessRecord],
                   b: list[ProcessRecord], parted: int | None) -> None:
    """Runs A and B part, and the recorded run carries a noise envelope: say whether B
    stays inside it (a parting by rounding) or where it leaves (a real change)."""
    envelope = recorded.outputs.envelope if recorded.outputs is not None else None
    if parted is None or envelope is None:
        return
    from manifest.numeric.envelope import judge
    from manifest.numeric.measure import numeric_of

    report.numeric = judge(numeric_of(a), numeric_of(b), envelope).to_json()


def _trails(records: list[ProcessRecord], *, auto: bool) -> dict[int, dict[int, str]]:
    out: dict[int, dict[int, str]] = {}
    for r in records:
        points = r.get("auto_trail") if auto else (r.get("trail") or r.get("auto_trail"))
        out[int(r.get("rank") or 0)] = {int(p["step"]): str(p["digest"]) for p in points or []}
    return out


def _first_parting(a: dict[int, dict[int, str]], b: dict[int, dict[int, str]]) -> int | None:
    first: int | None = None
    for rank, steps in a.items():
        other = b.get(rank, {})
        for step in sorted(set(steps) & set(other)):
            if steps[step] != other[step]:
                first = step if first is None else min(first, step)
                break
    return first


def _recorded_trails(recorded: Manifest) -> dict[int, dict[int, str]]:
    assert recorded.outputs is not None
    return {p.rank: {t.step: t.digest for t in p.trail} for p in recorded.outputs.processes}


# -------------------------------------------------------------------- main


def explain_run(data: bytes, *, file: str, cwd: Path, options: ExplainOptions,
                announce: Any = None, show_plan: Any = None, note: Any = None) -> ExplainReport:
    """Explain where a recorded run and fresh runs of it part; never raises for a mismatch.

    ``show_plan(plan)`` sees the plan before an untrusted manifest is refused or
    run; ``announce(argv)`` is called once it may run.
    """
    from manifest.rerun.environment import argv_to_run
    from manifest.rerun.plan import plan_from_manifest
    from manifest.rerun.workspace import open_workspace
    from manifest.store import OverlayStore
    from manifest.travel.pack import is_pack, read_pack

    packed = read_pack(data) if is_pack(data) else None
    recorded = load_manifest(packed.manifest if packed else data)
    argv = list(recorded.command.argv) if recorded.command else []
    report = ExplainReport(file=file, run_id=recorded.run_id, command=argv)
    repo = repo_root_of(cwd)
    root = repo or cwd
    local = store_for(recorded, root)
    # A pack's blobs (patch, op streams) are read from memory, never written.
    store = OverlayStore(local.root, packed.blobs) if packed else local
    from manifest.capture.snapshot import probe_machine
    from manifest.rerun.environment import environment_for
    from manifest.trust import check_trust

    used, machine = environment_for(  # --env run: the runs and the drift are the run's env's
        recorded, probe_machine(), options.rebuild, tree=root, note=note,
        trust=lambda: check_trust(recorded, user_trusted=options.rerun.trust,
                                  signer=options.rerun.signer),
        cluster=options.rerun.cluster)  # with --on, each job's node rebuilds it
    report.environment = used.to_json()
    if options.rebuild is not None and used.python is None and used.request is None:
        record(report, rules.explain_failed(used.line, ReasonCode.ENVIRONMENT_NOT_BUILT))
        return report
    report.drift = environment_drift(recorded, machine)
    if recorded.command is None or recorded.outputs is None:
        record(report, rules.explain_failed("the manifest records no command to re-run",
                                            ReasonCode.NO_COMMAND))
        return report
    report.drift.extend(threads_drift(recorded, options.threads))
    if options.rerun.in_place and not options.code_checked:
        from manifest.rerun.inputs import in_place_code_problem

        # Other code would part from the record and be blamed on the environment.
        problem = in_place_code_problem(recorded, root, local)
        if problem is not None and not problem.startswith("cannot check"):
            record(report, rules.explain_failed(f"--in-place: {problem}",
                                                ReasonCode.IN_PLACE_CODE))
            return report
    threads_a = recorded.determinism.num_threads or 1
    runs = (f"A: the recorded settings ({threads_a} thread(s))",
            f"B: {options.threads or threads_a} thread(s)",
            "then A and B again up to the first step where they part, recording every op")
    plan = plan_from_manifest(recorded, verb="explain", root=root, runs=runs,
                              options=replace(options.rerun,
                                              cluster=used.on_cluster(options.rerun.cluster)))
    report.plan = plan.to_json()
    report.confinement = plan.confinement
    if show_plan is not None and plan.trust.basis != "sealed":
        show_plan(plan)
    plan.require()
    argv_to_run(plan.argv)  # a missing MANIFEST_SECRET_N is refused before any work
    with open_workspace(plan, root, recorded=None if options.rerun.in_place else recorded,
                        store=store, keep=options.keep) as workspace:
        if announce is not None:
            announce(argv)
        _explain_in(recorded, report, plan, workspace, options, store,
                    used if options.rebuild is not None else None)
    return report


def _explain_in(recorded: Manifest, report: ExplainReport, plan: RerunPlan,
                workspace: Workspace, options: ExplainOptions, store: Any,
                used: RunEnvironment | None = None) -> None:
    from manifest.rerun.dispatch import executor_for
    from manifest.rerun.environment import in_environment, rerun_env

    base = replace(plan.settings, trail="all", root=str(workspace.mount_at))
    other = base if options.threads is None else replace(base, threads=options.threads)
    report.runs = [_describe("A", base), _describe("B", other)]
    report.threads = [base.threads, other.threads]
    env, _ = rerun_env(recorded, workspace.mount_at)
    env, workspace = in_environment(used, env, workspace)
    executor = executor_for(plan)
    scratch = workspace.scratch

    def launch(label: str, settings: LaunchSettings, ops: dict[str, Any] | None) -> Any:
        started = time.perf_counter()
        writable: list[Path] = []
        if ops is not None:
            settings = replace(settings, ops=ops)
            writable.append(Path(ops["dir"]))
        result = executor.run(plan, workspace, settings, env, writable=writable)
        report.timings[label] = time.perf_counter() - started
        if result.job is not None:
            report.jobs.append({"run": label, **result.job})
            from manifest.rerun.cluster.remote_run import confinement_line

            report.confinement = confinement_line(plan, result.job)  # what the host applied
            from manifest.rerun.environment import jobs_environment

            # --on with --env run: what each job's node used
            report.environment = jobs_environment(report.jobs) or report.environment
            from manifest.verify.drift import drift_of_jobs

            drift_of_jobs(recorded, report, report.jobs[-1], report.jobs)  # the nodes' drift
        return result

    recorded_trails = _recorded_trails(recorded)
    step = options.step
    if step is None:
        a = launch("locate A", base, None)
        b = launch("locate B", other, None)
        if a.exit_code != 0 or b.exit_code != 0:
            record(report, rules.explain_failed(
                f"the re-run failed: {_failure(plan, a if a.exit_code else b)}",
                ReasonCode.RERUN_FAILED))
            return
        trail_a, trail_b = _trails(a.records, auto=True), _trails(b.records, auto=True)
        report.steps_run = max((len(t) for t in trail_a.values()), default=0)
        if not report.steps_run:
            ran = max((int(r.get("steps") or 0) for r in a.records), default=0)
            record(report, rules.explain_failed(
                f"the command ran {ran} optimizer step(s) but fingerprinted none: its Python "
                "could not import blake3 (it is probably not the Python manifest is installed "
                "in; install torch-manifest into it)" if ran else
                "the command ran no optimizer step (torch.optim) and no backward(), so there is "
                "no step to explain"))
            return
        parted = _first_parting(trail_a, trail_b)
        _judge_parting(recorded, report, a.records, b.records, parted)
        report.recorded_step = _first_parting(_trails(a.records, auto=False), recorded_trails)
        step = parted if parted is not None else report.recorded_step
        if step is None:
            record(report, rules.explain_agree(
                f"the runs do not part: two fresh runs and the recorded trail agree "
                f"at every one of {report.steps_run} steps"))
            return
        if parted is None and not recorded_op_streams(recorded, store):
            # A and B agree, and no recorded op stream to hold them against:
            # recording their ops again would only show two equal streams.
            report.first_step = step
            _environment(report, step)
            return
    report.first_step = step
    since = max(1, step - LOOKBACK)
    window = {"from": since, "to": step, "stop": step, "values_budget": options.values_budget}
    dir_a, dir_b = scratch / "ops-a", scratch / "ops-b"
    dir_a.mkdir()
    dir_b.mkdir()
    a2 = launch("pinpoint A", base, {**window, "dir": str(dir_a)})
    b2 = launch("pinpoint B", other, {**window, "dir": str(dir_b)})
    if a2.exit_code != 0 or b2.exit_code != 0:
        failed_run = a2 if a2.exit_code else b2
        if options.step is None:
            # The same command ran to its end twice moments ago without the recorder.
            record(report, rules.explain_failed(
                f"the re-run up to step {step} failed only while manifest recorded "
                f"its ops ({_child_error(plan, failed_run)}): a fault in manifest's "
                "op recorder, not in the command or its confinement; please report it"))
        else:
            record(report, rules.explain_failed(
                f"the re-run up to step {step} failed: {_failure(plan, failed_run)}",
                ReasonCode.RERUN_FAILED))
        return
    streams_a, streams_b = streams_in(dir_a), streams_in(dir_b)
    if not streams_a:
        record(report, rules.explain_failed(
            "no op stream was recorded (is this torch without TorchDispatchMode?)"))
        return
    broken = [(label, s.error) for label, streams in (("A", streams_a), ("B", streams_b))
              for s in streams.values() if s.error]
    if broken:
        label, error = broken[0]
        record(report, rules.explain_failed(
            f"manifest's op recorder failed in run {label} ({error}): a fault in "
            f"manifest, not in the command or its confinement; please report it"))
        return
    report.findings = compare_streams(streams_a, streams_b, step, "run A vs run B", since=since)
    record(report, rules.explain_parted(report.reason))
    if report.findings:
        kinds = {f.kind for f in report.findings}
        if "input-from-outside" in kinds:
            report.cause = "outside-input"
        elif options.threads is not None and other != base:
            # The only setting B changes: the thread count is the cause, whichever
            # op (forward, backward or optimizer) first computes differently.
            report.cause = "threads"
        else:
            report.cause = "nondeterminism"
        return
    _environment(report, step)
    recorded_streams = recorded_op_streams(recorded, store)
    if recorded_streams and any(s.steps[0] <= step <= s.steps[1]
                                for s in recorded_streams.values()):
        report.findings = compare_streams(recorded_streams, streams_a, step,
                                          "recorded op stream vs run A", values=False)


def _child_error(plan: RerunPlan, result: Any) -> str:
    """The failed child's error, redacted (a child's exception can quote its credentials)."""
    from manifest.capture.run import _process_error
    from manifest.redact import redact_text

    error = _process_error(result.records) or f"command exited with status {result.exit_code}"
    return redact_text(error, argv=list(plan.argv))


def _failure(plan: RerunPlan, result: Any) -> str:
    """Why a run failed, as verify says it: the child's error (redacted), its exit status,
    and that it ran confined."""
    from manifest.rerun.executor import confined_hint

    return _child_error(plan, result) + confined_hint(plan)


def _environment(report: ExplainReport, step: int) -> None:
    """A and B agree: the record differs because of what is different here."""
    record(report, rules.explain_parted(
        "two fresh runs agree with each other but not with the recorded run: "
        "the cause is the environment or the inputs, not nondeterminism"))
    report.cause = "environment"
    report.recorded_step = report.recorded_step or step


def recorded_op_streams(recorded: Manifest, store: Any) -> dict[int, OpStream]:
    """Op streams stored at capture (``--fingerprint-ops``), by rank."""
    out: dict[int, OpStream] = {}
    if recorded.outputs is None:
        return out
    for process in recorded.outputs.processes:
        ref = process.ops
        if ref is None:
            continue
        blob = store.get(ref.digest)
        if blob is not None:
            out[process.rank] = parse_stream(blob, what=f"recorded op stream {ref.digest}")
    return out


def _describe(label: str, s: Any) -> str:
    det = "recipe on" if s.deterministic else "recipe off"
    return f"{label}: seed {s.seed}, {s.threads} thread(s), {det}"
