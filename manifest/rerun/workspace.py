"""The workspace: the tree a re-run runs in, with its inputs where the command looks.

The second of the re-run's three steps (plan, workspace, executor), the same
for verify, explain and lab:

* The recorded commit is materialised with ``git clone --shared
  --no-checkout`` and a checkout: objects are borrowed through git's
  alternates, not copied, so the clone costs its checkout (the bundled
  example's scratch tree with outputs: ~2 MB), and the user's repository,
  working tree, index, stash and branches are never written. The recorded patch comes
  from the local blob store only (``store_for``: never from a location the
  manifest names) and is applied with ``git apply --binary``.
* Datasets git does not carry are put where the tree expects them: an empty
  mount point when the re-run is confined (the sandbox binds the real one
  read-only), a copy up to 256 MiB (``COPY_DATA_MAX``) when it is not, a
  symlink named in the report above that size. Inputs outside the repository
  are reachable by the relative path the command used (``manifest.rerun.inputs``).
  Every path was validated by the plan (``manifest.rerun.paths``).
* In place (``--in-place``, and the lab, which runs the command the user
  typed in the user's tree) the tree is the user's own; confined, it is the
  only writable tree.
* The scratch directory holds a lock while in use and is removed on exit and
  on SIGTERM/SIGINT/SIGHUP; one left by a SIGKILL is swept by the next
  re-run (``manifest.rerun.scratch``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from manifest.gitrun import GitFailedError, GitMissingError, run_git
from manifest.models import Manifest
from manifest.store import STORE_DIRNAME, BlobStore

if TYPE_CHECKING:
    from manifest.rerun.plan import RerunPlan


def repo_root_of(cwd: Path) -> Path | None:
    try:
        proc = run_git(["rev-parse", "--show-toplevel"], cwd, check=False)
    except GitMissingError:
        return None
    return Path(os.fsdecode(proc.stdout.strip())) if proc.returncode == 0 else None


def store_for(recorded: Manifest, root: Path) -> BlobStore:
    """The local blob store of the repository at ``root``.

    ``observed.store`` is informational: a manifest that named a write
    location (or a directory of the repository holding committed "blobs")
    would choose where verify reads patches and writes. The store is the
    one this repository's ``[tool.manifest] store`` names, else ``.manifest``.
    """
    del recorded
    from manifest.config import load_config
    from manifest.errors import ManifestError

    try:
        configured = load_config(root)[0].get("store")
    except ManifestError:  # a broken pyproject is reported by the verbs that read it
        configured = None
    if isinstance(configured, str) and configured:
        return BlobStore(root / configured)
    return BlobStore(root / STORE_DIRNAME)


def materialise(recorded: Manifest, root: Path, store: BlobStore, scratch: Path) -> Path:
    """A scratch tree at the recorded commit with the recorded patch applied.

    It sits as deep in ``scratch`` as recorded inputs outside the repository
    climb (``manifest.rerun.inputs``), so their relative paths land inside it.
    """
    from manifest.errors import NoVerdictError
    from manifest.rerun.inputs import scratch_depth, tree_base

    commit = recorded.code.commit
    if commit is None:
        raise NoVerdictError("the manifest records no commit, so there is no tree to rebuild.",
                             hint="Use --in-place to run it in the current directory.")
    check_commit_here(recorded, root)
    tree = tree_base(scratch, scratch_depth(recorded))[1]
    tree.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_git(["clone", "--quiet", "--shared", "--no-checkout", str(root), str(tree)], scratch)
        run_git(["checkout", "--quiet", "--detach", commit], tree)
        if recorded.code.diff_digest:
            patch = store.get(recorded.code.diff_digest)
            if patch is None:
                raise NoVerdictError(
                    f"the recorded patch {recorded.code.diff_digest} is missing from the store "
                    f"{store.root}; cannot rebuild the recorded tree.")
            run_git(["apply", "--binary", "--whitespace=nowarn", "-"], tree, input_bytes=patch)
    except GitFailedError as exc:
        raise NoVerdictError(f"could not materialise the recorded code: {exc.message}.") from exc
    return tree


def check_commit_here(recorded: Manifest, root: Path) -> None:
    """Refuse (exit 2) where the recorded commit cannot come from: outside any repository,
    or in a repository that lacks it (another project, a clone not fetched since). Said in
    words that name the commit and remote, not git's (``fatal: reference is not a tree``)."""
    from manifest.errors import UsageError

    commit = recorded.code.commit or ""
    remote = recorded.observed.remote_url
    where = (f"run it in a clone of the repository that made the run: commit {commit}, "
             f"remote {remote or '(none recorded)'}")
    if repo_root_of(root) is None:
        raise UsageError(f"{root} is not inside a git repository, so the recorded code cannot "
                         f"be rebuilt here: {where}.")
    found = run_git(["cat-file", "-e", f"{commit}^{{commit}}"], root, check=False)
    if found.returncode != 0:
        raise UsageError(f"the repository at {root} does not hold the recorded commit "
                         f"{commit[:12]}: {where}.",
                         hint="In the right clone, 'git fetch' brings a commit made since "
                         "the last fetch.")


