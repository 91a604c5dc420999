"""``manifest capture [-- CMD]``: record the environment, and run and record a command.

The command is started by ``manifest.launch.runner`` (every Python
process prepared, one JSON record each); this module turns a finished run
into its sealed manifest, and ``capture_from_cli`` orders the whole verb:

1. ``[tool.manifest]`` fills what the command line left out (command, data,
   outputs, seed, threads, store); the snapshot is taken and ``--data``
   digested before the command starts.
2. The process records are merged into ``randomness``/``determinism``
   (identity) and ``outputs.processes`` (``merge_records``), each rank's op
   stream stored as a blob.
3. Declared outputs (globs relative to the working directory) are digested,
   weight files tensor by tensor (``manifest.weights.tables``); an output an
   earlier run left behind fails the capture instead of being recorded.
4. Files the run opened are digested as discovered inputs
   (``manifest.capture.observed``), within a budget; the rest are named.

Verify's re-run builds its manifest with the same ``build_run_manifest``, so
the two records of a run are made by one function. Longer than 500 lines because of
that: the record-to-manifest steps both verbs share stay in the one module they call,
and what needs none of them lives beside it (``observed``, ``environ``, ``snapshot``).
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from manifest.canonical import seal
from manifest.capture.environ import environ_reads, environ_recorded, keyed_reads
from manifest.capture.snapshot import Snapshot, observed_for, seal_snapshot, take_snapshot
from manifest.config import load_config, string_list
from manifest.errors import ConfigError, UsageError
from manifest.launch.boot._manifest_wire import CUBLAS_VAR, ProcessRecord
from manifest.launch.process import Process, read_processes
from manifest.models import (
    Artifact,
    Command,
    Compute,
    Determinism,
    Flags,
    LoaderSeed,
    LockfileDisagreement,
    Manifest,
    NumericPoint,
    Observed,
    OpStreamRef,
    Outputs,
    OutsideProcess,
    ProcessDeterminism,
    ProcessOutcome,
    ProcessRandomness,
    Randomness,
    RankRecording,
    RngFingerprints,
    SeedCall,
    SwitchCall,
    TrailPoint,
)
from manifest.redact import redact_argv, redact_text

if TYPE_CHECKING:  # the launcher is imported where a command runs, not for a snapshot
    from manifest.data.remote.source import ProgressSink
    from manifest.launch.runner import LaunchResult, LaunchSettings

M = TypeVar("M", bound=BaseModel)


def _fingerprints(raw: Any) -> RngFingerprints | None:
    if not isinstance(raw, dict):
        return None
    return RngFingerprints(python=raw.get("python"), numpy=raw.get("numpy"),
                           torch_cpu=raw.get("torch_cpu"), cuda=list(raw.get("cuda") or []))


def _items(model: type[M], raw: Any) -> list[M] | None:
    """Valid entries of a record's list (None when the process recorded none)."""
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for item in raw:
        try:
            out.append(model.model_validate(item))
        except ValidationError:
            continue
    return out or None


def _strings(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict) or not raw:
        return None
    return {str(k): str(v) for k, v in raw.items()}


def merge_records(records: list[ProcessRecord]
                  ) -> tuple[list[ProcessRandomness], list[ProcessDeterminism],
                             list[ProcessOutcome]]:
    """Per-rank randomness, determinism and outcome entries from process records."""
    rnd, det, out = [], [], []
    for p in read_processes(records):
        rank = p.rank or 0  # select_ranks gave every record an int
        if p.seed is not None and not 0 <= p.seed <= 2**53 - 1:
            raise UsageError(
                f"rank {rank}'s seed {p.seed} (base + rank, --per-rank-seed) is above 2**53-1, "
                "the largest seed a manifest records.", hint="Choose a smaller --seed.")
        rnd.append(ProcessRandomness(rank=rank, seed=p.seed,
                                     at_start=_fingerprints(p.at_start),
                                     reseeds=_items(SeedCall, p.reseeds),
                                     loaders=_items(LoaderSeed, p.loaders),
                                     unaccounted=sorted(set(p.unaccounted)) or None))
        det.append(ProcessDeterminism(
            rank=rank, local_rank=p.local_rank, world_size=p.world_size,
            torch_imported=p.torch_imported,
            flags=Flags(**p.flags) if p.flags is not None else None,
            pythonhashseed=p.pythonhashseed,
            cuda_runtime=p.cuda_runtime, cudnn=p.cudnn, nccl=p.nccl,
            devices=list(p.devices),
            switches=_items(SwitchCall, p.switches),
            fp32_precision=_strings(p.fp32_precision),
            environ=environ_reads(p.environ),
        ))
        # The script's own manifest.trail() wins; otherwise the launcher's
        # automatic per-optimizer-step trail.
        trail = p.trail or p.auto_trail
        out.append(ProcessOutcome(
            rank=rank, at_exit=_fingerprints(p.at_exit),
            trail=[TrailPoint(step=t.step, digest=t.digest) for t in trail],
            trail_scheme=p.auto_trail_scheme if not p.trail and p.auto_trail else None,
            numeric=_items(NumericPoint, p.numeric),
            secret_reads=keyed_reads(p.environ),
            environ_recorded=environ_recorded(p),
        ))
    return rnd, det, out


