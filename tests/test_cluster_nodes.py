"""Multi-node on clusters, the parts that need no cluster (issue 30): the command every node
runs, each node's rendezvous variables, one result from the nodes' results, what a cluster
cannot place, and ``capture --nodes DIR`` merging itself (threads standing in for nodes).

The real engines run these in ``tests/test_cluster_nodes_e2e.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import load_manifest
from manifest.errors import UsageError
from manifest.nodes.gather import (
    MERGED,
    ForeignMerge,
    NodesMissing,
    check_directory,
    gather,
    record_name,
)
from manifest.nodes.layout import Layout, cluster_launch, node_env, ranks_held, rendezvous_host
from manifest.nodes.merge import merge_nodes
from manifest.nodes.torchrun import as_every_node_runs, option
from manifest.rerun.cluster.placement import NodeNeed, combine_results, need_of, shortfall
from tests.test_nodes import node_record

ARGV = ["torchrun", "--nnodes=2", "--nproc-per-node=1", "--node-rank=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=head-a:29400", "--rdzv-id=job7", "train.py", "--lr", "1"]


def test_the_endpoint_leaves_the_command_every_node_ran() -> None:
    other_head = [a.replace("head-a:29400", "head-b:1234").replace("job7", "job8") for a in ARGV]
    assert as_every_node_runs(ARGV) == as_every_node_runs(other_head) == [
        "torchrun", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", "train.py",
        "--lr", "1"]
    static = ["torchrun", "--nnodes", "2", "--master-addr", "h", "--master_port=1",
              "train.py", "--master-addr", "kept"]
    assert as_every_node_runs(static) == ["torchrun", "--nnodes", "2", "train.py",
                                          "--master-addr", "kept"]  # the script's own words
    assert as_every_node_runs(["python", "x.py"]) == ["python", "x.py"]


def test_merged_run_id_does_not_depend_on_the_head_or_port() -> None:
    """Two launches of one run from different heads: the merged manifests share a run_id;
    positive control: the node records themselves still name their endpoint."""
    def launch(endpoint: str) -> list[Any]:
        out = []
        for node in (0, 1):
            record = node_record(node)
            assert record.command is not None
            argv = [a.replace("--rdzv-endpoint=head:29400", f"--rdzv-endpoint={endpoint}")
                    for a in record.command.argv]
            out.append(node_record(node, changes={"command.argv": argv}))
        return out

    a, b = launch("head-a:29400"), launch("head-b:31000")
    assert a[0].run_id != b[0].run_id  # positive control: a node record names its endpoint
    merged_a = merge_nodes([(f"n{i}", m) for i, m in enumerate(a)])
    merged_b = merge_nodes([(f"n{i}", m) for i, m in enumerate(b)])
    assert merged_a.run_id == merged_b.run_id
    assert merged_a.command is not None
    assert not any("rdzv-endpoint" in w for w in merged_a.command.argv)


def test_cluster_launch_leaves_node_rank_and_endpoint_to_each_node() -> None:
    argv = cluster_launch(as_every_node_runs(ARGV), Layout(2, 1))
    assert option(argv, "node_rank") is None and option(argv, "rdzv_endpoint") is None
    # static: the one rendezvous that honours a node rank (tests/test_layout.py parses it)
    assert option(argv, "rdzv_backend") == "static" and option(argv, "nnodes") == "2"
    assert option(argv, "rdzv_conf") == "timeout=120"  # the same on every node
    assert argv[-3:] == ["train.py", "--lr", "1"]
    assert node_env(1, "10.0.0.5", 29500) == {
        "PET_NODE_RANK": "1", "PET_RDZV_ENDPOINT": "10.0.0.5:29500"}
    assert node_env(0, "10.0.0.5", 29500)["PET_NODE_RANK"] == "0"  # rank 0 serves the store


def test_the_rendezvous_host_is_node_0_s_address_or_loopback_on_one_host() -> None:
    assert rendezvous_host(["10.0.0.5", "10.0.0.6"]) == "10.0.0.5"
    assert rendezvous_host(["192.0.2.2", "192.0.2.2"]) == "127.0.0.1"
    assert rendezvous_host(["h"]) == "h"
    # which ranks a node's launch held, as its log says it: workers only, in order
    assert ranks_held([{"rank": 3}, {"rank": 2}, {"rank": None}, {"pid": 1},
                       {"rank": 2, "mp_child": True}, {"rank": 2}]) == [2, 3]
    with pytest.raises(UsageError, match="does not start torchrun"):
        cluster_launch(["python", "train.py"], Layout(2, 1))


def _doc(node: int, **extra: Any) -> dict[str, Any]:
    return {"format": "manifest-remote-result/v1", "bundle": "blake3:x", "exit_code": 0,
            "records": [{"rank": node}], "env": {"PYTHONHASHSEED": "0"},
            "op_streams": {f"ops-{node}": "AA=="}, "opened": {f"{{tree}}/f{node}": "k"},
            "modules": ["torch", f"m{node}"], "started_ns": 100 - node, "outside": [],
            "workers": 1, "artifacts": ([{"path": "out/model.safetensors"}] if node == 0 else []),
            "missing": [] if node == 0 else ["out/*.safetensors"],
            "writable": [{f"w{node}": "AA=="}], "outputs": {},
            "confinement": "not confined on the host (x)", **extra}


def test_nodes_results_become_one_result() -> None:
    doc = combine_results([_doc(0), _doc(1)])
    assert [r["rank"] for r in doc["records"]] == [0, 1]
    assert doc["artifacts"] == [{"path": "out/model.safetensors"}]
    assert doc["missing"] == []  # node 0 wrote it: not missing from the run
    assert doc["modules"] == ["m0", "m1", "torch"]
    assert doc["started_ns"] == 99 and doc["workers"] == 2 and doc["nodes"] == 2
    assert doc["writable"] == [{"w0": "AA==", "w1": "AA=="}]
    assert set(doc["op_streams"]) == {"ops-0", "ops-1"}
    failed = combine_results([_doc(0), _doc(1, exit_code=7)])
    assert failed["exit_code"] == 7
    refused = combine_results([_doc(0), {"format": "x", "refused": "edited"}])
    assert refused["refused"] == "node 1: edited"


def test_a_layout_the_cluster_cannot_place_is_said() -> None:
    need = need_of({"nodes": 2, "gpus": 0}, threads=2)
    assert need == NodeNeed(2, 2, 0)
    assert shortfall(need, [("a", 2, 0), ("b", 4, 0)]) is None
    one = shortfall(need, [("a", 4, 0)])
    assert one is not None and "2 distinct nodes with 2 CPUs each" in one and "a (4 CPUs)" in one
    small = shortfall(NodeNeed(1, 2, 1), [("a", 1, 0)])
    assert small is not None and "one node with 2 CPUs and 1 GPU" in small
    assert need_of({"nodes": 2, "gpus": 4}, 1).gpus == 2  # GPUs per node


def test_capture_nodes_merges_once_whoever_finishes_last(tmp_path: Path) -> None:
    check_directory(tmp_path)
    results: dict[int, Any] = {}

    def node(i: int) -> None:
        results[i] = gather(node_record(i), tmp_path, timeout_s=60)

    threads = [threading.Thread(target=node, args=(i,)) for i in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.merged_here for r in results.values()) == [False, True]  # one merged
    merged = load_manifest((tmp_path / MERGED).read_bytes())
    expected = merge_nodes([(f"node{i}", node_record(i)) for i in (0, 1)])
    assert merged.run_id == expected.run_id == results[0].run_id == results[1].run_id
    with pytest.raises(UsageError, match="already holds a merged run"):
        check_directory(tmp_path)  # a second launch into the same directory


def test_a_node_that_never_arrives_is_named(tmp_path: Path) -> None:
    with pytest.raises(NodesMissing, match=r"the record of node 1 of 2 has not arrived") as err:
        gather(node_record(0), tmp_path, timeout_s=1)
    assert err.value.hint is not None and "manifest merge" in err.value.hint
    assert not (tmp_path / MERGED).exists()


def _gather_in_thread(record: Any, directory: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """Node ``record``'s capture --nodes on a thread; its result or error lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = gather(record, directory, timeout_s=120)
        except Exception as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _wait_for(path: Path) -> None:
    """Until node 0 has written its record (an event, not a fixed sleep)."""
    import time

    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("foreign", ["another run", "not a manifest"])
