"""Multi-node records, merge and layouts without running anything (``manifest.nodes``).

Node records here are made from the golden manifest with a topology added, so
the refusals, the order-free bytes and the 64-node merge are tested fast; the
real two-node torchrun runs are in ``test_nodes_e2e.py``.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any, cast

import pytest

from manifest.canonical import dumps, seal
from manifest.diff.engine import diff_manifests
from manifest.errors import UsageError
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Manifest, RankPlace, Topology
from manifest.nodes.layout import Layout, local_launches, parse_layout, relation
from manifest.nodes.merge import MergeRefused, merge_nodes
from manifest.nodes.topology import segments_from, topology_from_records
from manifest.nodes.torchrun import find_torchrun, option, with_options, without_node_rank
from tests.runs import manifest_cli

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"
ARGV = ["torchrun", "--nnodes=4", "--nproc-per-node", "2", "--node-rank=0",
        "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "train.py", "--lr", "1"]


def node_record(node: int, nodes: int = 2, per_node: int = 2,
                changes: dict[str, Any] | None = None) -> Manifest:
    """The golden manifest as node ``node``'s record of a nodes × per_node torchrun run."""
    doc: dict[str, Any] = json.loads(GOLDEN.read_bytes())
    ranks = [node * per_node + i for i in range(per_node)]
    argv = with_options(ARGV, {"nnodes": str(nodes), "node_rank": str(node)})
    doc["command"]["argv"] = argv
    doc["command"]["topology"] = {
        "launcher": "torchrun", "nodes": nodes, "world_size": nodes * per_node,
        "local_world_size": per_node, "backend": "gloo", "node": node,
        "nccl": {"NCCL_ALGO": "Ring"},
        "ranks": [{"rank": r, "node": node, "local_rank": r % per_node, "device": "cpu"}
                  for r in ranks]}
    procs = {k: doc[s]["processes"][0] for k, s in
             (("rnd", "randomness"), ("det", "determinism"))}
    doc["randomness"]["processes"] = [dict(procs["rnd"], rank=r) for r in ranks]
    doc["determinism"]["processes"] = [dict(procs["det"], rank=r) for r in ranks]
    out = doc["outputs"]["processes"][0]
    doc["outputs"]["processes"] = [dict(out, rank=r) for r in ranks]
    if node != 0:  # only global rank 0 saves
        doc["outputs"]["artifacts"] = []
    doc["observed"]["rendezvous"] = "torchelastic:job"
    for path, value in (changes or {}).items():
        target = doc
        *parents, leaf = path.split(".")
        for p in parents:
            target = target[p]
        target[leaf] = value
    return seal(doc)


def merged_of(records: list[Manifest]) -> bytes:
    return dumps(merge_nodes([(f"node{i}.json", m) for i, m in enumerate(records)]))


# ------------------------------------------------------------------- torchrun


def test_torchrun_options_are_read_and_rewritten_in_both_spellings() -> None:
    argv = ["env", "A=1", "torchrun", "--nnodes", "2", "--node_rank=1", "--standalone",
            "train.py", "--node-rank", "9"]
    line = find_torchrun(argv)
    assert line is not None and argv[line.end] == "train.py"
    assert option(argv, "node_rank") == "1" and option(argv, "nnodes") == "2"
    assert without_node_rank(argv) == ["env", "A=1", "torchrun", "--nnodes", "2",
                                       "--standalone", "train.py", "--node-rank", "9"]
    assert with_options(argv, {"nnodes": "4", "standalone": None}) == [
        "env", "A=1", "torchrun", "--nnodes=4", "--node_rank=1", "train.py", "--node-rank", "9"]
    module = ["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"]
    assert option(module, "nproc_per_node") == "2"
    assert find_torchrun(["python", "train.py"]) is None


def test_local_launches_meet_on_loopback_one_per_node() -> None:
    launches = local_launches(ARGV, Layout(2, 1), 12345)
    assert [option(a, "node_rank") for a in launches] == ["0", "1"]
    for argv in launches:
        assert option(argv, "rdzv_endpoint") == "127.0.0.1:12345"
        assert option(argv, "nnodes") == "2" and option(argv, "nproc_per_node") == "1"
        assert argv[-3:] == ["train.py", "--lr", "1"]
    with pytest.raises(UsageError):
        local_launches(["python", "train.py"], Layout(2, 1), 1)
    assert parse_layout("1x2") == Layout(1, 2)
    with pytest.raises(UsageError):
        parse_layout("two by one")


# ---------------------------------------------------------------- topology


def _record(rank: int, node: int, restart: int = 0, **extra: Any) -> ProcessRecord:
    env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
           "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "j",
           "TORCHELASTIC_RESTART_COUNT": str(restart), "NCCL_ALGO": "Ring"}
    return cast(ProcessRecord, {"rank": rank, "launch_env": env, "backend": "gloo",
                                "device": "cpu", **extra})


