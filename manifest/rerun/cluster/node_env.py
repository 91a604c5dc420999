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
* verify and explain (``manifest.verify.drift``) replace the drift taken from this
  machine with each node's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from manifest.errors import NoVerdictError

if TYPE_CHECKING:
    from manifest.rerun.environment import RunEnvironment


MAX_PROBE_BYTES = 4 << 20
"""The most JSON a node's probes may hold (4 MiB, all nodes together): this machine's env
section is 49 kB with ~120 distributions; a 5 GB CUDA stack has some 60 more."""
MAX_NODE_NAME = 255
"""A node name longer than a host name can be (RFC 1035: 255 bytes) is not a node's."""


def probe_on_node(used: RunEnvironment | None,
                  environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """On the node: ``{"node", "env", "hardware"}``, the env section of the interpreter the
    re-run used (the rebuilt venv's with ``--env run``, else this one's: the cluster's
    python) and the node's hardware section, or
    ``{"node", "error"}`` when that interpreter could not be probed. ``environ``: the
    variables the re-run ran with (the recorded numerics ones put back), whose allow-listed
    ones are recorded rather than this job process's (Ray sets ``OMP_NUM_THREADS`` there)."""
    from manifest.capture.snapshot import probe_machine
    from manifest.probes.env import numerics_variables
    from manifest.rerun.interpreter import probe_env_in

    node = os.uname().nodename
    env, hardware, _ = probe_machine()
    if used is not None and used.python is not None:
        try:
            env = probe_env_in(used.python, env)
        except NoVerdictError as exc:
            return {"node": node, "error": exc.message, "hardware": hardware}
    if environ is not None:
        env = dict(env, variables=numerics_variables(dict(environ)))
    return {"node": node, "env": env, "hardware": hardware}


def checked_probes(doc: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The node probes of a job's result (``probes``: one per node; ``probe``: one node),
    each ``{"node", "env"}`` or ``{"node", "error"}``, with the node's ``hardware`` section
    when it sent one; None when the node sent none (a node running an older
    torch-manifest). ``where`` names the job in the refusal.

    Raises NoVerdictError (one sentence) for probes that are too large or not env sections."""
    from pydantic import ValidationError

    from manifest.models import Env, Hardware

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
        hardware: dict[str, Any] = {}
        if probe.get("hardware") is not None:
            try:
                hardware = {"hardware": Hardware.model_validate(probe["hardware"]).model_dump(
                    mode="json")}
            except ValidationError as exc:
                first = exc.errors()[0]
                at = ".".join(str(p) for p in first["loc"]) or "hardware"
                raise refuse(f"node {i}: hardware.{at}: {first['msg']}") from exc
        if isinstance(probe.get("error"), str) and "env" not in probe:
            checked.append({"node": probe["node"], "error": probe["error"][:500], **hardware})
            continue
        try:
            env = Env.model_validate(probe.get("env"))
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"]) or "env"
            raise refuse(f"node {i}: {at}: {first['msg']}") from exc
        checked.append({"node": probe["node"], "env": env.model_dump(mode="json"), **hardware})
    return checked
