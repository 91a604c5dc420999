"""Rebuilt environments, cached by what they hold, so the second rebuild is instant.

A rebuilt venv lives at ``$XDG_CACHE_HOME/manifest/envs/<key>`` (default
``~/.cache/manifest/envs``), where the key is a digest of what decides its files
(:func:`environment_key`: the Python version and each rebuilt distribution's name,
version and recorded content digest). It is built in a temporary folder beside its place
and renamed into it (``rename`` on one file system is atomic), so a reader sees a whole
environment or none; when two rebuilds race, the first rename wins and the second
discards its copy.

A hit is not believed blindly, because the venv is a folder a re-run's script (or another
user of a shared cache) could write to:

* a cache folder or venv not owned by this user, or writable by its group or by others, is
  not used (:func:`unsafe`): one sentence, and the environment is built in this user's
  private folder instead (:func:`private_root`);
* the stamp lives outside the venv, in ``$XDG_CACHE_HOME/manifest/env-stamps`` (mode 0700,
  :func:`stamp_root`), named by the venv's real path and key: the proof made at build time
  and :func:`files_stamp`, a digest of every file's path, size, mtime_ns, ctime_ns and
  inode in site-packages (``__pycache__`` left out: the venv's python never reads it, see
  ``manifest.pyenv.rebuild``). When that digest is unchanged the stored proof stands (a
  stat per file: ~0.1 s for torch's ~15,000); when anything was written, or there is no
  stamp of this user's, every file is hashed again against the record
  (``manifest.pyenv.prove``, ~3 s for torch), so an edit is named. ctime cannot be set
  back by a process, so restoring mtime does not hide an edit;
* ``bin/python*`` and ``pyvenv.cfg`` are compared with a fresh ``uv venv`` of the same
  interpreter (:func:`fresh_venv`), as are the files it writes in site-packages.

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

STAMP_FORMAT = "manifest-env-stamp/v1"

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
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
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


def place(root: Path, key: str) -> Path:
    """Where ``key``'s venv lives under ``root``."""
    return root / key.partition(":")[2]


def unsafe(path: Path) -> str | None:
    """Why ``path`` may not hold environments this user runs: not owned by this user, or
    writable by its group or by others (anyone who can write there can plant code); None
    when it is private."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if os.path.islink(path):
        return f"{path} is a symbolic link"
    if st.st_uid != os.getuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by its group or by others"
    return None


def _private(path: Path) -> str | None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return f"{path} cannot be created ({exc.strerror})"
    return unsafe(path)


def usable_root(root: Path) -> tuple[Path, str | None]:
    """``root`` (created private when absent) if it is safe (:func:`unsafe`), else
    :func:`private_root` and the sentence that says why ``root`` was not used."""
    problem = _private(root)
    if problem is None:
        return root, None
    said = problem.removeprefix(f"{root} ")
    return private_root(), f"not using the environment cache {root}: it {said}"


def private_root() -> Path:
    """This user's own place for environments: :func:`cache_root` when it is private, else
    ``<tmp>/manifest-envs-<uid>`` when that is, else a fresh temporary folder."""
    for candidate in (cache_root(), Path(tempfile.gettempdir()) / f"manifest-envs-{os.getuid()}"):
        if _private(candidate) is None:
            return candidate
    return Path(tempfile.mkdtemp(prefix="manifest-envs-"))


def stamp_root() -> Path | None:
    """``$XDG_CACHE_HOME/manifest/env-stamps`` (mode 0700), or None when it is not private:
    then nothing is stamped and every hit is hashed again."""
    root = cache_root().parent / "env-stamps"
    return root if _private(root) is None else None


def _stamp_file(folder: Path, key: str) -> Path | None:
    root = stamp_root()
    if root is None:
        return None
    name = blake3.blake3(f"{os.path.realpath(folder)}\0{key}".encode("utf-8",
                                                                   "surrogateescape"))
    return root / f"{name.hexdigest()}.json"


def read_stamp(folder: Path, key: str) -> dict[str, Any] | None:
    """This user's stamp of the venv at ``folder`` for ``key``, or None."""
    path = _stamp_file(folder, key)
    if path is None:
        return None
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT
            or stamp.get("key") != key or stamp.get("folder") != os.path.realpath(folder)):
        return None
    return stamp


