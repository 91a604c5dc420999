"""The parent side of the launcher: start the command with every Python process prepared.

``manifest capture -- CMD``, verify's re-run, explain's two runs and the lab's
runs all start a command here, so the child-process handling is one module
that none of them has to copy, apart from how a finished run becomes a
manifest (``manifest.capture.run``):

1. The child gets ``manifest/launch/boot`` first on ``PYTHONPATH``; its
   ``sitecustomize`` prepares every Python process the command starts
   (seeds, flags, thread count; see ``manifest.launch.boot._manifest_launch``),
   plus ``PYTHONHASHSEED``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and the
   OpenMP/MKL thread counts in its environment. ``MANIFEST_LAUNCH`` marks the
   run: the package's start-up hook (``torch_manifest.pth``) loads the same
   ``sitecustomize`` in any process that keeps it, so a command that replaces
   ``PYTHONPATH`` is still prepared. A Python process that escapes both
   (``python -S``, ``env -i python``) is named in ``LaunchResult.outside``
   (``manifest.launch.outside``).
2. The child's stdout is sent to our stderr, so stdout carries only the
   manifest.
3. Each prepared process writes a JSON record (and, with an op window, an
   op stream) at exit into a private directory that lives only as long as
   the run. Ranks are processes with a ``RANK`` variable (torchrun); without
   any, every prepared process that is not a multiprocessing child, in start
   order (``select_ranks``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from manifest.errors import UsageError
from manifest.launch.boot._manifest_wire import (
    CONFIG_VAR,
    CUBLAS_VAR,
    OPS_VAR,
    RECORDS_VAR,
    WORKER_PREFIX,
)
from manifest.launch.boot._manifest_wire import CUBLAS_DETERMINISTIC as CUBLAS_DETERMINISTIC
from manifest.launch.boot._manifest_wire import PRIVATE_FILE as PRIVATE_FILE
from manifest.launch.boot._manifest_wire import SEALED_RUN_VAR as SEALED_RUN_VAR
from manifest.launch.boot._manifest_wire import ProcessRecord as ProcessRecord
from manifest.launch.process import Process, read_process, read_processes

LAUNCH_DIR = Path(__file__).resolve().parent.parent / "launch" / "boot"
RECIPE_NCCL = {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
"""What the recipe sets for collectives, where the user did not: torch's
``use_deterministic_algorithms`` sets no NCCL variable, and NCCL picks its algorithm per
message size from a tuning model, NVLS reducing inside the switch. Megatron-LM's
``--deterministic-mode`` refuses to start unless ``NCCL_ALGO`` is one of Tree, Ring,
CollnetDirect, CollnetChain or ^NVLS; its MCore helpers set ``Ring`` and
``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (Transformer Engine's kernels), as here."""

def default_threads() -> int:
    """The thread count torch would use here: OMP_NUM_THREADS, else the CPUs we may run on."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdecimal() and int(value) > 0:
        return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def launch_identity(commit: str | None, diff_digest: str | None, argv: list[str],
                    seed: int) -> str:
    """``blake3:…`` of the code (commit and uncommitted bytes), the command and the seed.

    What the Lightning and Hugging Face callbacks log as ``manifest.launch_id``. It
    is known before the run starts and is the same in the capture and in every
    re-run, on any machine (the manifest's own run_id also covers what the run
    imported and the machine, known only at its end, so a callback cannot log it;
    ``capture`` tags the tracker runs with it once sealed, ``manifest.capture.trackers``).
    ``manifest show`` prints it as ``launch id``, so a tracker's entry leads to the
    manifest.

    The argv is the one the manifest records: redacted (``manifest.redact.redact_argv``,
    which leaves an already redacted argv as it is). So the capture (raw argv), every re-run
    and ``show`` (the recorded argv) give the same id, and no secret enters it: hashed from
    the raw argv, ``--api-key=A`` and ``--api-key=B`` would give two ids, and a low-entropy
    key could be guessed offline from a logged one.
    """
    from manifest.canonical import blake3_name, canonical_bytes
    from manifest.redact import redact_argv

    return blake3_name(canonical_bytes({"commit": commit, "diff_digest": diff_digest,
                                        "argv": redact_argv(argv), "seed": seed}))


@dataclass(frozen=True)
class LaunchSettings:
    """Everything the launcher needs; verify rebuilds it from a manifest."""

    seed: int
    derivation: str
    threads: int
    deterministic: bool
    trail: str = "sampled"
    """Automatic step trail: ``sampled`` (every step to 1000, then thinner), ``all``, ``off``."""
    ops: dict[str, Any] | None = None
    """Op-stream window for ``_manifest_opstream.StepWindow`` (``MANIFEST_OPS``), or None."""
    root: str | None = None
    """The repository root: call sites inside it are recorded repo-relative."""
    hashseed: str | None = None
    """PYTHONHASHSEED unless the environment sets one (default ``0``: it is a switch, not a
    seed to vary, so two captures with different ``--seed`` hash strings alike)."""
    numeric: bool = True
    """The numeric trail beside the step trail (loss, norms, projections per step)."""
    perturb: int | None = None
    """An envelope run: move the state one ULP (this seed) before the first update. Given to
    the child in the private file (``PRIVATE_FILE``), never in its environment."""
    emulate: str | None = None
    """``tf32`` or ``bf16``: the run emulates that matmul precision on CPU
    (``launch/boot/_manifest_precision``): an envelope run at a re-run's precision, or
    ``verify --emulate`` standing in for another device. None: float32 as the run asks."""
    sealed: str | None = None
    """``launch_identity`` of this run, given to the child as ``MANIFEST_SEALED_RUN``: the
    id the integration callbacks log, the same in the capture and every re-run."""

    def child_env(self, records_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        existing = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(LAUNCH_DIR) + (os.pathsep + existing if existing else "")
        env[CONFIG_VAR] = json.dumps({
            "seed": self.seed, "derivation": self.derivation,
            "threads": self.threads, "deterministic": self.deterministic,
            "trail": "" if self.trail == "off" else self.trail,
            "root": self.root,
            **({} if self.numeric else {"numeric": False}),
            **({} if self.emulate is None else {"emulate": self.emulate}),
        })
        write_private(records_dir, self.perturb)
        env.pop(OPS_VAR, None)
        if self.ops is not None:
            env[OPS_VAR] = json.dumps({"dir": str(records_dir), **self.ops})
        env[RECORDS_VAR] = str(records_dir)
        env.pop(SEALED_RUN_VAR, None)
        if self.sealed is not None:
            env[SEALED_RUN_VAR] = self.sealed
        env.setdefault("PYTHONHASHSEED", self.hashseed or "0")
        if self.deterministic:
            env.setdefault(CUBLAS_VAR, CUBLAS_DETERMINISTIC)
            for name, value in RECIPE_NCCL.items():
                env.setdefault(name, value)
        env["OMP_NUM_THREADS"] = str(self.threads)
        env["MKL_NUM_THREADS"] = str(self.threads)
        return env


PRIVATE_BYTES = 64
"""The length of the launcher's private settings file (``PRIVATE_FILE``), in every run: what
must not show in the environment or argv. Every run gets it, with the same name and this
length, the real run included: its perturbation (an envelope run's one-ULP seed, ``null``
in the real run) is no marker a script can read from ``os.environ``, ``sys.argv`` or
``/proc/self/environ``; a script that scaled its learning rate only in envelope runs would
inflate its own envelope."""


def write_private(records_dir: Path, perturb: int | None) -> None:
    """The private settings of one run (``PRIVATE_FILE``), padded to ``PRIVATE_BYTES``."""
    text = json.dumps({"perturb": perturb})
    if len(text) > PRIVATE_BYTES:  # a seed is at most 2**53-1: 33 bytes with its key
        raise UsageError(f"perturbation seed {perturb} is too large.")
    path = Path(records_dir) / PRIVATE_FILE
    path.write_text(text.ljust(PRIVATE_BYTES), encoding="utf-8")


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int
    records: list[ProcessRecord]
    env: dict[str, str]
    op_streams: dict[str, bytes] = field(default_factory=dict)
    """File name → bytes of each op stream the processes wrote (``ops-<rank>-<pid>.json``)."""
    opened: dict[str, str] = field(default_factory=dict)
    """Every process's files opened (absolute path -> ``r``/``w``/``rw``, first use wins)."""
    modules: frozenset[str] = frozenset()
    """Top-level modules imported by any process."""
    started_ns: int = 0
    outside: list[dict[str, str]] = field(default_factory=list)
    """Python processes that ran outside the recipe (``manifest.launch.outside``)."""
    workers: int = 0
    """Worker processes started (forks, multiprocessing children), each counted at its start."""
    attempts: list[ProcessRecord] = field(default_factory=list)
    """Earlier attempts of an elastic run (torchelastic ``--max-restarts``) whose ranks were
    replaced by a restart: their records, not counted among ``records``."""
    tables: tuple[list[Any], list[str]] | None = None
    """(output artifacts with their tensor tables, declared globs that matched nothing) as
    computed where the run ran (a cluster executor, ``manifest.rerun.cluster``), whose
    outputs stay there; None: the outputs are in the tree, read them there."""
    job: dict[str, Any] | None = None
    """Where a cluster executor ran it: executor, job id, dashboard or log location (no
    credentials), bytes shipped and returned, the remote log tail of a failure (redacted)."""

    unreadable: int = 0
    """Files in the records directory that were no readable JSON object (a process's own
    output there, a record cut off): left out, and said (:meth:`notes`)."""

    def notes(self) -> list[str]:
        """What the caller should tell the user about how the records were read."""
        if not self.unreadable:
            return []
        return [f"{self.unreadable} process record(s) unreadable or not a JSON object; "
                "left out."]

    @cached_property
    def processes(self) -> list[Process]:
        """``records`` read once into typed views (``manifest.launch.process``)."""
        return read_processes(self.records)


def run_under_launcher(
    argv: list[str], cwd: Path, settings: LaunchSettings, *, base_env: dict[str, str] | None = None,
    wrap: Callable[[list[str], Path], list[str]] | None = None,
) -> LaunchResult:
    """Run ``argv`` with every Python process prepared; return its records.

    ``wrap(argv, records_dir)`` returns the command line that actually runs
    (verify's sandbox: it must leave ``records_dir`` writable).
    """
    from manifest.launch.outside import PythonWatch

    with tempfile.TemporaryDirectory(prefix="manifest-records-") as tmp, PythonWatch() as watch:
        env = settings.child_env(Path(tmp), base_env)
        full = wrap(argv, Path(tmp)) if wrap is not None else argv
        started_ns = time.time_ns()
        try:
            code = _run_to_end(full, cwd, env)
        except FileNotFoundError as exc:
            raise UsageError(f"command not found: {argv[0]}.") from exc
        except PermissionError as exc:
            raise UsageError(f"command is not executable: {argv[0]}.") from exc
        records: list[ProcessRecord] = []
        streams: dict[str, bytes] = {}
        workers = junk = 0
        for name in sorted(os.listdir(tmp)):
            if name.startswith(WORKER_PREFIX):
                workers += 1
            elif name.startswith("ops-") and name.endswith(".json"):
                streams[name] = Path(tmp, name).read_bytes()
            elif name.endswith(".json"):
                try:
                    record = json.loads(Path(tmp, name).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    record = None
                if isinstance(record, dict):  # its values are checked where they are read
                    records.append(cast(ProcessRecord, record))
                else:  # a process's own output: `[1]` is no record (r.get would fail)
                    junk += 1
    opened: dict[str, str] = {}
    modules: set[str] = set()
    for p in read_processes(records):  # every process, DataLoader workers too
        for path, kind in p.opened.items():
            opened[path] = kind if opened.get(path, kind) == kind else "rw"
        modules.update(p.modules)
    ranks = select_ranks(records)
    return LaunchResult(code, latest_attempt(ranks), env, streams, opened, frozenset(modules),
                        started_ns, outside_found(argv, env, watch.found, records), workers,
                        attempts=earlier_attempts(ranks), unreadable=junk)


def outside_found(argv: list[str], env: dict[str, str], watched: list[dict[str, str]],
                  records: list[ProcessRecord]) -> list[dict[str, str]]:
    """Every lookout's findings (``manifest.launch.outside``): the command line itself,
    the process tree, and each prepared process's audit of what it started."""
    from manifest.launch.boot._manifest_escape import describe_start
    from manifest.launch.outside import COMMAND_LINE, merge_found

    top = describe_start(argv, env)
    if top is not None:
        top["site"] = COMMAND_LINE
    return merge_found([top] if top else [], watched,
                       *(p.outside for p in read_processes(records)))


def _run_to_end(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Run ``argv`` to its end; if we are interrupted (Ctrl-C, SIGTERM turned into an
    exception), stop it first with SIGTERM, so a keeper between us and the command
    (the re-run's guard, bubblewrap) can take down everything the command started,
    then with SIGKILL if it has not stopped within 10 s."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=sys.stderr.fileno(),
                            stdin=subprocess.DEVNULL)
    try:
        return proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def select_ranks(records: list[ProcessRecord]) -> list[ProcessRecord]:
    """The records that stand for ranks, each with its ``rank`` set."""
    processes = [p for p in read_processes(records) if not p.mp_child]
    # Without RANK, the rank srun or mpirun gave the process (manifest.nodes.topology).
    ranks: list[tuple[int | None, Process]] = []
    for p in processes:
        given = p.rank
        if given is None:
            given = next((int(p.launch_env[k]) for k in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                                         "PMI_RANK")
                          if p.launch_env.get(k, "").isdecimal()), None)
        ranks.append((given, p))
    ranked = [(rank, p) for rank, p in ranks if rank is not None]
    if ranked:
        return [{**p.raw, "rank": rank} for rank, p in sorted(ranked, key=lambda rp: rp[0])]
    ordered = sorted(processes, key=lambda p: (p.start_ns or 0, p.pid or 0))
    return [{**p.raw, "rank": i} for i, p in enumerate(ordered)]


def restart_of(record: ProcessRecord) -> int:
    """The elastic restart a record's process belongs to (0 without torchelastic)."""
    value = read_process(record).launch_env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.isdecimal() else 0


def latest_attempt(ranks: list[ProcessRecord]) -> list[ProcessRecord]:
    """The ranks of the last restart: a restarted elastic run records each rank once per
    attempt, and only the last attempt's ranks produced the outputs."""
    if not ranks:
        return ranks
    last = max(restart_of(r) for r in ranks)
    return [r for r in ranks if restart_of(r) == last]


def earlier_attempts(ranks: list[ProcessRecord]) -> list[ProcessRecord]:
    if not ranks:
        return []
    last = max(restart_of(r) for r in ranks)
    return [r for r in ranks if restart_of(r) != last]


def stream_ranks(result: LaunchResult) -> dict[str, int]:
    """Stream file name → rank of the process that wrote it (by pid, as ranks were assigned)."""
    by_pid = {p.pid: p.rank or 0 for p in result.processes if p.pid}
    out: dict[str, int] = {}
    for name in result.op_streams:
        pid = name.removesuffix(".json").rsplit("-", 1)[-1]
        if pid.isdecimal() and int(pid) in by_pid:
            out[name] = by_pid[int(pid)]
    return out
