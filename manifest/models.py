"""The manifest data model (schema ``manifest/v1``).

Every model is frozen, forbids unknown fields and validates strictly, so a
manifest that loads is exactly a manifest this code could have written.
Probes never raise for a missing optional part: they store ``None`` in the
field and a sentence in the section's ``unavailable`` map (field -> reason).

Integers are bounded to the JSON-safe range (|n| < 2^53) because RFC 8785
serialises numbers as IEEE doubles; seeds are bounded to that range at the
CLI, byte counts cannot reach it. Floats are finite (no NaN/Infinity).

Which sections name a run (``run_id``) is decided in ``manifest.canonical``.

Longer than 500 lines because it is the whole schema in one file: the JSON
Schema is generated from it and the diff's rule table follows it field by
field, so a section split across modules would hide a field from both.

Fields added after the first release are declared with :func:`later`: they
default to ``None`` and are left out of the document while ``None``, so a
manifest written before they existed keeps its exact bytes and ``run_id``
(``tests/golden`` pins that).

No ``from __future__ import annotations`` here: with it every field's
annotation is a string that pydantic compiles and evaluates when the class is
made (~240 of them), which made importing this module take 15 ms instead of
10 ms of the ~0.16 s of ``manifest capture`` (benchmarks/capture_latency.py);
the JSON Schema is the same either way. So a field may name only a class
defined above it.
"""

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

SCHEMA_V1 = "manifest/v1"

MAX_SAFE_INT = 2**53 - 1

Digest = Annotated[str, StringConstraints(pattern=r"^blake3:[0-9a-f]{64}$")]
"""``blake3:`` followed by 64 lowercase hex digits."""

Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
Seed = Annotated[int, Field(ge=0, le=MAX_SAFE_INT)]
Reasons = dict[str, str]


def _is_none(value: Any) -> bool:
    return value is None


def later(description: str) -> Any:
    """A field added after ``manifest/v1`` shipped: ``None`` by default, omitted while None."""
    return Field(default=None, exclude_if=_is_none, description=description)


