"""A received manifest's checkpoint paths are data (issue 29 with the path validator).

``verify --segments`` copies the recorded checkpoint from the user's tree into the
scratch clone at its recorded path. A crafted manifest may name a path that climbs
out (``../``), an absolute one, or one whose place in the clone is a committed
symlink pointing at the user's files. Each case first shows what a plain join of
the recorded path would do (the positive control: it reaches outside), then that
the replay refuses it or writes inside the clone only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from manifest.models import Checkpoint
from manifest.rerun.paths import UnsafePathError
from manifest.verify.placing import place
from manifest.weights.tables import digest_artifact


def _setup(tmp_path: Path, rel: str) -> tuple[Checkpoint, Path, Path]:
    """The user's tree holding a real checkpoint at ``rel`` (when it is inside), and a
    scratch clone (a git repository) to place it in."""
    user = tmp_path / "user"
    (user / "out").mkdir(parents=True)
    source = user / "out" / "step-5.pt"
    torch.save({"w": torch.arange(4.0)}, source)
    clone = tmp_path / "scratch" / "tree"
    clone.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(clone)], check=True, capture_output=True)
    artifact = digest_artifact(source, "out/step-5.pt")
    return Checkpoint(step=5, path=rel, artifact=artifact, lost=None), user, clone


@pytest.mark.parametrize("rel", ["../../victim.pt", "/tmp/victim.pt", "out/../../victim.pt"])
def test_a_path_out_of_the_tree_is_refused(tmp_path: Path, rel: str) -> None:
    ck, user, clone = _setup(tmp_path, rel)
    joined = os.path.normpath(clone / rel)
    assert not joined.startswith(str(clone) + "/")  # the control: a plain join leaves
    with pytest.raises(UnsafePathError):
        place(ck, user, clone, clone)
    assert not (tmp_path / "victim.pt").exists()


def test_a_committed_link_at_the_place_is_not_written_through(tmp_path: Path) -> None:
    ck, user, clone = _setup(tmp_path, "out/step-5.pt")
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"the user's file")
    (clone / "out").mkdir()
    (clone / "out" / "step-5.pt").symlink_to(victim)
    # The control: copying to the path as it stands writes into the victim.
    import shutil

    probe = tmp_path / "probe-link"
    probe.symlink_to(tmp_path / "probe-target")
    shutil.copyfile(user / "out" / "step-5.pt", probe)
    assert (tmp_path / "probe-target").exists()
    assert place(ck, user, clone, clone) is None
    assert victim.read_bytes() == b"the user's file"
    placed = clone / "out" / "step-5.pt"
    assert not placed.is_symlink()
    assert placed.read_bytes() == (user / "out" / "step-5.pt").read_bytes()


def test_a_committed_link_on_the_way_is_refused(tmp_path: Path) -> None:
    ck, user, clone = _setup(tmp_path, "out/step-5.pt")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (clone / "out").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        place(ck, user, clone, clone)
    assert list(outside.iterdir()) == []


def test_the_placed_checkpoint_is_not_a_change_to_the_code(tmp_path: Path) -> None:
    """Placed in a directory git does not ignore, it stays out of the clone's status (the
    bundle of a cluster replay must carry the recorded patch)."""
    ck, user, clone = _setup(tmp_path, "out/step-5.pt")
    assert place(ck, user, clone, clone) is None
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=clone, capture_output=True, text=True, check=True).stdout
    assert status == ""
    (clone / "out" / "other.pt").write_bytes(b"x")  # the control: a neighbour is seen
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=clone, capture_output=True, text=True, check=True).stdout
    assert status == "?? out/other.pt\n"
