"""The host's typed view of one process record (``_manifest_wire.ProcessRecord``).

A record is JSON the user's process wrote, so its shape is not trusted: :func:`read_process`
reads every key the host uses once, through the wire's names, and keeps a value only when
it has the type the boot side writes (a forged field becomes its empty value, never a
traceback). The host modules (``capture.run``, ``launch.runner``, ``nodes.topology``,
``capture.checkpoints``, ``capture.environ``) then read attributes that mypy checks instead
of string keys.

Lists whose entries become manifest models (seeding calls, switches, loaders, numeric
points) stay as the record gave them: the models validate each entry and skip the ones
that fail (``manifest.capture.run``), which is the one check they need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from manifest.launch.boot._manifest_wire import ProcessRecord


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class TrailStep:
    """A step-trail point: the state's fingerprint after optimizer step ``step``."""

    step: int
    digest: str


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint save the process recorded (``_manifest_checkpoints``)."""

    step: int
    path: str
    kind: str
    sig: list[int] | None
    """``[size, mtime_ns, inode]`` at the save, to tell a file changed after it."""


def _trail(raw: Any) -> list[TrailStep]:
    out = []
    for point in _list(raw):
        if isinstance(point, dict):
            step, digest = point.get("step"), point.get("digest")
            if isinstance(step, int) and not isinstance(step, bool) and isinstance(digest, str):
                out.append(TrailStep(step, digest))
    return out


def _checkpoints(raw: Any) -> list[SavedCheckpoint]:
    out = []
    for note in _list(raw):
        if not isinstance(note, dict):
            continue
        try:
            step, path, kind = int(note["step"]), str(note["path"]), str(note["kind"])
        except (KeyError, TypeError, ValueError):
            continue
        sig = note.get("sig")
        out.append(SavedCheckpoint(step, path, kind, sig if isinstance(sig, list) else None))
    return out


@dataclass(frozen=True)
class Process:
    """What the host reads of one process record, each field typed (see the module)."""

    pid: int | None
    rank: int | None
    """``RANK`` as given, or as ``launch.runner.select_ranks`` filled it in."""
    start_ns: int | None
    end_ns: int | None
    launch_env: dict[str, str]
    """The launcher variables the process saw (``_manifest_topology``), as strings."""
    seed: int | None
    local_rank: int | None
    world_size: int | None
    torch_imported: bool
    pythonhashseed: str | None
    at_start: dict[str, Any] | None
    at_exit: dict[str, Any] | None
    reseeds: list[Any]
    loaders: list[Any]
    unaccounted: list[str]
    flags: dict[str, Any] | None
    cuda_runtime: str | None
    cudnn: str | None
    nccl: str | None
    devices: list[Any]
    switches: list[Any]
    fp32_precision: dict[str, Any] | None
    environ: dict[str, Any] | None
    """The script's own variable reads (``_manifest_environ``), checked entry by entry by
    ``manifest.capture.environ``."""
    environ_dropped: int
    trail: list[TrailStep]
    """The script's own ``manifest.trail()`` points."""
    auto_trail: list[TrailStep]
    """The launcher's automatic per-optimizer-step trail."""
    auto_trail_scheme: str | None
    numeric: list[Any]
    recording_ns: int | None
    exception: str | None
    opened: dict[str, str]
    """Files opened: absolute path -> ``r``/``w``/``rw`` (other entries skipped)."""
    modules: list[str]
    outside: Any
    """What the process saw start outside the recipe (checked by ``launch.outside``)."""
    checkpoints: list[SavedCheckpoint]
    device: str | None
    backend: str | None
    mp_child: bool
    raw: ProcessRecord = field(repr=False, compare=False)
    """The record itself, for the modules below the host that read it whole."""


def read_process(record: ProcessRecord) -> Process:
    """The typed view of ``record`` (see the module for how a forged field is read)."""
    env = record.get("launch_env")
    opened = record.get("opened")
    at_start, at_exit = record.get("at_start"), record.get("at_exit")
    return Process(
        pid=_int(record.get("pid")),
        rank=_int(record.get("rank")),
        start_ns=_int(record.get("start_ns")),
        end_ns=_int(record.get("end_ns")),
        launch_env=({str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}),
        seed=_int(record.get("seed")),
        local_rank=_int(record.get("local_rank")),
        world_size=_int(record.get("world_size")),
        torch_imported=bool(record.get("torch_imported")),
        pythonhashseed=_str(record.get("pythonhashseed")),
        at_start=_dict(at_start),
        at_exit=_dict(at_exit),
        reseeds=_list(record.get("reseeds")),
        loaders=_list(record.get("loaders")),
        unaccounted=[str(g) for g in _list(record.get("unaccounted"))],
        flags=_dict(record.get("flags")),
        cuda_runtime=_str(record.get("cuda_runtime")),
        cudnn=_str(record.get("cudnn")),
        nccl=_str(record.get("nccl")),
        devices=_list(record.get("devices")),
        switches=_list(record.get("switches")),
        fp32_precision=_dict(record.get("fp32_precision")),
        environ=_dict(record.get("environ")),
        environ_dropped=_int(record.get("environ_dropped")) or 0,
        trail=_trail(record.get("trail")),
        auto_trail=_trail(record.get("auto_trail")),
        auto_trail_scheme=_str(record.get("auto_trail_scheme")),
        numeric=_list(record.get("numeric")),
        recording_ns=_int(record.get("recording_ns")),
        exception=str(record.get("exception") or "") or None,
        opened=({p: k for p, k in opened.items() if isinstance(p, str) and k in ("r", "w", "rw")}
                if isinstance(opened, dict) else {}),
        modules=[m for m in _list(record.get("modules")) if isinstance(m, str)],
        outside=record.get("outside"),
        checkpoints=_checkpoints(record.get("checkpoints")),
        device=_str(record.get("device")),
        backend=_str(record.get("backend")),
        mp_child=bool(record.get("mp_child")),
        raw=record,
    )


def read_processes(records: list[ProcessRecord]) -> list[Process]:
    """:func:`read_process` of each record, in order."""
    return [read_process(r) for r in records]
