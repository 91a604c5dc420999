"""Two nodes captured from one shared checkout (issue 32).

A log each node writes into the repository is an untracked file, so code, to the
other node's capture: merge refuses, and its refusal names the files (not only
``code.diff_digest``) and says where logs go. Logs in a directory git ignores
merge (the positive control). Real torchrun, gloo on CPU, two "nodes" on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from manifest.nodes.patches import differing_files, files_of
from tests.runs import free_port, make_repo, manifest_cli

PATCH_A = (b"diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n"
           b"-x = 1\n+x = 2\ndiff --git a/node0.log b/node0.log\nnew file mode 100644\n")
PATCH_B = (b"diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n"
           b"-x = 1\n+x = 2\ndiff --git a/node0.log b/node0.log\nnew file mode 100644\n"
           b"--- /dev/null\n+++ b/node0.log\n@@ -0,0 +1 @@\n+step 1\n"
           b"diff --git a/node1.log b/node1.log\nnew file mode 100644\n")


def test_patches_are_compared_file_by_file() -> None:
    assert sorted(files_of(PATCH_B)) == ["node0.log", "node1.log", "train.py"]
    assert differing_files(PATCH_A, PATCH_B) == ["node0.log", "node1.log"]
    assert differing_files(PATCH_A, PATCH_A) == []


def _capture_both(repo: Path, out: Path, log_dir: str) -> list[Path]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    procs, paths = [], []
    for node in (0, 1):
        paths.append(out / f"node{node}.json")
        capture = [sys.executable, "-m", "manifest", "capture", "--seed", "0", "--artifact",
                   "out/*.safetensors", "-o", str(paths[-1]), "--", "torchrun", "--nnodes=2",
                   "--nproc-per-node=1", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=shared", "train.py",
                   "--steps", "4"]
        # As a user would: each node's log redirected into the checkout they share.
        line = " ".join(f"'{a}'" for a in capture) + f" 2> {log_dir}/node{node}.log"
        procs.append(subprocess.Popen(["bash", "-c", line], cwd=repo, env=env))
        time.sleep(1.0)
    for node, proc in enumerate(procs):
        assert proc.wait(timeout=300) == 0, (repo / log_dir / f"node{node}.log").read_text()
    return paths


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_logs_in_a_shared_checkout_are_named_by_merge(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"logs/.gitignore": "*\n!.gitignore\n"})
    # Positive control: logs in a directory git ignores are not code; the nodes merge.
    out = tmp_path / "ignored"
    out.mkdir()
    paths = _capture_both(repo, out, "logs")
    merged = manifest_cli("merge", *map(str, paths), cwd=repo)
    assert merged.returncode == 0, merged.stderr.decode()
    assert "node_rank" not in (repo / "logs" / "node1.log").read_text()  # no torchrun warning

    shutil.rmtree(repo / "out")
    out = tmp_path / "in-repo"
    out.mkdir()
    paths = _capture_both(repo, out, ".")
    proc = manifest_cli("merge", *map(str, paths), cwd=repo)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    # Node 1 started a second later and saw node 0's log as an untracked file (each
    # capture leaves out the file its own output goes to).
    assert "uncommitted changes differ in 1 file(s): node0.log" in err, err
    assert "write it outside the repository or into a directory git ignores" in err


def test_merge_refusal_names_the_files_from_the_local_store(tmp_path: Path) -> None:
    from manifest.nodes.merge import MergeRefused, merge_nodes
    from manifest.store import BlobStore
    from tests.test_nodes import node_record

    store = BlobStore(tmp_path / "store")
    a, b = store.put(PATCH_A), store.put(PATCH_B)
    records = [(f"node{i}.json", node_record(i, changes={"code.diff_digest": d}))
               for i, d in enumerate((a, b))]
    with pytest.raises(MergeRefused) as refused:
        merge_nodes(records, store=store)
    assert "differ in 2 file(s): node0.log, node1.log" in refused.value.message
    assert "directory git ignores" in refused.value.diagnostics()
    # Without the patches, it says it cannot name them (never a guess).
    with pytest.raises(MergeRefused) as unnamed:
        merge_nodes(records, store=BlobStore(tmp_path / "empty"))
    assert "cannot be named here" in unnamed.value.message