def recording_costs(processes: list[Process]) -> list[RankRecording] | None:
    """Each rank's time in the trails (``recording_ns``) and its share of its wall time
    (``observed.recording``); None when no process recorded any."""
    out = []
    for p in processes:
        spent, start, end = p.recording_ns, p.start_ns, p.end_ns
        if spent is None or spent <= 0 or start is None or end is None or end <= start:
            continue
        out.append(RankRecording(rank=p.rank or 0, seconds=spent / 1e9,
                                 share=min(1.0, spent / (end - start))))
    return out or None


def digest_outputs(globs: list[str], cwd: Path, *,
                   malformed_ok: bool = False) -> tuple[list[Artifact], list[str]]:
    """Artifacts matching the declared globs, and the globs that matched nothing."""
    from manifest.weights.dcp import is_dcp_dir
    from manifest.weights.tables import digest_artifact

    artifacts: dict[str, Artifact] = {}
    missing: list[str] = []
    for pattern in globs:
        matches = sorted(glob.glob(pattern, root_dir=cwd, recursive=True))
        # A DCP checkpoint is a directory, recorded as one artifact (manifest.weights.dcp).
        files = [m.rstrip("/") for m in matches if (cwd / m).is_file() or is_dcp_dir(cwd / m)]
        if not files:
            missing.append(pattern)
        for rel in files:
            if rel not in artifacts:
                artifacts[rel] = digest_artifact(cwd / rel, rel, malformed_ok=malformed_ok)
    return [artifacts[k] for k in sorted(artifacts)], missing


def _process_error(records: list[ProcessRecord]) -> str | None:
    return next((p.exception for p in read_processes(records) if p.exception), None)


def store_op_streams(result: LaunchResult, store: Any) -> dict[int, OpStreamRef]:
    """Each rank's op stream (``--fingerprint-ops``) as a blob; its reference by rank."""
    refs: dict[int, OpStreamRef] = {}
    from manifest.launch.runner import stream_ranks

    for name, rank in stream_ranks(result).items():
        data = result.op_streams[name]
        try:
            doc = json.loads(data)
            steps = [int(s) for s in doc["steps"]]
            count = len(doc["ops"])
        except (ValueError, KeyError, TypeError):
            continue
        refs[rank] = OpStreamRef(digest=store.put(data), steps=steps, ops=count)
    return refs


