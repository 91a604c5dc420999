"""Where and how a cluster re-run submits: the options, the extras, the staging folder.

The floor of :mod:`manifest.rerun.cluster`: the plan, the CLI and every executor read
these, and this module imports none of them, so the executors (which need
:func:`default_folder`) never import their own registry back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

EXECUTORS = ("ray", "slurm", "k8s")
EXTRA = {"ray": "ray", "slurm": "slurm", "k8s": "k8s"}
MODULE = {"ray": "ray.job_submission", "slurm": "submitit", "k8s": "kubernetes"}


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how a cluster executor submits (flags, else ``[tool.manifest.executors.NAME]``).

    Holds no credential: ``address`` is stored without user and password."""

    on: str
    address: str | None = None
    """Ray: the Jobs API address (``http://head:8265``), credentials stripped."""
    partition: str | None = None
    account: str | None = None
    time_min: int | None = None
    """SLURM: the job's time limit in minutes."""
    folder: str | None = None
    """SLURM (submitit's log folder) and Kubernetes (where bundles are staged): a path
    the cluster's nodes see; default a private directory under the user's cache."""
    image: str | None = None
    """Kubernetes: the image; default the manifest's container digest."""
    namespace: str = "default"
    claim: str | None = None
    """Kubernetes: the PersistentVolumeClaim that holds ``folder`` on the nodes."""
    bundle_url: str | None = None
    """Kubernetes: an object-store prefix (``s3://bucket/prefix``) the bundle is uploaded to
    and an init container fetches it from (instead of ``claim``)."""
    shared_paths: tuple[str, ...] = ()
    """Paths every node of the cluster sees as this machine does (``--shared-path``): data
    under them is mounted from the same path, not shipped."""
    max_data_bytes: int = 1 << 30
    """Data outside the repository bundled with the re-run, at most (default 1 GiB)."""
    python: str = "python"
    """The interpreter on the cluster that has torch-manifest installed."""
    timeout_s: float | None = None
    fetch_outputs: bool = False
    dry_run: bool = False
    local: bool = False
    """SLURM: submitit's local executor (processes on this machine), as when SLURM is absent."""
    extra: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {f.name: (dict(getattr(self, f.name)) if f.name == "extra"
                         else getattr(self, f.name)) for f in fields(self)}

    def describe(self) -> str:
        if self.on == "ray":
            return f"Ray Jobs at {self.address or '(RAY_ADDRESS)'}"
        if self.on == "slurm":
            parts = [f"partition {self.partition}" if self.partition else None,
                     f"account {self.account}" if self.account else None,
                     f"time {self.time_min} min" if self.time_min else None]
            import shutil

            # What SlurmExecutor.local() decides: without sbatch, submitit runs it here.
            how = ("submitit local executor on this machine" if self.local
                   else "submitit local executor on this machine (no sbatch on PATH)"
                   if shutil.which("sbatch") is None else "SLURM through submitit")
            return how + "".join(f", {p}" for p in parts if p)
        return f"Kubernetes Indexed Job in namespace {self.namespace}"


def cluster_options(on: str, flags: Mapping[str, Any], config: Mapping[str, Any]
                    ) -> ClusterOptions:
    """Options for ``--on ON``: the flags that were given, else ``[tool.manifest.executors.ON]``."""
    from manifest.errors import ConfigError
    from manifest.redact import strip_url_credentials

    table = config.get(on, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[tool.manifest.executors.{on}] must be a table.")
    known = {f.name for f in fields(ClusterOptions)} - {"on", "extra", "dry_run"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"[tool.manifest.executors.{on}] has unknown key(s): "
                          f"{', '.join(unknown)}.")
    values: dict[str, Any] = {k: v for k, v in table.items() if k in known}
    values.update({k: v for k, v in flags.items() if v is not None and v is not False})
    if "shared_paths" in values:
        values["shared_paths"] = tuple(str(p) for p in values["shared_paths"])
    if values.get("address"):
        values["address"] = strip_url_credentials(str(values["address"]))
    options = ClusterOptions(on=on)
    return replace(options, **values)


def missing_extra(on: str) -> str | None:
    """None when ``--on ON``'s library imports, else the sentence that says how to get it."""
    import importlib.util

    # The top-level package only: finding it imports nothing (ray's own import is ~1 s).
    try:
        found = importlib.util.find_spec(MODULE[on].partition(".")[0])
    except ValueError:  # in sys.modules as None: imports of it are blocked
        found = None
    if found is None:
        return (f"--on {on} needs its client library: pip install "
                f"'torch-manifest[{EXTRA[on]}]'.")
    return None


def default_folder(on: str) -> Path:
    """A private directory under the user's cache for bundles and logs."""
    import os

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "torch-manifest" / on
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
