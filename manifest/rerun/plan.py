"""The plan: exactly what a re-run will execute, decided once, before anything runs.

verify, explain, lab and gate all re-run a recorded command, and each needs all of
trust, paths, confinement and what the user is shown: a verb that assembles its own
re-run can miss one (run a crafted ``command.cwd`` of ``../..`` outside the scratch
tree, print nothing before it runs, leave its runs unconfined). So every verb builds
one :class:`RerunPlan` here and hands it to a
workspace and an executor (``manifest.rerun.workspace``,
``manifest.rerun.executor``):

* every path the manifest names is validated here, once
  (``manifest.rerun.paths``): ``cwd`` and output globs stay in the tree,
  datasets are never system trees, and a dataset outside the repository is
  an input the plan lists (it needs the same trust as the command);
* the trust decision (``manifest.trust``) is part of the plan: sealed
  here, signed by a trusted identity, ``--trust`` after reading the plan, or
  (lab) the command the user typed;
* confinement is decided here: bubblewrap when it works, unless the verb was
  asked (``--no-sandbox``) or has a stated reason not to (the gate);
  ``--require-sandbox`` refuses without it;
* what the user sees (``lines``) and what ``--format json`` reports
  (``to_json``) are the same object, every recorded string escaped.

The plan is immutable and holds no secret: withheld argv values are filled
from ``MANIFEST_SECRET_N`` by the executor at the last moment
(``manifest.rerun.environment.argv_to_run``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.launch.boot._manifest_wire import CONFIG_VAR
from manifest.nodes.plan import NodeRun
from manifest.trust import TrustDecision, escape_text, quote_arg

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchSettings
    from manifest.models import Manifest
    from manifest.rerun.cluster.hardware import GpuNeed
    from manifest.rerun.cluster.options import ClusterOptions

_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: str) -> bool:
    """Whether a dataset path names remote data (``s3://…``): pinned, never linked."""
    return bool(_REMOTE.match(path))


def local_table(path: str) -> str | None:
    """The folder a ``delta:///ABS/PATH[@VERSION]`` dataset lives in: remote by how it is
    pinned (from its log), local by where the command reads it, so the re-run must see
    it (read-only) like any absolute input. None for any other path."""
    if not path.startswith("delta:///"):
        return None
    folder, at, version = path.removeprefix("delta://").rpartition("@")
    return folder if at and version.isdigit() else path.removeprefix("delta://")


@dataclass(frozen=True)
class RerunOptions:
    """What a verb's flags say about its re-run (the same flags on every verb)."""

    trust: bool = False
    """``--trust``: run a manifest not sealed here and not signed by a trusted identity."""
    signer: str | None = None
    """A verified signature's identity that the user's policy trusts."""
    sandbox: bool = True
    """Confine when bubblewrap works (``--no-sandbox`` turns it off)."""
    require_sandbox: bool = False
    network: bool = False
    in_place: bool = False
    threads: int | None = None
    cluster: ClusterOptions | None = None
    """``--on ray|slurm|k8s``: run where the run ran (``manifest.rerun.cluster``); None: here."""
    layout: str | None = None
    """``--layout NxP``: re-run a torchrun run on N nodes × P processes on this machine
    (``manifest.nodes.layout``); None: the recorded layout."""


@dataclass(frozen=True)
class PlannedInput:
    """A dataset the re-run reads: the path the command uses and where it comes from."""

    path: str
    source: str
    outside: bool
    """Outside the repository: needs the same trust as running the command."""


@dataclass(frozen=True)
class RerunPlan:
    """One re-run, fully decided (:func:`plan_from_manifest`, :func:`plan_command`)."""

    verb: str
    argv: tuple[str, ...]
    """As recorded (withheld values are ``<redacted:N>`` placeholders)."""
    cwd: str
    """Relative to the tree, validated."""
    variables: tuple[tuple[str, str], ...]
    inputs: tuple[PlannedInput, ...]
    outputs: tuple[str, ...]
    trust: TrustDecision
    confined: bool
    unconfined_reason: str | None
    network: bool
    in_place: bool
    settings: LaunchSettings
    runs: tuple[str, ...] = field(default_factory=tuple)
    """What the verb will do with it (``run A: …``, ``3 runs under the recipe`` …)."""
    require_sandbox: bool = False
    """``--require-sandbox``: refuse (no verdict) rather than run unconfined."""
    cluster: ClusterOptions | None = None
    """Where it runs when not here (``--on``); it holds no credential."""
    commit: str | None = None
    diff_digest: str | None = None
    """The recorded code: a cluster's side refuses a bundle whose patch is not this one."""
    topology: dict[str, int] | None = None
    """Nodes, processes and GPUs the recorded run used (a cluster places the job by it)."""
    gpu: GpuNeed | None = None
    """Each node's recorded GPU model and count, as a cluster asks for them."""
    sandbox_requested: bool = True
    """Whether to confine where the job runs (a cluster's host decides if it can)."""
    nodes: tuple[NodeRun, ...] = ()
    """A multi-node re-run here: each node's torchrun, run together (``LocalNodesExecutor``)."""
    layout: str | None = None
    """The layout the nodes re-run on, e.g. ``2 nodes × 1 process``."""

    @property
    def executor(self) -> str:
        if self.cluster is not None:
            return self.cluster.on
        if self.nodes:
            return "local-nodes-confined" if self.confined else "local-nodes-unconfined"
        return "local-confined" if self.confined else "local-unconfined"

    @property
    def confinement(self) -> str:
        if self.cluster is not None:
            # A prediction: the host decides, and the report replaces this line with what
            # the job says happened there (remote_run.confinement_line).
            how = ("bubblewrap if the host can run it, else not confined (the report says "
                   "which)" + (", network allowed (--network)" if self.network
                               else ", no network")
                   if self.sandbox_requested else "not confined (--no-sandbox)")
            return f"on {self.cluster.describe()}: {how}"
        if not self.confined:
            return f"not confined ({self.unconfined_reason})"
        where = ("your tree writable (in place)" if self.in_place
                 else "only the scratch tree writable")
        return (f"bubblewrap: system read-only, {where}, private /tmp, "
                + ("network allowed (--network)" if self.network else "no network"))

    def lines(self) -> list[str]:
        """The plan as text lines, every recorded string escaped."""
        out = [f"command: {' '.join(quote_arg(a) for a in self.argv)}",
               f"in: {escape_text(self.cwd)}" + (" (in place)" if self.in_place else "")]
        for name, value in self.variables:
            out.append(f"sets: {escape_text(name)}={quote_arg(value)}")
        for item in self.inputs:
            where = " (outside the repository)" if item.outside else ""
            out.append(f"links: {escape_text(item.path)} -> {escape_text(item.source)} "
                       f"(read-only){where}")
        out.extend(f"writes: {escape_text(glob)}" for glob in self.outputs)
        if self.nodes:
            out.append(f"layout: {self.layout} on this machine, every node at once")
        elif self.layout and self.cluster is not None:
            out.append(f"layout: {self.layout}, one torchrun per node placed by "
                       f"{self.cluster.on}; each node gets its node rank and node 0's "
                       "endpoint where it runs")
        out.extend(f"node {n.node}: {' '.join(quote_arg(a) for a in n.argv)}"
                   for n in self.nodes)
        out.extend(f"runs: {escape_text(run)}" for run in self.runs)
        out.append(f"confinement: {self.confinement}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "verb": self.verb, "argv": list(self.argv), "cwd": self.cwd,
            "in_place": self.in_place, "variables": dict(self.variables),
            "inputs": [{"path": i.path, "source": i.source, "outside": i.outside}
                       for i in self.inputs],
            "outputs": list(self.outputs), "runs": list(self.runs),
            "executor": self.executor, "confined": self.confined,
            "confinement": self.confinement, "network": self.network,
            "trust": {"allowed": self.trust.allowed, "basis": self.trust.basis,
                      "reason": self.trust.reason},
            **({"cluster": self.cluster.to_json(), "topology": self.topology,
                "gpu": None if self.gpu is None else {
                    "model": self.gpu.model, "count": self.gpu.count, "mig": self.gpu.mig,
                    "ecc": self.gpu.ecc}}
               if self.cluster is not None else {}),
            **({"layout": self.layout,
                "nodes": [{"node": n.node, "argv": list(n.argv)} for n in self.nodes]}
               if self.nodes else {"layout": self.layout} if self.layout else {}),
        }

    def require(self) -> None:
        """Refuse, before anything runs, what the plan does not allow."""
        from manifest.errors import NoVerdictError, UntrustedManifestError

        if not self.trust.allowed:
            raise UntrustedManifestError(
                f"{self.trust.reason}.",
                hint="Read what it would run (above) and pass --trust to run it anyway.")
        if not self.confined and self.require_sandbox and self.cluster is None:
            raise NoVerdictError(f"--require-sandbox: the re-run cannot be confined: "
                                 f"{self.unconfined_reason}.",
                                 hint="Install bubblewrap (apt-get install bubblewrap).")


def sandbox_unavailable(options: RerunOptions) -> str | None:
    """None when the re-run will be confined, else why not."""
    if not options.sandbox:
        return "--no-sandbox"
    from manifest.rerun.sandbox import unavailable_reason

    return unavailable_reason()


def plan_inputs(root: Path, data: list[tuple[str, str | None]]) -> tuple[PlannedInput, ...]:
    """Each (dataset path, path as given from the repository) validated, with its source."""
    from manifest.rerun.paths import dataset_link

    out: list[PlannedInput] = []
    for path, from_repo in data:
        path = local_table(path) or path
        if is_remote(path):
            continue  # pinned from metadata and re-listed by verify; nothing to link
        rel = dataset_link(root, path)
        source = os.path.realpath(root / rel if rel is not None else path)
        climbs = bool(from_repo) and ".." in Path(from_repo or "").parts
        out.append(PlannedInput(path, source, rel is None or climbs))
    return tuple(out)


def plan_command(*, verb: str, root: Path, argv: list[str], cwd: str, outputs: list[str],
                 data: list[tuple[str, str | None]], settings: LaunchSettings,
                 variables: dict[str, str], options: RerunOptions, trust: TrustDecision,
                 runs: tuple[str, ...] = (), unconfined_because: str | None = None) -> RerunPlan:
    """The plan for ``argv``; every path validated (``UnsafePathError`` before anything runs)."""
    from manifest.rerun.paths import tree_relative

    for glob in outputs:
        tree_relative(glob, "declared output")
    tree_relative(cwd, "the recorded working directory")
    inputs = plan_inputs(root, data)
    reason = unconfined_because or sandbox_unavailable(options)
    if options.cluster is not None:  # the workspace is shipped, not mounted: confined there
        reason = f"runs on {options.cluster.on}"
    return RerunPlan(
        verb=verb, argv=tuple(argv), cwd=cwd, variables=tuple(sorted(variables.items())),
        inputs=inputs, outputs=tuple(outputs), trust=trust, confined=reason is None,
        unconfined_reason=reason, network=options.network, in_place=options.in_place,
        settings=settings, runs=runs,
        require_sandbox=options.require_sandbox and unconfined_because is None,
        cluster=options.cluster, sandbox_requested=options.sandbox)


MAX_NODES = 4096
"""The most nodes a recorded topology may claim and still be planned (each node is one
launch: here, one torchrun on this machine; on a cluster, one placed node)."""
MAX_WORLD_SIZE = 1 << 20
"""The most ranks (world size, or processes per node) a recorded topology may claim."""


def refuse_oversized(recorded: Manifest) -> None:
    """Refuse, before anything is built from it, a topology beyond :data:`MAX_NODES` nodes or
    :data:`MAX_WORLD_SIZE` ranks: a received manifest claiming 10^6 or 2^53 − 1 nodes made
    the planner build a launch per node before the trust refusal, and the verb never
    answered. One sentence, exit 2, in constant time."""
    from manifest.errors import UsageError

    topology = recorded.command.topology if recorded.command is not None else None
    if topology is None:
        return
    per_node = topology.local_world_size or 0
    if (topology.nodes > MAX_NODES or topology.world_size > MAX_WORLD_SIZE
            or per_node > MAX_WORLD_SIZE):
        raise UsageError(
            f"the manifest's topology claims {topology.nodes} node(s), world size "
            f"{topology.world_size}, beyond what a re-run is planned for ({MAX_NODES} nodes, "
            f"world size {MAX_WORLD_SIZE}): refusing to plan it.")
    if topology.nodes > topology.world_size:
        raise UsageError(
            f"the manifest's topology claims {topology.nodes} node(s) for world size "
            f"{topology.world_size}: every node runs at least one rank, refusing to plan it.")


def recorded_settings(recorded: Manifest, threads: int | None = None) -> LaunchSettings:
    """The launcher settings a manifest was recorded under (``threads`` overrides)."""
    from manifest.launch.runner import LaunchSettings, launch_identity

    argv = list(recorded.command.argv) if recorded.command else []
    return LaunchSettings(
        seed=recorded.randomness.seed or 0,
        derivation=recorded.randomness.derivation or "same",
        threads=threads or recorded.determinism.num_threads or 1,
        deterministic=recorded.determinism.requested,
        hashseed=recorded.determinism.pythonhashseed,
        sealed=launch_identity(recorded.code.commit, recorded.code.diff_digest, argv,
                               recorded.randomness.seed or 0),
    )


def plan_from_manifest(recorded: Manifest, *, verb: str, root: Path, options: RerunOptions,
                       runs: tuple[str, ...] = (),
                       unconfined_because: str | None = None,
                       trust: TrustDecision | None = None) -> RerunPlan:
    """The plan to re-run ``recorded``'s command, with the trust decision for it (``trust``:
    one the caller already made with the same options, so it is asked once)."""
    from manifest.trust import check_trust

    assert recorded.command is not None
    settings = recorded_settings(recorded, options.threads)
    variables = dict(recorded.env.variables)
    if recorded.command.code_env:
        variables.update(recorded.command.code_env)
    variables.update({
        "OMP_NUM_THREADS": str(settings.threads), "MKL_NUM_THREADS": str(settings.threads),
        CONFIG_VAR: (f"seed={settings.seed} derivation={settings.derivation} "
                     f"deterministic={settings.deterministic}"),
    })
    decision = trust or check_trust(recorded, user_trusted=options.trust, signer=options.signer)
    refuse_oversized(recorded)  # trust decided, and nothing built yet that a claim sizes
    plan = plan_command(
        verb=verb, root=root, argv=list(recorded.command.argv), cwd=recorded.command.cwd,
        outputs=list(recorded.command.outputs),
        data=[(ds.path, ds.from_repo) for ds in recorded.data], settings=settings,
        variables=variables, options=options, trust=decision, runs=runs,
        unconfined_because=unconfined_because)
    from dataclasses import replace

    from manifest.nodes.plan import cluster_node_runs, node_runs

    if options.cluster is None:
        local = node_runs(list(plan.argv), recorded, options.layout)
        return plan if local is None else replace(plan, nodes=local.nodes, layout=local.layout)
    cluster = options.cluster
    from manifest.rerun.cluster.options import K8sOptions

    if isinstance(cluster, K8sOptions):  # the recorded container image is the default --image
        from manifest.rerun.cluster.image import with_recorded_image

        cluster = with_recorded_image(cluster, recorded.env.container.image_digest)
    plan = replace(plan, cluster=cluster, commit=recorded.code.commit,
                   diff_digest=recorded.code.diff_digest, topology=recorded_topology(recorded),
                   gpu=recorded_gpu(recorded))
    launches = cluster_node_runs(list(plan.argv), recorded, options.layout)
    if launches is None or launches.placed is None:
        return plan
    nodes, per_node = launches.placed
    # The nodes meet over TCP: where the host confines the run, it keeps the network.
    return replace(plan, argv=launches.argv, layout=launches.layout,
                   topology={**(plan.topology or {}), "nodes": nodes, "per_node": per_node},
                   network=plan.network or nodes > 1)


def recorded_gpu(recorded: Manifest) -> GpuNeed:
    """Each node's GPUs as recorded: node 0's model (a merged run records every node's, and
    a node of another model is named by the device rule), per node."""
    from manifest.rerun.cluster.hardware import gpu_need

    hardware = recorded.hardware
    topology = recorded.command.topology if recorded.command is not None else None
    nodes = topology.nodes if topology is not None else 1
    total = hardware.gpu_count or 0
    gpus = [(g.name, g.mig_mode, g.ecc_mode) for g in hardware.gpus or []]
    return gpu_need(gpus, -(-total // nodes) if total else 0)


def recorded_topology(recorded: Manifest) -> dict[str, int]:
    """Nodes, processes (ranks) and GPUs of the recorded run, for a cluster's placement."""
    ranks = len(recorded.determinism.processes) or 1
    world = max((p.world_size or 0 for p in recorded.determinism.processes), default=0)
    topology = recorded.command.topology if recorded.command is not None else None
    return {"nodes": topology.nodes if topology is not None else 1,
            "processes": max(ranks, world),
            "gpus": recorded.hardware.gpu_count or 0}
