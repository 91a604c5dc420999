"""The flow every cluster executor shares: bundle, submit, wait, bring the records back.

A cluster executor only says how to submit a bundle and how to watch its job
(:class:`Submission`, the same idea as submitit's ``Job`` and Ray's
``JobSubmissionClient``: ``status``, ``logs``, ``cancel``). Everything else is
here, once:

* the workspace becomes a bundle (``manifest.rerun.cluster.bundle``); its
  patch is the code probe's over the scratch clone, which must reproduce the
  recorded ``code.diff_digest`` before anything is shipped;
* the job is watched with backoff (0.2 s doubling to 2 s: one status call per
  interval whatever the job does; a short job, as each of explain's four
  runs can be, is seen to end within 2 s); Ctrl-C cancels the job and
  re-raises; the timeout (``--timeout``) cancels it and gives no verdict;
* the remote result (``manifest.rerun.remote``) becomes a ``LaunchResult``:
  records and op streams as a local run has them, files the run wrote into
  the verb's writable directories written there, each output's tensor table
  (``tables``), the output files themselves only with ``--fetch-outputs``;
* a job that ends without a result gives no verdict with its log's last lines,
  redacted (``manifest.redact``); a bundle refused on arrival says why.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from manifest.errors import NoVerdictError

if TYPE_CHECKING:
    from manifest.capture.launcher import LaunchResult, LaunchSettings
    from manifest.rerun.cluster import ClusterOptions
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace

TAIL_LINES = 40
POLL_MAX_S = 2.0


class Submission(Protocol):
    """One submitted job (what each cluster executor returns from ``submit``)."""

    job_id: str
    where: str
    """Dashboard URL or log location, credentials stripped."""

    def finished(self) -> bool: ...

    def state(self) -> str: ...

    def result(self) -> dict[str, Any] | None:
        """The entrypoint's result document, once finished (None: it wrote none)."""

    def log_tail(self) -> str: ...

    def cancel(self) -> None: ...


@dataclass
class RunFigures:
    """What one remote run cost: for the report and ``benchmarks/cluster_overhead.py``."""

    bundle_s: float = 0.0
    submit_to_result_s: float = 0.0
    shipped_bytes: int = 0
    returned_bytes: int = 0
    files: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def redacted_tail(text: str, argv: Sequence[str] = ()) -> str:
    from manifest.redact import redact_text

    lines = [line for line in text.splitlines() if line.strip()]
    return redact_text("\n".join(lines[-TAIL_LINES:]), argv=argv)


def topology_of(plan: RerunPlan) -> dict[str, Any]:
    return dict(plan.topology or {})