class Model(BaseModel):
    """Shared configuration of every manifest model."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        validate_default=True,
        # Build each validator on first use, not at import: `manifest capture`
        # uses a handful of the models and must start in well under 0.25 s.
        defer_build=True,
    )


# --------------------------------------------------------------------- code


class Submodule(Model):
    path: str
    commit: str | None


class Code(Model):
    """The source tree: commit plus the exact uncommitted bytes.

    ``diff_digest`` is the blake3 of the patch (``git diff --binary HEAD`` of
    tracked files followed by untracked, not-ignored files as additions); the
    patch itself lives in the store at ``blobs/blake3-<hex>`` so verify can
    re-apply it. ``lockfiles`` maps repo-relative paths to file digests.
    """

    commit: str | None
    dirty: bool | None
    diff_digest: Digest | None
    untracked_files: Count | None
    submodules: list[Submodule]
    shallow: bool | None
    detached: bool | None
    lockfiles: dict[str, Digest]
    unavailable: Reasons = Field(default_factory=dict)


# --------------------------------------------------------------------- data


Strength = Literal["content-digest", "version-pin", "change-detector"]
"""What a remote dataset's pin proves (``manifest.data.remote``): the provider's
digest of every object's full bytes; an immutable version of every object, whose
bytes are not known here; or only facts that change when an object is rewritten."""


class RemotePin(Model):
    """How a dataset in a bucket, on the Hub or in a Delta table was pinned
    (``manifest.data.remote``).

    Pinned from metadata, no object body read, unless ``mode`` is ``deep``.
    """

    provider: Literal["s3", "gcs", "hf", "delta"]
    endpoint: str | None
    """The service's base URL when it is not the provider's default, never with userinfo."""
    revision: str | None
    """The Hub commit the revision resolved to, or the Delta table version; None for
    buckets."""
    mode: Literal["listing", "checksums", "deep"]
    strength: Strength
    pins: Digest
    """Blob of the per-object pins (``manifest-remote/v1``): key, size, version, checksum."""
    checksums: dict[str, Count]
    """How many objects carry each kind of provider checksum (``none`` for those without)."""
    versioned: Count
    """How many objects are pinned to a version id, generation or commit."""


class Dataset(Model):
    """One dataset: the Merkle root of its bytes (see ``manifest.data``)."""

    name: str
    path: str
    root: Digest
    files: Count
    bytes: Count
    listing: Digest | None = None
    """Blob holding the per-file listing, so verify can name changed files."""
    source: Literal["discovered"] | None = later(
        "'discovered': not declared with --data; the launcher saw the run open it")
    from_repo: str | None = later(
        "for a path outside the repository: where it lies relative to the repository root "
        "(e.g. ../../data/x), so verify can make it reachable from the scratch clone")
    remote: RemotePin | None = later(
        "for data in a bucket, on the Hub or in a Delta table (path is its s3://, gs://, "
        "hf:// or delta:// URL): how it "
        "was pinned and what that proves; root is then the pins' root, or with mode 'deep' "
        "the same BLAKE3 root a local copy of the objects gives")


# ---------------------------------------------------------------------- env


class Container(Model):
    runtime: str | None
    image_digest: str | None
    source: str | None


ALWAYS_BITS_NAMES = frozenset({"torch", "triton", "pytorch-triton", "pytorch-triton-rocm",
                               "pytorch-triton-xpu", "cuda-toolkit"})
"""Distributions that count for the bits whether or not a module of theirs was imported:
torch, the Triton build its compiler runs, and CUDA 13's toolkit metapackage. By exact
name: torchvision, torchmetrics or tritonclient share a prefix and count, like any
package, only when the run imported them."""

_CUDA_LIBRARY = re.compile(
    r"nvidia-[a-z0-9-]+-cu[0-9]+"  # CUDA 12's libraries: nvidia-cublas-cu12 ...
    r"|nvidia-(?:cublas|cuda-cccl|cuda-crt|cuda-cupti|cuda-nvcc|cuda-nvrtc|cuda-runtime"
    r"|cudnn|cufft|cufile|curand|cusolver|cusparse|cusparselt|nccl|nvjitlink|nvshmem|nvtx"
    r"|nvvm)")  # CUDA 13's, renamed without the suffix (cuda-toolkit's components)
"""The CUDA libraries torch loads as shared objects (never imported): not nvidia-ml-py
(imported as pynvml when used), nvidia-dali-cuda120 or nvidia-modelopt."""


def always_counts(name: str) -> bool:
    """Whether distribution ``name`` counts for the bits even when the run imported no
    module of it: :data:`ALWAYS_BITS_NAMES` and the CUDA libraries (:data:`_CUDA_LIBRARY`)."""
    normal = re.sub(r"[-_.]+", "-", name).lower()
    return normal in ALWAYS_BITS_NAMES or _CUDA_LIBRARY.fullmatch(normal) is not None


class DirectUrl(Model):
    """PEP 610 ``direct_url.json`` of a distribution installed from a URL, path or VCS."""

    url: str
    """Credentials, query and fragment stripped (``manifest.redact.strip_url_credentials``)."""
    editable: bool = False
    vcs: str | None = None
    commit_id: str | None = None
    archive_hash: str | None = None
    """``sha256=<hex>`` when ``archive_info`` gives one."""


class Distribution(Model):
    """One installed distribution, by content (``manifest.probes.distributions``)."""

    version: str
    """Exact, local label kept (``2.13.0+cpu``)."""
    tags: list[str]
    """The ``Tag:`` lines of ``WHEEL``; [] for egg-info or unknown."""
    installer: str | None
    """What ``INSTALLER`` says (pip, uv, ...)."""
    direct_url: DirectUrl | None
    files: Digest | None
    """blake3 of its RECORD lines inside site-packages, installer bookkeeping, bytecode and
    console scripts left out; None where there is no RECORD (egg-info, some editable
    installs)."""


class Sources(Model):
    """Where the distributions can come from, as pip and uv were configured at capture."""

    indexes: list[str]
    find_links: list[str]
    origin: str
    """Which configuration files and variables said so, or that nothing was configured."""


class Env(Model):
    python: str
    implementation: str
    torch: str | None
    torch_cuda: str | None
    torch_hip: str | None
    torch_git: str | None
    numpy: str | None
    cuda_runtime: str | None
    cuda_driver: str | None
    cudnn: str | None
    nccl: str | None
    blas: str | None
    packages: dict[str, str]
    packages_digest: Digest
    container: Container
    variables: dict[str, str]
    """Allow-listed environment variables that can change numerics."""
    unavailable: Reasons = Field(default_factory=dict)
    imported: list[str] | None = later(
        "distributions (normalised names) whose modules the run imported; only these, torch "
        "and its CUDA libraries can change the bits")
    distributions: dict[str, Distribution] | None = later(
        "each installed distribution (normalised name) by version, wheel tags, installer, "
        "direct URL and a digest of its files; files count for the run_id where the version "
        "does, unless the install is editable (its files name the checkout's path)")
    sources: Sources | None = later(
        "the indexes and find-links pip and uv were configured with at capture; where-from, "
        "not bits")
    environment_digest: Digest | None = later(
        "blake3 over (name, version, files) of every distribution; like packages_digest, "
        "out of the run_id when env.imported is known")


# ----------------------------------------------------------------- hardware


class Gpu(Model):
    index: Count
    name: str
    memory_bytes: Count | None
    compute_capability: str | None
    mig_mode: bool | None
    ecc_mode: bool | None


class HardwareFacts(Model):
    """What one machine has: the ``hardware`` section, and each node's in a merged run."""

    gpus: list[Gpu] | None
    gpu_count: Count | None
    gpu_driver: str | None
    cpu_model: str | None
    cpu_isa: list[str]
    unavailable: Reasons = Field(default_factory=dict)


