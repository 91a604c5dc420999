"""Real two-node torchrun runs on 127.0.0.1: capture → merge → verify, end to end.

Each "node" is its own clone of the repository (its own disk, as on a
cluster), launched with ``manifest capture -- torchrun --nnodes=2
--node-rank=i --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT …``; gloo on
CPU (c10d ignores the node rank, from ``--node-rank`` or ``PET_NODE_RANK``
alike, and numbers the nodes itself; each record keeps the node rank c10d
gave its process). verify re-runs node ``i`` with ``--node-rank=i`` under the
static rendezvous, the one that honours it, so node ``i`` holds ranks ``i × P …``
and torchrun does not warn that it ignores the node rank. The heaviest tests of
the multi-node work live in this one module so CI can run them in one process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runs import capture, free_port, git, make_repo, manifest_cli

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")]

STEPS = "8"


def clones(tmp: Path, n: int = 2) -> list[Path]:
    origin = make_repo(tmp / "origin", {})
    out = []
    for i in range(n):
        path = tmp / f"node{i}"
        git(tmp, "clone", "-q", str(origin), str(path))
        out.append(path)
    return out


def node_command(node: int, port: int, *, nodes: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    return ["torchrun", f"--nnodes={nodes}", "--nproc-per-node=1", f"--node-rank={node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=e2e",
            *extra, "train.py", "--steps", STEPS]


def capture_nodes(repos: list[Path], out: Path, *, first: int = 0, delay: float = 1.0,
                  port: int | None = None) -> list[Path]:
    """Capture every node at once (``first`` started ``delay`` s before the others);
    the node records' paths, by node index of the launch."""
    port = port or free_port()
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    order = [first] + [i for i in range(len(repos)) if i != first]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    paths = [out / f"node{i}.json" for i in range(len(repos))]
    for i in order:
        cmd = [sys.executable, "-m", "manifest", "capture", "--seed", "0",
               "--artifact", "out/*.safetensors", "-o", str(paths[i]), "--",
               *node_command(i, port, nodes=len(repos))]
        procs[i] = subprocess.Popen(cmd, cwd=repos[i], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        time.sleep(delay)
    for i, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"node {i}: {err.decode()[-3000:]}"
    return paths


def rank0_repo(repos: list[Path]) -> Path:
    """The clone whose node got global rank 0 (c10d hands out node ranks on arrival), where
    the recorded output lies."""
    [holder] = [r for r in repos if (r / "out" / "model.safetensors").exists()]
    return holder


@pytest.fixture(scope="module")
def two_node_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nodes")
    repos = clones(tmp)
    runs = []
    port = free_port()  # the endpoint is in argv, so in the identity: the same both times
    for first in (0, 1):  # node 0 starts first, then node 1 first
        out = tmp / f"run-{first}"
        out.mkdir()
        runs.append(capture_nodes(repos, out, first=first, port=port))
        holder = rank0_repo(repos)
        runs[-1].append(holder)
        if first == 0:  # keep the first run's output where verify compares it
            shutil.copytree(holder / "out", out / "saved-out")
            for r in repos:
                shutil.rmtree(r / "out", ignore_errors=True)
    # Verify the first run where its rank 0 wrote (its output put back).
    first_records, second_records = runs[0][:2], runs[1][:2]
    for r in repos:
        shutil.rmtree(r / "out", ignore_errors=True)
    holder = runs[0][2]
    shutil.copytree(tmp / "run-0" / "saved-out", holder / "out")
    return {"repos": repos, "first": first_records, "second": second_records,
            "holder": holder, "tmp": tmp}


def merge(paths: list[Path], cwd: Path) -> bytes:
    proc = manifest_cli("merge", *map(str, paths), cwd=cwd)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


def test_node_records_say_where_each_rank_ran(two_node_runs: dict[str, Any]) -> None:
    docs = [json.loads(p.read_bytes()) for p in two_node_runs["first"]]
    nodes = sorted(d["command"]["topology"]["node"] for d in docs)
    assert nodes == [0, 1]
    for d in docs:
        t = d["command"]["topology"]
        assert (t["launcher"], t["nodes"], t["world_size"], t["backend"]) == (
            "torchrun", 2, 2, "gloo")
        assert [r["device"] for r in t["ranks"]] == ["cpu"]
        assert t["nccl"]["NCCL_ALGO"] == "Ring"  # set by the recipe, seen by the worker
        assert d["outputs"]["status"] == "ok"  # the node without an output too
        assert d["observed"]["rendezvous"] == "torchelastic:e2e"
    savers = [d for d in docs if d["outputs"]["artifacts"]]
    assert len(savers) == 1 and savers[0]["command"]["topology"]["ranks"][0]["rank"] == 0


def test_merge_in_both_orders_byte_identical_and_same_run_id_in_both_start_orders(
        two_node_runs: dict[str, Any]) -> None:
    tmp = two_node_runs["tmp"]
    a, b = two_node_runs["first"]
    ab, ba = merge([a, b], tmp), merge([b, a], tmp)
    assert ab == ba
    other = merge(list(reversed(two_node_runs["second"])), tmp)
    first, second = json.loads(ab), json.loads(other)
    assert first["run_id"] == second["run_id"]
    assert (first["outputs"]["artifacts"][0]["tensors"]
            == second["outputs"]["artifacts"][0]["tensors"])
    assert first["outputs"]["artifacts"][0]["node"] == 0
    assert first["command"]["topology"]["ranks"] == [
        {"rank": 0, "node": 0, "local_rank": 0, "device": "cpu"},
        {"rank": 1, "node": 1, "local_rank": 0, "device": "cpu"}]


def _verify(two_node_runs: dict[str, Any], *extra: str) -> tuple[int, dict[str, Any], str]:
    holder = two_node_runs["holder"]
    (holder / "run.json").write_bytes(merge(two_node_runs["first"], holder))
    proc = manifest_cli("verify", "run.json", "--format", "json", *extra, cwd=holder)
    return proc.returncode, json.loads(proc.stdout or b"{}"), proc.stderr.decode()


def test_verify_two_nodes_on_localhost_identical(two_node_runs: dict[str, Any]) -> None:
    code, report, err = _verify(two_node_runs)
    assert code == 0, err[-3000:]
    assert report["verdict"] == "identical"
    assert report["topology"]["relation"] == "same"
    assert report["plan"]["executor"].startswith("local-nodes")
    nodes = report["plan"]["nodes"]
    assert [n["node"] for n in nodes] == [0, 1]
    assert all("--rdzv-endpoint=127.0.0.1:" in " ".join(n["argv"]) for n in nodes)
    assert not [d for d in report["drift"] if d["impact"] == "bits"]
    # torchrun ignores --node-rank under c10d and says so; the local launches avoid that.
    assert "node_rank is only used for static rdzv_backend" not in err


def test_verify_equivalent_layout_is_said(two_node_runs: dict[str, Any]) -> None:
    code, report, err = _verify(two_node_runs, "--layout", "1x2")
    assert code == 0, err[-3000:]
    assert report["verdict"] == "identical"
    assert report["topology"]["relation"] == "equivalent"
    assert any("equivalent layout" in n for n in report["notes"])


def test_verify_changed_world_size_is_measured_never_a_bare_differs(
        two_node_runs: dict[str, Any]) -> None:
    code, report, err = _verify(two_node_runs, "--layout", "1x1")
    assert code == 1, err[-3000:]
    assert report["verdict"] == "changed-topology"
    assert report["topology"]["relation"] == "changed-world-size"
    reason = report["reason"]
    assert "world size 2 → 1" in reason and "max |Δ|" in reason and "max ULP" in reason
    assert "not measured" not in reason
    assert report["first_divergent_step"] is not None


def test_a_node_record_alone_is_not_verified(two_node_runs: dict[str, Any]) -> None:
    holder = two_node_runs["holder"]
    record = two_node_runs["first"][0]
    proc = manifest_cli("verify", str(record), cwd=holder)
    assert proc.returncode == 2
    assert "manifest merge" in proc.stderr.decode()


def test_a_node_with_a_changed_file_is_refused_by_merge(tmp_path: Path) -> None:
    repos = clones(tmp_path)
    # Positive control: the same launch from unchanged clones merges.
    paths = capture_nodes(repos, tmp_path, delay=0.5)
    assert merge(paths, tmp_path)
    with (repos[1] / "train.py").open("a") as fh:
        fh.write("# changed on node 1 only\n")
    paths = capture_nodes(repos, tmp_path, delay=0.5)
    proc = manifest_cli("merge", *map(str, paths), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b""
    err = proc.stderr.decode()
    assert "code.dirty" in err or "code.diff_digest" in err, err
    assert "(" + str(paths[1]) + ")" in err or "(" + str(paths[0]) + ")" in err


FAIL_ONCE = """\
import os, runpy, sys
if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    raise RuntimeError("first attempt fails on purpose")
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def test_torchelastic_restart_becomes_ordered_segments(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"flaky.py": FAIL_ONCE})
    cmd = ["torchrun", "--nproc-per-node=1", "--max-restarts=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", "flaky.py", "--steps", STEPS]
    _, doc = capture(repo, "--seed", "0", command=cmd)
    segments = doc["outputs"]["segments"]
    assert [s["restart"] for s in segments] == [0, 1]
    assert "first attempt fails on purpose" in segments[0]["error"]
    assert segments[1]["error"] is None and "resized" not in segments[1]
    assert [p["rank"] for p in doc["determinism"]["processes"]] == [0]  # the last attempt's
    assert doc["outputs"]["status"] == "ok"
