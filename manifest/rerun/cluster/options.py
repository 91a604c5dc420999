"""Where and how a cluster re-run submits: one row per executor, each with its own options.

The floor of :mod:`manifest.rerun.cluster`: the plan, the CLI and every executor read
these, and this module imports none of them, so the executors (which need
:func:`default_folder`) never import their own registry back.

:data:`REGISTRY` is the one table of executors (fsspec's registry pattern, as
``manifest.data.remote.registry``): the executor class by import path, the client library
it needs, the extra that installs it, and its options record. Each executor owns its
options: :class:`ClusterOptions` holds what every executor reads (the timeout, the data
that travels, the hardware rule), and :class:`RayOptions`, :class:`SlurmOptions` and
:class:`K8sOptions` add their own. A flag or a ``[tool.manifest.executors.NAME]`` key that
belongs to another executor is refused in one sentence, with a "did you mean" for a
misspelt one (submitit's "Unknown argument 'x' for executor 'slurm'"). A fourth executor
is one module and one row here; ``tests/test_cluster_options.py`` ties the rows to the
``--on`` choices, the flags, the extras in pyproject.toml and the docs' executor table.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar


@dataclass(frozen=True)
class ClusterOptions:
    """What every cluster executor reads (flags, else ``[tool.manifest.executors.NAME]``).

    Holds no credential: an address is stored without user and password."""

    on: str
    shared_paths: tuple[str, ...] = ()
    """Paths every node of the cluster sees as this machine does (``--shared-path``): data
    under them is mounted from the same path, not shipped."""
    max_data_bytes: int = 1 << 30
    """Data outside the repository bundled with the re-run, at most (default 1 GiB)."""
    timeout_s: float | None = None
    fetch_outputs: bool = False
    other_hardware: bool = False
    """Run even where the cluster has no node with the recorded GPU model (``--other-gpu``):
    the verdict then follows the device rule, and the report says so."""
    extra: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, Any] | None = field(default=None, repr=False)
    """``--env run``: what the node needs to rebuild and prove the run's environment
    (``manifest.rerun.environment.NodeRebuild.to_json``), set by the verb once the
    manifest's trust is decided; never a user's key."""
    note: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    """Where the executor's progress sentences go as they happen (the CLI renders them on
    stderr); None: they are kept and returned with the job (``job["notes"]``)."""

    FLAGS: ClassVar[dict[str, str]] = {
        "shared_paths": "--shared-path", "timeout_s": "--timeout",
        "fetch_outputs": "--fetch-outputs", "other_hardware": "--other-gpu"}
    """Each option's flag (an option without one is a ``pyproject.toml`` key only)."""

    def to_json(self) -> dict[str, Any]:
        out = {f.name: (dict(getattr(self, f.name)) if isinstance(getattr(self, f.name),
                                                                Mapping)
                        else getattr(self, f.name)) for f in fields(self)
               if f.name not in ("environment", "note")}
        out["env"] = "run" if self.environment is not None else "here"
        return out

    def describe(self) -> str:
        return f"--on {self.on}"

    @property
    def prints_only(self) -> bool:
        """The executor prints what it would submit and runs nothing (k8s ``--dry-run``)."""
        return False


@dataclass(frozen=True)
class RayOptions(ClusterOptions):
    address: str | None = None
    """The Jobs API address (``http://head:8265``), credentials stripped."""
    python: str = "python"
    """The interpreter on the cluster that has torch-manifest installed."""
    accelerator_types: Mapping[str, str] = field(default_factory=dict)
    """NVML GPU name → the ``accelerator_type`` the cluster's nodes declare, where Ray's own
    derivation (``NVIDIA H100 80GB HBM3`` → ``H100``) does not fit the site."""

    FLAGS: ClassVar[dict[str, str]] = {"address": "--address"}

    def describe(self) -> str:
        return f"Ray Jobs at {self.address or '(RAY_ADDRESS)'}"



@dataclass(frozen=True)
class SlurmOptions(ClusterOptions):
    partition: str | None = None
    account: str | None = None
    time_min: int | None = None
    """The job's time limit in minutes."""
    folder: str | None = None
    """submitit's log folder, a path the cluster's nodes see; default a private directory
    under the user's cache."""
    local: bool = False
    """submitit's local executor (processes on this machine), as when SLURM is absent."""
    gpu_types: Mapping[str, str] = field(default_factory=dict)
    """NVML GPU name → the site's GRES type (``--gres=gpu:TYPE:N``); default derived from
    the name (``NVIDIA H100 80GB HBM3`` → ``h100``)."""
    gpu_features: Mapping[str, str] = field(default_factory=dict)
    """NVML GPU name → a node feature (``--constraint``), for a site that types its GPUs by
    feature instead of GRES type; a name listed here is asked for this way."""

    FLAGS: ClassVar[dict[str, str]] = {"partition": "--partition", "account": "--account",
                                       "time_min": "--time"}

    def describe(self) -> str:
        parts = [f"partition {self.partition}" if self.partition else None,
                 f"account {self.account}" if self.account else None,
                 f"time {self.time_min} min" if self.time_min else None]
        import shutil

        # What SlurmExecutor.local() decides: without sbatch, submitit runs it here.
        how = ("submitit local executor on this machine" if self.local
               else "submitit local executor on this machine (no sbatch on PATH)"
               if shutil.which("sbatch") is None else "SLURM through submitit")
        return how + "".join(f", {p}" for p in parts if p)