class NodeHardware(HardwareFacts):
    """One node's hardware in a merged multi-node run (``manifest merge``)."""

    node: Count


class Hardware(HardwareFacts):
    nodes: list[NodeHardware] | None = later(
        "a merged multi-node run: each node's hardware (the fields above are node 0's); "
        "nodes may differ, and the diff labels each difference")


# --------------------------------------------------------------- randomness


class RngFingerprints(Model):
    """blake3 of each generator's serialised state."""

    python: Digest | None
    numpy: Digest | None
    torch_cpu: Digest | None
    cuda: list[Digest]


class SeedCall(Model):
    """A call in the run that reseeded a generator (or made a seeded one)."""

    call: str
    """``random.seed``, ``numpy.random.seed``, ``numpy.random.default_rng``,
    ``torch.manual_seed``, ``torch.cuda.manual_seed(_all)``, ``seed_everything``, ``set_seed``."""
    seed: str | None
    """The seed as text (``str(int)``): seeds may exceed JSON's safe integers."""
    site: str
    """``file:line`` of the first frame in the user's code (repo-relative inside the repository)."""
    generators: list[str]
    """Global generators it reseeded: ``python``, ``numpy``, ``torch_cpu``, ``cuda``."""
    drawn: list[str]
    """Of those, the ones already drawn from since the launcher seeded them."""


class LoaderSeed(Model):
    """A DataLoader iterator with worker processes: worker i is seeded ``base_seed + i``."""

    base_seed: str
    """As text: a random int64."""
    workers: Count
    site: str


class ProcessRandomness(Model):
    rank: Count
    seed: Seed | None
    at_start: RngFingerprints | None
    reseeds: list[SeedCall] | None = later("seeding calls the run made, in order (first 32)")
    loaders: list[LoaderSeed] | None = later("DataLoader worker seeds (first 16 iterators)")
    unaccounted: list[str] | None = later(
        "generators whose draws the states at start and exit cannot account for: a state set "
        "from a saved one (random.setstate, torch.set_rng_state, fork_rng …), or draws made "
        "before torch was imported")


class Randomness(Model):
    seed: Seed | None
    derivation: Literal["same", "base+rank"] | None
    processes: list[ProcessRandomness] = Field(default_factory=list)
    unavailable: Reasons = Field(default_factory=dict)


# -------------------------------------------------------------- determinism


class Flags(Model):
    """Every switch that selects kernels or reduction order."""

    deterministic_algorithms: bool | None
    deterministic_warn_only: bool | None
    cudnn_deterministic: bool | None
    cudnn_benchmark: bool | None
    allow_tf32_matmul: bool | None
    allow_tf32_cudnn: bool | None
    float32_matmul_precision: str | None
    autocast: bool | None
    num_threads: Count | None
    num_interop_threads: Count | None


class SwitchCall(Model):
    """A recipe switch the run itself changed, with its value and call site."""

    switch: str
    """e.g. ``torch.backends.cuda.matmul.allow_tf32``, ``torch.autocast``."""
    value: str
    site: str


