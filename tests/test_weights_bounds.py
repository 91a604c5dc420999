"""Checkpoint metadata held to its real size, and weight files opened as regular files only
(issue 38, "Memory out of proportion to the file"; issue 41, the weights import circle).

Each hostile case starts from a real checkpoint (``torch.distributed.checkpoint.save``,
``huggingface_hub.save_torch_state_dict``) and carries a positive control: the trusting
reader (plain ``pickle``, a plain ``read_bytes()``, the old all-pairs overlap check) does
the dangerous thing, the benign twin is still read, and ours refuses the hostile one
with a sentence, in memory proportional to the file.
"""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from manifest.errors import MalformedArtifactError
from manifest.weights.bounds import MalformedWeightsError
from manifest.weights.dcp import MAX_CHUNKS, METADATA_SLACK, _check_tiling
from manifest.weights.tables import digest_artifact

WEIGHTS = Path(__file__).resolve().parents[1] / "manifest" / "weights"


def _dcp(path: Path) -> Path:
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"w": torch.arange(16, dtype=torch.float32)}, checkpoint_id=str(path))
    return path


def _refused(path: Path) -> str:
    started = time.monotonic()
    with pytest.raises(MalformedArtifactError) as err:
        digest_artifact(path, path.name)
    print(f"{path.name}: refused in {time.monotonic() - started:.3f} s")
    text = err.value.diagnostics()
    assert path.name in text and "\n" not in text
    return text


# ------------------------------------------------------------------ .metadata


