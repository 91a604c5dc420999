"""Where a replayed stretch's checkpoints go, and how the ones at its end are compared.

``verify --segments`` (``manifest.verify.segments``) copies the recorded
checkpoint a stretch resumes from out of the user's tree into the stretch's
scratch clone, at its recorded path. That path is a manifest's, so data: it is
checked by the path validator (``manifest.rerun.paths``: relative, no ``..``,
no committed link on the way out of the clone), a committed file or link at
its place is removed (never written through), and the file is left out of the
clone's git status so a cluster bundle still carries the recorded patch. The
checkpoint must be the one the run saved (its digest, or for DCP its table).

What lies at the recorded path in the user's tree is read through the bounded
opener (``manifest.weights.mapped``, ``manifest.bounded.open_regular``): a regular
file only (a FIFO there left ``verify --at`` without an answer after 40 s), a link
followed only inside the user's repository, and of the recorded size before a
byte is hashed (a 32 GiB sparse file where 2,205 bytes were recorded was hashed
whole). Any of these gives the stretch a no-verdict that names the file, in
milliseconds.

A checkpoint in a Hugging Face ``checkpoint-N/`` directory is the whole directory
for a resume: the files beside it are copied through the bounded reader (regular
files, no link, checked after the open), only those capture recorded, each of its
recorded size and digest (a sparse 3 GiB file placed there, or a planted
``trainer_state.json``, is refused by name before it is copied or read by the
replay); for a manifest that recorded none, bounded in all (:data:`SIBLING_FACTOR`).

A stretch's end checkpoints are declared outputs of its replay, each checked as
a path in the scratch tree before the run (about 1 ms each: 100,000 recorded at
one step took 102 s before a verdict). More than :data:`MAX_AT_ONE_STEP` at the
stretch's end give it a no-verdict that says so (:func:`end_outputs`).

After the replay, each checkpoint recorded at the stretch's end is compared
tensor by tensor with the replay's: read from the scratch tree, or from the
tensor table a cluster job sent back.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path
from typing import Any

from manifest.capture.checkpoints import HF_CHECKPOINT
from manifest.models import Checkpoint, Manifest

MAX_AT_ONE_STEP = 4096
"""Checkpoints recorded at one stretch end that a replay compares (a 2,048-rank run that
saves one file per rank has 2,048 at each step)."""


def end_outputs(recorded: Manifest, end: int) -> tuple[tuple[str, ...], str | None]:
    """The checkpoints recorded at step ``end`` as output globs of the stretch's replay, and
    the reason it is not replayed (None when it is): more than :data:`MAX_AT_ONE_STEP`."""
    assert recorded.outputs is not None
    found = [c.path for c in recorded.outputs.checkpoints or []
             if c.step == end and c.artifact is not None]
    if len(found) > MAX_AT_ONE_STEP:
        return (), (f"the manifest records {len(found):,} checkpoints at step {end}, more "
                    f"than the {MAX_AT_ONE_STEP:,} a replay compares at one step")
    return tuple(glob.escape(p) for p in found), None


def _user_root(original_cwd: Path, tree: Path, cwd: Path) -> Path:
    """The user's repository root: ``original_cwd`` less the command's cwd within ``tree``
    (no recorded path leads above it)."""
    depth = len(cwd.relative_to(tree).parts) if cwd.is_relative_to(tree) else 0
    return original_cwd.parents[depth - 1] if depth else original_cwd


def _exclude(tree: Path, path: Path) -> None:
    """Leave ``path`` out of the scratch clone's untracked files (its own info/exclude)."""
    exclude = tree / ".git" / "info" / "exclude"
    if not exclude.parent.is_dir() or exclude.parent.is_symlink():
        return
    rel = path.relative_to(tree).as_posix()
    if "\n" in rel or "\r" in rel:
        return  # not a pattern git can hold; the patch check then names the tree as changed
    pattern = "/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", rel)
    with open(exclude, "a", encoding="utf-8") as f:
        f.write(pattern + "\n")