def test_topology_from_worker_records_node_record_and_whole_run() -> None:
    one = topology_from_records([_record(1, 1)])
    assert one is not None and one.node == 1 and one.nodes == 2 and one.world_size == 2
    assert one.nccl == {"NCCL_ALGO": "Ring"} and one.backend == "gloo"
    whole = topology_from_records([_record(0, 0), _record(1, 1)])
    assert whole is not None and whole.node is None
    assert [(p.rank, p.node, p.device) for p in whole.ranks] == [(0, 0, "cpu"), (1, 1, "cpu")]
    assert topology_from_records([{"rank": 0, "launch_env": {}}]) is None
    slurm = topology_from_records([{"rank": 0, "launch_env": {
        "SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
        "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77"}}])
    assert slurm is not None and slurm.launcher == "slurm"
    assert [(p.rank, p.node, p.local_rank) for p in slurm.ranks] == [(3, 1, 1)]


def test_restart_segments_in_order_and_a_resize_is_named() -> None:
    earlier = [_record(0, 0, 0, exception="RuntimeError: boom")]
    last: list[ProcessRecord] = [{**_record(0, 0, 1), "launch_env": {
        **_record(0, 0, 1)["launch_env"], "WORLD_SIZE": "4"}}]
    segments = segments_from(earlier, last, None)
    assert segments is not None
    assert [(s.restart, s.world_size, s.error, s.resized) for s in segments] == [
        (0, 2, "RuntimeError: boom", None), (1, 4, None, "2 → 4")]
    assert segments_from([], last, None) is None


# ------------------------------------------------------------------- merge


def test_merge_is_byte_identical_in_every_order() -> None:
    records = [node_record(i, nodes=3) for i in range(3)]
    outs = {merged_of(list(p)) for p in itertools.permutations(records)}
    assert len(outs) == 1
    merged = Manifest.model_validate_json(outs.pop())
    assert merged.command is not None and merged.command.topology is not None
    t = merged.command.topology
    assert t.node is None and t.world_size == 6 and [r.rank for r in t.ranks] == list(range(6))
    assert "--node-rank" not in " ".join(merged.command.argv)
    assert [p.rank for p in merged.determinism.processes] == list(range(6))
    assert merged.outputs is not None and merged.outputs.status == "ok"
    assert {a.node for a in merged.outputs.artifacts} == {0}
    assert merged.hardware.nodes is not None and len(merged.hardware.nodes) == 3


@pytest.mark.parametrize(("field", "value", "named"), [
    ("code.diff_digest", "blake3:" + "1" * 64, "code.diff_digest"),
    ("randomness.seed", 7, "randomness.seed"),
    ("env.torch", "9.9.9", "env.torch"),
    ("env.cuda_runtime", "99.0", "env.cuda_runtime"),
    ("determinism.num_threads", 64, "determinism.num_threads"),
    ("data", [], "data"),
])
def test_merge_refuses_nodes_that_disagree_naming_node_and_field(
        field: str, value: Any, named: str) -> None:
    good = node_record(0)
    bad = node_record(1, changes={field: value})
    for order in ([good, bad], [bad, good]):
        with pytest.raises(MergeRefused) as err:
            merged_of(order)
        assert "node 1" in err.value.message and named in err.value.message


def test_merge_refuses_other_runs_duplicates_gaps_and_non_node_records() -> None:
    with pytest.raises(MergeRefused, match="another run"):
        merged_of([node_record(0),
                   node_record(1, changes={"observed.rendezvous": "torchelastic:x"})])
    with pytest.raises(MergeRefused, match="rank 0 is in two"):
        merged_of([node_record(0), node_record(0)])
    with pytest.raises(MergeRefused, match="ranks 4, 5"):
        merged_of([node_record(0, nodes=3), node_record(1, nodes=3)])
    plain = seal(json.loads(GOLDEN.read_bytes()))
    with pytest.raises(MergeRefused, match="not a node record"):
        merge_nodes([("plain.json", plain)])


def test_merge_heterogeneous_hardware_is_kept_and_diffed_node_by_node() -> None:
    gpu = [{"index": 0, "name": "NVIDIA H100", "memory_bytes": 1, "compute_capability": "9.0",
            "mig_mode": False, "ecc_mode": True}]
    a = merge_nodes([("0", node_record(0)), ("1", node_record(1))])
    b = merge_nodes([("0", node_record(0)),
                     ("1", node_record(1, changes={"hardware.gpus": gpu}))])
    lines = [d for d in diff_manifests(a, b).differences if d.path.startswith("hardware.nodes")]
    assert lines and all(d.impact.value == "bits" for d in lines)
    assert any("node 1 GPU 0" in d.reason for d in lines), [d.reason for d in lines]


