"""The confined re-run: bubblewrap, when this machine can run it.

Verify runs someone else's command. Validating the manifest's paths
(``manifest.rerun.paths``) keeps *our* writes inside the scratch tree; the
sandbox keeps the *command's* writes there too, whatever it does:

* the whole system is bound read-only (``--ro-bind / /``), so the user's
  files, home and repository cannot be written;
* the scratch clone is the only writable tree, mounted at ``mount_at`` (the
  repository's path) so that relative and absolute paths resolve as they did
  at capture, and the user's real tree at that path is hidden;
* datasets and other inputs are bound read-only at their recorded paths
  (``ro_binds``; the truth check adds the inputs it discovers);
* ``/tmp`` and ``/dev/shm`` are private tmpfs; devices are the host's (GPUs
  need ``/dev/nvidia*``);
* no network (a private network namespace with only loopback, so torchrun's
  rendezvous on 127.0.0.1 still works) unless ``--network``;
* a new session (no ``TIOCSTI`` into the user's terminal), PID and IPC
  namespaces, and the sandbox dies with verify.

bubblewrap is a Debian/Ubuntu/Fedora package (``apt-get install
bubblewrap``). It needs unprivileged user namespaces (or root); some
containers forbid them. Availability is therefore decided by running
``bwrap ... true`` with the same options once per process (~5 ms), not by
looking for the binary. ``MANIFEST_BWRAP`` names another binary (tests use a
missing one to exercise the unconfined path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SandboxSpec:
    """What the confined command sees. Paths are absolute host paths."""

    scratch: Path
    """The writable tree (the scratch clone)."""
    mount_at: Path
    """Where ``scratch`` appears inside the sandbox (the recorded repository path)."""
    ro_binds: list[tuple[Path, Path]] = field(default_factory=list)
    """(host source, path inside) bound read-only after the tree, in order."""
    rw_paths: list[Path] = field(default_factory=list)
    """Host paths bound writable at the same path (the launcher's records directory)."""
    network: bool = False


_PROBE: dict[str, str | None] = {}


def bwrap_program() -> str:
    return os.environ.get("MANIFEST_BWRAP") or "bwrap"


def _base_args(network: bool) -> list[str]:
    args = ["--die-with-parent", "--new-session", "--unshare-all"]
    if network:
        args.append("--share-net")
    return [*args, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
            "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp"]  # noqa: S108 (inside the sandbox)


def unavailable_reason() -> str | None:
    """None when bubblewrap can confine a command here, else why not (one phrase)."""
    program = bwrap_program()
    if program in _PROBE:
        return _PROBE[program]
    path = shutil.which(program)
    reason: str | None
    if path is None:
        reason = f"bubblewrap ({program}) is not installed"
    else:
        try:
            proc = subprocess.run([path, *_base_args(False), "--", "true"],
                                  capture_output=True, timeout=20, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = f"bubblewrap cannot start ({exc})"
        else:
            if proc.returncode == 0:
                reason = None
            else:
                lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
                why = lines[-1] if lines else f"exit {proc.returncode}"
                reason = f"bubblewrap cannot create namespaces here ({why})"
    _PROBE[program] = reason
    return reason


def describe(spec: SandboxSpec) -> str:
    """The report's confinement line."""
    return "bubblewrap: system read-only, scratch tree writable, private /tmp, " + (
        "network allowed" if spec.network else "no network")


def interpreter_binds(mount_at: Path) -> list[Path]:
    """The Python environment the re-run needs that the sandbox would otherwise hide.

    The scratch tree is mounted over the repository and ``/tmp`` is private, so
    a virtual environment inside the repository (``.venv``, ignored by git and
    so absent from the scratch clone) or under ``/tmp`` would vanish, and so
    would this package itself when it is installed from a checkout under
    ``/tmp`` (an editable install, as CI makes): the launcher's
    ``sitecustomize`` would not load and ``import manifest`` would fail. They
    are bound back read-only, like the system. Other ``sys.path`` entries under
    ``/tmp`` are bound too; entries inside the repository never are (the
    scratch tree's own files must win), and nothing that would cover the
    scratch tree's mount point is bound.
    """
    import sys

    import manifest

    found: list[Path] = []

    def add(raw: str | None, *, inside_ok: bool) -> None:
        if not raw:
            return
        path = Path(os.path.realpath(raw))
        inside = path.is_relative_to(mount_at)
        if inside and not inside_ok:
            return
        if not (inside or path.is_relative_to("/tmp")):  # noqa: S108
            return
        if not inside and mount_at.is_relative_to(path):
            return  # binding it would hide the scratch tree
        if path.is_dir() and path not in found:
            found.append(path)

    for prefix in (sys.prefix, sys.base_prefix, os.environ.get("VIRTUAL_ENV")):
        add(prefix, inside_ok=True)
    add(str(Path(manifest.__file__).resolve().parent.parent), inside_ok=False)
    for entry in sys.path:
        add(entry, inside_ok=False)
    return found


def wrap(spec: SandboxSpec, argv: list[str], cwd_inside: Path) -> list[str]:
    """The command line that runs ``argv`` confined, in ``cwd_inside``."""
    path = shutil.which(bwrap_program()) or bwrap_program()
    args = [path, *_base_args(spec.network),
            "--bind", str(spec.scratch), str(spec.mount_at)]
    for prefix in interpreter_binds(spec.mount_at):
        args += ["--ro-bind", str(prefix), str(prefix)]
    for source, inside in spec.ro_binds:
        args += ["--ro-bind", str(source), str(inside)]
    for rw in spec.rw_paths:
        args += ["--bind", str(rw), str(rw)]
    return [*args, "--chdir", str(cwd_inside), "--", *argv]
