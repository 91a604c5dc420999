"""DCP directories and sharded safetensors are weights like any other: tensor tables.

Every checkpoint here is written by the real library (``torch.distributed.checkpoint``
in one process and under gloo with 2 ranks sharding a DTensor;
``huggingface_hub.save_torch_state_dict`` for the Hugging Face shard convention) and
its table must equal the table of the same state dict saved by ``torch.save``:
the identity of a tensor does not depend on how it was stored or split.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from manifest.weights.compare import compare_artifacts
from manifest.weights.tables import digest_artifact


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 4))
    sd = dict(model.state_dict())
    sd["transposed"] = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    sd["counts"] = torch.arange(5, dtype=torch.int64)
    sd["half"] = torch.linspace(0, 1, 7, dtype=torch.bfloat16)
    return sd


def _dcp_save(state: Mapping[str, object], path: Path) -> None:
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        save(state, checkpoint_id=str(path))


def test_dcp_table_equals_torch_save_table(tmp_path: Path) -> None:
    sd = _state()
    _dcp_save({**sd, "step": 7}, tmp_path / "ck")
    torch.save(sd, tmp_path / "full.pt")
    dcp_art = digest_artifact(tmp_path / "ck", "ck")
    full = digest_artifact(tmp_path / "full.pt", "full.pt")
    assert dcp_art.format == "dcp" and dcp_art.tensors is not None and full.tensors is not None
    step = dcp_art.tensors.pop("step")
    assert step.dtype == "pickle"
    assert dcp_art.tensors == full.tensors
    # .metadata carries a fresh save_id: a second save of the same tensors has another
    # directory digest and the same table.
    _dcp_save({**sd, "step": 7}, tmp_path / "again")
    again = digest_artifact(tmp_path / "again", "again")
    assert again.digest != digest_artifact(tmp_path / "ck", "ck").digest
    assert again.tensors is not None and again.tensors.pop("step") == step
    assert again.tensors == full.tensors


def test_dcp_one_ulp_is_named_with_numbers(tmp_path: Path) -> None:
    sd = _state()
    _dcp_save(sd, tmp_path / "a")
    nudged = dict(sd)
    w = sd["0.weight"].clone()
    w.view(-1)[5] = torch.nextafter(w.view(-1)[5], torch.tensor(10.0))
    nudged["0.weight"] = w
    _dcp_save(nudged, tmp_path / "b")
    a = digest_artifact(tmp_path / "a", "ck")
    b = digest_artifact(tmp_path / "b", "ck")
    delta = compare_artifacts(a, b, recorded_file=tmp_path / "a", new_file=tmp_path / "b")
    assert not delta.identical
    assert [(d.name, d.elements, d.max_ulp) for d in delta.tensors] == [("0.weight", 1, 1)]


_TWO_RANKS = r"""
import os, sys, warnings
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def main(rank, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    from torch.distributed import checkpoint as dcp
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    full = {"w": torch.randn(9, 5), "b": torch.randn(6), "col": torch.randn(4, 7)}
    sharded = {"w": distribute_tensor(full["w"], mesh, [Shard(0)]),
               "b": distribute_tensor(full["b"], mesh, [Shard(0)]),
               "col": distribute_tensor(full["col"], mesh, [Shard(1)])}
    dcp.save(sharded, checkpoint_id=out)
    if rank == 0:
        torch.save(full, out + ".pt")
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=2)
"""


def test_dcp_saved_by_two_gloo_ranks_assembles_the_full_tensors(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "two.py"
    script.write_text(_TWO_RANKS)
    out = tmp_path / "ck"
    proc = subprocess.run([sys.executable, str(script), str(out), str(port)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    distcp = sorted(p.name for p in out.iterdir() if p.suffix == ".distcp")
    assert len(distcp) == 2  # one file per rank: the tensors really are split
    dcp_art = digest_artifact(out, "ck")
    full = digest_artifact(Path(str(out) + ".pt"), "ck.pt")
    assert dcp_art.tensors is not None and dcp_art.tensors == full.tensors
    assert dcp_art.tensors["w"].shape == [9, 5] and dcp_art.tensors["col"].shape == [4, 7]


def test_sharded_safetensors_index_equals_one_file(tmp_path: Path) -> None:
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in _state().items()}
    (tmp_path / "sharded").mkdir()
    save_torch_state_dict(sd, tmp_path / "sharded", max_shard_size=500)
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    shards = set(json.loads(index.read_text())["weight_map"].values())
    assert len(shards) >= 2  # really split
    save_file(sd, tmp_path / "one.safetensors")
    art = digest_artifact(index, "sharded/model.safetensors.index.json")
    one = digest_artifact(tmp_path / "one.safetensors", "one.safetensors")
    assert art.format == "safetensors-index" and art.tensors == one.tensors
    # The artifact digest covers the shards: a shard rewritten with other values changes
    # both the digest and the one tensor's entry.
    name = sorted(shards)[0]
    from safetensors.torch import load_file

    inner = load_file(tmp_path / "sharded" / name)
    key = sorted(inner)[0]
    inner[key] = inner[key] + 1
    shutil.copy(tmp_path / "sharded" / name, tmp_path / "kept")
    save_file(inner, tmp_path / "sharded" / name, metadata={"format": "pt"})
    changed = digest_artifact(index, "sharded/model.safetensors.index.json")
    assert changed.digest != art.digest and changed.tensors is not None
    assert [k for k in sd if changed.tensors[k] != art.tensors[k]] == [key]  # type: ignore[index]


_SAVES = """
import os, sys, warnings
import pytest
import torch
from huggingface_hub import save_torch_state_dict
from torch.distributed.checkpoint.state_dict_saver import save
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
if os.environ.get("NUDGE"):
    with torch.no_grad():
        model[2].bias[0] = torch.nextafter(model[2].bias[0], torch.tensor(9.0))
os.makedirs("out/hf", exist_ok=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    save(model.state_dict(), checkpoint_id="out/dcp")
save_torch_state_dict(model.state_dict(), "out/hf", max_shard_size=1000)
"""


@pytest.mark.slow
def test_capture_verify_and_diff_compare_dcp_and_sharded_tensor_by_tensor(
        tmp_path: Path) -> None:
    from tests.runs import make_repo, manifest_cli

    repo = make_repo(tmp_path / "repo", {"saves.py": _SAVES}, example=False)
    cap = manifest_cli("capture", "--seed", "1", "--artifact", "out/dcp", "--artifact",
                       "out/hf/*.index.json", "--", "python", "saves.py", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    doc = json.loads(cap.stdout)
    formats = {a["path"]: (a["format"], len(a["tensors"])) for a in doc["outputs"]["artifacts"]}
    assert formats == {"out/dcp": ("dcp", 4),
                       "out/hf/model.safetensors.index.json": ("safetensors-index", 4)}
    same = manifest_cli("verify", "--trust", "run.json", cwd=repo)
    assert same.returncode == 0, same.stdout.decode() + same.stderr.decode()
    nudged = manifest_cli("verify", "--trust", "run.json", cwd=repo, env={"NUDGE": "1"})
    assert nudged.returncode == 1, nudged.stderr.decode()
    text = nudged.stdout.decode()
    assert "2.bias" in text and "out/dcp" in text and "index.json" in text