def write_stamp(folder: Path, key: str, stamp: dict[str, Any]) -> None:
    """Keep ``stamp`` for the venv at ``folder`` (atomically; nothing when stamps cannot be
    kept privately)."""
    path = _stamp_file(folder, key)
    if path is None:
        return
    doc = dict(stamp, format=STAMP_FORMAT, key=key, folder=os.path.realpath(folder))
    fd, tmp = tempfile.mkstemp(prefix=".stamp-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
    os.replace(tmp, path)


def forget(folder: Path, key: str) -> None:
    """Remove this user's stamp of ``folder`` and the folder (a copy that failed its
    checks, so the next build can take its place)."""
    path = _stamp_file(folder, key)
    if path is not None:
        path.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def lookup(root: Path, key: str) -> tuple[Path, dict[str, Any]] | None:
    """The cached venv for ``key`` and this user's stamp of it, or None."""
    folder = place(root, key)
    if not folder.is_dir():
        return None
    stamp = read_stamp(folder, key)
    return None if stamp is None else (folder, stamp)


def staging(root: Path) -> Path:
    """A fresh temporary folder beside the cached venvs (same file system: rename works)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix=".building-", dir=root))


def publish(root: Path, key: str, built: Path, stamp: dict[str, Any]) -> Path:
    """Rename ``built`` to its key's place and stamp it; the place's venv is returned.

    When another rebuild put the same key there first (with a stamp of this user's),
    ``built`` is removed and the existing venv is returned, unstamped by this call: the
    caller checks it as any hit.
    """
    final = place(root, key)
    for _attempt in range(2):
        try:
            os.rename(built, final)
            write_stamp(final, key, stamp)
            return final
        except OSError:
            if lookup(root, key) is not None:  # another rebuild got there first
                shutil.rmtree(built, ignore_errors=True)
                return final
            if _attempt:
                raise
            # A folder with no stamp of this user's (a copy someone emptied, broke or
            # planted): never trusted, replaced.
            shutil.rmtree(final, ignore_errors=True)
    return final


FreshVenv = tuple[str, bytes, dict[str, str]]
"""What a fresh ``uv venv`` of an interpreter writes: the real path its ``bin/python``
resolves to, its ``pyvenv.cfg``, and its site-packages files (path to sha256)."""


def venv_facts(venv: Path) -> FreshVenv:
    """:data:`FreshVenv` of the venv at ``venv``."""
    from manifest.pyenv.prove import file_sha256, site_packages

    site = site_packages(venv)
    files = {}
    for folder, dirs, names in os.walk(site):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                files[os.path.relpath(path, site)] = file_sha256(path)
    return (os.path.realpath(venv / "bin" / "python"),
            (venv / "pyvenv.cfg").read_bytes(), files)


def venv_problem(venv: Path, fresh: FreshVenv) -> str | None:
    """Why the venv at ``venv`` is not what a fresh build writes (:data:`FreshVenv`):
    ``bin/python*`` resolving elsewhere, another ``pyvenv.cfg``; None when it is."""
    base, cfg, _files = fresh
    pythons = sorted((venv / "bin").glob("python*"))
    if not pythons:
        return "it has no bin/python"
    for python in pythons:
        if os.path.realpath(python) != base:
            return (f"bin/{python.name} does not resolve to the interpreter it was built "
                    "from")
    try:
        same = (venv / "pyvenv.cfg").read_bytes() == cfg
    except OSError:
        same = False
    if not same:
        return "its pyvenv.cfg is not what a fresh build writes"
    return None


def discard(built: Path) -> None:
    shutil.rmtree(built, ignore_errors=True)
