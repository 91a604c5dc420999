"""What a re-run needs besides the code: its inputs where the command looked, the
variables that chose its code, and, with ``--in-place``, proof that the tree is the code.

* **Outside inputs by the same relative path.** A command run as ``python
  main.py --data ../../data/wikitext`` looks two levels above the repository.
  In the sandbox the scratch clone is mounted at the repository's own path,
  so that path resolves as it did at capture. Unconfined, the clone is
  placed as deep inside a private directory as the deepest recorded
  ``from_repo`` path climbs (``w/up/tree`` for ``../../``), and each outside
  input is linked where the relative path lands (``w/data/wikitext``), so
  nothing outside the scratch directory is created or written. Absolute
  paths are the same paths on this machine.
* **Partly carried directories.** A dataset directory whose ``prepare.py``
  is tracked but whose ``*.bin`` shards are ignored exists in the clone:
  its missing entries are linked (or bound) one by one.
* **Code variables** (``PYTHONPATH`` …) are replayed with ``{repo}``
  standing for the tree the command runs in; an outside entry that does not
  exist here is drift.
* **In place** means the same code: the tree's commit and patch digest must
  be the recorded ones, else no verdict.
* **A failed re-run** names the files it tried to read that the scratch
  clone lacks but the user's tree has (git does not carry them), with the
  ``--data`` that would provide them.
"""

from __future__ import annotations

import os
from pathlib import Path

from manifest.models import Manifest
from manifest.store import BlobStore

_UP = "up"


def scratch_depth(recorded: Manifest) -> int:
    """How many directory levels above the repository the recorded inputs reach."""
    depth = 0
    for ds in recorded.data:
        if ds.from_repo:
            parts = Path(ds.from_repo).parts
            depth = max(depth, len([p for p in parts[:len(parts)] if p == ".."]))
    return depth


def tree_base(scratch: Path, depth: int) -> tuple[Path, Path]:
    """(private base directory, where the clone goes) for inputs ``depth`` levels up."""
    base = scratch / "w"
    return base, base.joinpath(*([_UP] * max(depth - 1, 0)), "tree")


def outside_links(recorded: Manifest, tree: Path) -> list[tuple[Path, Path]]:
    """(recorded absolute input, where its relative path lands from ``tree``)."""
    links: list[tuple[Path, Path]] = []
    for ds in recorded.data:
        if not ds.from_repo or not os.path.isabs(ds.path) or not os.path.exists(ds.path):
            continue
        target = Path(os.path.normpath(tree / ds.from_repo))
        if target != Path(ds.path):
            links.append((Path(ds.path), target))
    return links


def link_outside(links: list[tuple[Path, Path]], base: Path) -> None:
    """Symlink each outside input at its landing place (always inside ``base``)."""
    for source, target in links:
        if not target.is_relative_to(base) or os.path.lexists(target):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)


def missing_entries(source: Path, target: Path) -> list[tuple[Path, Path]]:
    """Entries of ``source`` that the existing directory ``target`` lacks, recursively."""
    out: list[tuple[Path, Path]] = []
    try:
        entries = sorted(os.scandir(source), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        dst = target / entry.name
        if not os.path.lexists(dst):
            out.append((Path(os.path.realpath(entry.path)), dst))
        elif entry.is_dir(follow_symlinks=False) and dst.is_dir() and not dst.is_symlink():
            out.extend(missing_entries(Path(entry.path), dst))
    return out


def code_env(recorded: Manifest, tree_root: Path) -> tuple[dict[str, str] | None, list[str]]:
    """(code variables to set, or None for a manifest that recorded none; outside entries
    that do not exist here)."""
    from manifest.capture.observed import outside_entries, replay_code_env

    if recorded.command is None or recorded.command.code_env is None:
        return None, []
    recorded_env = recorded.command.code_env
    missing = [e for e in outside_entries(recorded_env) if not os.path.exists(e)]
    return replay_code_env(recorded_env, tree_root), missing


def in_place_code_problem(recorded: Manifest, root: Path, store: BlobStore) -> str | None:
    """Why the tree at ``root`` is not the recorded code (None when it is).

    Raises nothing: a tree without git returns a sentence that starts with
    ``cannot check`` (the caller marks the verdict instead of refusing).
    """
    from manifest.capture.observed import remembered_written
    from manifest.capture.snapshot import own_output_files
    from manifest.probes.code import probe_code

    probe = probe_code(root, exclude=own_output_files(),
                       written=lambda _root: remembered_written(store))
    now, then = probe.code, recorded.code
    if now.commit is None:
        return f"cannot check the code: {now.unavailable.get('commit', 'no git')}"
    if then.commit is None:
        return "cannot check the code: the manifest records no commit"
    if now.commit != then.commit:
        return (f"the tree is at commit {now.commit[:12]}, the run was recorded at "
                f"{then.commit[:12]}: not the recorded code")
    if now.diff_digest != then.diff_digest:
        what = "has uncommitted changes" if now.diff_digest else "has no uncommitted changes"
        return (f"the tree {what} other than the recorded ones (patch "
                f"{(now.diff_digest or 'none')[:19]} vs {(then.diff_digest or 'none')[:19]}): "
                "not the recorded code")
    return None


def missing_inputs_hint(opened: dict[str, str], run_root: Path, mounted_at: Path,
                        user_root: Path) -> str | None:
    """Files the re-run tried to read that the clone lacks and the user's tree has."""
    found: list[str] = []
    for path, kind in sorted(opened.items()):
        if kind == "w":
            continue
        rel = None
        for prefix in (run_root, mounted_at):
            try:
                rel = Path(path).relative_to(prefix)
                break
            except ValueError:
                continue
        if rel is None or rel.parts[:1] == (".git",):
            continue
        if not os.path.lexists(run_root / rel) and (user_root / rel).exists():
            found.append(rel.as_posix())
    if not found:
        return None
    names = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    first = found[0]
    return (f"the command read {names}, which git does not carry (present in your tree, absent "
            f"from the scratch clone); capture again with --data {first} (or its folder)")