def dataset_binds(recorded: Manifest, root: Path, tree: Path) -> list[tuple[Path, Path]]:
    """(real dataset, where the scratch tree wants it) for each recorded dataset.

    Relative datasets that git does not carry come from the same path in the
    user's repository; absolute ones stay where they were recorded. Paths are
    validated first (``manifest.rerun.paths``): nothing outside ``tree`` is
    named as a destination.
    """
    from manifest.rerun.paths import dataset_link
    from manifest.rerun.plan import is_remote, local_table

    binds: list[tuple[Path, Path]] = []
    for ds in recorded.data:
        path = local_table(ds.path) or ds.path  # a Delta table is read where it lies
        if is_remote(path):
            continue  # pinned from metadata, re-listed by verify: nothing to link
        rel = dataset_link(root, path)
        if rel is None:
            if os.path.exists(path):
                binds.append((Path(os.path.realpath(path)), Path(path)))
            continue
        target = tree / rel
        if os.path.isdir(target) and not os.path.islink(target) and (root / rel).is_dir():
            from manifest.rerun.inputs import missing_entries

            binds.extend(missing_entries(root / rel, target))  # git carries part of it
            continue
        if os.path.lexists(target) or not (root / rel).exists():
            continue  # git carries it (or there is nothing to link)
        binds.append((Path(os.path.realpath(root / rel)), target))
    return binds


PRIVATE_IN_SANDBOX = ("/tmp", "/dev/shm")  # noqa: S108 (paths the sandbox replaces)
"""Host folders the sandbox replaces with its own empty tmpfs (``manifest.rerun.sandbox``)."""


def unseen_inputs(recorded: Manifest, *, confined: bool) -> list[str]:
    """A note per file the recorded run read that this re-run cannot see.

    Capture digests the files a run reads that git does not carry (``source:
    discovered``), and verify provides those; beyond its budget (256 files, 1 GiB) it
    names the rest in ``observed.inputs_not_digested`` without providing them. Of
    those, a file inside the repository is absent from the scratch clone (git does not
    carry it), and one under ``/tmp`` or ``/dev/shm`` is hidden by the sandbox's
    private ones. A script that falls back to a default when its file is missing (a
    learning rate read from ``/tmp/lr.txt``) would otherwise re-run something else in
    silence.
    """
    notes: list[str] = []
    for path in sorted(recorded.observed.inputs_not_digested or {}):
        if not os.path.isabs(path):
            notes.append(f"the run read {path}, which git does not carry and capture did not "
                         "digest: the re-run's scratch clone does not have it; capture again "
                         f"with --data {path} so verify provides it (and checks it)")
        elif confined and any(path == top or path.startswith(top + "/")
                              for top in PRIVATE_IN_SANDBOX):
            notes.append(f"the run read {path}, outside the repository, which capture did not "
                         "digest: the sandbox's private /tmp hides it from the re-run; capture "
                         f"again with --data {path} (verify then provides it read-only and "
                         "checks it), or verify with --no-sandbox")
    return notes


COPY_DATA_MAX = 256 << 20
"""Unconfined, a dataset up to this size (as recorded) is copied into the scratch tree
rather than linked, so the re-run cannot write into the user's files through the link."""


def link_data(binds: list[tuple[Path, Path]], tree: Path, *, confined: bool,
              sizes: dict[Path, int] | None = None) -> list[str]:
    """Put each dataset in the scratch tree; return notes for the report.

    Confined: an empty mount point that the sandbox binds read-only. Unconfined:
    a copy when the dataset is small (``COPY_DATA_MAX``), else a symlink, named
    in a note (the re-run could write through it). Parents are created one
    component at a time, never through a link that leaves the tree.
    """
    from manifest.rerun.paths import make_parents

    notes: list[str] = []
    for source, target in binds:
        if not target.is_relative_to(tree):
            continue  # absolute dataset: the sandbox binds it where it was recorded
        rel = target.relative_to(tree)
        make_parents(tree, rel.parent, f"the dataset {rel}")
        if confined:
            if source.is_dir():
                target.mkdir()
            else:
                target.touch()
        elif (sizes or {}).get(target, COPY_DATA_MAX + 1) <= COPY_DATA_MAX:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=False)
            else:
                shutil.copyfile(source, target)
        else:
            target.symlink_to(source)
            notes.append(f"dataset {rel} is linked, not copied, and the re-run is not "
                         "confined: it could write into it")
    return notes


