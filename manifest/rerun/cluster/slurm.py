"""``--on slurm``: the re-run as a SLURM job, submitted through submitit.

submitit (``AutoExecutor``) writes the job's script, submits it with
``sbatch`` and watches it with one shared ``sacct`` poller; where SLURM is
absent (no ``sbatch`` on ``PATH``) or ``local = true`` is asked, its
``LocalExecutor`` runs the same job as a process on this machine, so the
flow is the same on a laptop and on a cluster.

The job is the remote entrypoint's ``run_bundle`` called as a function:
submitit pickles the call, so the bundle and the result both live in the
folder (``--folder`` / ``[tool.manifest.executors.slurm] folder``; default
``~/.cache/torch-manifest/slurm``), which must be a filesystem the compute
nodes share with the submitter. The job's stdout/stderr stay there; their
path is the report's log location.

With ``--env run`` the job first rebuilds the run's environment with uv under the
shared folder (``FOLDER/envs/<key>``, keyed by the environment's digest: the next job on
any node reuses it; built in a temporary folder and renamed, so concurrent jobs never see
half of one), proves it there, and runs the re-run with that venv's ``python``
(``manifest.rerun.environment.on_node``).

Placement follows the recorded topology: one task per node (the command
starts its own ranks, as ``torchrun`` does), ``cpus_per_task`` the recorded
thread count, and the recorded GPUs by model: a typed GRES
(``--gres=gpu:h100:2``) or, where ``[tool.manifest.executors.slurm] gpu_features`` names
the model as a node feature, ``--constraint`` with ``gpus_per_node``
(``manifest.rerun.cluster.hardware``). Partition, account and time limit come from the
user.

A multi-node run is one job of ``nodes=N``, ``tasks_per_node=1``: each task
is one node's torchrun (``manifest.rerun.cluster.placement``), its node rank
the task's node, the rendezvous on the job's first node (its address as
``scontrol show node`` gives it, ``NodeAddr``) at a port derived from the job
id, so every task computes the same endpoint without talking to the others.
Before submitting, ``sinfo`` says whether the partition has N nodes with the
CPUs one node needs and the recorded GPU model (GRES types and features); a layout it
cannot hold is said and nothing is submitted.

The job's state is SLURM's own: ``squeue``, then ``scontrol show job`` once
it has left the queue (submitit reads ``sacct``, which a cluster without
accounting storage does not answer). A cancel is ``scancel``, confirmed by
that state.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.rerun.cluster.remote_run import ClusterExecutor

if TYPE_CHECKING:
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.cluster.options import SlurmOptions
    from manifest.rerun.plan import RerunPlan


_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
          "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "FINISHED", "INTERRUPTED", "DONE"}
_QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD",
           "REQUEUE_FED", "SUSPENDED"}
PORT_BASE = 20000
PORT_SPAN = 20000


def gpu_gres(field: str) -> dict[str, int]:
    """GPUs per type in one node's ``sinfo %G`` field (``gpu:h100:2(S:0),gpu:a100:1``;
    an untyped ``gpu:2`` counts under ""): what a typed request can land on."""
    found: dict[str, int] = {}
    for item in field.split(","):
        words = item.split("(")[0].split(":")
        if words[0] != "gpu" or len(words) < 2 or not words[-1].isdigit():
            continue
        kind = words[1] if len(words) > 2 else ""
        found[kind] = found.get(kind, 0) + int(words[-1])
    return found


def rendezvous_port(job_id: str) -> int:
    """The port node 0 serves the rendezvous on: every task of the job derives the same one."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def node_address(name: str) -> str:
    """How the other nodes reach node ``name``: SLURM's ``NodeAddr`` for it, else the name."""
    try:
        proc = subprocess.run(["scontrol", "show", "node", name, "-o"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return name
    for word in proc.stdout.split():
        if word.startswith("NodeAddr="):
            return word.partition("=")[2] or name
    return name


def run_job(bundle: str, outdir: str, expect: str, nodes: int = 1) -> dict[str, Any]:
    """What each task of the SLURM job runs: the remote entrypoint, refusals as a result. In a
    multi-node job each task is one node: its node rank (the task's) and node 0's endpoint
    are set as torchrun's variables first, and the task's log says which global ranks its
    node held (``manifest: node I held global ranks …``)."""
    from manifest.errors import ManifestError
    from manifest.rerun.remote import RESULT_FORMAT, run_bundle

    out = Path(outdir)
    node: int | None = None
    if nodes > 1:
        import submitit

        from manifest.nodes.layout import node_env, rendezvous_host

        job = submitit.JobEnvironment()
        local = "SUBMITIT_LOCAL_JOB_ID" in os.environ
        addresses = (["127.0.0.1"] * nodes if local
                     else [node_address(name) for name in job.hostnames])
        node = int(job.global_rank)
        os.environ.update(node_env(node, rendezvous_host(addresses),
                                   rendezvous_port(str(job.job_id))))
        out = out / f"node-{node}"
    try:
        doc = run_bundle(Path(bundle), out, expect)
    except ManifestError as exc:
        return {"format": RESULT_FORMAT, "bundle": expect, "refused": exc.message}
    if node is not None:
        from manifest.nodes.layout import held_line

        sys.stdout.write(held_line(node, doc.get("records") or []))  # the task's log
        sys.stdout.flush()
    return doc


def _slurm_state(job_id: str) -> str | None:
    """SLURM's own state of the job: ``squeue``, then ``scontrol show job`` (None: unknown)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                              text=True, timeout=30, check=False)
        states = proc.stdout.split()
        if proc.returncode == 0 and states:
            return states[0]
        proc = subprocess.run(["scontrol", "show", "job", job_id, "-o"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in proc.stdout.split():
        if word.startswith("JobState="):
            return word.partition("=")[2]
    return None


class SlurmJob:
    """One submitit job (a :class:`~manifest.rerun.cluster.remote_run.Submission`)."""

    def __init__(self, job: Any, keep: Path, *, nodes: int = 1, real: bool = True) -> None:
        self.job = job
        self.job_id = str(job.job_id)
        self.where = str(job.paths.stdout)
        self.keep = keep
        self.nodes = nodes
        self.real = real

    def state(self) -> str:
        if self.real:
            return _slurm_state(self.job_id) or str(self.job.state)
        return str(self.job.state)

    def finished(self) -> bool:
        if self.job.done():
            return True
        # A job that ended without writing its result (killed, node failure): submitit would
        # wait on sacct, which a cluster without accounting storage never answers.
        return self.real and self.state().split()[0].rstrip("+") in _ENDED

    def queued(self) -> bool:
        return self.state() in _QUEUED

    def result(self) -> dict[str, Any] | None:
        from manifest.rerun.cluster.placement import combine_results

        try:
            docs: list[dict[str, Any]] = (self.job.results() if self.nodes > 1
                                          else [self.job.result()])
        except Exception:  # submitit re-raises the job's failure: there is no result
            return None
        return combine_results(docs)

    def log_tail(self) -> str:
        parts = []
        jobs = getattr(self.job, "_sub_jobs", None) or [self.job]
        for job in jobs:
            for log in (job.paths.stdout, job.paths.stderr):
                with contextlib.suppress(OSError):
                    parts.append(Path(log).read_text(encoding="utf-8", errors="replace"))
        return "\n".join(parts)

    def cancel(self) -> str | None:
        from manifest.rerun.cluster.remote_run import CANCEL_CONFIRM_S

        self.job.cancel(check=self.real)  # scancel; a failure raises with its stderr
        deadline = time.monotonic() + CANCEL_CONFIRM_S
        while time.monotonic() < deadline:
            state = self.state()
            if state.split()[0].rstrip("+") in _ENDED:
                return state
            time.sleep(0.5)
        return None


class SlurmExecutor(ClusterExecutor):
    """Submits each run of a plan as one SLURM job through submitit."""

    options: SlurmOptions

    def folder(self) -> Path:
        from manifest.rerun.cluster.options import default_folder

        return Path(self.options.folder) if self.options.folder else default_folder("slurm")

    def stage(self) -> Path:
        base = self.folder() / "bundles"
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="bundle-", dir=base))

    def env_cache(self) -> str | None:
        """``--env run``: the job rebuilds the run's environment under the shared folder
        (``FOLDER/envs/<key>``), so a second job on any node reuses it."""
        return str(self.folder() / "envs")

    def local(self) -> bool:
        return bool(self.options.local or shutil.which("sbatch") is None)

    def placement_problem(self, plan: RerunPlan) -> str | None:
        from manifest.rerun.cluster.placement import need_of, shortfall

        if self.local():
            return None
        need = need_of(plan.topology, plan.settings.threads)
        command = ["sinfo", "-h", "-N", "-o", "%N %c %G %t %f"]
        if self.options.partition:
            command += ["-p", self.options.partition]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None  # sbatch will say what is wrong
        free: dict[str, tuple[str, float, float]] = {}
        typed: dict[str, dict[str, int]] = {}
        features: dict[str, set[str]] = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) < 4 or parts[3].rstrip("*~#!%$@^-").lower() in {
                    "down", "drain", "drained", "draining", "fail", "failing", "future",
                    "maint", "unknown", "inval"}:
                continue
            typed[parts[0]] = gpu_gres(parts[2])
            features[parts[0]] = set(parts[4].split(",")) if len(parts) > 4 else set()
            free[parts[0]] = (parts[0], float(parts[1]), float(sum(typed[parts[0]].values())))
        problem = self.model_problem(plan, need.nodes, typed, features)
        if problem is not None:
            return problem
        return shortfall(need, list(free.values()))

    def gpu_request(self, plan: RerunPlan) -> dict[str, str]:
        """submitit's parameters for the recorded GPUs: typed GRES, or a feature constraint
        where the site names the model that way (``--other-gpu``: the count only)."""
        from manifest.rerun.cluster.hardware import GpuNeed, slurm_request

        gpu = plan.gpu or GpuNeed(model=None, count=0)
        if self.options.other_hardware or self.local():
            gpu = GpuNeed(model=None, count=gpu.count)
        return slurm_request(gpu, self.options.gpu_types, self.options.gpu_features)

    def model_problem(self, plan: RerunPlan, nodes: int, typed: dict[str, dict[str, int]],
                      features: dict[str, set[str]]) -> str | None:
        """Why no ``nodes`` nodes have the recorded model (GRES type or feature), or None."""
        from manifest.rerun.cluster.hardware import missing_model

        request = self.gpu_request(plan)
        if plan.gpu is None or not ({"slurm_gres", "slurm_constraint"} & set(request)):
            return None
        if "slurm_constraint" in request:
            feature = request["slurm_constraint"]
            per_node = [(n, sum(typed[n].values())) for n in typed if feature in features[n]]
            return missing_model(plan.gpu, {f for fs in features.values() for f in fs},
                                 wanted=f"feature {feature}", nodes=nodes, per_node=per_node)
        kind = request["slurm_gres"].split(":")[1]
        per_node = [(n, gres.get(kind, 0)) for n, gres in typed.items()]
        return missing_model(plan.gpu, {k for gres in typed.values() for k in gres if k},
                             wanted=f"GRES gpu:{kind}", nodes=nodes, per_node=per_node)

    def submit(self, plan: RerunPlan, bundle: Bundle) -> SlurmJob:
        import logging

        import submitit

        # submitit logs to stdout (a --json report's stream); its sacct warnings on a cluster
        # without accounting storage are answered by squeue/scontrol here.
        logging.getLogger("submitit").setLevel(logging.ERROR)

        from manifest.errors import NoVerdictError
        from manifest.redact import redact_text
        from manifest.rerun.cluster.placement import need_of

        need = need_of(plan.topology, plan.settings.threads)
        logs = self.folder() / "logs"
        cluster = "local" if self.local() else None
        # Isolated (-I): neither the job's working directory nor PYTHONPATH is on sys.path,
        # so the entrypoint that checks the bundle is the installed package.
        python = f"{shlex.quote(sys.executable)} -I"
        executor = submitit.AutoExecutor(folder=logs, cluster=cluster, local_python=python,
                                         slurm_python=python)
        params: dict[str, Any] = {
            "name": f"manifest-{plan.verb}", "nodes": need.nodes,
            "tasks_per_node": 1, "cpus_per_task": need.cpus,
            "timeout_min": self.options.time_min or 60,
        }
        gpus = self.gpu_request(plan)
        if "gpus_per_node" in gpus:
            params["gpus_per_node"] = int(gpus.pop("gpus_per_node"))
        if cluster is None:
            params.update(gpus)
            params.update({f"slurm_{k}": v for k, v in (
                ("partition", self.options.partition), ("account", self.options.account))
                if v})
        executor.update_parameters(**params)
        outdir = bundle.path.parent / "out"
        try:
            job = executor.submit(run_job, str(bundle.path), str(outdir), bundle.name,
                                  need.nodes)
        except Exception as exc:  # sbatch's refusal (submitit raises its stderr)
            raise NoVerdictError(f"SLURM refused the job: {redact_text(str(exc))}") from exc
        return SlurmJob(job, outdir, nodes=need.nodes, real=cluster is None)
