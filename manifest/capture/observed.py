"""What a captured run did, turned into manifest facts (the parent side of ``_manifest_observe``).

* **Stale outputs.** Before the command starts, every file the output globs
  already match is noted by (device, inode, size, mtime_ns); a match with
  the same four values afterwards was not written by this run. It is never
  recorded as this run's output (a leftover ``out/ckpt.pt`` once passed as
  the output of a script that wrote nothing), and never deleted. A glob none
  of whose matches this run wrote fails the run; one that matched this run's
  file too (``version_*``) just leaves the earlier ones out (:func:`stale_alone`).
* **Discovered inputs.** The launcher records the files each process opened;
  the ones read before being written that git does not carry (ignored files
  inside the repository, files outside it) are digested as data
  automatically, up to :data:`DISCOVER_MAX_FILES` files and
  :data:`DISCOVER_MAX_BYTES` bytes, so a 2 TB dataset is never hashed by
  surprise; the rest are named in ``observed.inputs_not_digested`` with a
  note asking for ``--data``.
* **Files the run wrote are never code.** Untracked files the run wrote inside
  the repository (opened for writing, or modified during the run: C++
  writers such as ``torch.save`` bypass Python's audit hook) are remembered
  by the store (``written-v1``), and the next capture leaves them out of the
  patch, so two captures of one commit share a run_id.
* **Variables that decide which code runs** (``PYTHONPATH`` …) are recorded
  with repository paths written as ``{repo}/…`` and replayed by verify inside
  the scratch clone.
* **Imported distributions.** Top-level module names from every process map
  to distributions, as ``importlib.metadata.packages_distributions`` maps them
  (:func:`imported_distributions`, ~25 ms where that call took 219 ms);
  only those, torch and its CUDA libraries count for the bits (see
  ``manifest.diff.rules``). A library the launcher itself loaded before user
  code (blake3, to fingerprint the generators) is the run's only when one of the
  run's modules holds it (``_manifest_observe.modules_imported``); nvidia-ml-py
  stays where installed: ``import torch`` itself imports ``pynvml``.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from manifest.store import BlobStore

DISCOVER_MAX_FILES = 256
DISCOVER_MAX_BYTES = 1 << 30
"""Digest discovered inputs unasked up to 256 files and 1 GiB (about a second here);
beyond that the user says ``--data`` and the cache makes later captures cheap."""

CODE_ENV_VARS = ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONHOME",
                 "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PYTHONOPTIMIZE")
"""Variables that decide which code a Python process runs."""
_PATH_VARS = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE"})
REPO_MARK = "{repo}"

_NOT_DATA_SUFFIXES = (".py", ".pyc", ".pyi", ".so", ".pth")
_TOOL_CACHES = (".cache/matplotlib", ".config/matplotlib", ".matplotlib", ".cache/fontconfig",
                ".triton", ".nv", ".cache/torch/kernels", ".cache/torch_extensions")
"""Per-user caches that libraries read at import (matplotlib's font list, compiled kernels):
they differ per machine and never hold training data."""
WRITTEN_FILE = "written-v1"
_MAX_REMEMBERED = 10000

FileKey = tuple[int, int, int, int]


# ------------------------------------------------------------------ outputs


def _key(st: os.stat_result) -> FileKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def output_matches(globs: Iterable[str], cwd: Path) -> dict[str, FileKey]:
    """Regular files the output globs match now, by (device, inode, size, mtime_ns)."""
    found: dict[str, FileKey] = {}
    for pattern in globs:
        for rel in glob.glob(pattern, root_dir=cwd, recursive=True):
            try:
                st = os.stat(cwd / rel)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found[rel] = _key(st)
    return found


def stale_outputs(before: dict[str, FileKey], globs: Iterable[str], cwd: Path) -> list[str]:
    """Matches the run did not write: the same file, unchanged, as before it started."""
    after = output_matches(globs, cwd)
    return sorted(rel for rel, key in after.items() if before.get(rel) == key)


def stale_alone(stale: list[str], globs: Iterable[str], cwd: Path) -> list[str]:
    """The stale matches that fail the run: those of a glob that matched nothing this run
    wrote. A glob that also matched a fresh file (``lightning_logs/version_*/…``, where
    each run writes the next ``version_N``) names the earlier runs' files too; they are
    left out of the outputs, and the run's own are recorded."""
    gone = set(stale)
    alone: list[str] = []
    for pattern in globs:
        matched = set(output_matches([pattern], cwd))
        if matched and matched <= gone:
            alone.extend(sorted(matched - set(alone)))
    return alone


# --------------------------------------------------------------- code env


def record_code_env(environ: dict[str, str], cwd: Path, root: Path | None) -> dict[str, str]:
    """The code-deciding variables set for the command, repository paths as ``{repo}/…``."""
    out: dict[str, str] = {}
    for var in CODE_ENV_VARS:
        value = environ.get(var)
        if value is None:
            continue
        if var in _PATH_VARS and root is not None:
            entries = value.split(os.pathsep)
            value = os.pathsep.join(_repo_form(e, cwd, root) for e in entries)
        out[var] = value
    return out


def _repo_form(entry: str, cwd: Path, root: Path) -> str:
    if not entry:
        return entry
    absolute = os.path.normpath(os.path.join(cwd, entry))
    rel = os.path.relpath(absolute, root)
    if rel == ".":
        return REPO_MARK
    if rel == ".." or rel.startswith("../"):
        return absolute
    return f"{REPO_MARK}/{rel}"


def replay_code_env(recorded: dict[str, str], root: Path) -> dict[str, str]:
    """Recorded code variables with ``{repo}`` standing for ``root`` (the scratch clone)."""
    out: dict[str, str] = {}
    for var, value in recorded.items():
        if var in _PATH_VARS:
            value = os.pathsep.join(
                str(root) + e[len(REPO_MARK):] if e == REPO_MARK or e.startswith(REPO_MARK + "/")
                else e for e in value.split(os.pathsep))
        out[var] = value
    return out


def outside_entries(recorded: dict[str, str]) -> list[str]:
    """Paths outside the repository that the recorded code variables name."""
    found: list[str] = []
    for var, value in recorded.items():
        if var in _PATH_VARS:
            found.extend(e for e in value.split(os.pathsep)
                         if e and not e.startswith(REPO_MARK))
    return found


# ---------------------------------------------------------- written files


def remembered_written(store: BlobStore) -> frozenset[str]:
    """Repo-relative paths that earlier captured runs wrote (never code)."""
    try:
        text = (store.root / WRITTEN_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return frozenset()
    return frozenset(line for line in text.split("\n") if line)


def remember_run_writes(store: BlobStore, root: Path, opened: dict[str, str],
                        started_ns: int, also: Iterable[str] = ()) -> list[str]:
    """Remember the untracked files a run wrote in the tree at ``root`` (and ``also``):
    never code for a later capture or lab of that tree. Returns the untracked paths."""
    untracked = untracked_files(root)
    remember_written(store, [*written_by_run(opened, root, untracked, started_ns), *also])
    return untracked


def remember_written(store: BlobStore, paths: Iterable[str]) -> None:
    """Add paths to the store's memory of run-written files (capped, atomic)."""
    from manifest.store import atomic_write

    new = set(paths)
    if not new:
        return
    known = remembered_written(store)
    if new <= known:
        return
    merged = sorted(known | new)[-_MAX_REMEMBERED:]
    try:
        store.ensure()
        atomic_write(store.root / WRITTEN_FILE, ("\n".join(merged) + "\n").encode("utf-8"))
    except OSError:
        return


def written_by_run(opened: dict[str, str], root: Path, untracked: list[str],
                   started_ns: int) -> list[str]:
    """Untracked repo files the run wrote: opened for writing, or modified while it ran."""
    found: set[str] = set()
    for path, kind in opened.items():
        if kind != "r":
            rel = _inside(path, root)
            if rel is not None:
                found.add(rel)
    for rel in untracked:
        try:
            if os.stat(root / rel).st_mtime_ns >= started_ns:
                found.add(rel)
        except OSError:
            continue
    return sorted(found)


def matching_files(untracked: list[str], root: Path,
                   files: frozenset[tuple[int, int]]) -> list[str]:
    """The untracked paths that are these (device, inode) files."""
    found: list[str] = []
    for rel in untracked:
        try:
            st = os.stat(root / rel)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in files:
            found.append(rel)
    return found


def _inside(path: str, root: Path) -> str | None:
    rel = os.path.relpath(path, root)
    if rel == "." or rel == ".." or rel.startswith("../"):
        return None
    return rel


# ------------------------------------------------------------------ inputs


def discovered_inputs(
    opened: dict[str, str], *, root: Path | None, tracked: frozenset[str],
    in_patch: frozenset[str], skip: list[Path], skip_files: frozenset[tuple[int, int]],
) -> list[tuple[Path, int]]:
    """Files the run read that git does not carry: (absolute path, bytes), sorted.

    Read first (kind ``r`` or ``rw``: ``r+`` memmaps), regular, not Python
    code, not tracked, not in the code patch, not under a declared dataset,
    output or the store, and not one of the capture's own files.
    """
    home = os.path.expanduser("~")
    skip = [*skip, *(Path(home, c) for c in _TOOL_CACHES)]
    skip_text = tuple(os.path.abspath(p) + os.sep for p in skip)
    found: list[tuple[Path, int]] = []
    for path, kind in opened.items():
        if kind not in ("r", "rw") or path.endswith(_NOT_DATA_SUFFIXES):
            continue
        if path.startswith(skip_text) or os.path.abspath(path) in {s[:-1] for s in skip_text}:
            continue
        if root is not None:
            rel = _inside(path, root)
            if rel is not None and (rel in tracked or rel in in_patch
                                    or rel.split("/")[0] == ".git"):
                continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in skip_files:
            continue
        found.append((Path(path), st.st_size))
    return sorted(found)


def split_by_budget(found: list[tuple[Path, int]]) -> tuple[list[Path], dict[Path, int]]:
    """(files to digest now, files too many or too large to digest unasked)."""
    take: list[Path] = []
    left: dict[Path, int] = {}
    total = 0
    for path, size in found:
        if len(take) < DISCOVER_MAX_FILES and total + size <= DISCOVER_MAX_BYTES:
            take.append(path)
            total += size
        else:
            left[path] = size
    return take, left


def digest_inputs(paths: list[Path], *, root: Path | None, store: BlobStore, no_cache: bool,
                  quiet: bool) -> list[dict[str, Any]]:
    """Dataset entries (``source: discovered``) for individual files; name = recorded path."""
    from manifest.data.cache import DigestCache
    from manifest.data.datasets import recorded_path
    from manifest.data.digest import digest_path
    from manifest.data.listing import path_text
    from manifest.models import Dataset

    if not paths:
        return []
    store.ensure()
    cache = DigestCache.in_store(store.root)
    out: list[dict[str, Any]] = []
    for path in paths:
        where = recorded_path(path, root)
        found = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet,
                            label=path_text(os.fsencode(path)), skip=[store.root])
        from_repo = None
        if root is not None and os.path.isabs(where):
            from_repo = os.path.relpath(where, root)
        out.append(Dataset(name=where, path=where, root=found.root, files=found.files,
                           bytes=found.total_bytes, listing=None, source="discovered",
                           from_repo=from_repo).model_dump(mode="json", exclude_none=False))
    return out


def tracked_files(root: Path) -> frozenset[str]:
    """Every path git tracks in the repository (one ``ls-files``)."""
    from manifest.gitrun import run_git

    out = run_git(["ls-files", "-z"], root, check=False).stdout
    return frozenset(os.fsdecode(p) for p in out.split(b"\0") if p)


def untracked_files(root: Path) -> list[str]:
    """Untracked, not-ignored paths (what the code patch would pack)."""
    from manifest.gitrun import run_git

    out = run_git(["ls-files", "-z", "--others", "--exclude-standard"], root, check=False).stdout
    return [os.fsdecode(p) for p in out.split(b"\0") if p]


# ------------------------------------------------------------ distributions


def imported_distributions(modules: Iterable[str]) -> list[str]:
    """Normalised names of the distributions providing these top-level modules.

    The answer ``importlib.metadata.packages_distributions()`` gives for them
    (a distribution's declared ``top_level.txt``, else the top-level names of
    the files it lists, inferred by importlib.metadata itself), without that
    call's cost: it parses every distribution's file list into path objects
    and every METADATA, 219 ms of each captured run here (222 distributions,
    mkdocs-material alone lists 14,666 files), ~10% of a two-node 13 s job's
    overhead (``benchmarks/nodes_overhead.py``). Here a file list is first
    searched as text, and only one with a line that could name a wanted module
    (:func:`_top_lines`) goes to importlib.metadata's inference; only a
    providing distribution's METADATA is read.
    """
    import importlib.metadata

    from manifest.probes.env import normalise_name

    wanted = frozenset(m for m in modules if m)
    infer = getattr(importlib.metadata, "_top_level_inferred", None)
    names: set[str] = set()
    try:
        if not callable(infer):  # a Python without the helper: the whole mapping
            mapping = importlib.metadata.packages_distributions()
            return sorted({normalise_name(d) for m in wanted for d in mapping.get(m, ())})
        lines = _top_lines(wanted)
        for dist in importlib.metadata.distributions():
            declared = (dist.read_text("top_level.txt") or "").split()
            if declared:
                provided = not wanted.isdisjoint(declared)
            else:
                listed = dist.read_text("RECORD")
                # an empty RECORD sends importlib.metadata to egg-info's SOURCES.txt, and
                # its lines are what splitlines() splits (U+2028 too), not only "\n"
                provided = ((not listed or lines.search("\n".join(listed.splitlines()))
                             is not None) and not wanted.isdisjoint(infer(dist)))
            if provided:
                name = dist.metadata["Name"]
                if name:
                    names.add(normalise_name(name))
    except Exception:  # a broken distribution must not fail the capture
        return []
    return sorted(names)


def _top_lines(wanted: frozenset[str]) -> re.Pattern[str]:
    """A RECORD line whose path could be a wanted module's (``torch/…``, ``six.py``), or
    one whose first part pathlib or csv could read otherwise (quoted, ``./``).

    Never a false "no": importlib.metadata's name for a listed path is its first
    part, or a lone file's name without its suffix, so the line starts with the
    name and then ``/``, ``.`` or the ``,`` that ends the path.
    """
    if not wanted:
        return re.compile(r"(?!)")
    names = "|".join(re.escape(m) for m in sorted(wanted))
    return re.compile(rf'^(?:"|\./|(?:{names})[./,])', re.MULTILINE)