def place(checkpoint: Checkpoint, original_cwd: Path, tree: Path, cwd: Path) -> str | None:
    """Copy a recorded checkpoint into the scratch tree after checking it is the one the
    run saved; the reason when it cannot be (missing, changed, never kept).

    Its path is a manifest's, so data: relative, no ``..``, and no link on the way out of
    the scratch tree (``manifest.rerun.paths``, raising ``UnsafePathError``). It is left
    out of the scratch clone's status (``.git/info/exclude``), so the code probe a cluster
    run makes over the tree still gives the recorded patch."""
    from manifest.errors import MalformedArtifactError
    from manifest.rerun.paths import make_parents, tree_relative
    from manifest.weights.mapped import member_files
    from manifest.weights.tables import digest_artifact

    where = f"checkpoint {checkpoint.path} (step {checkpoint.step})"
    if checkpoint.artifact is None:
        return f"{where} was not kept: {checkpoint.lost}"
    rel = tree_relative(checkpoint.path, "the recorded checkpoint")
    original, target = original_cwd / rel, cwd / rel
    hf = HF_CHECKPOINT.fullmatch(rel.parent.name) is not None
    make_parents(tree, rel.parent, f"the recorded checkpoint {checkpoint.path}", start=cwd)
    _exclude(tree, target.parent if hf else target)
    if not os.path.lexists(original):
        return f"{where} is missing: {original} does not exist"
    try:
        found = digest_artifact(original, checkpoint.path, size=checkpoint.artifact.bytes,
                                within=_user_root(original_cwd, tree, cwd))
    except (MalformedArtifactError, OSError) as exc:
        return f"{where} cannot be read: {str(exc).rstrip('.')}"
    # A DCP directory's .metadata carries a fresh save_id, so a rewrite of the same state
    # has another digest: its table (every tensor and every pickled item) decides.
    same_dcp = found.format == "dcp" and found.tensors == checkpoint.artifact.tensors
    if found.digest != checkpoint.artifact.digest and not same_dcp:
        return f"{where} changed since capture (its digest is not the recorded one)"
    if hf:
        # A Hugging Face Trainer checkpoint is its whole directory (trainer_state.json,
        # rng_state.pth …): copied beside the file whose digest was checked, bounded.
        return _place_directory(checkpoint, original, target,
                                _user_root(original_cwd, tree, cwd), where)
    if original.is_dir():
        _clear(target)
        target.mkdir()
        for member in member_files(original):
            _copy(member, target / member.name)
    else:
        if found.format == "safetensors-index":
            from manifest.weights.sharded import shard_paths

            for name, shard in shard_paths(original).items():
                _copy(shard, target.parent / name)
        _copy(original, target)
    return None


SIBLING_ALLOWANCE = 64 << 20
"""Bytes beside a checkpoint copied for a manifest that recorded none (made before capture
recorded them), besides :data:`SIBLING_FACTOR` times the checkpoint's own size."""
SIBLING_FACTOR = 4
"""A Trainer's optimizer.pt holds Adam's two moments (twice the weights); its scheduler,
RNG states and trainer_state.json are kilobytes: four times the weights and 64 MiB cover a
real directory, and bound what a sparse file placed there can cost the scratch tree."""