def _output_tops(root: Path, tree: Path, cwd: Path, globs: list[str]) -> None:
    """Make the top directory of each declared output (``out`` of ``out/*.safetensors``)
    in the scratch tree when the user's tree has it and git does not carry it: a script
    may save into ``out/`` without creating it, as it did at capture. Nothing deeper is
    made: a logger that picks the next free ``version_N`` (Lightning's) must find the
    tree as the recorded run found it, and ``version_0`` taken would make it write
    ``version_1``. An empty top directory changes no such choice."""
    from manifest.rerun.paths import make_parents, static_prefix, tree_relative

    for glob in globs:
        rel = tree_relative(glob, "declared output")
        prefix = static_prefix(rel)
        if len(rel.parts) < 2 or prefix == PurePosixPath("."):
            continue  # a file at the top, or a wildcard from the start: no directory to make
        top = prefix.parts[0]
        user_dir = root / cwd.relative_to(tree) / top
        if user_dir.is_dir() and not user_dir.is_symlink() and not (cwd / top).exists():
            make_parents(tree, PurePosixPath(top), f"declared output {glob}", start=cwd)


@dataclass(frozen=True)
class Workspace:
    """Where one plan runs. Paths are host paths."""

    root: Path
    """The user's repository (or directory) the verb was called in."""
    scratch: Path
    """The private scratch directory (locked, removed at the end)."""
    tree: Path
    """The code the command runs in: the scratch clone, or ``root`` in place."""
    cwd: Path
    """``tree`` / the plan's ``cwd``, checked to stay inside it."""
    mount_at: Path
    """Where the command sees ``tree``: the repository's own path when confined."""
    ro_binds: tuple[tuple[Path, Path], ...] = ()
    """(host source, path the command sees) bound read-only when confined."""
    notes: tuple[str, ...] = field(default_factory=tuple)


@contextlib.contextmanager
def open_workspace(plan: RerunPlan, root: Path, *, recorded: Manifest | None = None,
                   store: BlobStore | None = None, keep: bool = False) -> Iterator[Workspace]:
    """The workspace for ``plan``: a scratch clone of ``recorded``'s code, or ``root`` in place."""
    from manifest.rerun.inputs import link_outside, outside_links, tree_base
    from manifest.rerun.paths import check_cwd, check_outputs
    from manifest.rerun.scratch import scratch_dir

    with scratch_dir(keep=keep) as scratch:
        notes: list[str] = []
        if plan.in_place or recorded is None:
            tree = root
            binds = [(Path(i.source), Path(i.path)) for i in plan.inputs
                     if os.path.isabs(i.path) and os.path.exists(i.path)]
        else:
            assert store is not None
            tree = materialise(recorded, root, store, scratch)
            binds = dataset_binds(recorded, root, tree)
            sizes = {tree / ds.path: ds.bytes for ds in recorded.data
                     if not os.path.isabs(ds.path) and "://" not in ds.path}
            notes.extend(link_data(binds, tree, confined=plan.confined, sizes=sizes))
            notes.extend(unseen_inputs(recorded, confined=plan.confined))
            if not plan.confined:
                # Confined, the clone is mounted at the repository's path and
                # relative paths resolve as at capture; here they land in scratch.
                link_outside(outside_links(recorded, tree), tree_base(scratch, 0)[0])
        cwd = check_cwd(tree, plan.cwd)
        check_outputs(tree, cwd, list(plan.outputs))
        if tree != root:
            _output_tops(root, tree, cwd, list(plan.outputs))
        mount_at = root if plan.confined else tree
        ro = tuple((src, root / dst.relative_to(tree)) if dst.is_relative_to(tree) else (src, dst)
                   for src, dst in binds) if plan.confined else ()
        yield Workspace(root=root, scratch=scratch, tree=tree, cwd=cwd, mount_at=mount_at,
                        ro_binds=ro, notes=tuple(notes))