def test_a_foreign_run_json_dropped_while_node_0_waits_is_refused(tmp_path: Path,
                                                                   foreign: str) -> None:
    """Issue 38: another writer drops a run.json into the --nodes directory while node 0
    waits for node 1. Positive control: that file is a valid, sealed merge of a 2-node run,
    which is all the old check asked of it; ours asks for node 0's own record in it."""
    from manifest.store import atomic_write

    mine = node_record(0)
    thread, out = _gather_in_thread(mine, tmp_path)
    _wait_for(tmp_path / record_name(0))
    if foreign == "another run":
        other = [node_record(i, changes={"randomness.seed": 99}) for i in (0, 1)]
        data = merged_of_records(other)
        loaded = load_manifest(data)  # the positive control: a valid merge …
        assert loaded.command is not None and loaded.command.topology is not None
        assert loaded.command.topology.nodes == 2 and loaded.run_id != mine.run_id
        assert mine.digest not in (loaded.observed.node_records or [])  # … of other records
    else:
        data = b"{not json"
    atomic_write(tmp_path / MERGED, data)
    thread.join()
    error = out.get("error")
    assert isinstance(error, ForeignMerge), out
    assert error.exit_code == 2 and "\n" not in str(error)
    assert f"does not hold node 0's record ({mine.digest})" in str(error) or (
        "is not a manifest this launch's merge could write" in str(error))


