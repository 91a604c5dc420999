"""The environment a cluster re-run used, probed on its node, and the drift taken from it.

With ``--on`` the re-run runs on a node, so the environment drift a reviewer reads must be
that node's, not the submitting machine's:

* on the node (:func:`probe_on_node`, called by ``manifest.rerun.remote``): the env section
  of the interpreter the re-run used, with the probe capture uses (``probe_machine``): the
  rebuilt venv's python (``--env run``, through ``probe_env_in``) or the cluster's python
  that runs the job;
* back here (:func:`checked_probes`): the probes are untrusted input like the rest of a
  node's result: at most :data:`MAX_PROBE_BYTES` of JSON, each an ``Env`` section that the
  manifest model accepts, or a job is refused with one sentence (no verdict);
* verify (:func:`drift_on_nodes`): the drift computed before the re-run from this machine is
  replaced by each node's; drift all nodes share is said once, the rest per node, and the
  report's environment line says whose environment the drift is about.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from manifest.errors import NoVerdictError

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.rerun.environment import RunEnvironment
    from manifest.verify.report import Drift, Machine


class DriftReport(Protocol):
    """What of a verb's report the node's drift replaces (verify's and explain's)."""

    drift: list[Drift]
    environment: dict[str, Any] | None

MAX_PROBE_BYTES = 4 << 20
"""The most JSON a node's probes may hold (4 MiB, all nodes together): this machine's env
section is 49 kB with ~120 distributions; a 5 GB CUDA stack has some 60 more."""
MAX_NODE_NAME = 255
"""A node name longer than a host name can be (RFC 1035: 255 bytes) is not a node's."""


def probe_on_node(used: RunEnvironment | None,
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """On the node: ``{"node", "env"}``, the env section of the interpreter the re-run used
    (the rebuilt venv's with ``--env run``, else this one's: the cluster's python), or
    ``{"node", "error"}`` when that interpreter could not be probed. ``environ``: the
    variables the re-run ran with (the recorded numerics ones put back), whose allow-listed
    ones are recorded rather than this job process's (Ray sets ``OMP_NUM_THREADS`` there)."""
    from manifest.capture.snapshot import probe_machine
    from manifest.probes.env import numerics_variables
    from manifest.rerun.environment import probe_env_in

    node = os.uname().nodename
    env, _, _ = probe_machine()
    if used is not None and used.python is not None:
        try:
            env = probe_env_in(used.python, env)
        except NoVerdictError as exc:
            return {"node": node, "error": exc.message}
    if environ is not None:
        env = dict(env, variables=numerics_variables(dict(environ)))
    return {"node": node, "env": env}


def checked_probes(doc: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The node probes of a job's result (``probes``: one per node; ``probe``: one node),
    each ``{"node", "env"}`` or ``{"node", "error"}``; None when the node sent none (a node
    running an older torch-manifest). ``where`` names the job in the refusal.

    Raises NoVerdictError (one sentence) for probes that are too large or not env sections."""
    from pydantic import ValidationError

    from manifest.models import Env

    raw = doc.get("probes") if "probes" in doc else (
        [doc["probe"]] if "probe" in doc else None)
    if raw is None:
        return None

    def refuse(why: str) -> NoVerdictError:
        return NoVerdictError(f"{where} returned an environment probe that is not one ({why}).")

    try:
        size = len(json.dumps(raw))
    except (TypeError, ValueError) as exc:
        raise refuse("not JSON") from exc
    if size > MAX_PROBE_BYTES:
        raise refuse(f"{size} bytes, more than {MAX_PROBE_BYTES}")
    if not isinstance(raw, list) or not raw:
        raise refuse("not a list of nodes")
    checked: list[dict[str, Any]] = []
    for i, probe in enumerate(raw):
        if not isinstance(probe, dict) or not isinstance(probe.get("node"), str) or not (
                0 < len(probe["node"]) <= MAX_NODE_NAME) or not probe["node"].isprintable():
            raise refuse(f"node {i}: no node name")
        if isinstance(probe.get("error"), str) and "env" not in probe:
            checked.append({"node": probe["node"], "error": probe["error"][:500]})
            continue
        try:
            env = Env.model_validate(probe.get("env"))
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"]) or "env"
            raise refuse(f"node {i}: {at}: {first['msg']}") from exc
        checked.append({"node": probe["node"], "env": env.model_dump(mode="json")})
    return checked


def drift_on_nodes(recorded: Manifest, report: DriftReport, machine: Machine | None,
                   probes: Sequence[dict[str, Any]]) -> None:
    """Replace the environment drift taken from this machine (``machine``; None: probed
    again, 0.2 s) in ``report`` with the drift of the environment each node's re-run used
    (``probes``, from :func:`checked_probes`), and say on the report's environment line
    whose it is. Drift every node shares is one line; a line only some nodes have names
    its node."""
    from manifest.verify.pipeline import environment_drift
    from manifest.verify.report import Drift

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
    per_node = [environment_drift(recorded, (p["env"], machine[1], machine[2]))
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
    _say(report, f"the drift shown is {who}, where the re-run ran, not this machine's",
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