def _place_directory(checkpoint: Checkpoint, original: Path, target: Path, root: Path,
                     where: str) -> str | None:
    """Copy a Hugging Face ``checkpoint-N/`` directory's regular files into the scratch
    tree through the bounded reader (``manifest.bounded.copy_regular_at``: no link, checked
    after the open); the reason when it cannot be.

    The checkpoint itself is bounded by its recorded size. The files beside it are the
    ones capture recorded (``siblings``): each of its recorded size and digest, and any
    other regular file there (a ``trainer_state.json`` placed since would steer the
    resume) is refused by name. A manifest that recorded none is bounded in all by
    :data:`SIBLING_FACTOR` times the checkpoint and :data:`SIBLING_ALLOWANCE`."""
    from manifest.bounded import InputKind, copy_regular_at
    from manifest.errors import ManifestError

    assert checkpoint.artifact is not None
    source = os.path.realpath(original.parent)
    if os.path.commonpath([os.path.realpath(root), source]) != os.path.realpath(root):
        return f"{where} is in a directory that leads out of the repository ({source})"
    recorded = checkpoint.siblings
    budget = SIBLING_FACTOR * checkpoint.artifact.bytes + SIBLING_ALLOWANCE
    try:
        fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"{where} cannot be read: {exc.strerror or exc}"
    try:
        with os.scandir(fd) as entries:
            names = sorted(e.name for e in entries if e.is_file(follow_symlinks=False))
        if recorded is not None:
            planted = [n for n in names if n != original.name and n not in recorded]
            if planted:
                shown = ", ".join(planted[:3]) + (" …" if len(planted) > 3 else "")
                return (f"{where}: {shown} beside it {'was' if len(planted) == 1 else 'were'}"
                        " not there at capture (not recorded); refusing to copy "
                        f"{'it' if len(planted) == 1 else 'them'} for the resume")
            missing = sorted(set(recorded) - set(names))
            if missing:
                return f"{where}: {missing[0]}, recorded beside it, is missing"
        for name in names:
            out = target.parent / name
            _clear(out)
            label = f"{original.parent.name}/{name}"
            if name == original.name:
                copy_regular_at(fd, name, out, InputKind.WEIGHTS, shown=label,
                                size=checkpoint.artifact.bytes if original.is_file() else None)
                continue
            if recorded is not None:
                size, digest = copy_regular_at(fd, name, out, InputKind.WEIGHTS, shown=label,
                                               size=recorded[name].bytes)
                if digest != recorded[name].digest:
                    out.unlink()
                    return (f"{where}: {name} beside it changed since capture (its digest "
                            "is not the recorded one)")
                continue
            try:
                size, _ = copy_regular_at(fd, name, out, InputKind.WEIGHTS, shown=label,
                                          cap=budget)
            except ManifestError as exc:
                return (f"{where}: the files beside it are over the {SIBLING_FACTOR}x its "
                        f"size and {SIBLING_ALLOWANCE >> 20} MiB copied for a manifest that "
                        f"recorded none ({str(exc).rstrip('.')})")
            budget -= size
    except ManifestError as exc:
        return f"{where} cannot be read: {str(exc).rstrip('.')}"
    except OSError as exc:
        return f"{where} cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def _clear(path: Path) -> None:
    """Remove what the scratch clone has at ``path`` (a committed file, or a link, never
    followed), so a copy lands in the tree and not where a link points."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _copy(source: Path, target: Path) -> None:
    _clear(target)
    shutil.copyfile(source, target)


def end_checkpoints(recorded: Manifest, end: int, original_cwd: Path, new_cwd: Path,
                     tables: tuple[list[Any], list[str]] | None = None) -> dict[str, bool]:
    """Each checkpoint recorded at ``end`` against the replay's: read from the scratch tree,
    or, for a replay that ran elsewhere, its tensor table as the job sent it back."""
    from manifest.errors import MalformedArtifactError
    from manifest.weights.compare import compare_artifacts
    from manifest.weights.tables import digest_artifact

    assert recorded.outputs is not None
    out: dict[str, bool] = {}
    returned = {a.path: a for a in tables[0]} if tables is not None else None
    for c in recorded.outputs.checkpoints or []:
        if c.step != end or c.artifact is None:
            continue
        if returned is not None:
            table = returned.get(c.path)
            out[c.path] = table is not None and compare_artifacts(
                c.artifact, table, recorded_file=None, new_file=new_cwd / c.path).identical
            continue
        path = new_cwd / c.path
        if not os.path.lexists(path):
            out[c.path] = False
            continue
        try:  # the replay's own file; not a regular file (a FIFO), it differs
            again = digest_artifact(path, c.path, malformed_ok=True)
        except (MalformedArtifactError, OSError):
            out[c.path] = False
            continue
        out[c.path] = compare_artifacts(c.artifact, again, recorded_file=original_cwd / c.path,
                                        new_file=path).identical
    return out
