"""A received manifest whose topology claims more than any run (issue 31): planning is
bounded by a documented limit (``manifest.rerun.plan.MAX_NODES``, ``MAX_WORLD_SIZE``),
checked once trust is decided and before anything sized by the claim is built.

``tests/hostile/conformance/planner/<case>.json``: ``topology`` holds the fields set
on a merged two-node record (sealed, but not here: verify would refuse to run it
without ``--trust``), ``argv`` the verb. A ``*_fail`` case ends with exit 2 and one
sentence, within a second of work (the figure is printed; the limit is generous for
a busy machine), nothing run. ``*_ok``: planned, then refused as untrusted.

Positive control: building one launch per claimed node, as the planner did before the
trust refusal, dies of ``MemoryError`` under a 1 GiB address-space limit at 2^53 − 1
nodes (the verb used to grow past a gigabyte and never answer).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_sentence
from tests.runs import manifest_cli

HERE = Path(__file__).parent / "conformance" / "planner"
LIMIT_S = 20.0


def _cases() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _manifest(topology: dict[str, Any]) -> bytes:
    from manifest.canonical import dumps, seal, to_document
    from manifest.nodes.merge import merge_nodes
    from tests.test_nodes import node_record

    merged = merge_nodes([("a", node_record(0)), ("b", node_record(1))])
    doc = to_document(merged)
    doc["command"]["topology"].update(topology)
    return dumps(seal(doc))


@pytest.mark.parametrize("name", _cases())
def test_planner_case(name: str, tmp_path: Path) -> None:
    case: dict[str, Any] = json.loads((HERE / f"{name}.json").read_text())
    assert name.endswith(("_ok", "_fail")), name
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=120)
    (tmp_path / "run.json").write_bytes(_manifest(case["topology"]))
    marker = tmp_path / "out"
    started = time.monotonic()
    proc = manifest_cli(*case["argv"], cwd=tmp_path, timeout=LIMIT_S * 3)
    elapsed = time.monotonic() - started
    print(f"planner/{name}: exit {proc.returncode} in {elapsed:.3f} s")
    err = proc.stderr.decode()
    assert proc.returncode == case["exit"], err
    assert "Traceback" not in err and "internal error" not in err
    assert elapsed < LIMIT_S, elapsed
    assert not marker.exists(), "the command ran"
    lines = [line for line in err.splitlines() if line.startswith("manifest:")]
    assert case["stderr"] in lines[-1], err
    if name.endswith("_fail"):
        assert_one_sentence(err)


def test_the_limits_are_documented() -> None:
    from manifest.rerun.plan import MAX_NODES, MAX_WORLD_SIZE

    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert f"{MAX_NODES:,}" in text or str(MAX_NODES) in text
    assert f"{MAX_WORLD_SIZE:,}" in text or str(MAX_WORLD_SIZE) in text


def test_control_a_launch_per_claimed_node_runs_out_of_memory() -> None:
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from manifest.nodes.layout import Layout, local_launches\n"
            "argv = ['torchrun', '--nnodes=2', '--nproc-per-node=2', 'train.py']\n"
            "local_launches(argv, Layout(2 ** 53 - 1, 2), 12345)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode != 0 and "MemoryError" in proc.stderr, proc.stderr[-2000:]
