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

from manifest.models import Checkpoint, Manifest

HF_CHECKPOINT = re.compile(r"checkpoint-[0-9]+")
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
        # rng_state.pth …): copied beside the file whose digest was checked.
        for member in member_files(original.parent):
            _copy(member, target.parent / member.name)
        return None
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