def build_run_manifest(
    snap: Snapshot,
    *,
    cwd: Path,
    argv: list[str],
    settings: LaunchSettings,
    result: LaunchResult,
    datasets: list[dict[str, Any]],
    output_globs: list[str],
    malformed_ok: bool = False,
    compute: dict[str, Any] | None = None,
    stale: list[str] | None = None,
    code_env: dict[str, str] | None = None,
    not_digested: dict[str, int] | None = None,
) -> Manifest:
    """The sealed manifest of a finished run. ``malformed_ok``: a malformed weight file
    is recorded by file digest (verify's re-run) instead of refused (capture). ``stale``
    outputs were left by an earlier run: they are not recorded and the run fails;
    ``datasets`` may hold discovered inputs."""
    rnd, det, outcomes = merge_records(result.records)
    if result.op_streams:
        refs = store_op_streams(result, snap.store)
        outcomes = [o.model_copy(update={"ops": refs[o.rank]}) if o.rank in refs else o
                    for o in outcomes]
    artifacts, missing = (result.tables if result.tables is not None
                          else digest_outputs(output_globs, cwd, malformed_ok=malformed_ok))
    status: Literal["ok", "failed"] = "ok"
    error = None
    if stale:
        from manifest.capture.observed import stale_alone

        artifacts = [a for a in artifacts if a.path not in stale]
        stale = stale_alone(stale, output_globs, cwd)
    if result.exit_code != 0:
        status = "failed"
        error = _process_error(result.records) or f"command exited with status {result.exit_code}"
        error = redact_text(error, argv=argv)  # a child's exception can quote its credentials
    elif stale:
        status = "failed"
        error = (f"output(s) {', '.join(stale)} were left by an earlier run, not written by this "
                 "one; move or delete them and capture again")
    elif missing and not _one_node_of_several(result):
        # On a multi-node run a node whose processes saved nothing is normal (most
        # scripts save on global rank 0 only): merge checks the outputs of all nodes.
        status = "failed"
        error = f"declared output(s) matched no file: {', '.join(missing)}"
    root = snap.code.root or cwd
    try:
        rel_cwd = os.path.relpath(cwd, root)
    except ValueError:
        rel_cwd = "."
    doc = dict(snap.sections)
    doc["data"] = sorted(datasets, key=lambda d: str(d["name"]))
    if result.records:
        from manifest.capture.observed import imported_distributions

        doc["env"] = dict(doc["env"], imported=imported_distributions(result.modules))
    none_ran = "the command started no Python process"
    if result.outside:
        none_ran = (f"no Python process ran under the launcher; {len(result.outside)} ran outside "
                    "the recipe (determinism.outside_recipe)")
    doc["randomness"] = Randomness(
        seed=settings.seed, derivation=settings.derivation,  # type: ignore[arg-type]
        processes=rnd, unavailable={} if rnd else {"processes": none_ran})
    doc["determinism"] = Determinism(
        requested=settings.deterministic, num_threads=settings.threads,
        cublas_workspace_config=result.env.get(CUBLAS_VAR),
        pythonhashseed=result.env.get("PYTHONHASHSEED"), processes=det, unavailable={},
        # None when none (left out), so a run without any keeps its run_id
        outside_recipe=[OutsideProcess.model_validate(p) for p in result.outside] or None)
    from manifest.nodes.topology import segments_from, topology_from_records, writer_nodes

    topology = topology_from_records(result.records)
    doc["command"] = Command(
        argv=redact_argv(argv), cwd=rel_cwd, outputs=list(output_globs),
        datasets=[d["name"] for d in datasets if d.get("source") is None],
        code_env=code_env, topology=topology)
    if topology is not None and topology.nodes > 1:
        # On a multi-node run each node writes to its own disk: say which node wrote what.
        writers = writer_nodes(result.records, topology, cwd)
        artifacts = [a.model_copy(update={"node": writers.get(a.path, topology.node)})
                     for a in artifacts]
    from manifest.capture.checkpoints import record_checkpoints

    doc["outputs"] = Outputs(
        status=status, exit_code=result.exit_code, error=error, artifacts=artifacts,
        processes=outcomes, workers=result.workers or None,
        # Each left out when none (an elastic run that never restarted, a run that saved no
        # checkpoint), so such a run keeps its bytes.
        segments=(segments_from(result.attempts, result.records, error)
                  if topology is not None else None),
        checkpoints=record_checkpoints(result.records, cwd, Path(root)) or None)
    pids = [p.pid for p in result.processes if p.pid]
    observed = Observed.model_validate(observed_for(snap, pids=pids))
    extra: dict[str, Any] = {"recording": recording_costs(result.processes)}
    if compute is not None:
        extra["compute"] = Compute.model_validate(compute)
    if not_digested:
        extra["inputs_not_digested"] = dict(sorted(not_digested.items()))
    if snap.code.root is not None and doc["code"]["lockfiles"]:
        from manifest.probes.code import lockfile_disagreements

        disagree = lockfile_disagreements(snap.code.root, list(doc["code"]["lockfiles"]),
                                          doc["env"]["packages"])
        if disagree:  # left out when none, so a run whose lockfiles agree keeps its bytes
            extra["lockfile_disagrees"] = [LockfileDisagreement.model_validate(d)
                                           for d in disagree]
    if topology is not None:
        from manifest.nodes.topology import rendezvous_of

        extra["rendezvous"] = rendezvous_of(result.records)
    doc["observed"] = observed.model_copy(update=extra)
    return seal(doc)


