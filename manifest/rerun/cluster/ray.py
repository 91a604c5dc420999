"""``--on ray``: the re-run as a Ray job (Ray Jobs API, ``JobSubmissionClient``).

The bundle is the job's ``working_dir``: Ray zips and uploads it to the
cluster, content-addressed by its own hash, and unpacks it on the node that
runs the entrypoint. Ray leaves out files a ``.gitignore`` names unless told
otherwise, and the scratch tree's own ``.gitignore`` names its datasets, so the
upload is made with ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``; a file dropped
anyway (a ``.rayignore``) is refused on arrival, not silently missed.

The entrypoint runs with ``--emit``: its result comes back in the job's log
between marker lines, because a Ray cluster shares no filesystem with the
submitter. The job reserves the recorded run's CPUs (its thread count), GPUs and
GPU model (``accelerator_type:<T>``, the resource Ray declares on a node from NVML's
name: ``manifest.rerun.cluster.hardware``), so Ray places it on a node that has them.

A multi-node plan's entrypoint is the driver ``manifest.rerun.cluster.ray_nodes``
instead: a placement group of one bundle per recorded node, ``STRICT_SPREAD``,
and one torchrun per node meeting at node 0. Before submitting, the nodes Ray
reports (``ray.util.state.list_nodes`` through the same address) are checked
against the layout: a layout no set of alive nodes can hold is said and
nothing is submitted. A job Ray keeps ``PENDING`` is said while it waits.

A cancel is ``stop_job``, confirmed by the job's status reaching ``STOPPED``
(or another end state); an error from the client is said, not swallowed.

The address is the one given (``--address`` or ``[tool.manifest.executors.ray]``),
kept without credentials; ``RAY_ADDRESS`` in the environment supplies the full
one (a token in its URL stays out of the plan, the bundle and the report).
"""

from __future__ import annotations

import os
import shlex
import time
import uuid
from typing import TYPE_CHECKING, Any

from manifest.rerun.cluster.remote_run import ClusterExecutor

if TYPE_CHECKING:
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.cluster.options import RayOptions
    from manifest.rerun.plan import RerunPlan

_TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def _address(given: str | None) -> str:
    """The address to connect to: ``RAY_ADDRESS`` when it is the given one with credentials."""
    from manifest.errors import UsageError
    from manifest.redact import strip_url_credentials

    env = os.environ.get("RAY_ADDRESS")
    if given is None:
        if env is None:
            raise UsageError("--on ray needs the cluster's address: --address "
                             "http://HEAD:8265, [tool.manifest.executors.ray] address, "
                             "or RAY_ADDRESS.")
        return env
    if env is not None and strip_url_credentials(env) == given:
        return env
    return given


class RayJob:
    """One submitted Ray job (a :class:`~manifest.rerun.cluster.remote_run.Submission`)."""

    def __init__(self, client: Any, job_id: str, dashboard: str) -> None:
        self.client = client
        self.job_id = job_id
        self.where = f"{dashboard}/#/jobs/{job_id}"
        self._logs: str | None = None

    def state(self) -> str:
        return str(self.client.get_job_status(self.job_id).value)

    def finished(self) -> bool:
        return self.state() in _TERMINAL

    def _log(self) -> str:
        if self._logs is None:
            self._logs = str(self.client.get_job_logs(self.job_id))
        return self._logs

    def result(self) -> dict[str, Any] | None:
        from manifest.rerun.remote import decode_result

        return decode_result(self._log())

    def log_tail(self) -> str:
        from manifest.rerun.remote import BEGIN

        log = self._log()
        return log[:log.find(BEGIN)] if BEGIN in log else log

    def queued(self) -> bool:
        return self.state() == "PENDING"

    def cancel(self) -> str | None:
        from manifest.rerun.cluster.remote_run import CANCEL_CONFIRM_S

        state = self.state()
        if state not in _TERMINAL:
            self.client.stop_job(self.job_id)  # an unreachable cluster raises: said
        deadline = time.monotonic() + CANCEL_CONFIRM_S
        while time.monotonic() < deadline:
            state = self.state()
            if state in _TERMINAL:
                return state
            time.sleep(0.5)
        return None


