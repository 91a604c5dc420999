"""What ``manifest verify`` found (``VerifyReport``), how it was asked (``VerifyOptions``).

The report is filled in by two stages, the pipeline (``manifest.verify.pipeline``:
integrity, drift, data, trust) and the re-run (``manifest.verify.rerun``), and
read by four consumers that never run anything: the terminal and Markdown
renderers, the gate and explain. Holding it apart keeps the re-run stage
below the pipeline (no import cycle between them) and lets a renderer name the
type without importing git, the store or the sandbox.

A mismatch is a result, not an exception: the verdict (a :class:`Verdict`)
becomes the exit status through the one table of every verb's verdicts
(:mod:`manifest.judge`: ``Verdict``, ``VERDICTS``, ``BASES`` and the rules live
there, and are named here for this report's readers). Only the judge writes the
verdict, with its reason and code (``manifest.judge.rules.record``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.errors import EXIT_NO_VERDICT
from manifest.judge import BASES, VERDICTS
from manifest.judge import Verdict as Verdict  # the report's readers name it from here
from manifest.weights.compare import ArtifactDelta

if TYPE_CHECKING:
    from manifest.probes.hardware import NvmlFacts
    from manifest.rerun.cluster.options import ClusterOptions
    from manifest.rerun.environment import RebuildOptions
    from manifest.rerun.plan import RerunOptions

Machine = tuple[dict[str, Any], dict[str, Any], "NvmlFacts | None"]
"""(env section, hardware section, raw NVML facts) as ``capture.probe_machine`` returns."""




@dataclass(frozen=True)
class Drift:
    path: str
    impact: str
    reason: str
    change: str = "changed"
    """``added`` (only today: a package installed since), ``removed`` or ``changed``."""


@dataclass(frozen=True)
class DataChange:
    name: str
    path: str
    detail: str
    files: list[str]
    checked: bool = True
    """False: the check could not be made (another endpoint, no access); ``detail`` says
    why. Nothing is then known about the data: it counts neither as changed nor as same."""


@dataclass
class VerifyReport:
    """What verify found. ``verdict`` decides the exit status."""

    file: str
    run_id: str
    command: list[str]
    verdict: str = Verdict.NO_VERDICT
    """A :class:`Verdict` (see :data:`VERDICTS` for what each means)."""
    reason: str | None = None
    reason_code: str | None = None
    """The reason's stable code (``manifest.judge.reasons.ReasonCode``)."""
    basis: str = "nothing"
    """What the verdict rests on, in words: ``tensors``, ``trail``, ``tensors and trail``
    or ``nothing`` (see :data:`BASES`)."""
    drift: list[Drift] = field(default_factory=list)
    data: list[DataChange] = field(default_factory=list)
    artifacts: list[ArtifactDelta] = field(default_factory=list)
    first_divergent_step: int | None = None
    first_divergent_op: Any = None
    """Where the re-run's op stream parts from the one stored at capture (a
    ``manifest.ops.findings.Finding``), when the capture stored one."""
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
    plan: dict[str, Any] | None = None
    """What the re-run was planned to be (``manifest.rerun.plan.RerunPlan.to_json``)."""
    topology: dict[str, str] | None = None
    """A distributed run: how the re-run's layout relates to the recorded one
    (``manifest.nodes.layout.Relation``: same, equivalent, changed-layout, changed-world-size)."""
    outside_recipe: list[str] = field(default_factory=list)
    """Python processes that ran outside the recipe, in the recorded run or the re-run
    (``manifest.launch.outside.outside_recipe``): the verdict speaks only for the
    processes the launcher prepared."""
    numeric: dict[str, Any] | None = None
    """Where bits could not be expected: the numeric trails judged against a noise envelope
    (``manifest.numeric.envelope.Judgement.to_json``), with ``envelope_from`` (whose envelope
    decided, or None when none may), ``resolution``, the confidence, ``trail_verdict`` (the
    trails alone) and ``outputs`` / ``outputs_verdict`` (each declared output held to the
    bound's last step: ``manifest.verify.equivalence``)."""
    environment: dict[str, Any] | None = None
    """Which Python environment the re-run used, and the drift was taken from
    (``manifest.rerun.environment.RunEnvironment.to_json``): ``used`` (``run``: rebuilt and
    proven, ``here``: this machine's), ``line`` (what the report says), the rebuild's proof."""
    job: dict[str, Any] | None = None
    """Where a cluster executor ran the re-run (``--on``): executor, job id, dashboard or log
    location, bundle name, the host's confinement and network policy, bytes shipped and
    returned, the redacted log tail of a failed job."""

    @property
    def bits_drift(self) -> list[Drift]:
        return [d for d in self.drift if d.impact == "bits"]

    @property
    def changed_data(self) -> list[DataChange]:
        """Recorded datasets found changed (not those that could not be checked)."""
        return [d for d in self.data if d.checked]

    @property
    def basis_text(self) -> str:
        """The basis in a sentence, for every renderer."""
        return BASES.get(self.basis, self.basis)

    @property
    def exit_code(self) -> int:
        try:
            return VERDICTS[Verdict(self.verdict)][0]
        except (ValueError, KeyError):
            return EXIT_NO_VERDICT

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "manifest-verify/v1",
            "file": self.file,
            "run_id": self.run_id,
            "command": self.command,
            "verdict": str(self.verdict),
            "reason": self.reason,
            "reason_code": self.reason_code,
            "basis": self.basis,
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
            "plan": self.plan,
            "outside_recipe": self.outside_recipe,
            **({"job": self.job} if self.job is not None else {}),
            **({"environment": self.environment} if self.environment is not None else {}),
            **({"topology": self.topology} if self.topology is not None else {}),
            **({"numeric": self.numeric} if self.numeric is not None else {}),
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
    unconfined_because: str | None = None
    """A verb's stated reason to re-run unconfined (the gate), reported as such."""
    cluster: ClusterOptions | None = None
    """``--on ray|slurm|k8s``: re-run where the run ran (``manifest.rerun.cluster``)."""
    layout: str | None = None
    """``--layout NxP``: re-run a torchrun run on this layout here (``manifest.nodes``)."""
    emulate: str | None = None
    """``--emulate tf32|bf16``: the re-run emulates that matmul precision on CPU, standing
    in for a device that uses it; judged against the run's envelope at that precision
    (``manifest.numeric.precision.choose``)."""
    envelope: int = 0
    """``--envelope N``: where the outputs differ by rounding only, measure the noise envelope
    here (N one-ULP runs with fresh seeds and one under another thread count, in the scratch
    tree) and judge the re-run against it (``manifest.verify.equivalence``)."""
    rebuild: RebuildOptions | None = None
    """``--env run``: re-run (and take drift) in the run's own environment, rebuilt by uv and
    proven (``manifest.rerun.environment.rebuilt_environment``); None: this machine's."""
    outputs: Path | None = None
    """``--outputs DIR``: where the recorded output files are (a run received without them):
    each is checked against its recorded digest, or tensor table, before it is used
    (``manifest.verify.equivalence.locate_recorded``)."""

    def rerun_options(self, **changes: Any) -> RerunOptions:
        """The re-run engine's part of these options (``manifest.rerun.plan.RerunOptions``),
        in one place, so a flag both layers read is copied here only; ``changes`` replace
        fields (the cluster a rebuilt environment runs on, segments' fresh trees)."""
        from dataclasses import replace

        from manifest.rerun.plan import RerunOptions

        return replace(RerunOptions(
            trust=self.trust, signer=self.signer, sandbox=self.sandbox,
            require_sandbox=self.require_sandbox, network=self.network,
            in_place=self.in_place, threads=self.threads, cluster=self.cluster,
            layout=self.layout), **changes)