def test_merged_output_missing_everywhere_fails_the_run() -> None:
    empty = node_record(0, changes={"outputs.artifacts": []})
    merged = merge_nodes([("0", empty), ("1", node_record(1))])
    assert merged.outputs is not None and merged.outputs.status == "failed"
    assert "no file on any node" in (merged.outputs.error or "")


def test_merge_64_synthetic_node_records_timed(capsys: pytest.CaptureFixture[str]) -> None:
    base = node_record(0, nodes=64, per_node=8)
    records = [base] + [node_record(i, nodes=64, per_node=8) for i in range(1, 64)]
    random.Random(0).shuffle(records)
    started = time.perf_counter()
    merged = merge_nodes([(f"n{i}.json", m) for i, m in enumerate(records)])
    elapsed = time.perf_counter() - started
    assert merged.command is not None and merged.command.topology is not None
    assert merged.command.topology.world_size == 512
    with capsys.disabled():
        print(f"\nmerge of 64 node records (512 ranks): {elapsed * 1000:.0f} ms")
    assert elapsed < 30


def test_merge_cli_exit_2_one_sentence(tmp_path: Path) -> None:
    for i, m in enumerate([node_record(0), node_record(1, changes={"randomness.seed": 5})]):
        (tmp_path / f"n{i}.json").write_bytes(dumps(m))
    proc = manifest_cli("merge", "n0.json", "n1.json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert "Traceback" not in err and "node 1 (n1.json)" in err and "randomness.seed" in err
    ok = manifest_cli("merge", "n0.json", "n0.json", cwd=tmp_path)
    assert ok.returncode == 2 and "two node records" in ok.stderr.decode()


# ------------------------------------------------------------------ layouts


def _topology(nodes: int, per_node: int, backend: str = "gloo",
              device: str = "cpu") -> Topology:
    return Topology(launcher="torchrun", nodes=nodes, world_size=nodes * per_node,
                    local_world_size=per_node, backend=backend, nccl={},
                    ranks=[RankPlace(rank=r, node=r // per_node, local_rank=r % per_node,
                                     device=device) for r in range(nodes * per_node)])


def test_layout_relations() -> None:
    assert relation(_topology(2, 1), _topology(2, 1)).kind == "same"
    equivalent = relation(_topology(2, 1), _topology(1, 2))
    assert equivalent.kind == "equivalent" and "equivalent layout" in equivalent.text
    assert relation(_topology(2, 1, "nccl", "cuda:0"),
                    _topology(1, 2, "nccl", "cuda:0")).kind == "changed-layout"
    changed = relation(_topology(2, 1), _topology(1, 1))
    assert changed.kind == "changed-world-size" and "world size 2 → 1" in changed.text
    nccl = copy.deepcopy(_topology(2, 1)).model_copy(update={"nccl": {"NCCL_ALGO": "Tree"}})
    assert relation(_topology(2, 1), nccl).kind == "changed-layout"


# -------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_nccl_run_records_backend_devices_and_recipe_nccl_settings(tmp_path: Path) -> None:
    """Two ranks over NCCL on the GPU(s) here: the recipe's NCCL_ALGO is in force in every
    rank and recorded with the backend and each rank's device."""
    import shutil

    import torch

    from tests.runs import capture, free_port, make_repo

    if shutil.which("torchrun") is None or torch.cuda.device_count() < 1:
        pytest.skip("needs torchrun and a GPU")
    per_node = min(2, torch.cuda.device_count())
    script = ("import os, torch, torch.distributed as dist\n"
              "dist.init_process_group('nccl')\n"
              "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
              "t = torch.ones(4, device='cuda') * (dist.get_rank() + 1)\n"
              "dist.all_reduce(t)\n"
              "if dist.get_rank() == 0:\n"
              "    os.makedirs('out', exist_ok=True)\n"
              "    torch.save({'t': t.cpu()}, 'out/t.pt')\n"
              "dist.destroy_process_group()\n")
    repo = make_repo(tmp_path / "repo", {"nccl_job.py": script}, example=False)
    cmd = ["torchrun", f"--nproc-per-node={per_node}", f"--master-port={free_port()}",
           "nccl_job.py"]
    _, doc = capture(repo, command=cmd, outputs="out/*.pt")
    topology = doc["command"]["topology"]
    assert topology["backend"] == "nccl"
    assert topology["nccl"]["NCCL_ALGO"] == "Ring"
    assert [r["device"] for r in topology["ranks"]] == [f"cuda:{i}" for i in range(per_node)]