class RayExecutor(ClusterExecutor):
    """Submits each run of a plan as a Ray job."""

    options: RayOptions

    def gpu_resources(self, plan: RerunPlan) -> dict[str, float]:
        """The recorded GPU model as Ray's ``accelerator_type`` resource (none: no GPU, or
        ``--other-gpu``)."""
        from manifest.rerun.cluster.hardware import ray_resources

        if plan.gpu is None or self.options.other_hardware:
            return {}
        return ray_resources(plan.gpu, self.options.accelerator_types)

    def placement_problem(self, plan: RerunPlan) -> str | None:
        from manifest.rerun.cluster.hardware import missing_model
        from manifest.rerun.cluster.placement import need_of, shortfall

        try:
            from ray.util.state import list_nodes

            nodes = list_nodes(address=_address(self.options.address), detail=True,
                               timeout=30, raise_on_missing_output=False)
        except Exception:  # the state API unreachable: submission will say what is wrong
            return None
        alive = [n for n in nodes if n.state == "ALIVE"]
        need = need_of(plan.topology, plan.settings.threads)
        wanted = self.gpu_resources(plan)
        if wanted and plan.gpu is not None:
            (key,) = wanted
            declared = [k.removeprefix("accelerator_type:") for n in alive
                        for k in n.resources_total if k.startswith("accelerator_type:")]
            per_node = [(str(n.node_id), int(n.resources_total.get("GPU", 0)))
                        for n in alive if key in n.resources_total]
            problem = missing_model(plan.gpu, declared, wanted=key, nodes=need.nodes,
                                    per_node=per_node)
            if problem is not None:
                return problem
            alive = [n for n in alive if key in n.resources_total]
        free = [(f"{n.node_ip}:{str(n.node_id)[:8]}", float(n.resources_total.get("CPU", 0)),
                 float(n.resources_total.get("GPU", 0))) for n in alive]
        return shortfall(need, free)

    def submit(self, plan: RerunPlan, bundle: Bundle) -> RayJob:
        from ray.job_submission import JobSubmissionClient

        from manifest.errors import NoVerdictError
        from manifest.redact import redact_text, strip_url_credentials
        from manifest.rerun.cluster.placement import need_of

        address = _address(self.options.address)
        try:
            client = JobSubmissionClient(address)
        except (ConnectionError, RuntimeError) as exc:
            raise NoVerdictError(f"cannot reach Ray Jobs at {strip_url_credentials(address)}: "
                                 f"{redact_text(str(exc))}") from exc
        job_id = f"manifest-{bundle.name.removeprefix('blake3:')[:12]}-{uuid.uuid4().hex[:8]}"
        need = need_of(plan.topology, plan.settings.threads)
        model = self.gpu_resources(plan)
        words: tuple[str | int, ...] = (
            self.options.python, "-I", "-m", "manifest.rerun.remote", ".", "--expect",
            bundle.name, "--emit")
        if need.nodes > 1:
            words = (self.options.python, "-I", "-m", "manifest.rerun.cluster.ray_nodes", ".",
                     "--expect", bundle.name, "--nodes", need.nodes, "--cpus", need.cpus,
                     "--gpus", need.gpus, "--python", self.options.python,
                     *(word for k, v in model.items() for word in ("--resource", f"{k}={v}")))
        entrypoint = " ".join(shlex.quote(str(a)) for a in words)
        import logging

        # Ray's client logs each upload at INFO on stderr: the verb's progress is its own.
        for logger in [*logging.root.manager.loggerDict, "ray"]:
            if logger == "ray" or logger.startswith("ray."):
                logging.getLogger(logger).setLevel(logging.WARNING)
        previous = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE")
        os.environ["RAY_RUNTIME_ENV_IGNORE_GITIGNORE"] = "1"
        try:
            # A head that has just started answers "No available agent" until its job
            # agent is up (seconds): retried for up to a minute, anything else is final.
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.submit_job(
                        entrypoint=entrypoint, submission_id=job_id,
                        runtime_env={"working_dir": str(bundle.path)},
                        # A multi-node driver only waits: its nodes hold the resources.
                        entrypoint_num_cpus=need.cpus if need.nodes == 1 else 0,
                        entrypoint_num_gpus=(need.gpus or None) if need.nodes == 1 else None,
                        entrypoint_resources=(model or None) if need.nodes == 1 else None,
                        metadata={"manifest.bundle": bundle.name, "manifest.verb": plan.verb})
                    break
                except RuntimeError as exc:
                    if "No available agent" not in str(exc) or time.monotonic() > deadline:
                        raise NoVerdictError(
                            f"Ray at {strip_url_credentials(address)} refused the job: "
                            f"{redact_text(str(exc))}") from exc
                    time.sleep(2)
        finally:
            if previous is None:
                os.environ.pop("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", None)
            else:
                os.environ["RAY_RUNTIME_ENV_IGNORE_GITIGNORE"] = previous
        return RayJob(client, job_id, strip_url_credentials(address).rstrip("/"))