def test_node_0_takes_the_merge_that_holds_its_own_record(tmp_path: Path) -> None:
    """The benign twin: node 1 completes the set and merges; waiting node 0 finds its own
    record's digest in the merge and takes it."""
    mine = node_record(0)
    thread, out = _gather_in_thread(mine, tmp_path)
    _wait_for(tmp_path / record_name(0))
    done = gather(node_record(1), tmp_path, timeout_s=60)
    thread.join()
    assert "error" not in out, out
    assert done.merged_here and not out["result"].merged_here
    assert out["result"].run_id == done.run_id
    merged = load_manifest((tmp_path / MERGED).read_bytes())
    assert merged.observed.node_records == [mine.digest, node_record(1).digest]


def merged_of_records(records: list[Any]) -> bytes:
    from manifest.canonical import dumps

    return dumps(merge_nodes([(f"node{i}.json", m) for i, m in enumerate(records)]))


def _forged(mine: Any, others: list[Any]) -> bytes:
    """The reviewer's forgery: another run's merge (seed 99), its node_records list rewritten
    to name ``mine`` (read from node-0.json by anyone who can read the directory), re-sealed.
    The list is outside identity, so the seal is as valid as the merge's own."""
    import json

    from manifest.canonical import dumps, seal

    doc = json.loads(merged_of_records(others))
    doc["observed"]["node_records"] = [mine.digest, *doc["observed"]["node_records"][1:]]
    return dumps(seal(doc))


def test_a_resealed_merge_of_another_run_listing_node_0_s_digest_is_refused(
        tmp_path: Path) -> None:
    """Issue 36/38 review: a listed digest is no proof. The forgery is dropped while node 0
    waits for node 1. Positive control: it loads as a valid sealed merge that lists node 0's
    digest, which is all the previous check asked of it."""
    from manifest.store import atomic_write

    mine = node_record(0)
    forged = _forged(mine, [node_record(i, changes={"randomness.seed": 99}) for i in (0, 1)])
    loaded = load_manifest(forged)
    assert mine.digest in (loaded.observed.node_records or []) and loaded.run_id != mine.run_id
    thread, out = _gather_in_thread(mine, tmp_path)
    _wait_for(tmp_path / record_name(0))
    atomic_write(tmp_path / MERGED, forged)
    thread.join()
    error = out.get("error")
    assert isinstance(error, ForeignMerge), out
    assert error.exit_code == 2 and "\n" not in str(error)
    assert "before the record of node 1 did, so no node of this launch merged it" in str(error)


def test_node_0_checks_the_merge_s_content_against_the_records_beside_it(
        tmp_path: Path) -> None:
    """With every record in the directory, node 0 merges them again (its own as it holds it)
    and takes run.json only when it is that merge, byte for byte. The honest merge is taken
    (positive control); the seed-99 forgery and the honest merge with one output's digest
    changed and re-sealed, both listing node 0's digest, are refused with one sentence."""
    import json

    from manifest.canonical import dumps, seal
    from manifest.nodes.gather import take_merge

    mine, theirs = node_record(0), node_record(1)
    for i, record in enumerate((mine, theirs)):
        (tmp_path / record_name(i)).write_bytes(dumps(record))
    honest = merged_of_records([mine, theirs])
    doc = json.loads(honest)
    doc["outputs"]["artifacts"][0]["digest"] = "blake3:" + "ab" * 32
    edited = dumps(seal(doc))
    cases = {"honest": honest, "another run": _forged(mine, [
        node_record(i, changes={"randomness.seed": 99}) for i in (0, 1)]), "edited": edited}
    for data in cases.values():
        assert mine.digest in (load_manifest(data).observed.node_records or [])
    (tmp_path / MERGED).write_bytes(honest)
    taken = take_merge(tmp_path / MERGED, mine, 0, 2).run_id
    assert taken == load_manifest(honest).run_id
    for name in ("another run", "edited"):
        (tmp_path / MERGED).write_bytes(cases[name])
        with pytest.raises(ForeignMerge) as refused:
            take_merge(tmp_path / MERGED, mine, 0, 2)
        assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
        assert "lists node 0's record but is not the merge of this launch's records" in (
            str(refused.value)), name
    # node-0.json rewritten by another writer does not move the check: node 0 merges the
    # record it holds, so the forgery stays refused and the honest merge stays taken.
    (tmp_path / record_name(0)).write_bytes(dumps(node_record(0, changes={
        "randomness.seed": 99})))
    (tmp_path / MERGED).write_bytes(honest)
    assert take_merge(tmp_path / MERGED, mine, 0, 2).run_id == taken
