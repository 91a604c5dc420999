"""The one path validator: every path a manifest names is data, checked here.

A manifest (or the repository it points at) can name paths that make a
re-run touch the user's files: ``command.cwd`` = ``/home/u/project`` or
``../..`` runs the command in the real tree; a dataset path ``../../x`` made
verify create directories and links outside the scratch directory; a
committed symlink ``out -> /home/u/project/out`` made the re-run overwrite the
original outputs. So, before anything runs:

* ``command.cwd`` and every output glob are relative, free of ``..`` and NUL,
  and resolve (following the links the scratch tree holds) inside the tree;
* a declared output, or a directory on the way to it, that is a symlink
  leaving the tree is refused; missing parents are created here, one
  component at a time without following links;
* a relative dataset path is linked only from the matching recorded dataset
  root, inside the tree; an absolute one is never linked (the sandbox binds
  it read-only at its recorded path), may not cover the tree itself, and is
  never a system tree (``/``, ``/usr``, ``/etc``, ``/proc``, ``/sys``, ``/dev``,
  the home directory itself: ``SYSTEM_TREES``), which would be hashed and
  listed file by file.

Violations raise :class:`UnsafePathError` (exit 3: no verdict can be reached
without running somewhere the manifest should not reach).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from manifest.errors import NoVerdictError

_GLOB_CHARS = frozenset("*?[")


class UnsafePathError(NoVerdictError):
    """A manifest path would reach outside the scratch tree."""


def _show(value: str) -> str:
    from manifest.trust import escape_text

    return escape_text(value)


def tree_relative(value: str, what: str) -> PurePosixPath:
    """``value`` as a relative path inside the tree, or :class:`UnsafePathError`."""
    if "\0" in value:
        raise UnsafePathError(f"{what} {_show(value)} contains a NUL byte.")
    path = PurePosixPath(value)
    if path.is_absolute() or value.startswith("~"):
        raise UnsafePathError(
            f"{what} {_show(value)} lies outside the repository: a re-run would write there.",
            hint="Capture with paths inside the tree, or use --in-place knowingly.")
    if ".." in path.parts:
        raise UnsafePathError(
            f"{what} {_show(value)} climbs out of the repository with '..': a re-run would "
            "write outside the scratch tree.")
    return path


def static_prefix(glob: PurePosixPath) -> PurePosixPath:
    """The leading components of a glob that hold no wildcard."""
    parts: list[str] = []
    for part in glob.parts:
        if _GLOB_CHARS & set(part):
            break
        parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def inside(tree: Path, candidate: Path) -> bool:
    """Whether ``candidate`` resolves (all links followed) to ``tree`` or below it."""
    real_tree = os.path.realpath(tree)
    real = os.path.realpath(candidate)
    return real == real_tree or real.startswith(real_tree.rstrip("/") + "/")


def check_cwd(tree: Path, cwd: str) -> Path:
    """The directory to run in: ``tree/cwd``, refused if it leaves the tree."""
    rel = tree_relative(cwd, "the recorded working directory")
    full = tree / rel
    if not inside(tree, full):
        raise UnsafePathError(
            f"the recorded working directory {_show(cwd)} is a symlink that leaves the "
            "repository.")
    return full


def check_outputs(tree: Path, cwd: Path, globs: list[str]) -> None:
    """Refuse output globs (and existing outputs or parents) that lead outside ``tree``.

    Run on the materialised tree before the command: a committed symlink at an
    output's place, or on the way to it, would carry the re-run's write into
    the target. Nothing is created: the tree holds no directory the recorded run
    did not find there at start (a logger that picks the next free
    ``version_N`` directory would otherwise see ``version_0`` taken). The
    existing components are checked up to the first missing one; below it the
    command creates plain directories itself, as it did when it was recorded.
    """
    for glob in globs:
        rel = tree_relative(glob, "declared output")
        prefix = static_prefix(rel)
        _check_existing(tree, prefix if prefix != rel else rel.parent,
                        f"declared output {_show(glob)}", start=cwd)
        for match in cwd.glob(str(rel)) if rel.parts else []:
            if match.is_symlink() and not inside(tree, match):
                raise UnsafePathError(
                    f"declared output {_show(glob)} is a committed symlink that leaves the "
                    "repository: a re-run would write through it.")


def _check_existing(tree: Path, rel: PurePosixPath, what: str, *, start: Path) -> None:
    """Refuse a link leaving ``tree`` among the existing components of ``start/rel``."""
    current = start
    for part in rel.parts:
        if part in ("", "."):
            continue
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return  # nothing below exists: the command creates it
        if stat.S_ISLNK(st.st_mode) and not inside(tree, current):
            raise UnsafePathError(
                f"{what} goes through a committed symlink that leaves the repository: "
                "a re-run would write through it.")


def make_parents(tree: Path, rel: PurePosixPath | Path, what: str, *,
                 start: Path | None = None) -> None:
    """Create ``start/rel`` (``start`` defaults to ``tree``) one component at a time,
    refusing a component that is a link leaving ``tree``: nothing is created through it."""
    current = start or tree
    for part in PurePosixPath(rel).parts:
        if part in ("", "."):
            continue
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current)
            except OSError as exc:
                raise UnsafePathError(
                    f"cannot create the directory for {what}: {exc.strerror or exc}.") from exc
            continue
        if stat.S_ISLNK(st.st_mode) and not inside(tree, current):
            raise UnsafePathError(
                f"{what} goes through a committed symlink that leaves the repository: "
                "a re-run would write through it.")


SYSTEM_TREES = ("/", "/usr", "/etc", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib",
                "/lib64", "/boot", "/var", "/run", "/home", "/root", "/srv", "/opt",
                "/tmp", "/mnt", "/media")  # noqa: S108 (refused, never used)
"""Directories a received manifest may never name as a dataset: hashing one reads the
system (``/usr``: 117k files, 41 s, and every file name listed in the report)."""
SYSTEM_SUBTREES = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run")
"""Nothing below these is training data: secrets, pseudo-files that never end, devices."""


def system_tree(ds_path: str) -> str | None:
    """Why an absolute dataset path is a system tree (None when it is not).

    Checked on the path as written and as resolved, so a link to ``/etc`` is one too.
    The home directory itself (and any directory that holds it) is refused; a
    folder inside it is data.
    """
    home = os.path.realpath(os.path.expanduser("~"))
    for candidate in (os.path.normpath(ds_path), os.path.realpath(ds_path)):
        if candidate == home:
            return "it is your home directory"
        if candidate in SYSTEM_TREES:
            return f"{candidate} is a system directory"
        for top in SYSTEM_SUBTREES:
            if candidate.startswith(top + "/"):
                return f"it lies inside {top}"
        if home.startswith(candidate.rstrip("/") + "/"):
            return "it holds your home directory"
    return None


def dataset_link(tree: Path, ds_path: str) -> PurePosixPath | None:
    """Where a dataset is linked inside ``tree`` (None for an absolute, unlinked one)."""
    if "\0" in ds_path:
        raise UnsafePathError(f"dataset path {_show(ds_path)} contains a NUL byte.")
    if os.path.isabs(ds_path):
        why = system_tree(ds_path)
        if why is not None:
            raise UnsafePathError(
                f"dataset path {_show(ds_path)} is refused: {why}, not training data.",
                hint="A dataset must be a folder or file of its own.")
        real_tree = os.path.realpath(tree)
        # As written, normalised (``/a/repo/..``) and resolved (a link to a parent).
        for form in {ds_path.rstrip("/") or "/", os.path.normpath(ds_path),
                     os.path.realpath(ds_path)}:
            if real_tree == form or real_tree.startswith(form.rstrip("/") + "/"):
                raise UnsafePathError(
                    f"dataset path {_show(ds_path)} contains the repository itself.")
        return None
    rel = tree_relative(ds_path, "dataset path")
    if rel == PurePosixPath("."):
        raise UnsafePathError("a dataset path names the repository root itself.")
    return rel