def test_bytes_after_the_pickle_are_refused(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    honest = (ck / ".metadata").read_bytes()
    # The control: the unpickler stops at STOP and never sees what follows.
    assert pickle.loads(honest + bytes(100)) is not None
    with open(ck / ".metadata", "ab") as fh:
        fh.write(bytes(100))
    assert "100 bytes after the end of its pickle" in _refused(ck)
    (ck / ".metadata").write_bytes(honest)  # the benign twin
    assert digest_artifact(ck, "ck").format == "dcp"


def test_6_gib_of_zeros_after_the_pickle_are_refused_before_a_byte_is_read(
        tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    with open(ck / ".metadata", "r+b") as fh:  # sparse: 6 GiB on no disk
        fh.seek(0, os.SEEK_END)
        fh.truncate(fh.tell() + (6 << 30))
    tracemalloc.start()
    try:
        text = _refused(ck)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "its .distcp files allow" in text
    print(f"peak Python allocation: {peak:,} bytes")
    assert peak < METADATA_SLACK  # nothing of the 6 GiB was read


def _lying(ck: Path, dims: int, count: int) -> None:
    """``w`` claimed as ``count`` chunks of a ``dims``-dimensional tensor, each one element:
    an honest tiling whose chunks have no storage."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    md = FileSystemReader(str(ck)).read_metadata()
    meta: Any = md.state_dict_metadata["w"]
    meta.size = torch.Size([count] + [1] * (dims - 1))
    meta.chunks = [ChunkStorageMetadata(offsets=torch.Size([i] + [0] * (dims - 1)),
                                        sizes=torch.Size([1] * dims)) for i in range(count)]
    (ck / ".metadata").write_bytes(pickle.dumps(md))


def test_metadata_larger_than_its_distcp_files_is_refused_unread(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    _lying(ck, 32, MAX_CHUNKS)
    size = (ck / ".metadata").stat().st_size
    assert size > METADATA_SLACK
    assert f"{size:,} bytes, more than" in _refused(ck)


def test_lying_chunks_padded_to_pass_the_size_bound_reach_the_tiling_in_bounded_memory(
        tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    _lying(ck, 32, MAX_CHUNKS)
    with open(ck / "__0_0.distcp", "ab") as fh:  # the padding that lets .metadata through
        fh.write(bytes((ck / ".metadata").stat().st_size))
    tracemalloc.start()
    try:
        text = _refused(ck)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "has no storage entry" in text  # the tiling passed: it is an honest one
    old = MAX_CHUNKS * MAX_CHUNKS * 32  # one boolean array of the all-pairs check
    print(f"peak Python allocation: {peak:,} bytes (the all-pairs check: {old:,} per array)")
    assert peak < old // 16


def _grid(rows: int, cols: int, height: int = 3,
          width: int = 5) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [((r * height, c * width), (height, width)) for r in range(rows)
            for c in range(cols)]


def test_tiling_of_a_grid_is_accepted_and_an_overlap_anywhere_is_found() -> None:
    boxes = _grid(64, 128)  # 8,192 chunks, as a 2-D mesh lays them out
    size = (64 * 3, 128 * 5)
    started = time.monotonic()
    _check_tiling(size, boxes, "w")
    print(f"8,192-chunk grid checked in {time.monotonic() - started:.3f} s")
    # The same count of chunks, two of them overlapping and the cover kept whole (one
    # chunk moved by one row onto its neighbour, the volume unchanged): found.
    moved = list(boxes)
    (r, c), s = moved[4000]
    moved[4000] = ((r + 1, c), s)
    with pytest.raises(MalformedWeightsError, match=r"overlap|outside"):
        _check_tiling(size, moved, "w")


def test_chunks_no_straight_cut_separates_are_compared_pair_by_pair() -> None:
    """A pinwheel: four 2×1 and 1×2 chunks around a 1×1 centre tile a 3×3 tensor, and no
    straight line splits them; the pairwise check accepts it, and finds a moved chunk."""
    pinwheel: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
        ((0, 0), (2, 1)), ((0, 1), (1, 2)), ((1, 2), (2, 1)), ((2, 0), (1, 2)),
        ((1, 1), (1, 1))]
    _check_tiling((3, 3), pinwheel, "w")
    bad = [*pinwheel[:4], ((0, 0), (1, 1))]  # the centre moved onto a corner: same volume
    with pytest.raises(MalformedWeightsError, match="overlap"):
        _check_tiling((3, 3), bad, "w")


def test_too_many_chunks_no_cut_separates_are_refused_not_compared() -> None:
    """8,192 one-element chunks all at the origin of an 8,192×1×1 tensor: the volume adds
    up, no cut splits them, and comparing every pair is past the bound: refused with a
    sentence, at once. The twin, the same chunks one per row, is an honest tiling."""
    count = MAX_CHUNKS
    honest: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
        ((i, 0, 0), (1, 1, 1)) for i in range(count)]
    _check_tiling((count, 1, 1), honest, "w")
    piled = [((0, 0, 0), (1, 1, 1))] * count
    started = time.monotonic()
    with pytest.raises(MalformedWeightsError, match="no straight cut separates"):
        _check_tiling((count, 1, 1), piled, "w")
    print(f"refused in {time.monotonic() - started:.3f} s")


# ------------------------------------------------------------------ sharded index


def _sharded(path: Path) -> Path:
    from huggingface_hub import save_torch_state_dict

    path.mkdir()
    save_torch_state_dict({f"layer{i}": torch.full((64,), float(i)) for i in range(4)}, path,
                          max_shard_size=600)
    return path / "model.safetensors.index.json"


def test_control_a_plain_read_of_the_linked_index_runs_out_of_memory(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.symlink_to("/dev/zero")
    assert index.stat().st_size == 0  # what the 64 MiB check saw
    code = ("import resource, pathlib\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            f"pathlib.Path({str(index)!r}).read_bytes()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode != 0 and "MemoryError" in proc.stderr, proc.stderr


def test_index_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "m")
    assert digest_artifact(index, "m").format == "safetensors-index"  # the benign twin
    index.unlink()
    index.symlink_to("/dev/zero")
    assert "device" in _refused(index)


def test_index_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "m")
    index.unlink()
    os.mkfifo(index)
    assert "FIFO" in _refused(index)


# ------------------------------------------------------------------ the files themselves


def test_recorded_size_is_checked_before_a_byte_is_hashed(tmp_path: Path) -> None:
    good = tmp_path / "step-5.pt"
    torch.save({"w": torch.arange(4.0)}, good)
    recorded = digest_artifact(good, "step-5.pt")
    assert digest_artifact(good, "step-5.pt", size=recorded.bytes) == recorded
    with open(good, "r+b") as fh:  # 32 GiB on no disk
        fh.truncate(32 << 30)
    started = time.monotonic()
    with pytest.raises(MalformedArtifactError, match=f"not the {recorded.bytes:,} recorded"):
        digest_artifact(good, "step-5.pt", size=recorded.bytes)
    assert time.monotonic() - started < 5  # hashing 32 GiB takes minutes


def test_a_link_out_of_the_tree_is_refused_and_one_inside_is_followed(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    (tree / "out").mkdir(parents=True)
    torch.save({"w": torch.arange(4.0)}, tree / "out" / "step-5.pt")
    (tree / "out" / "last.pt").symlink_to("step-5.pt")
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes((tree / "out" / "step-5.pt").read_bytes())
    (tree / "out" / "away.pt").symlink_to(outside)
    inside = digest_artifact(tree / "out" / "last.pt", "out/last.pt", within=tree)
    assert inside.format == "torch"
    assert digest_artifact(outside, "x").digest == inside.digest  # the same bytes
    with pytest.raises(MalformedArtifactError, match="link out of"):
        digest_artifact(tree / "out" / "away.pt", "out/away.pt", within=tree)


# ------------------------------------------------------------------ issue 41


def _imports(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_weight_readers_never_import_tables_back() -> None:
    graph = {p.stem: {n.rsplit(".", 1)[-1] for n in _imports(p)
                      if n.startswith("manifest.weights.")}
             for p in WEIGHTS.glob("*.py") if p.stem != "__init__"}
    assert {"dcp", "sharded", "torch_archive"} <= graph["tables"]  # the control: seen
    for reader in ("dcp", "sharded", "safetensors_file", "torch_archive", "mapped"):
        assert "tables" not in graph[reader], reader

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n}))
                   for n in graph.get(start, ()))

    circles = sorted(m for m in graph if reaches(m, m, {m}))
    assert circles == [], circles

