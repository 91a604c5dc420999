"""Assemble a manifest from the probes.

``capture_snapshot`` records code, environment and hardware (no command).
Running a command under the launcher builds on it (``manifest.capture.run``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from manifest import __version__
from manifest.canonical import blake3_name, seal
from manifest.models import SCHEMA_V1, Manifest, Observed
from manifest.probes.code import CodeProbe, probe_code
from manifest.probes.env import probe_env
from manifest.probes.hardware import NvmlFacts, logical_cpus, probe_hardware
from manifest.store import STORE_DIRNAME, BlobStore


@dataclass(frozen=True)
class Snapshot:
    """The probes' results plus what the observed section needs."""

    code: CodeProbe
    sections: dict[str, Any]
    nvml: NvmlFacts | None
    store: BlobStore
    started: float
    started_iso: str


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def own_output_files(extra: Path | None = None) -> frozenset[tuple[int, int]]:
    """(device, inode) of the files this capture writes its manifest to.

    That is the regular files stdout and stderr are redirected to (``>
    run.json 2> cap.err``), and ``-o FILE`` if it exists already (a previous
    capture's manifest, about to be replaced).
    """
    import stat

    found: set[tuple[int, int]] = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                found.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    if extra is not None:
        try:
            st = os.stat(extra)
            found.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    return frozenset(found)


def default_store(cwd: Path, code: CodeProbe, configured: str | None = None) -> BlobStore:
    return store_at(code.root if code.root is not None else cwd, configured)


def store_at(base: Path, configured: str | None = None) -> BlobStore:
    """The blob store of the repository at ``base`` (``[tool.manifest] store`` or .manifest)."""
    if configured:
        path = Path(configured)
        return BlobStore(path if path.is_absolute() else base / path)
    return BlobStore(base / STORE_DIRNAME)


def probe_machine(
    nvml: Any | None = None,
) -> tuple[dict[str, Any], dict[str, Any], NvmlFacts | None]:
    """The env and hardware sections (as JSON) of this machine, and the raw NVML facts."""
    hardware, facts, reason = probe_hardware(nvml)
    env = probe_env(
        cuda_driver=facts.cuda_driver if facts else None, cuda_driver_reason=reason
    )
    return env.model_dump(mode="json"), hardware.model_dump(mode="json"), facts


def take_snapshot(
    cwd: Path, *, store_dir: str | None = None, nvml: Any | None = None,
    manifest_file: Path | None = None,
    machine: tuple[dict[str, Any], dict[str, Any], NvmlFacts | None] | None = None,
) -> Snapshot:
    """Run the code, env and hardware probes."""
    started = time.time()
    started_iso = now_iso()
    from manifest.capture.observed import remembered_written

    code = probe_code(cwd, exclude=own_output_files(manifest_file),
                      written=lambda root: remembered_written(store_at(root, store_dir)))
    store = default_store(cwd, code, store_dir)
    if code.patch:
        store.put(code.patch)
    env, hardware, facts = machine if machine is not None else probe_machine(nvml)
    sections: dict[str, Any] = {
        "schema": SCHEMA_V1,
        "code": code.code.model_dump(mode="json"),
        "data": [],
        "env": env,
        "hardware": hardware,
        "randomness": {"seed": None, "derivation": None, "processes": [],
                       "unavailable": {"seed": "no command was run"}},
        "determinism": {
            "requested": False,
            "num_threads": None,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
            "processes": [],
            "unavailable": {"num_threads": "no command was run"},
        },
        "command": None,
        "outputs": None,
    }
    return Snapshot(code, sections, facts, store, started, started_iso)


def observed_for(snap: Snapshot, *, pids: list[int] | None = None) -> dict[str, Any]:
    finished = time.time()
    # uname's nodename is what gethostname() returns on POSIX, without the
    # socket module's import (a few ms of every capture).
    if hasattr(os, "uname"):
        host = os.uname().nodename
    else:  # pragma: no cover - Windows
        import socket

        try:
            host = socket.gethostname()
        except OSError:
            host = ""
    try:
        store_rel = os.path.relpath(snap.store.root, snap.code.root or Path.cwd())
    except ValueError:
        store_rel = str(snap.store.root)
    return Observed(
        tool_version=__version__,
        started_at=snap.started_iso,
        finished_at=now_iso(),
        duration_s=round(max(0.0, finished - snap.started), 6),
        hostname_hash=blake3_name(host.encode()) if host else None,
        branch=snap.code.branch,
        remote_url=snap.code.remote_url,
        store=store_rel,
        logical_cpus=logical_cpus(),
        gpu_uuid_hashes=snap.nvml.uuid_hashes if snap.nvml else [],
        pids=pids or [],
        large_untracked=dict(sorted(snap.code.large.items())) or None,
    ).model_dump(mode="json")


def seal_snapshot(snap: Snapshot, datasets: list[dict[str, Any]] | None = None) -> Manifest:
    """The manifest of a snapshot with no command run (plus any datasets)."""
    doc = dict(snap.sections)
    doc["data"] = datasets or []
    doc["observed"] = observed_for(snap)
    return seal(doc)


def capture_snapshot(cwd: Path, *, store_dir: str | None = None,
                     nvml: Any | None = None) -> Manifest:
    """A manifest of the environment alone (``manifest capture`` with no command)."""
    return seal_snapshot(take_snapshot(cwd, store_dir=store_dir, nvml=nvml))