def _one_node_of_several(result: LaunchResult) -> bool:
    from manifest.nodes.topology import topology_from_records

    topology = topology_from_records(result.records)
    return topology is not None and topology.node is not None


def _config_int(table: dict[str, Any], key: str, origin: Path | None) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**53 - 1:
        raise ConfigError(f"[tool.manifest] {key} in {origin} must be an integer from 0 to "
                          "2**53-1.")
    return value


@dataclass(frozen=True)
class CaptureOptions:
    """What ``manifest capture`` is asked to do: built once by the CLI from its flags
    (``manifest.cli.verbs_record``), by the gate from its project. ``None`` (and an empty
    command) leaves the choice to ``[tool.manifest]``, then to the default."""

    command: list[str] = field(default_factory=list)
    seed: int | None = None
    data: list[str] | None = None
    outputs: list[str] | None = None
    """Output globs, relative to the working directory."""
    threads: int | None = None
    deterministic: bool = True
    store_dir: str | None = None
    no_cache: bool = False
    quiet: bool = False
    per_rank_seed: bool = False
    """Seed each rank with base + rank instead of the same seed."""
    manifest_file: Path | None = None
    """Where the manifest will be written, so the run's discovered inputs leave it out."""
    fingerprint_ops: int | None = None
    """Record an op stream of optimizer steps 1..N."""
    trail: bool = True
    remote_mode: Literal["listing", "checksums", "deep"] = "listing"
    """How s3://, gs:// and hf:// datasets are pinned (``manifest.data.remote``)."""
    envelope: int = 0
    """Envelope runs to measure the run's noise envelope with (0: none)."""
    precision: str = "fp32"
    """With ``envelope``: the matmul precision its runs emulate."""


