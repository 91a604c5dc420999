"""The wire between the user's process and the host: the process record's type and names.

Every Python process the launcher prepares writes one JSON record at exit
(``_manifest_launch._write_record``) into ``$MANIFEST_LAUNCH_RECORDS/<pid>.json``; the host
(``manifest.launch.runner``, ``manifest.capture.run``, ``manifest.nodes.topology``, ...)
reads it back. This module is the one both sides import: the boot side by its bare name
(``manifest/launch/boot`` is first on the child's ``sys.path``), the host as
``manifest.launch.boot._manifest_wire``. It holds the record's ``TypedDict``
(``ProcessRecord``: every key the boot side writes), the environment variables that carry
settings to the child, and the constants both sides spell.

Standard library only, and nothing but ``typing`` at import: it loads into every process of
every run before user code, under whichever interpreter the command runs, so it uses no
``typing`` name newer than Python 3.9 (``NotRequired`` is 3.11: an optional nested key is a
``total=False`` subclass instead).

A record comes from a file the user's process wrote, so the host never trusts its shape:
``manifest.launch.process.read_process`` reads each key it uses once, by these names, into
a typed view, keeping a value only when it has the type the boot side writes (a forged
field becomes empty). The TypedDict says which keys exist and what the boot side puts
there; ``tests/test_process_record.py`` checks a real record against it key for key.
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

# ------------------------------------------------------- environment variables

CONFIG_VAR = "MANIFEST_LAUNCH"
"""The launch settings (JSON: seed, derivation, threads, deterministic, trail, root, and
``numeric``/``emulate`` when not the default); its presence marks a prepared process."""
RECORDS_VAR = "MANIFEST_LAUNCH_RECORDS"
"""The private directory each process writes its record (and op streams) into."""
OPS_VAR = "MANIFEST_OPS"
"""The op-stream window (JSON, ``_manifest_opstream.StepWindow``) of explain and lab runs."""
AUDIT_VAR = "MANIFEST_AUDIT"
"""``manifest lab``'s op audit: the file ``_manifest_audit`` writes to."""
SEALED_RUN_VAR = "MANIFEST_SEALED_RUN"
"""``manifest.launch.runner.launch_identity`` of the run, read by the integration callbacks."""
SEGMENT_VAR = "MANIFEST_SEGMENT"
"""``{"step_offset": S, "stop_after": E}``: a resumed segment (``verify --segments``,
``manifest lab --resume-at``; ``_manifest_checkpoints``)."""
PROBE_VAR = "MANIFEST_RESUME_PROBE"
"""``{"from": K}``: fingerprint what a resume must carry before each optimizer step after K
(``manifest.lab.resume``; ``_manifest_checkpoints``)."""
RESUME_VAR = "MANIFEST_RESUME_FROM"
"""A checkpoint to resume from by a known convention (``manifest.verify.conventions``;
``_manifest_checkpoints``)."""
CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"
"""The cuBLAS workspace setting deterministic cuBLAS needs (CUDA 10.2+), set unless the
user set one."""

# ------------------------------------------------------------- records directory

PRIVATE_FILE = "launch-private"
"""The run's private settings in the records directory (an envelope run's ``perturb``
seed): what must not show in the environment or argv (``manifest.launch.runner``)."""
TRACKERS_KEY: Final = "trackers"
"""The record's key the training-loop callbacks leave their tracker locators under
(``manifest.integrations._locators``), read by ``manifest.capture.trackers``."""
WORKER_PREFIX = "worker-"
"""``worker-<pid>``: a worker (fork, multiprocessing child) started; it holds its parent."""

# ------------------------------------------------------------------ the record


class RngFingerprints(TypedDict, total=False):
    """``_manifest_rng.rng_fingerprints``: generator name -> ``blake3:`` digest."""

    python: str | None
    numpy: str | None
    torch_cpu: str | None
    cuda: list[str]


class StepDigest(TypedDict):
    """A step-trail point: the state's fingerprint after optimizer step ``step``."""

    step: int
    digest: str


class NumericPoint(TypedDict):
    """A numeric-trail point (``_manifest_trail.numeric_point``)."""

    step: int
    loss: float | None
    loss_eps: float | None
    groups: list[list[float]]


