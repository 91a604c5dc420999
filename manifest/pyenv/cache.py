"""Rebuilt environments, cached by what they hold, so the second rebuild is instant.

A rebuilt venv lives at ``$XDG_CACHE_HOME/manifest/envs/<key>`` (default
``~/.cache/manifest/envs``), where the key is a digest of what decides its files
(:func:`environment_key`: the Python version and each rebuilt distribution's name,
version and recorded content digest). It is built in a temporary folder beside its place
and renamed into it (``rename`` on one file system is atomic), so a reader sees a whole
environment or none; when two rebuilds race, the first rename wins and the second
discards its copy.

A hit is not believed blindly, because the venv is a folder a re-run's script could write
to. The stamp holds the proof made at build time and :func:`files_stamp`, a digest of
every file's path, size, mtime, ctime and inode in site-packages (``__pycache__`` left
out: running the venv writes it). When that digest is unchanged the stored proof stands
(a stat per file: ~0.1 s for torch's ~15,000); when anything was written, every file is
hashed again against the record (``manifest.pyenv.prove``, ~3 s for torch), so an edit is
named. ctime cannot be set back by a process, so restoring mtime does not hide an edit.
uv's own cache is never linked into the venv (``--link-mode copy``): editing a rebuilt
file cannot reach the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import blake3

from manifest.pyenv.sources import Pin

STAMP = "manifest-env.json"
"""Inside each cached venv: its key and the proof made when it was built."""
KEY_FORMAT = "manifest-env/v1"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/manifest/envs`` (XDG base directory spec; a relative value is
    ignored), else ``~/.cache/manifest/envs``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "manifest" / "envs"


def environment_key(python: str, pins: list[Pin]) -> str:
    """``blake3:<hex>`` over the Python version and every pin's name, version and files."""
    lines = [KEY_FORMAT, f"python {python}"]
    lines += sorted(f"{p.name} {p.version} {p.files or '-'} {p.kind}" for p in pins)
    return "blake3:" + blake3.blake3("\n".join(lines).encode("utf-8")).hexdigest()


def files_stamp(site: Path) -> str:
    """``blake3:<hex>`` over (path, size, mtime_ns, ctime_ns, inode) of every file under
    ``site``, in path order, ``__pycache__`` folders left out."""
    lines = []
    for folder, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, site)
            lines.append(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}")
    lines.sort()
    return "blake3:" + blake3.blake3("\n".join(lines).encode("utf-8", "surrogateescape")
                                     ).hexdigest()


def _folder(root: Path, key: str) -> Path:
    return root / key.partition(":")[2]


def lookup(root: Path, key: str) -> tuple[Path, dict[str, Any]] | None:
    """The cached venv for ``key`` and its stamp, or None."""
    folder = _folder(root, key)
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("key") != key:
        return None
    return folder, stamp


def staging(root: Path) -> Path:
    """A fresh temporary folder beside the cached venvs (same file system: rename works)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix=".building-", dir=root))


def publish(root: Path, key: str, built: Path, stamp: dict[str, Any]) -> Path:
    """Stamp ``built`` and rename it to its key's place; the place's venv is returned.

    When another rebuild put the same key there first, ``built`` is removed and the
    existing venv is used.
    """
    (built / STAMP).write_text(json.dumps(dict(stamp, key=key), sort_keys=True),
                               encoding="utf-8")
    final = _folder(root, key)
    for _attempt in range(2):
        try:
            os.rename(built, final)
            return final
        except OSError:
            if lookup(root, key) is not None:  # another rebuild got there first
                shutil.rmtree(built, ignore_errors=True)
                return final
            if _attempt:
                raise
            # A folder without a valid stamp (a copy someone emptied or broke): never
            # trusted, replaced.
            shutil.rmtree(final, ignore_errors=True)
    return final


def discard(built: Path) -> None:
    shutil.rmtree(built, ignore_errors=True)