class EnvRead(Model):
    """An environment variable the run's own code read (``launch/boot/_manifest_environ``):
    where it was first read and a digest of what it returned, never the value."""

    site: str
    """``file:line`` of the first read (repo-relative inside the repository)."""
    set: bool
    """Whether it was set when read (an unset one made the script fall back to a default)."""
    digest: Digest | None
    """The value's digest, keyed (``manifest.capture.environ.keyed_digest``: blake3 in keyed
    mode, under ``key``, of the value's blake3, UTF-8); a manifest made before reads were
    keyed holds the plain blake3 here, with no ``key``. None when unset, when withheld
    because the value looks like a secret (by its name, ``manifest.redact.is_secret_name``,
    or its shape), when no key could be read or made, or when the run's Python had no
    blake3 to digest it with."""
    key: Digest | None = later(
        "the blake3 of the key the digest is keyed with (the capturing user's environ.key): "
        "digests under two keys are not comparable, and without the key no dictionary of "
        "values leads back to one")


class ProcessDeterminism(Model):
    rank: Count
    local_rank: Count | None
    world_size: Count | None
    torch_imported: bool
    flags: Flags | None
    pythonhashseed: str | None
    """PYTHONHASHSEED in force since the interpreter started."""
    cuda_runtime: str | None
    cudnn: str | None
    nccl: str | None
    devices: list[str]
    switches: list[SwitchCall] | None = later(
        "recipe switches the run changed, and autocast regions it entered (first 64)")
    fp32_precision: dict[str, str] | None = later(
        "PyTorch's newer TF32 switches at exit (torch.backends.fp32_precision and the "
        "per-backend ones), where this torch has them")
    environ: dict[str, EnvRead] | None = later(
        "environment variables the run's own code read (not libraries', not the launcher's, "
        "not those compared under env.variables, command.code_env or command.topology): "
        "name -> where and the digest of the value; in identity, since another value is "
        "another run")


class OutsideProcess(Model):
    """A Python process the run started that the launcher did not prepare
    (``manifest.launch.outside``): no seeds, no switches, no record."""

    command: str
    """The interpreter, its options and the script or module name; never the script's
    arguments (e.g. ``python -S train.py``)."""
    reason: str
    """Why the launcher could not reach it (``-S``, an environment without the marker …)."""
    site: str
    """Where it was started: ``file:line`` of the call in a prepared process, ``the command
    line``, or ``under <program>`` for a process the parent's watch saw."""


class Determinism(Model):
    requested: bool
    """Whether the launcher was asked to enforce the deterministic recipe."""
    num_threads: Count | None
    cublas_workspace_config: str | None
    pythonhashseed: str | None
    processes: list[ProcessDeterminism] = Field(default_factory=list)
    unavailable: Reasons = Field(default_factory=dict)
    outside_recipe: list[OutsideProcess] | None = later(
        "Python processes the run started outside the recipe (python -S, a scrubbed "
        "environment …): the recipe was not in force in them, whatever 'requested' says")


# ------------------------------------------------------------------ command


class RankPlace(Model):
    """Where one global rank ran: its node, its place there, its device."""

    rank: Count
    node: Count
    local_rank: Count | None
    device: str | None
    """``cpu`` or ``cuda:<index>`` (the physical index on its node), as the process saw it
    at exit; None when the process never imported torch."""


class Topology(Model):
    """How a distributed run was laid out (``manifest.nodes.topology``): part of its identity,
    since a reduction's order follows the ranks, the backend and the collective settings."""

    launcher: Literal["torchrun", "slurm", "kubernetes", "mpi", "env"]
    """What placed the processes: torchrun/torchelastic, srun, an Indexed Job, mpirun, or
    only ``RANK``/``WORLD_SIZE`` in the environment."""
    nodes: Count
    world_size: Count
    local_world_size: Count | None
    """Processes per node, when every node runs the same number."""
    backend: str | None
    """The process group's backend (``gloo``, ``nccl`` …) when the script started one."""
    ranks: list[RankPlace]
    nccl: dict[str, str]
    """Collective settings in force in the ranks (``NCCL_ALGO``, ``NCCL_PROTO`` …)."""
    node: Count | None = later(
        "a node record: the node this record covers, waiting for manifest merge (a merged "
        "run's command.argv is the command every node ran, its --node-rank set aside)")


