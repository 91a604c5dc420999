"""The flow every cluster executor shares: bundle, submit, wait, bring the records back.

A cluster executor only says how to submit a bundle and how to watch its job
(:class:`Submission`, the same idea as submitit's ``Job`` and Ray's
``JobSubmissionClient``: ``status``, ``logs``, ``cancel``). Everything else is
here, once:

* the workspace becomes a bundle (``manifest.rerun.cluster.bundle``); its
  patch is the code probe's over the scratch clone, which must reproduce the
  recorded ``code.diff_digest`` before anything is shipped;
* a layout the cluster cannot place (too few nodes with the CPUs and GPUs one
  node needs, ``manifest.rerun.cluster.placement``) is said before anything
  is submitted, from the engine's own view of its nodes;
* the job is watched with backoff (0.2 s doubling to 2 s: one status call per
  interval whatever the job does; a short job, as each of explain's four
  runs can be, is seen to end within 2 s). Its id and where to follow it are
  said when it is submitted; a job still queued is said every 30 s, and one
  not started after ``PENDING_LIMIT_S`` (10 minutes) is cancelled as
  unplaceable. The wait has a default limit (``DEFAULT_TIMEOUT_S``, 2 hours;
  ``--timeout`` sets another). Ctrl-C and SIGTERM (what a CI runner's own
  timeout sends) cancel the job and re-raise; the timeout cancels it and
  gives no verdict. A cancel is only reported as done when the engine's own
  status says the job ended (:meth:`Submission.cancel` returns that state);
* a multi-node plan (``plan.layout``) ships one bundle that every node checks
  and runs, with the network allowed where the host confines it (the nodes
  meet over TCP); the nodes' results become one
  (``manifest.rerun.cluster.placement.combine_results``);
* the remote result (``manifest.rerun.remote``) becomes a ``LaunchResult``:
  records and op streams as a local run has them, files the run wrote into
  the verb's writable directories written there, each output's tensor table
  (``tables``), the output files themselves only with ``--fetch-outputs``;
* a job that ends without a result gives no verdict with its log's last lines,
  redacted (``manifest.redact``); a bundle refused on arrival says why;
* ``--env run``: the bundle carries the node's rebuild request
  (``manifest.rerun.environment.NodeRebuild``; :meth:`ClusterExecutor.env_cache` says
  where the node keeps rebuilt venvs), the node rebuilds and proves the run's environment
  before anything runs, and each node's environment line and proof come back in the job
  (``job["environment"]``, the report's environment line);
* progress sentences (submitted, queued, data shipped) go to the options' ``note``
  as they happen (the CLI renders them); without one they are kept and returned with the
  job (``job["notes"]``): the library never prints.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from manifest.errors import NoVerdictError

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchResult, LaunchSettings
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.cluster.options import ClusterOptions
    from manifest.rerun.plan import RerunPlan
    from manifest.rerun.workspace import Workspace

TAIL_LINES = 40
POLL_MAX_S = 2.0
DEFAULT_TIMEOUT_S = 2 * 3600.0
"""How long a verb waits for a job when ``--timeout`` is not given."""
PENDING_LIMIT_S = 600.0
"""A job the engine has not started after this long is cancelled: it cannot be placed."""
QUEUED_NOTE_S = 30.0
CANCEL_CONFIRM_S = 60.0
"""How long a cancel waits for the engine to say the job ended."""


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

    def queued(self) -> bool:
        """Whether the engine has not started the job yet (waiting for resources)."""

    def cancel(self) -> str | None:
        """Ask the engine to stop the job, then wait (up to ``CANCEL_CONFIRM_S``) for its own
        status to say it ended: that state, or None when it never said so."""


@dataclass
class RunFigures:
    """What one remote run cost: for the report and ``benchmarks/cluster_overhead.py``."""

    bundle_s: float = 0.0
    submit_to_result_s: float = 0.0
    shipped_bytes: int = 0
    returned_bytes: int = 0
    files: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Started:
    """A submitted job and what :meth:`ClusterExecutor.finish` needs to make its result."""

    job: Submission
    plan: RerunPlan
    workspace: Workspace
    writable: tuple[Path, ...]
    figures: RunFigures
    bundle: str
    staged: Path
    """The staging directory, removed once the job is finished or abandoned."""
    submitted: float
    since: float
    """``time.monotonic()`` at submission: the wait's limit counts from here, so jobs waited
    for one after another each get the same time from their own submission."""


def redacted_tail(text: str, argv: Sequence[str] = ()) -> str:
    from manifest.redact import redact_text

    lines = [line for line in text.splitlines() if line.strip()]
    return redact_text("\n".join(lines[-TAIL_LINES:]), argv=argv)


def topology_of(plan: RerunPlan) -> dict[str, Any]:
    return dict(plan.topology or {})


class ClusterExecutor:
    """Base of the Ray, SLURM and Kubernetes executors (``Executor`` of the re-run engine)."""

    def __init__(self, options: ClusterOptions,
                 note: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.last: RunFigures | None = None
        self.notes: list[str] = []
        """Progress sentences kept when nobody receives them as they happen."""
        self.note = note or options.note or self.notes.append

    @property
    def name(self) -> str:
        return self.options.on

    # -- what each executor provides
    def stage(self) -> Path:
        """A directory for the bundle that the job will see (default: a private temp dir)."""
        return Path(tempfile.mkdtemp(prefix="manifest-bundle-"))

    def submit(self, plan: RerunPlan, bundle: Bundle) -> Submission:
        raise NotImplementedError

    def env_cache(self) -> str | None:
        """Where the node keeps rebuilt environments (``--env run``), a path every node
        sees; None: the node's own user cache (``manifest.pyenv.cache.cache_root``)."""
        return None

    def environment_request(self) -> dict[str, Any] | None:
        """``--env run``'s request as the bundle carries it, with :meth:`env_cache`."""
        request = self.options.environment
        if request is None:
            return None
        return dict(request, cache=self.env_cache())

    def placement_problem(self, plan: RerunPlan) -> str | None:
        """Why the cluster cannot place the plan's layout, asked of the engine before
        anything is submitted (None: it can, or the engine cannot be asked)."""
        return None

    def _say_gpu(self, plan: RerunPlan) -> None:
        """What of the recorded GPUs the request cannot hold, said before submitting."""
        from manifest.rerun.cluster.hardware import shown

        gpu = plan.gpu
        if gpu is None or gpu.model is None or not gpu.count:
            return
        if self.options.other_hardware:
            self.note(f"--other-gpu: the re-run may run on another GPU model than the "
                      f"recorded {shown(gpu.model)}; across GPU models no numeric verdict is "
                      "given (the device rule).")
        for what in gpu.unexpressed:
            self.note(f"the run recorded {what}; --on {self.name} cannot request it, so the "
                      "node's own mode applies (the verdict's drift names a difference).")

    # -- the shared flow
    def run(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
            env: dict[str, str], *, writable: Sequence[Path] = ()) -> LaunchResult:
        return self.finish(self.start(plan, workspace, settings, env, writable=writable))

    def start(self, plan: RerunPlan, workspace: Workspace, settings: LaunchSettings,
              env: dict[str, str], *, writable: Sequence[Path] = ()) -> Started:
        """Bundle the workspace and submit it; the job runs while the caller goes on (verify
        --segments submits every stretch, then waits for each: :meth:`finish`)."""
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
        nodes = int((plan.topology or {}).get("nodes") or 1)
        problem = self.placement_problem(plan)
        if problem is not None:
            raise NoVerdictError(f"{self.name} cannot place this re-run: {problem}; nothing "
                                 "was submitted.")
        self._say_gpu(plan)
        inputs, data = self._outside_data(plan, workspace.root)
        staged = self.stage()
        try:
            bundle = build_bundle(
                staged / "bundle", tree=workspace.tree, cwd=workspace.cwd,
                mount_at=workspace.mount_at, argv=plan.argv, outputs=plan.outputs,
                patch=patch, commit=plan.commit, diff_digest=plan.diff_digest,
                settings=dataclasses.asdict(settings), env=env, writable=writable,
                topology=topology_of(plan), fetch_outputs=self.options.fetch_outputs,
                sandbox=plan.sandbox_requested, network=plan.network or nodes > 1,
                require_sandbox=plan.require_sandbox, only=only, inputs=inputs,
                shared=[d["path"] for d in data if d["how"].startswith("shared")],
                environment=self.environment_request())
            figures.bundle_s = time.perf_counter() - started
            figures.shipped_bytes, figures.files = bundle.bytes, bundle.files
            submitted = time.perf_counter()
            job = self.submit(plan, bundle)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        if not self.options.prints_only:
            self.note(f"{self.name} job {job.job_id} submitted"
                      + (f" ({plan.layout})" if plan.layout else "") + f"; follow it at "
                      f"{job.where}")
        figures.extra["data"] = data
        return Started(job=job, plan=plan, workspace=workspace, writable=tuple(writable),
                       figures=figures, bundle=bundle.name, staged=staged, submitted=submitted,
                       since=time.monotonic())

    def finish(self, started: Started) -> LaunchResult:
        """Wait for a started job (Ctrl-C, SIGTERM and the time limit cancel it) and turn
        its result into the launcher's records."""
        import shutil

        try:
            doc = self._wait(started.job, started.plan, since=started.since)
        finally:
            shutil.rmtree(started.staged, ignore_errors=True)
        figures = started.figures
        figures.submit_to_result_s = time.perf_counter() - started.submitted
        figures.returned_bytes = len(json.dumps(doc))
        self.last = figures
        return self._result(doc, started.job, started.bundle, started.workspace,
                            started.writable, figures)

    def abandon(self, started: Started) -> str:
        """Cancel a started job nobody will wait for (another one failed or was
        interrupted); what the engine said."""
        import shutil

        try:
            return self._cancelled(started.job)
        finally:
            shutil.rmtree(started.staged, ignore_errors=True)

    def _outside_data(self, plan: RerunPlan, root: Path
                      ) -> tuple[list[tuple[Path, str, str | None]], list[dict[str, Any]]]:
        """Data outside the repository: (what goes in the bundle, one line per dataset for
        the report). Under a ``--shared-path`` it is mounted from the same path where the
        job runs; otherwise it is bundled, content-addressed like every file, up to
        ``max_data_bytes`` in all; over that is one sentence (exit 2) before anything is
        built. Each is said before submission, never silently left behind."""
        import os

        from manifest.errors import UsageError

        shipped: list[tuple[Path, str, str | None]] = []
        said: list[dict[str, Any]] = []
        total = 0
        for item in plan.inputs:
            if not item.outside:
                continue
            named = item.path if os.path.isabs(item.path) else os.path.normpath(
                root / item.path)
            shared = next((sp for sp in self.options.shared_paths
                           if Path(named).is_relative_to(sp)
                           or Path(item.source).is_relative_to(sp)), None)
            if shared is not None:
                said.append({"path": named, "how": f"shared: mounted from the same path "
                                                   f"(--shared-path {shared})"})
                continue
            source = Path(item.source)
            size = (source.stat().st_size if source.is_file() else
                    sum(f.stat().st_size for f in source.rglob("*") if f.is_file()))
            total += size
            if total > self.options.max_data_bytes:
                raise UsageError(
                    f"--on {self.name}: the data outside the repository ({named}, "
                    f"{size / 2**20:.1f} MiB; {total / 2**20:.1f} MiB in all) is over the "
                    f"{self.options.max_data_bytes / 2**20:.0f} MiB that travels in a bundle.",
                    hint=f"If every node of the cluster sees it at that path, pass "
                         f"--shared-path {os.path.dirname(named) or named}; or raise "
                         f"max_data_bytes in [tool.manifest.executors.{self.name}].")
            shipped.append((source, named, os.path.relpath(named, root)))
            said.append({"path": named, "how": "bundled (content-addressed)", "bytes": size})
        for line in said:
            self.note(f"data outside the repository: {line['path']}: {line['how']}"
                      + (f", {line['bytes']} bytes" if "bytes" in line else ""))
        return shipped, said

    def _wait(self, job: Submission, plan: RerunPlan, *, since: float | None = None
              ) -> dict[str, Any]:
        limit = self.options.timeout_s or DEFAULT_TIMEOUT_S
        flag = "--timeout" if self.options.timeout_s else "the default wait; --timeout sets another"
        started = since or time.monotonic()
        deadline = started + limit
        next_note = started + QUEUED_NOTE_S
        delay = 0.2
        try:
            with _sigterm_as_interrupt():
                while not job.finished():
                    now = time.monotonic()
                    if now > deadline:
                        raise NoVerdictError(
                            f"the {self.name} job {job.job_id} did not finish within {limit:g} s "
                            f"({flag}); {self._cancelled(job)}")
                    if now > next_note and job.queued():
                        waited = now - started
                        if waited > PENDING_LIMIT_S:
                            raise NoVerdictError(
                                f"the {self.name} job {job.job_id} was not started within "
                                f"{PENDING_LIMIT_S:g} s ({job.state()}): the cluster cannot place "
                                f"it now; {self._cancelled(job)}")
                        self.note(f"{self.name} job {job.job_id} still {job.state()} after "
                                  f"{waited:.0f} s: waiting for resources (see {job.where})")
                        next_note = now + QUEUED_NOTE_S
                    time.sleep(delay)
                    delay = min(delay * 2, POLL_MAX_S)
        except KeyboardInterrupt:
            self.note(f"interrupted: {self._cancelled(job)}")
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
        if "printed" in doc:  # k8s --dry-run: the objects, nothing ran
            return doc
        if "unplaced" in doc:
            raise NoVerdictError(f"the {self.name} job {job.job_id} could not place its nodes: "
                                 f"{doc['unplaced']}")
        return doc

    def _cancelled(self, job: Submission) -> str:
        """Cancel ``job`` and say what the engine reported (never assumed)."""
        try:
            state = job.cancel()
        except Exception as exc:  # said to the user, with the job id
            from manifest.redact import redact_text

            return (f"cancelling it failed ({redact_text(str(exc))}): stop job {job.job_id} "
                    f"yourself ({job.where})")
        if state is None:
            return (f"it was asked to stop, but {self.name} still reports it "
                    f"{job.state()} after {CANCEL_CONFIRM_S:g} s: check {job.where}")
        return f"it was cancelled ({self.name} reports {state})"

    def _result(self, doc: dict[str, Any], job: Submission, name: str, workspace: Workspace,
                writable: Sequence[Path], figures: RunFigures) -> LaunchResult:
        from manifest.launch.runner import LaunchResult
        from manifest.models import Artifact

        if "printed" in doc:  # k8s --dry-run: returned, never raised; nothing ran
            return LaunchResult(exit_code=0, records=[], env={}, job={
                "executor": self.name, "job_id": job.job_id, "where": job.where,
                "bundle": name, "printed": doc["printed"]})
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
            "nodes": int(doc.get("nodes") or 1),
            **({"placed_on": list(doc["placed_on"])} if doc.get("placed_on") else {}),
            **({"data": figures.extra["data"]} if figures.extra.get("data") else {}),
        }
        from manifest.rerun.environment import nodes_environment

        used = nodes_environment(list(doc.get("environments") or ([doc["environment"]]
                                                               if doc.get("environment")
                                                               else [])))
        if used is not None:
            job_info["environment"] = used
        from manifest.rerun.cluster.node_env import checked_probes

        probes = checked_probes(doc, f"the {self.name} job {job.job_id}")
        if probes is not None:  # the environment each node's re-run used (verify's drift)
            job_info["probes"] = probes
        if self.notes:
            job_info["notes"] = list(self.notes)
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


def confinement_line(plan: RerunPlan, job: dict[str, Any] | None) -> str:
    """The report's confinement line once a cluster job ran: where it ran and what the host
    that ran it applied (its own words, from the result: bubblewrap with its policy, or
    ``not confined on the host (why)``), never the plan's prediction; the plan's line when
    no job reported one."""
    if plan.cluster is None or job is None or not job.get("confinement"):
        return plan.confinement
    return f"on {plan.cluster.describe()}: {job['confinement']}"


def _network_policy(doc: dict[str, Any]) -> str:
    where = str(doc.get("confinement") or "")
    if "no network" in where:
        return "no network (bubblewrap on the host)"
    if "network allowed" in where and int(doc.get("nodes") or 1) > 1:
        return "network allowed (bubblewrap on the host): the nodes meet over TCP"
    if "network allowed" in where:
        return "network allowed (--network)"
    return "not restricted by manifest on the host: the cluster's own policy applies"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI runner's timeout, ``kill``) handled as Ctrl-C while a job is waited on,
    so the job is cancelled, not orphaned. Only in the main thread (where Python runs
    signal handlers); elsewhere nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