@dataclass(frozen=True)
class K8sOptions(ClusterOptions):
    image: str | None = None
    """The image; default the manifest's container digest."""
    namespace: str = "default"
    claim: str | None = None
    """The PersistentVolumeClaim that holds ``folder`` on the nodes."""
    bundle_url: str | None = None
    """An object-store prefix (``s3://bucket/prefix``) the bundle is uploaded to and an
    init container fetches it from (instead of ``claim``)."""
    folder: str | None = None
    """Where bundles are staged: a path the claim's volume holds; default a private
    directory under the user's cache."""
    python: str = "python"
    """The interpreter in the image that has torch-manifest installed."""
    dry_run: bool = False
    gpu_label: str = "nvidia.com/gpu.product"
    """The node label that names the GPU model (NVIDIA's GPU feature discovery sets it)."""
    gpu_products: Mapping[str, str] = field(default_factory=dict)
    """NVML GPU name → the label's value on the site's nodes; default derived from the name
    as feature discovery writes it (``NVIDIA H100 80GB HBM3`` → ``NVIDIA-H100-80GB-HBM3``)."""

    FLAGS: ClassVar[dict[str, str]] = {"image": "--image", "namespace": "--namespace",
                                       "claim": "--claim", "bundle_url": "--bundle-url",
                                       "dry_run": "--dry-run"}

    def describe(self) -> str:
        return f"Kubernetes Indexed Job in namespace {self.namespace}"

    @property
    def prints_only(self) -> bool:
        return self.dry_run


@dataclass(frozen=True)
class ExecutorRow:
    """One executor: its class by import path, the client library, its extra, its options."""

    executor: str
    library: str
    extra: str
    options: type[ClusterOptions]


REGISTRY: dict[str, ExecutorRow] = {
    "ray": ExecutorRow("manifest.rerun.cluster.ray:RayExecutor", "ray.job_submission",
                       "ray", RayOptions),
    "slurm": ExecutorRow("manifest.rerun.cluster.slurm:SlurmExecutor", "submitit",
                         "slurm", SlurmOptions),
    "k8s": ExecutorRow("manifest.rerun.cluster.k8s:KubernetesExecutor", "kubernetes",
                       "k8s", K8sOptions),
}
"""``--on NAME`` → its row; the executor is imported on first use, and none imports this
table back."""

EXECUTORS = tuple(REGISTRY)


NOT_OPTIONS = frozenset({"on", "extra", "environment", "note"})
"""Fields the verb sets, never a flag or a ``[tool.manifest.executors.NAME]`` key."""


def _own(options: type[ClusterOptions]) -> set[str]:
    """The option names of one executor's record that a user may set."""
    return {f.name for f in fields(options)} - NOT_OPTIONS


def owner_of(name: str) -> list[str]:
    """The executors whose options include ``name`` (every one for a common option)."""
    return [on for on, row in REGISTRY.items() if name in _own(row.options)]


def _flag(name: str) -> str | None:
    for row in REGISTRY.values():
        if name in row.options.FLAGS:
            return row.options.FLAGS[name]
    return ClusterOptions.FLAGS.get(name)


def cluster_options(on: str, flags: Mapping[str, Any], config: Mapping[str, Any]
                    ) -> ClusterOptions:
    """Options for ``--on ON``: the flags that were given, else ``[tool.manifest.executors.ON]``.

    A given flag (not None, not False, not empty) or a key that another executor owns is
    refused, as is an unknown key; each in one sentence."""
    from manifest.errors import ConfigError, UsageError
    from manifest.redact import strip_url_credentials

    row = REGISTRY[on]
    own = _own(row.options)
    given = {k: v for k, v in flags.items() if v is not None and v is not False and v != ()
             and v != []}
    for name in sorted(set(given) - own):
        owners = owner_of(name)
        flag = _flag(name) or name
        raise UsageError(f"{flag} is an option of --on {' and --on '.join(owners) or '?'}, "
                         f"not of --on {on}.")
    table = config.get(on, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[tool.manifest.executors.{on}] must be a table.")
    for key in sorted(set(table) - own):
        owners = owner_of(key)
        if owners:
            raise ConfigError(f"[tool.manifest.executors.{on}] has {key!r}, an option of "
                              f"{' and '.join(owners)}, not of {on}.")
        close = difflib.get_close_matches(key, sorted(own), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"[tool.manifest.executors.{on}] has unknown key {key!r}{hint}.")
    values: dict[str, Any] = dict(table)
    values.update(given)
    if "shared_paths" in values:
        values["shared_paths"] = tuple(str(p) for p in values["shared_paths"])
    for name in ("accelerator_types", "gpu_types", "gpu_features", "gpu_products"):
        if name in values:
            mapping = values[name]
            if not isinstance(mapping, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
                raise ConfigError(f"[tool.manifest.executors.{on}] {name} must be a table of "
                                  "GPU names to strings.")
            values[name] = dict(mapping)
    if values.get("address"):
        values["address"] = strip_url_credentials(str(values["address"]))
    return replace(row.options(on=on), **values)


def missing_extra(on: str) -> str | None:
    """None when ``--on ON``'s library imports, else the sentence that says how to get it."""
    import importlib.util

    row = REGISTRY[on]
    # The top-level package only: finding it imports nothing (ray's own import is ~1 s).
    try:
        found = importlib.util.find_spec(row.library.partition(".")[0])
    except ValueError:  # in sys.modules as None: imports of it are blocked
        found = None
    if found is None:
        from manifest.errors import install_line

        return f"--on {on} needs its client library: {install_line(row.extra)}."
    return None


def default_folder(on: str) -> Path:
    """A private directory under the user's cache for bundles and logs."""
    import os

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "torch-manifest" / on
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
