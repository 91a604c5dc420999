"""Files beside a recorded checkpoint in an HF ``checkpoint-N/`` directory (issue 49, class 7).

``verify --at`` places the whole directory for the Trainer's resume. Capture records the
files beside the checkpoint by size and digest (``Checkpoint.siblings``); placing copies
exactly those through the bounded reader and refuses by name a file placed there since (a
planted ``trainer_state.json`` steers the resume) or one of another size (a 3 GiB sparse
file, which costs nothing on disk, is refused before a byte is copied). Each hostile case
has its control: the untouched directory is placed whole, byte for byte.

The placing cases run on real files in real directories (a ``torch.save`` checkpoint, a
git scratch clone); the end-to-end case is a real Hugging Face Trainer under ``capture``
and ``verify --at``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import cast

import pytest

from manifest.capture.checkpoints import record_checkpoints
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Checkpoint
from manifest.verify.placing import SIBLING_ALLOWANCE, place
from tests.runs import make_repo, manifest_cli

SPARSE = 3 << 30
"""A 3 GiB sparse file: ``truncate`` gives it its size without a block on disk."""


def _run_dir(tmp_path: Path) -> tuple[Path, Checkpoint]:
    """A run's tree with ``out/checkpoint-4/`` as a Trainer leaves it, and its checkpoint as
    capture records it."""
    torch = pytest.importorskip("torch")
    tree = tmp_path / "run"
    ckpt = tree / "out" / "checkpoint-4"
    ckpt.mkdir(parents=True)
    torch.save({"w": torch.arange(6.0)}, ckpt / "model.pt")
    (ckpt / "trainer_state.json").write_text('{"global_step": 4}')
    (ckpt / "optimizer.pt").write_bytes(os.urandom(4096))
    records = cast("list[ProcessRecord]", [{"checkpoints": [  # no signature: matched by path
        {"step": 4, "path": str(ckpt / "model.pt"), "kind": "torch", "sig": None}]}])
    [checkpoint] = record_checkpoints(records, tree, tree)
    assert checkpoint.artifact is not None, checkpoint.lost
    return tree, checkpoint


def _scratch(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
    scratch.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(scratch)], check=True, timeout=120)
    return scratch


def test_capture_records_the_files_beside_an_hf_checkpoint(tmp_path: Path) -> None:
    tree, checkpoint = _run_dir(tmp_path)
    assert checkpoint.siblings is not None
    assert set(checkpoint.siblings) == {"trainer_state.json", "optimizer.pt"}
    assert checkpoint.siblings["trainer_state.json"].bytes == len('{"global_step": 4}')
    # A checkpoint outside a checkpoint-N/ directory records none (the control).
    plain = tree / "out" / "final.pt"
    plain.write_bytes((tree / "out" / "checkpoint-4" / "model.pt").read_bytes())
    [other] = record_checkpoints(cast("list[ProcessRecord]", [{"checkpoints": [
        {"step": 5, "path": str(plain), "kind": "torch", "sig": None}]}]), tree, tree)
    assert other.artifact is not None and other.siblings is None


def test_only_the_recorded_files_are_placed_beside_the_checkpoint(tmp_path: Path) -> None:
    tree, checkpoint = _run_dir(tmp_path)
    ckpt = tree / "out" / "checkpoint-4"
    scratch = _scratch(tmp_path)
    # The control: the untouched directory is placed whole, byte for byte.
    assert place(checkpoint, tree, scratch, scratch) is None
    placed = scratch / "out" / "checkpoint-4"
    assert sorted(p.name for p in placed.iterdir()) == sorted(p.name for p in ckpt.iterdir())
    for p in ckpt.iterdir():
        assert (placed / p.name).read_bytes() == p.read_bytes()

    # A file placed there since capture: refused by name, nothing of it copied.
    (ckpt / "huge.bin").touch()
    os.truncate(ckpt / "huge.bin", SPARSE)
    scratch_a = _scratch(tmp_path / "a")
    said = place(checkpoint, tree, scratch_a, scratch_a)
    assert said is not None and "huge.bin beside it was not there at capture" in said, said
    assert not (scratch_a / "out" / "checkpoint-4" / "huge.bin").exists()
    (ckpt / "huge.bin").unlink()

    # A recorded file of another size (a 3 GiB sparse one): refused before it is copied.
    state = (ckpt / "trainer_state.json").read_bytes()
    os.truncate(ckpt / "trainer_state.json", SPARSE)
    scratch_b = _scratch(tmp_path / "b")
    said = place(checkpoint, tree, scratch_b, scratch_b)
    assert said is not None and "not the 18 recorded" in said, said
    assert not (scratch_b / "out" / "checkpoint-4" / "trainer_state.json").exists()

    # Of the recorded size, other bytes: the resume would read another state; refused.
    (ckpt / "trainer_state.json").write_bytes(state.replace(b"4", b"9"))
    scratch_c = _scratch(tmp_path / "c")
    said = place(checkpoint, tree, scratch_c, scratch_c)
    assert said is not None and "trainer_state.json beside it changed since capture" in said
    assert not (scratch_c / "out" / "checkpoint-4" / "trainer_state.json").exists()

    # A link in its place is no regular file: not copied, and named as missing.
    (ckpt / "trainer_state.json").unlink()
    (ckpt / "trainer_state.json").symlink_to("/etc/hostname")
    scratch_d = _scratch(tmp_path / "d")
    said = place(checkpoint, tree, scratch_d, scratch_d)
    assert said is not None and "trainer_state.json, recorded beside it, is missing" in said


def test_a_manifest_without_recorded_siblings_copies_a_bounded_amount(tmp_path: Path) -> None:
    tree, recorded = _run_dir(tmp_path)
    checkpoint = recorded.model_copy(update={"siblings": None})  # made before they were kept
    ckpt = tree / "out" / "checkpoint-4"
    scratch = _scratch(tmp_path)
    assert place(checkpoint, tree, scratch, scratch) is None  # the control: placed whole
    assert (scratch / "out" / "checkpoint-4" / "trainer_state.json").exists()
    (ckpt / "huge.bin").touch()
    os.truncate(ckpt / "huge.bin", SPARSE)
    assert SIBLING_ALLOWANCE + 4 * recorded.artifact.bytes < SPARSE  # type: ignore[union-attr]
    scratch_b = _scratch(tmp_path / "b")
    said = place(checkpoint, tree, scratch_b, scratch_b)
    assert said is not None and "huge.bin" in said and "over the" in said, said
    assert not (scratch_b / "out" / "checkpoint-4" / "huge.bin").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_verify_at_refuses_a_planted_trainer_state(tmp_path: Path) -> None:
    """Through the real CLI: a ``trainer_state.json`` rewritten after capture gives the
    stretch no verdict, naming it; the directory as the run left it replays identically.
    (A file placed beside it, and a sparse one, are the placing cases above.)"""
    pytest.importorskip("transformers")
    from tests.test_resume_conventions import HF

    repo = make_repo(tmp_path / "repo", {"hf.py": HF, ".gitignore": "out/\n*.json\n"},
                     example=False)
    cap = manifest_cli("capture", "--seed", "0", "--artifact",
                       "out/checkpoint-16/model.safetensors", "--", "python", "hf.py", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    [model] = [c for c in json.loads(cap.stdout)["outputs"]["checkpoints"]
               if c["path"] == "out/checkpoint-4/model.safetensors"]
    assert "trainer_state.json" in model["siblings"]
    state = repo / "out" / "checkpoint-4" / "trainer_state.json"
    honest = state.read_bytes()

    def segment() -> tuple[int, dict[str, object]]:
        out = manifest_cli("verify", "-q", "--at", "6", "--format", "json", "run.json",
                           cwd=repo, timeout=600)
        assert b"Traceback" not in out.stderr, out.stderr.decode()
        [seg] = json.loads(out.stdout)["segments"]
        return out.returncode, seg

    state.write_bytes(honest.replace(b'"global_step": 4', b'"global_step": 2'))
    code, seg = segment()
    assert code == 3 and seg["verdict"] != "identical", seg
    assert "trainer_state.json beside it changed since capture" in str(seg["reason"]), seg
    state.write_bytes(honest)
    # The control: the directory as the run left it replays identically.
    code, seg = segment()
    assert code == 0 and seg["verdict"] == "identical", seg