class SeedCall(TypedDict):
    """A seeding call the script made (``_manifest_observe``)."""

    call: str
    seed: str
    site: str
    generators: list[str]
    drawn: list[str]


class SwitchCall(TypedDict):
    """A determinism switch the script set, with its call site."""

    switch: str
    value: str
    site: str


class LoaderSeed(TypedDict):
    """A DataLoader with workers: its base seed, as text (a 64-bit value)."""

    base_seed: str
    workers: int
    site: str


class Checkpoint(TypedDict):
    """A checkpoint the run saved: absolute path, step, writer, ``[size, mtime_ns, inode]``."""

    path: str
    step: int
    kind: str
    sig: list[int]


class Probe(TypedDict):
    """A resumed segment's state at ``step`` (``_manifest_checkpoints.state_probe``)."""

    step: int
    params: str
    grads: str
    optimizer_state: str
    hyper: list[dict[str, Any]]
    rng: RngFingerprints


class _EnvironReadBase(TypedDict):
    site: str
    set: bool
    digest: str | None


class EnvironRead(_EnvironReadBase, total=False):
    """One variable the script's code read (``_manifest_environ``), never its value."""

    secret: bool


class ProcessRecord(TypedDict, total=False):
    """One prepared process's record. Keys are written in three waves: at start-up
    (``_manifest_launch.install`` and the observers it installs), while the script runs
    (its seeding calls, switches, loaders, checkpoints, the processes it starts), and at exit
    (``_write_record``). A process killed before exit writes none; a key of a wave that did
    not happen is absent, so every key is optional."""

    # start-up (_manifest_launch.install)
    pid: int
    start_ns: int
    argv0: str | None
    rank: int | None
    """``RANK`` as given; the host fills it in for processes without one (``select_ranks``)."""
    local_rank: int | None
    world_size: int | None
    launch_env: dict[str, str]
    seed: int
    torch_imported: bool
    numpy_imported: bool
    pythonhashseed: str | None
    hash_randomization: bool
    at_start: RngFingerprints | None
    errors: list[str]
    exception: str | None
    emulate: str | None
    # the observers (_manifest_observe, _manifest_environ, _manifest_checkpoints, _topology)
    opened: dict[str, str]
    environ: dict[str, EnvironRead]
    environ_dropped: int
    reseeds: list[SeedCall]
    switches: list[SwitchCall]
    loaders: list[LoaderSeed]
    unaccounted: list[str]
    outside: list[dict[str, str]]
    checkpoints: list[Checkpoint]
    stopped_at: int
    probes: list[Probe]
    resumed_from: str
    backend: str
    # at exit (_write_record)
    end_ns: int
    flags: dict[str, Any] | None
    cuda_runtime: str | None
    cudnn: str | None
    nccl: str | None
    devices: list[str]
    at_exit: RngFingerprints | None
    trail: list[StepDigest]
    step_source: str
    steps: int
    numeric: list[NumericPoint]
    recording_ns: int
    auto_trail: list[StepDigest]
    auto_trail_scheme: str
    log: list[dict[str, Any]]
    modules: list[str]
    fp32_precision: dict[str, str] | None
    device: str
    mp_child: bool
    # the training-loop callbacks (manifest.integrations._locators), while the script runs
    trackers: list[dict[str, Any]]


RECORD_KEYS = ProcessRecord.__optional_keys__ | ProcessRecord.__required_keys__
"""Every key a record may carry."""

UNREAD_KEYS = {
    "argv0": "the script as the process saw it: for a person reading a record by hand",
    "numpy_imported": "the numpy fingerprints in at_start/at_exit already say it",
    "hash_randomization": "pythonhashseed is what the manifest records; this is its effect",
    "errors": "the launcher's own failures (a hook that raised), for debugging a record",
    "emulate": "which matmul precisions were emulated; the host knows what it asked for",
    "stopped_at": "a segment's stop step; the host knows the stop it set",
    "step_source": "steps counted from backward() calls instead of optimizer steps",
}
"""Keys the boot side writes that no host module reads, each with why it is kept."""