class Command(Model):
    argv: list[str]
    cwd: str
    """Working directory relative to the repository root ("." for the root)."""
    outputs: list[str]
    datasets: list[str]
    code_env: dict[str, str] | None = later(
        "variables that decide which code runs (PYTHONPATH …); repository paths as {repo}/…")
    topology: Topology | None = later(
        "a distributed run: nodes × processes, backend, rank → device, NCCL settings")


# ------------------------------------------------------------------ outputs


class Tensor(Model):
    dtype: str
    shape: list[Count]
    digest: Digest


class Artifact(Model):
    path: str
    digest: Digest
    bytes: Count
    format: Literal["safetensors", "torch", "file", "dcp", "safetensors-index"]
    """``dcp``: a torch.distributed.checkpoint directory; ``safetensors-index``: a
    ``*.safetensors.index.json`` with its shards (each is one artifact, its digest over
    its files' names and digests, its table every tensor of them)."""
    tensors: dict[str, Tensor] | None
    node: Count | None = later(
        "a multi-node run: the node whose processes wrote it (each node has its own disk)")


class TrailPoint(Model):
    step: Count
    digest: Digest


class NumericPoint(Model):
    """One step of the numeric trail (``launch/boot/_manifest_trail.numeric_point``): numbers
    that let two runs be compared by distance, not only by bits."""

    step: Count
    loss: float | None
    """The last scalar passed to ``backward()`` before this step; None when there was none."""
    loss_eps: float | None = None
    """Machine epsilon of the loss's dtype: one rounding of the loss, relative."""
    groups: list[list[float]]
    """Per parameter group: its L2 norm, then its sketch: 16 count-sketch values whose mean
    square estimates the squared distance to another run's (older manifests hold 4 dense
    random projections; points of different lengths are not compared)."""


class EnvelopeStep(Model):
    """How far each rounding-only run was from the base run at one step (relative)."""

    step: Count
    loss: list[float]
    """|Δloss| / |loss| of each run (the runs in ``Envelope.runs`` order)."""
    groups: list[list[float]]
    """Per parameter group, each run's relative parameter distance."""


class Envelope(Model):
    """A run's own noise envelope (``manifest.numeric.envelope``): what rounding alone does
    to its numeric trail, step by step. Measured by ``lab`` or ``capture --envelope``."""

    runs: list[str]
    """What each run changed: ``1 ULP (seed 1)``, ``threads 2 → 1`` …"""
    steps: list[EnvelopeStep]
    precision: Literal["fp32", "tf32", "bf16"] | None = later(
        "the matmul precision the envelope runs used (``manifest.numeric.precision``): a "
        "re-run at a coarser precision than this is not covered by it; absent: fp32")
    how: Literal["measured", "emulated"] | None = later(
        "how that precision was obtained: on the device itself, or emulated on CPU "
        "(``launch/boot/_manifest_precision``)")
    twin: list[NumericPoint] | None = later(
        "the recorded run's emulated twin: its recipe run once more under the emulation of "
        "``precision``, unperturbed (the numeric trail of the rank ``numeric.measure`` "
        "reads). The envelope's runs are measured against it, and ``verify --emulate`` "
        "judges a re-run against it, not the float32 trail (``numeric.twin``)")
    twin_outputs: dict[str, float] | None = later(
        "each declared output (its recorded path) → the twin's file's relative L2 distance "
        "from the recorded file, tensor by tensor: how far verify widens the output's bound "
        "when judging against the twin (``numeric.twin.output_bound``)")
    loss_eps: float | None = later(
        "the machine epsilon of the base run's loss (its trail's ``loss_eps``): the loss's "
        "rounding unit, which the loss bound is floored at. What a renderer with no trail at "
        "hand (lab) calibrates with; the verdict takes it from the recorded trail "
        "(``numeric.calibration.verdict_calibration``)")


class OpStreamRef(Model):
    """An op stream stored at capture (``--fingerprint-ops``) as a blob in the store."""

    digest: Digest
    steps: list[Count]
    """First and last optimizer step it covers."""
    ops: Count


class RecordingCost(Model):
    """What recording the step and numeric trails cost one process."""

    seconds: Annotated[float, Field(ge=0)]
    """Wall time spent fingerprinting and sketching the parameters after its steps."""
    share: Annotated[float, Field(ge=0)]
    """``seconds`` over the process's wall time, start-up to exit."""