def capture_from_cli(cwd: Path, options: CaptureOptions, *, nvml: Any | None = None,
                     progress: Any = None, data_progress: ProgressSink | None = None,
                     notes: list[str] | None = None, tagging: list[Any] | None = None
                     ) -> tuple[Manifest, int]:
    """What ``manifest capture`` does; returns the manifest and the exit status.

    ``nvml``: the NVML handle the snapshot and the compute record read (None: open it).
    ``progress(text)``: where notes of the envelope runs go; ``data_progress``: the line a
    remote dataset's listing shows its progress on; ``notes``: where notes about how the
    run's records were read are handed back, for the caller to show. ``tagging``: where a run's
    tracker tagging (``manifest.capture.trackers.Tagging``) is handed back, for the caller
    to run once the manifest is safely written; without it (``gate``: its capture is a
    check) no tracker run is tagged.
    """
    command, data, outputs = options.command, options.data, options.outputs
    manifest_file, no_cache, quiet = options.manifest_file, options.no_cache, options.quiet
    table, origin = load_config(cwd)
    if not command:
        configured = table.get("command")
        if configured is not None:
            if isinstance(configured, str):
                import shlex

                configured = shlex.split(configured)
            if not isinstance(configured, list) or not all(isinstance(a, str) for a in configured):
                raise ConfigError(f"[tool.manifest] command in {origin} must be a list of strings.")
            command = list(configured)
    data_base = None
    if data is None and origin is not None:
        data_base = origin.parent  # paths in [tool.manifest] are relative to pyproject.toml
    data = data if data is not None else string_list(table, "data", origin) or []
    outputs = outputs if outputs is not None else string_list(table, "outputs", origin) or []
    store_dir = options.store_dir or table.get("store")
    snap = take_snapshot(cwd, store_dir=store_dir, manifest_file=manifest_file, nvml=nvml)
    datasets: list[dict[str, Any]] = []
    if data:
        from manifest.data.datasets import digest_datasets

        found = digest_datasets(data, repo_root=snap.code.root, store=snap.store,
                                no_cache=no_cache, quiet=quiet, base=data_base,
                                remote_mode=options.remote_mode,
                                remote_progress=data_progress)
        # Sorted by name: the order of --data flags must not change the run's identity.
        datasets = [d.model_dump(mode="json") for d in sorted(found, key=lambda d: d.name)]
        root = snap.code.root
        for d in datasets:  # outside the repository: where a relative path from it lands
            if root is not None and os.path.isabs(d["path"]):
                d["from_repo"] = os.path.relpath(d["path"], root)
    if not command:
        return seal_snapshot(snap, datasets), 0
    from manifest.launch.runner import (
        LaunchSettings,
        default_threads,
        launch_identity,
        run_under_launcher,
    )

    seed = options.seed if options.seed is not None else (
        _config_int(table, "seed", origin) or 0)
    settings = LaunchSettings(
        seed=seed,
        derivation="base+rank" if options.per_rank_seed else "same",
        threads=options.threads or _config_int(table, "threads", origin) or default_threads(),
        deterministic=options.deterministic and table.get("deterministic", True) is not False,
        trail="sampled" if options.trail else "off",
        ops={"from": 1, "to": options.fingerprint_ops} if options.fingerprint_ops else None,
        root=str(snap.code.root) if snap.code.root is not None else None,
        sealed=launch_identity(snap.code.code.commit, snap.code.code.diff_digest, command, seed),
    )
    from manifest.capture import observed
    from manifest.probes.compute import compute_record, read_energy

    before = observed.output_matches(outputs, cwd)
    code_env = observed.record_code_env(dict(os.environ), cwd, snap.code.root)
    energy_before = read_energy(nvml)
    from manifest.numeric.measure import listing

    # --envelope: each envelope run starts from the tree this run starts from
    start = listing(snap.code.root or cwd) if options.envelope else None
    started = time.monotonic()
    result = run_under_launcher(command, cwd, settings)
    wall_s = time.monotonic() - started
    if notes is not None:
        notes.extend(result.notes())
    compute = compute_record(wall_s=wall_s, records=result.records, before=energy_before,
                             after=read_energy(nvml), env=result.env)
    stale = observed.stale_outputs(before, outputs, cwd)
    if stale and snap.code.root is not None:
        # A committed file is code, not a leftover of an earlier run.
        tracked = observed.tracked_files(snap.code.root)
        stale = [rel for rel in stale
                 if os.path.relpath(cwd / rel, snap.code.root) not in tracked]
    take, left = _inputs_and_writes(snap, cwd, result, datasets, outputs, manifest_file)
    inputs = observed.digest_inputs(take, root=snap.code.root, store=snap.store,
                                    no_cache=no_cache, quiet=quiet)
    manifest = build_run_manifest(snap, cwd=cwd, argv=command, settings=settings, result=result,
                                  datasets=datasets + inputs, output_globs=outputs,
                                  compute=compute, stale=stale, code_env=code_env,
                                  not_digested=left)
    assert manifest.outputs is not None
    if options.envelope and manifest.outputs.status == "ok":
        manifest = _with_envelope(manifest, result, settings, options.envelope, command, cwd,
                                  outputs, progress, tree=snap.code.root or cwd,
                                  precision=options.precision,
                                  start=start)
    # Verify runs a command without --trust only if this tool sealed it here.
    from manifest.trust import record_sealed

    record_sealed(manifest.digest)
    if tagging is not None:  # the caller tags the tracker runs once the manifest is written
        from manifest.capture.trackers import plan_tagging

        tagging.append(plan_tagging(manifest, result.records, tree=snap.code.root or cwd,
                                    store=snap.store))
    return manifest, 0 if manifest.outputs is not None and manifest.outputs.status == "ok" else 3


