"""Drift: the recorded environment and hardware against the ones a re-run used.

:func:`environment_drift` compares the record with a machine's env and hardware (this
machine's, or a rebuilt environment's). With ``--on`` the drift a reviewer reads is the
environment each node's re-run used: the nodes probe the interpreter their re-run used,
the probes come back checked (``manifest.rerun.cluster.node_env``), and here the drift
computed before the re-run from this machine is replaced by each node's: drift all nodes
share is said once, the rest per node, and the report's environment line says whose
environment the drift is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from manifest.canonical import seal, to_document
from manifest.verify.report import Drift, Machine

if TYPE_CHECKING:
    from manifest.models import Manifest


def environment_drift(recorded: Manifest, machine: Machine) -> list[Drift]:
    """Differences between the recorded env/hardware and today's (``machine``), with impact."""
    from manifest.diff.engine import diff_manifests

    # Only env and hardware are compared, so both sides leave out the outputs: a run that
    # kept 100,000 checkpoints has a 20 MB outputs section, and re-sealing and walking it
    # here took 15 of 46 s of such a verify.
    base = recorded.model_copy(update={"outputs": None})
    doc = to_document(base)
    nodes = doc["hardware"].get("nodes")
    doc["env"], doc["hardware"], _ = machine
    if recorded.env.imported is not None:  # what the run imported is not a fact of today
        doc["env"] = dict(doc["env"], imported=recorded.env.imported)
    if nodes is not None:  # a merged run: this machine against node 0
        doc["hardware"] = dict(doc["hardware"], nodes=nodes)
    today = seal(doc)
    found = [
        Drift(d.path, d.impact.value, d.reason, d.change.value)
        for d in diff_manifests(base, today).differences
        if d.section in ("env", "hardware")
    ]
    procs = recorded.determinism.processes
    if procs and not any(p.devices for p in procs) and any(
            cuda_family(d.path) for d in found):
        found.append(Drift(NO_GPU, "benign", "this run used no GPU: no process of it recorded "
                           "a CUDA device, so the CUDA libraries computed none of its results"))
    return found


NO_GPU = "determinism.processes[*].devices"
"""The path of the drift line saying that a run whose CUDA libraries drifted used no GPU."""
CUDA_FACTS = ("env.torch_cuda", "env.cudnn", "env.nccl", "env.cuda_runtime")
CUDA_PACKAGES = ("nvidia-", "triton", "pytorch-triton", "cuda-")


def cuda_family(path: str) -> bool:
    """A drift path of the CUDA side of a torch build: the CUDA build, cuDNN and NCCL it
    reports, and the distributions it loads (``nvidia-*``, ``triton``, ``cuda-*``)."""
    if path in CUDA_FACTS:
        return True
    name = path.removeprefix("env.packages[").removesuffix("]")
    return path.startswith("env.packages[") and name.startswith(CUDA_PACKAGES)


class DriftReport(Protocol):
    """What of a verb's report the node's drift replaces (verify's and explain's)."""

    drift: list[Drift]
    environment: dict[str, Any] | None


def drift_on_nodes(recorded: Manifest, report: DriftReport, machine: Machine | None,
                   probes: Sequence[dict[str, Any]]) -> None:
    """Replace the drift taken from this machine (``machine``; None: probed again, 0.2 s)
    in ``report`` with the drift of the environment each node's re-run used and of the
    node's hardware (``probes``, from ``rerun.cluster.node_env.checked_probes``; a node
    that sent no hardware leaves this machine's), and say on the report's environment line
    whose it is. Drift every node shares is one line; a line only some nodes have names
    its node."""

    if machine is None:
        from manifest.capture.snapshot import probe_machine

        machine = probe_machine()
    failed = [p for p in probes if "env" not in p]
    if failed:  # the drift stays this machine's, and the report says so
        why = "; ".join(f"{p['node']}: {p['error']}" for p in failed)
        _say(report, f"the drift shown is this machine's (the node's environment could not "
                     f"be probed: {why})", None)
        return

    def key(d: Drift) -> tuple[str, str, str]:
        return d.path, d.impact, d.reason

    here = {key(d) for d in environment_drift(recorded, machine)}
    rest = [d for d in report.drift if key(d) not in here]
    per_node = [environment_drift(recorded, (p["env"], p.get("hardware", machine[1]),
                                             machine[2]))
                for p in probes]
    shared = set.intersection(*({key(d) for d in found} for found in per_node))
    drift = [d for d in per_node[0] if key(d) in shared]
    names = [str(p["node"]) for p in probes]
    for i, found in enumerate(per_node):
        drift.extend(Drift(d.path, d.impact, f"node {i} ({names[i]}): {d.reason}", d.change)
                     for d in found if key(d) not in shared)
    report.drift = [*drift, *rest]
    nodes = list(dict.fromkeys(names))
    who = (f"node {nodes[0]}'s" if len(nodes) == 1
           else "the nodes' (" + ", ".join(nodes) + ")")
    hardware_here = "" if all("hardware" in p for p in probes) else (
        " (its hardware lines are this machine's: the node sent no hardware section)")
    _say(report, f"the drift shown is {who}, where the re-run ran, not this machine's"
                 f"{hardware_here}",
         (recorded, probes[0]["env"], nodes[0]) if report.environment is None or
         report.environment.get("used") != "run" else None)


def drift_of_jobs(recorded: Manifest, report: DriftReport, job: dict[str, Any],
                  jobs: Sequence[dict[str, Any]]) -> None:
    """explain's runs are jobs of their own (``jobs``, the latest ``job``): the first job's
    node probes replace the drift once, and the line saying whose drift it is is kept on the
    environment line the later jobs rebuild (``jobs_environment``)."""
    probes = job.pop("probes", None)
    said = next((j["drift_of"] for j in jobs if j is not job and j.get("drift_of")), None)
    if said is not None:
        env = report.environment or {}
        if not str(env.get("line") or "").endswith(said):
            _say(report, said, None)
        return
    if probes:
        drift_on_nodes(recorded, report, None, probes)
        job["drift_of"] = (report.environment or {}).get("drift_of")


def _say(report: DriftReport, line: str,
         this_one: tuple[Manifest, dict[str, Any], str] | None) -> None:
    """Add ``line`` to the report's environment line. ``this_one``: the re-run used the
    node's own environment (no ``--env run``), so the line counting the run's distributions
    that differ is taken again, from the node's environment instead of this machine's."""
    from manifest.rerun.environment import this_machine

    env = dict(report.environment or {})
    if this_one is not None:
        recorded, node_env, node = this_one
        counted = this_machine(recorded, node_env).to_json()
        env = {**env, **counted,
               "line": str(counted["line"]).replace("this machine's", f"node {node}'s", 1)}
    prior = env.get("line") or "this machine's"
    env["line"] = f"{prior}; {line}"
    env["drift_of"] = line
    report.environment = env