class RankRecording(Model):
    """What recording the trails cost one rank (``observed.recording``): a timing, so it
    sits with the other observations, and two captures of one run have equal ``outputs``."""

    rank: Count
    seconds: Annotated[float, Field(ge=0)]
    """Wall time spent fingerprinting and sketching the parameters after its steps."""
    share: Annotated[float, Field(ge=0)]
    """``seconds`` over the process's wall time, start-up to exit."""


class KeyedRead(Model):
    """A secret-looking variable the run's own code read (``manifest.capture.environ``), by
    a digest keyed on the machine that recorded it: only a run under the same key (verify's
    re-run there) can compare it; without the key it gives nothing back."""

    key: Digest
    """blake3 of that machine's key: digests under another key are not comparable."""
    digest: Digest
    """blake3 keyed with it of the value's blake3."""


class EnvReadsRecorded(Model):
    """That the launcher recorded a process's environment reads (``determinism.processes
    [*].environ``), and how completely: a manifest made before it did has no such record,
    and its reads are then not compared (``manifest.capture.environ``)."""

    names: Count
    """Names the run's own code read that the launcher kept, before those compared
    elsewhere were dropped."""
    dropped: Count
    """Names read past the launcher's limit (256), not kept: when not 0, the list is
    incomplete (counted up to 65,536)."""


class ProcessOutcome(Model):
    rank: Count
    at_exit: RngFingerprints | None
    trail: list[TrailPoint] = Field(default_factory=list)
    trail_scheme: str | None = later(
        "how the launcher's automatic step trail was fingerprinted ('word-sums-32'); absent "
        "where the script's own manifest.trail() made it, and in manifests made before the "
        "marker, whose automatic fingerprints a re-run cannot reproduce")
    # Left out of the document when absent, so manifests without it keep their bytes.
    ops: OpStreamRef | None = Field(default=None, exclude_if=lambda v: v is None)
    numeric: list[NumericPoint] | None = later(
        "the numeric trail: per step, the loss and each parameter group's norm and random "
        "projections, to compare runs by distance where bits cannot be expected")
    recording: RecordingCost | None = later(
        "what recording the step and numeric trails cost this process, in manifests that "
        "keep it here; a capture writes it to observed.recording, so that two captures of "
        "one run have equal outputs sections")
    secret_reads: dict[str, KeyedRead] | None = later(
        "secret-looking variables the run's own code read, by a digest keyed on this machine "
        "(outside identity: another machine has another key)")
    environ_recorded: EnvReadsRecorded | None = later(
        "that the launcher recorded the environment variables this process read, and how "
        "many it dropped past its limit; absent in manifests made before it did")


class Segment(Model):
    """One attempt of an elastic run (torchelastic ``--max-restarts``, a SLURM requeue)."""

    restart: Count
    world_size: Count | None
    ranks: list[Count]
    """The ranks that left a record in this attempt."""
    error: str | None
    """Why the attempt ended, when it failed."""
    resized: str | None = later(
        "a restart that resumed on another world size, e.g. '2 → 4': named, since its "
        "reductions differ from the attempt before")


class SiblingFile(Model):
    """A file beside a checkpoint in a Hugging Face ``checkpoint-N/`` directory
    (``trainer_state.json``, ``optimizer.pt``, ``rng_state.pth`` …), which a resume reads."""

    bytes: Count
    digest: Digest
    """blake3 of its bytes."""


class Checkpoint(Model):
    """A checkpoint the run wrote during training (``manifest.capture.checkpoints``)."""

    step: Count
    """The process's optimizer-step count when the save returned."""
    path: str
    """Relative to the command's cwd, as artifacts are."""
    artifact: Artifact | None
    """Digest and tensor table; None when ``lost`` says why it is not there."""
    lost: str | None
    """Why it could not be recorded: saved again at a later step, gone, outside the tree."""
    siblings: dict[str, SiblingFile] | None = later(
        "for a checkpoint in a Hugging Face checkpoint-N/ directory: the other regular files "
        "there, by name, as capture saw them; verify --at copies exactly these, of these "
        "sizes and digests, beside it for the resume")


