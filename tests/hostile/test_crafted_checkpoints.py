"""Crafted DCP directories and sharded-safetensors indexes: refused with a sentence.

Each case starts from a real checkpoint (``torch.distributed.checkpoint.save``,
``huggingface_hub.save_torch_state_dict``) whose metadata is then rewritten with
the library's own classes: a shard name or a DCP ``relative_path`` that climbs
out of the directory, a shard that is a link, a byte range past the end, a
chunk claiming a size nothing could allocate, overlapping chunks, a planted
reduce in ``.metadata``. Each carries a positive control showing the trusting
reader (the library's own loader, plain ``pickle``) does the dangerous thing,
then that ours refuses it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from manifest.errors import MalformedArtifactError
from manifest.weights.tables import digest_artifact


def _dcp(path: Path, state: dict[str, Any] | None = None) -> Path:
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(state or {"w": torch.arange(16, dtype=torch.float32)}, checkpoint_id=str(path))
    return path


def _metadata(path: Path) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return FileSystemReader(str(path)).read_metadata()


def _write_metadata(path: Path, md: Any) -> None:
    (path / ".metadata").write_bytes(pickle.dumps(md))


def _refused(path: Path) -> str:
    with pytest.raises(MalformedArtifactError) as err:
        digest_artifact(path, path.name)
    text = err.value.diagnostics()
    assert path.name in text and "\n" not in text
    return text


def _dcp_load(path: Path) -> torch.Tensor:
    from torch.distributed.checkpoint.state_dict_loader import load

    target = {"w": torch.zeros(16)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(target, checkpoint_id=str(path))
    return target["w"]


def test_real_dcp_is_read(tmp_path: Path) -> None:
    art = digest_artifact(_dcp(tmp_path / "ck"), "ck")
    assert art.format == "dcp" and art.tensors is not None and art.tensors["w"].shape == [16]


def test_relative_path_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    # Outside the checkpoint: another real DCP file holding other values.
    _dcp(tmp_path / "other", {"w": torch.full((16,), 7.0)})
    os.rename(tmp_path / "other" / "__0_0.distcp", tmp_path / "outside.distcp")
    md = _metadata(ck)
    md.storage_data = {k: dataclasses.replace(v, relative_path="../outside.distcp")
                       for k, v in md.storage_data.items()}
    _write_metadata(ck, md)
    # Positive control: torch's own loader joins the name to the directory and reads
    # the file outside it.
    assert torch.equal(_dcp_load(ck), torch.full((16,), 7.0))
    assert "not a plain file name" in _refused(ck)


def test_linked_distcp_file_is_refused(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    _dcp(tmp_path / "other", {"w": torch.full((16,), 3.0)})
    (ck / "__0_0.distcp").unlink()
    (ck / "__0_0.distcp").symlink_to(tmp_path / "other" / "__0_0.distcp")
    assert torch.equal(_dcp_load(ck), torch.full((16,), 3.0))  # followed by torch
    assert "not a regular file" in _refused(ck)


def test_byte_range_past_the_file_is_refused(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    md = _metadata(ck)
    md.storage_data = {k: dataclasses.replace(v, offset=2**40)
                       for k, v in md.storage_data.items()}
    _write_metadata(ck, md)
    assert "outside" in _refused(ck)


def test_huge_claimed_size_allocates_nothing(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    ck = _dcp(tmp_path / "ck")
    md = _metadata(ck)
    meta = md.state_dict_metadata["w"]
    huge = torch.Size([2**40, 2**20])
    meta.size = huge
    meta.chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=huge)]
    _write_metadata(ck, md)
    # Positive control: a reader that allocates the tensor the metadata claims (as
    # dcp.load's planner does for the target) cannot.
    with pytest.raises(RuntimeError):
        torch.empty(huge)
    text = _refused(ck)
    assert "storage entry" in text or "not one float32 tensor" in text


def test_overlapping_chunks_are_refused(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    ck = _dcp(tmp_path / "ck")
    md = _metadata(ck)
    meta = md.state_dict_metadata["w"]
    # Two chunks of 8 that both start at 0: 16 elements counted, half the tensor unwritten.
    meta.chunks = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([8])),
                   ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([8]))]
    _write_metadata(ck, md)
    assert "overlap" in _refused(ck)


class _Planted:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))

    def __init__(self, marker: Path) -> None:
        self.marker = marker


def test_planted_reduce_in_metadata_runs_under_pickle_never_under_ours(tmp_path: Path) -> None:
    ck = _dcp(tmp_path / "ck")
    marker = tmp_path / "ran"
    md = _metadata(ck)
    md.planner_data = _Planted(marker)
    _write_metadata(ck, md)
    pickle.loads((ck / ".metadata").read_bytes())  # positive control: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    art = digest_artifact(ck, "ck")
    assert not marker.exists()
    assert art.tensors is not None and list(art.tensors) == ["w"]


# --------------------------------------------------------------- sharded safetensors


def _sharded(path: Path) -> Path:
    from huggingface_hub import save_torch_state_dict

    path.mkdir()
    sd = {f"layer{i}": torch.full((64,), float(i)) for i in range(4)}
    save_torch_state_dict(sd, path, max_shard_size=600)
    return path / "model.safetensors.index.json"


def _retarget(index: Path, shard: str) -> None:
    doc = json.loads(index.read_text())
    doc["weight_map"] = dict.fromkeys(doc["weight_map"], shard)
    index.write_text(json.dumps(doc))


def test_real_sharded_index_is_read(tmp_path: Path) -> None:
    art = digest_artifact(_sharded(tmp_path / "m"), "m")
    assert art.format == "safetensors-index" and art.tensors is not None
    assert sorted(art.tensors) == ["layer0", "layer1", "layer2", "layer3"]


def test_shard_name_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = _sharded(tmp_path / "m")
    save_file({"layer0": torch.full((64,), 9.0)}, tmp_path / "secret.safetensors")
    _retarget(index, "../secret.safetensors")
    # Positive control: a loader that joins the shard name to the directory (as
    # transformers' sharded loader does) opens the file outside it.
    with safe_open(os.path.join(index.parent, "../secret.safetensors"), "pt") as fh:
        assert float(fh.get_tensor("layer0")[0]) == 9.0
    assert "not a plain file name" in _refused(index)


def test_absolute_shard_name_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    index = _sharded(tmp_path / "m")
    save_file({"layer0": torch.full((64,), 9.0)}, tmp_path / "secret.safetensors")
    _retarget(index, str(tmp_path / "secret.safetensors"))
    assert (index.parent / str(tmp_path / "secret.safetensors")).exists()  # join drops the dir
    assert "not a plain file name" in _refused(index)


def test_linked_shard_is_refused(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = _sharded(tmp_path / "m")
    save_file({"layer0": torch.full((64,), 9.0)}, tmp_path / "secret.safetensors")
    (index.parent / "linked.safetensors").symlink_to(tmp_path / "secret.safetensors")
    _retarget(index, "linked.safetensors")
    with safe_open(str(index.parent / "linked.safetensors"), "pt") as fh:  # followed
        assert float(fh.get_tensor("layer0")[0]) == 9.0
    assert "not a regular file" in _refused(index)


def test_index_naming_a_tensor_its_shard_lacks_is_refused(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "m")
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost"] = sorted(doc["weight_map"].values())[0]
    index.write_text(json.dumps(doc))
    assert "lacks" in _refused(index)


def test_lying_shard_header_is_refused(tmp_path: Path) -> None:
    import struct

    index = _sharded(tmp_path / "m")
    shard = index.parent / sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [0, 2**50]
    text = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    assert "points outside the file" in _refused(index)


def test_index_that_is_not_json_is_a_plain_file(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "m")
    index.write_text("{not json")
    art = digest_artifact(index, "m")
    assert art.format == "file" and art.tensors is None