class ClusterExecutor:
    """Base of the Ray, SLURM and Kubernetes executors (``Executor`` of the re-run engine)."""

    def __init__(self, options: ClusterOptions) -> None:
        self.options = options
        self.last: RunFigures | None = None

    @property
    def name(self) -> str:
        return self.options.on

    # -- what each executor provides
    def stage(self) -> Path:
        """A directory for the bundle that the job will see (default: a private temp dir)."""
        return Path(tempfile.mkdtemp(prefix="manifest-bundle-"))

    def submit(self, plan: RerunPlan, bundle: Bundle) -> Submission:
        raise NotImplementedError

    # -- the shared flow
    def run(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
            env: dict[str, str], *, writable: Sequence[Path] = ()) -> LaunchResult:
        import dataclasses
        import shutil

        from manifest.probes.code import probe_code
        from manifest.rerun.cluster.bundle import build_bundle, tree_files

        figures = RunFigures()
        started = time.perf_counter()
        patch = None
        if plan.diff_digest is not None:
            patch = probe_code(workspace.tree).patch
        only = None
        if workspace.tree == workspace.root:  # the user's own tree, not a scratch clone
            only = tree_files(workspace.tree, [i.source for i in plan.inputs])
        staged = self.stage()
        try:
            bundle = build_bundle(
                staged / "bundle", tree=workspace.tree, cwd=workspace.cwd,
                mount_at=workspace.mount_at, argv=plan.argv, outputs=plan.outputs,
                patch=patch, commit=plan.commit, diff_digest=plan.diff_digest,
                settings=dataclasses.asdict(settings), env=env, writable=writable,
                topology=topology_of(plan), fetch_outputs=self.options.fetch_outputs,
                sandbox=plan.sandbox_requested, network=plan.network,
                require_sandbox=plan.require_sandbox, only=only)
            figures.bundle_s = time.perf_counter() - started
            figures.shipped_bytes, figures.files = bundle.bytes, bundle.files
            submitted = time.perf_counter()
            job = self.submit(plan, bundle)
            doc = self._wait(job, plan)
            figures.submit_to_result_s = time.perf_counter() - submitted
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        figures.returned_bytes = len(json.dumps(doc))
        self.last = figures
        return self._result(doc, job, bundle.name, workspace, writable, figures)

    def _wait(self, job: Submission, plan: RerunPlan) -> dict[str, Any]:
        deadline = (time.monotonic() + self.options.timeout_s
                    if self.options.timeout_s else None)
        delay = 0.2
        try:
            while not job.finished():
                if deadline is not None and time.monotonic() > deadline:
                    job.cancel()
                    raise NoVerdictError(
                        f"the {self.name} job {job.job_id} did not finish within "
                        f"{self.options.timeout_s:g} s (--timeout); it was cancelled.")
                time.sleep(delay)
                delay = min(delay * 2, POLL_MAX_S)
        except KeyboardInterrupt:
            job.cancel()
            raise
        doc = job.result()
        if doc is None:
            raise NoVerdictError(
                f"the {self.name} job {job.job_id} ended ({job.state()}) without a result; "
                f"its log ({job.where}) ends with:\n"
                + redacted_tail(job.log_tail(), plan.argv))
        if "refused" in doc:
            raise NoVerdictError(f"the {self.name} job {job.job_id} refused the bundle on "
                                 f"arrival: {doc['refused']}")
        return doc

    def _result(self, doc: dict[str, Any], job: Submission, name: str, workspace: Workspace,
                writable: Sequence[Path], figures: RunFigures) -> LaunchResult:
        from manifest.capture.launcher import LaunchResult
        from manifest.models import Artifact

        seen = str(workspace.mount_at)

        def here(text: str) -> str:
            return text.replace("{tree}", seen)

        for directory, files in zip(writable, doc["writable"], strict=False):
            for rel, data in files.items():
                target = directory / rel
                if not target.resolve().is_relative_to(directory.resolve()):
                    continue  # a name that climbs out is not ours to write
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(data))
        tables: tuple[list[Any], list[str]] | None = (
            [Artifact.model_validate(a) for a in doc["artifacts"]], list(doc["missing"]))
        if doc.get("outputs"):
            for rel, data in doc["outputs"].items():
                target = workspace.cwd / rel
                if target.resolve().is_relative_to(workspace.tree.resolve()):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(base64.b64decode(data))
            tables = None  # fetched: read and compared here, with numbers
        exit_code = int(doc["exit_code"])
        job_info: dict[str, Any] = {
            "executor": self.name, "job_id": job.job_id, "where": job.where,
            "bundle": name, "confinement": doc.get("confinement"),
            "network": _network_policy(doc),
            "bytes_shipped": figures.shipped_bytes, "bytes_returned": figures.returned_bytes,
            "files_shipped": figures.files,
            "submit_to_result_s": round(figures.submit_to_result_s, 3),
            "outputs_fetched": tables is None,
        }
        if exit_code != 0:
            job_info["log_tail"] = redacted_tail(job.log_tail())
        return LaunchResult(
            exit_code=exit_code,
            records=json.loads(here(json.dumps(doc["records"]))),
            env=dict(doc["env"]),
            op_streams={k: base64.b64decode(v) for k, v in doc["op_streams"].items()},
            opened={here(k): v for k, v in doc["opened"].items()},
            modules=frozenset(doc["modules"]), started_ns=int(doc["started_ns"]),
            outside=list(doc["outside"]), workers=int(doc["workers"]),
            tables=tables, job=job_info)


def _network_policy(doc: dict[str, Any]) -> str:
    where = str(doc.get("confinement") or "")
    if "no network" in where:
        return "no network (bubblewrap on the host)"
    if "network allowed" in where:
        return "network allowed (--network)"
    return "not restricted by manifest on the host: the cluster's own policy applies"
