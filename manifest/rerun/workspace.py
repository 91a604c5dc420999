"""The user's repository verify starts from, and the scratch tree rebuilt from it.

Step 5 of ``manifest.verify.pipeline`` (isolation), and the same tree
``manifest explain`` rebuilds for its two runs, which is why it is a module
of its own rather than a step inside ``verify_run``:

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
  symlink named in the report above that size. Every path is validated first
  (``manifest.verify.paths``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from manifest.gitrun import GitFailedError, GitMissingError, run_git
from manifest.models import Manifest
from manifest.store import STORE_DIRNAME, BlobStore


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
    climb (``manifest.verify.inputs``), so their relative paths land inside it.
    """
    from manifest.errors import NoVerdictError
    from manifest.verify.inputs import scratch_depth, tree_base

    commit = recorded.code.commit
    if commit is None:
        raise NoVerdictError("the manifest records no commit, so there is no tree to rebuild.",
                             hint="Use --in-place to run it in the current directory.")
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


def dataset_binds(recorded: Manifest, root: Path, tree: Path) -> list[tuple[Path, Path]]:
    """(real dataset, where the scratch tree wants it) for each recorded dataset.

    Relative datasets that git does not carry come from the same path in the
    user's repository; absolute ones stay where they were recorded. Paths are
    validated first (``manifest.verify.paths``): nothing outside ``tree`` is
    named as a destination.
    """
    from manifest.verify.paths import dataset_link

    binds: list[tuple[Path, Path]] = []
    for ds in recorded.data:
        rel = dataset_link(root, ds.path)
        if rel is None:
            if os.path.exists(ds.path):
                binds.append((Path(os.path.realpath(ds.path)), Path(ds.path)))
            continue
        target = tree / rel
        if os.path.isdir(target) and not os.path.islink(target) and (root / rel).is_dir():
            from manifest.verify.inputs import missing_entries

            binds.extend(missing_entries(root / rel, target))  # git carries part of it
            continue
        if os.path.lexists(target) or not (root / rel).exists():
            continue  # git carries it (or there is nothing to link)
        binds.append((Path(os.path.realpath(root / rel)), target))
    return binds


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
    from manifest.verify.paths import make_parents

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
