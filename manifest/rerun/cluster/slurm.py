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

Placement follows the recorded topology: one task per node (the command
starts its own ranks, as ``torchrun`` does), ``cpus_per_task`` the recorded
thread count, ``gpus_per_node`` the recorded GPU count. Partition, account
and time limit come from the user.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.rerun.cluster.remote_run import ClusterExecutor

if TYPE_CHECKING:
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.plan import RerunPlan


def run_job(bundle: str, outdir: str, expect: str) -> dict[str, Any]:
    """What the SLURM job runs: the remote entrypoint, refusals as a result."""
    from manifest.errors import ManifestError
    from manifest.rerun.remote import RESULT_FORMAT, run_bundle

    try:
        return run_bundle(Path(bundle), Path(outdir), expect)
    except ManifestError as exc:
        return {"format": RESULT_FORMAT, "bundle": expect, "refused": exc.message}


class SlurmJob:
    """One submitit job (a :class:`~manifest.rerun.cluster.remote_run.Submission`)."""

    def __init__(self, job: Any, keep: Path) -> None:
        self.job = job
        self.job_id = str(job.job_id)
        self.where = str(job.paths.stdout)
        self.keep = keep

    def state(self) -> str:
        return str(self.job.state)

    def finished(self) -> bool:
        return bool(self.job.done())

    def result(self) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = self.job.result()
        except Exception:  # submitit re-raises the job's failure: there is no result
            return None
        return doc

    def log_tail(self) -> str:
        parts = []
        for log in (self.job.paths.stdout, self.job.paths.stderr):
            with contextlib.suppress(OSError):
                parts.append(Path(log).read_text(encoding="utf-8", errors="replace"))
        return "\n".join(parts)

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.job.cancel(check=False)


class SlurmExecutor(ClusterExecutor):
    """Submits each run of a plan as one SLURM job through submitit."""

    def folder(self) -> Path:
        from manifest.rerun.cluster import default_folder

        return Path(self.options.folder) if self.options.folder else default_folder("slurm")

    def stage(self) -> Path:
        base = self.folder() / "bundles"
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="bundle-", dir=base))

    def submit(self, plan: RerunPlan, bundle: Bundle) -> SlurmJob:
        import submitit

        topology = plan.topology or {}
        logs = self.folder() / "logs"
        cluster = "local" if self.options.local or shutil.which("sbatch") is None else None
        executor = submitit.AutoExecutor(folder=logs, cluster=cluster)
        params: dict[str, Any] = {
            "name": f"manifest-{plan.verb}", "nodes": int(topology.get("nodes") or 1),
            "tasks_per_node": 1, "cpus_per_task": plan.settings.threads,
            "timeout_min": self.options.time_min or 60,
        }
        if topology.get("gpus"):
            params["gpus_per_node"] = int(topology["gpus"])
        if cluster is None:
            params.update({f"slurm_{k}": v for k, v in (
                ("partition", self.options.partition), ("account", self.options.account))
                if v})
        executor.update_parameters(**params)
        outdir = bundle.path.parent / "out"
        job = executor.submit(run_job, str(bundle.path), str(outdir), bundle.name)
        return SlurmJob(job, outdir)