class Outputs(Model):
    status: Literal["ok", "failed", "not-run"]
    exit_code: int | None
    error: str | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    processes: list[ProcessOutcome] = Field(default_factory=list)
    workers: Count | None = later(
        "worker processes the run's processes forked or spawned (DataLoader workers, "
        "multiprocessing): they draw from generators whose states are not recorded")
    segments: list[Segment] | None = later(
        "an elastic run that restarted: its attempts in order, the last one's ranks above")
    checkpoints: list[Checkpoint] | None = later(
        "checkpoints the run saved during training, each with its step (verify --segments "
        "resumes from them)")
    envelope: Envelope | None = later(
        "the run's own noise envelope (capture --envelope): how far rounding-only runs "
        "drift from it step by step; verify's 'equivalent' is judged against it")


# ----------------------------------------------------------------- observed


class RankCompute(Model):
    """One rank's wall time, from its process start to its exit record."""

    rank: Count
    wall_s: Annotated[float, Field(ge=0)]


class GpuEnergy(Model):
    """Energy one GPU used during the run: the delta of NVML's total-energy counter."""

    index: Count
    energy_j: Annotated[float, Field(ge=0)]


class Compute(Model):
    """What the run cost: the compute record that GPAI documentation (EU AI Act, Annex XI)
    and NIST's AI RMF ask for. In ``observed``: it never names the run.

    ``gpu_hours`` is the GPUs visible to the run times the command's wall time.
    ``energy_j`` is the sum of ``gpus[*].energy_j``, present only where the driver
    exposes the total-energy counter (Volta and later); ``unavailable`` says why not.
    """

    wall_s: Annotated[float, Field(ge=0)]
    ranks: list[RankCompute] = Field(default_factory=list)
    gpu_count: Count
    gpu_hours: Annotated[float, Field(ge=0)]
    energy_j: Annotated[float, Field(ge=0)] | None = None
    gpus: list[GpuEnergy] = Field(default_factory=list)
    unavailable: dict[str, str] = Field(default_factory=dict)


def _absent(value: object) -> bool:
    return value is None


class LockfileDisagreement(Model):
    """An installed package at a version its lockfile does not pin (``manifest.probes.code``)."""

    package: str
    lockfile: str
    locked: str
    """The pinned version, or versions joined by ``or`` where the lock forks by platform."""
    installed: str


class Observed(Model):
    """Facts that cannot change the bits: never part of ``run_id``."""

    tool_version: str
    started_at: str
    finished_at: str
    duration_s: Annotated[float, Field(ge=0)]
    hostname_hash: Digest | None
    branch: str | None
    remote_url: str | None
    store: str | None
    logical_cpus: Count | None
    gpu_uuid_hashes: list[Digest] = Field(default_factory=list)
    pids: list[Count] = Field(default_factory=list)
    # Added after v1's first release: left out of the document when absent, so a
    # manifest recorded before it keeps its canonical bytes, run_id and digest.
    compute: Compute | None = Field(default=None, exclude_if=_absent)
    large_untracked: dict[str, Count] | None = later(
        "untracked, not-ignored files over 1 MiB left out of the code patch (path -> bytes)")
    rendezvous: str | None = later(
        "a distributed run: its torchelastic run id or SLURM job.step, so merge can tell "
        "node records of one run from another's")
    node_records: list[Digest] | None = later(
        "a merged multi-node run: the digest of each node record it was merged from, in node "
        "order, so a node's capture --nodes takes only a merge that holds its own record")
    inputs_not_digested: dict[str, Count] | None = later(
        "files the run read that git does not track and that were too large to digest "
        "unasked (path -> bytes): declare them with --data")
    recording: list[RankRecording] | None = later(
        "what recording the step and numeric trails cost each rank: seconds and share of its "
        "wall time")
    lockfile_disagrees: list[LockfileDisagreement] | None = later(
        "installed packages at another version than a lockfile at the repository root pins "
        "(requirements*.txt == lines, uv.lock, poetry.lock): the lockfile does not describe "
        "this run's environment")


# ----------------------------------------------------------------- manifest


class Manifest(Model):
    schema_: Literal["manifest/v1"] = Field(alias="schema")
    code: Code
    data: list[Dataset]
    env: Env
    hardware: Hardware
    randomness: Randomness
    determinism: Determinism
    command: Command | None
    outputs: Outputs | None
    observed: Observed
    run_id: Digest
    digest: Digest

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