def _with_envelope(manifest: Manifest, result: LaunchResult, settings: LaunchSettings,
                   runs: int, command: list[str], cwd: Path, outputs: list[str],
                   progress: Any, *, tree: Path, precision: str = "fp32",
                   start: set[str] | None = None) -> Manifest:
    """``--envelope N``: the run's noise envelope (``manifest.numeric.measure``), in
    ``outputs.envelope``; outside identity, so the run_id stays; the digest is new.

    The envelope runs run where the run ran, under the run's own settings (its op window
    too: nothing in their environment tells them apart). What they write in ``tree`` is
    undone afterwards: the files the run wrote, its declared outputs and its recorded
    checkpoints are put back byte for byte, and files only they created are deleted.
    With ``--precision P``, first the twin: the run once more under P's emulation,
    unperturbed; the envelope runs are measured against its trail, which the envelope
    carries (``twin``) with each declared output's exact distance from the twin's
    (``twin_outputs``), read while the twin's files are in place (``numeric.twin``)."""
    from manifest.canonical import to_document
    from manifest.launch.runner import run_under_launcher
    from manifest.numeric.measure import measure, numeric_of, written_files

    assert manifest.outputs is not None
    keep = written_files(result.opened)  # ``measure`` keeps those inside ``tree``
    keep += [cwd / c.path for c in manifest.outputs.checkpoints or [] if c.artifact is not None]
    from dataclasses import replace

    # --precision: the envelope runs emulate that precision (manifest.numeric.precision),
    # measured against the run's emulated twin (manifest.numeric.twin)
    emulated = replace(settings, emulate=precision) if precision != "fp32" else settings
    offsets: dict[str, float] = {}

    def twin_outputs(_: LaunchResult, aside: Any) -> None:
        """Each declared output of the twin against the run's own (kept aside), exactly."""
        from manifest.numeric.twin import file_distance

        for artifact in manifest.outputs.artifacts if manifest.outputs else []:
            recorded = aside(cwd / artifact.path)
            if recorded is not None and (cwd / artifact.path).is_file():
                distance = file_distance(recorded, cwd / artifact.path)
                if distance is not None:
                    offsets[artifact.path] = distance

    measured = measure(numeric_of(result.records), emulated, runs,
                       lambda planned: run_under_launcher(command, cwd, planned),
                       cwd=cwd, outputs=outputs, say=progress, keep=keep, tree=tree,
                       twin=twin_outputs if precision != "fp32" else None, start=start)
    for note in measured.notes:
        if progress is not None:
            progress(note)
    for failure in measured.failed:
        if progress is not None:
            progress(f"envelope run left out: {failure}")
    if measured.envelope is None:
        if progress is not None:
            progress(f"no envelope: {measured.reason}")
        return manifest
    doc = to_document(manifest)
    envelope = measured.envelope
    if precision != "fp32":
        envelope = envelope.model_copy(update={
            "precision": precision, "how": "emulated", "twin": measured.twin,
            "twin_outputs": offsets if measured.twin is not None else None})
        from manifest.numeric.twin import unparted

        stuck = unparted(envelope) if measured.twin is not None else []
        if stuck and progress is not None:
            progress(f"{len(stuck)} envelope run(s) never left the twin while the others "
                     "did: verify --emulate will not judge by this envelope")
    doc["outputs"]["envelope"] = envelope.model_dump(mode="json")
    return seal(doc)


def _inputs_and_writes(snap: Snapshot, cwd: Path, result: LaunchResult,
                       datasets: list[dict[str, Any]], outputs: list[str],
                       manifest_file: Path | None) -> tuple[list[Path], dict[str, int]]:
    """Discovered inputs to digest and those left to ``--data``; remembers run-written files."""
    from manifest.capture import observed
    from manifest.capture.snapshot import own_output_files

    root = snap.code.root
    tracked: frozenset[str] = frozenset()
    untracked: list[str] = []
    if root is not None:
        tracked = observed.tracked_files(root)
        untracked = observed.untracked_files(root)
        written = observed.written_by_run(result.opened, root, untracked, result.started_ns)
        # The capture's own files (``> run.json 2> cap.err``) are remembered too.
        written += observed.matching_files(untracked, root, own_output_files(manifest_file))
        observed.remember_written(snap.store, written)
    base = root or cwd
    skip = [Path(d["path"]) if os.path.isabs(d["path"]) else base / d["path"] for d in datasets]
    skip += [cwd / rel for rel in observed.output_matches(outputs, cwd)]
    skip.append(snap.store.root)
    found = observed.discovered_inputs(
        result.opened, root=root, tracked=tracked,
        in_patch=frozenset(untracked) - frozenset(snap.code.large),
        skip=skip, skip_files=own_output_files(manifest_file))
    take, left = observed.split_by_budget(found)
    from manifest.data.datasets import recorded_path

    return take, {recorded_path(p, root): n for p, n in left.items()}
