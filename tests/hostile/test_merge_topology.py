"""Node records that lie (issue 31): merge checks the topology as a whole, against the records
given, before anything is sized by a claim (``manifest.nodes.intake``).

``tests/hostile/conformance/merge/<case>.json``: ``records`` lists node records built
from the golden manifest (``node``, ``nodes`` (default 2), ``per_node`` (default 2),
``changes``: dotted fields set before sealing, as ``tests.test_nodes.node_record``
takes them); ``copies``: the first record given that many times (``reword``: each
copy's bytes differ, so only its topology can tell). Each goes through ``manifest
merge`` in a subprocess; a ``*_fail`` case ends with exit 2 and one sentence, well
within the limit (the figure is printed), nothing written to stdout.

Positive control: the allocation the old coverage check made from a claimed world size,
``set(range(world_size))``, dies of ``MemoryError`` under a 1 GiB address-space limit
at 10^8 (and could never finish at 2^53 − 1).
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

HERE = Path(__file__).parent / "conformance" / "merge"
LIMIT_S = 20.0


def _cases() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _record(spec: dict[str, Any], extra: dict[str, Any] | None = None) -> bytes:
    from manifest.canonical import dumps
    from tests.test_nodes import node_record

    changes = {**spec.get("changes", {}), **(extra or {})}
    return dumps(node_record(spec["node"], nodes=spec.get("nodes", 2),
                             per_node=spec.get("per_node", 2), changes=changes))


@pytest.mark.parametrize("name", _cases())
def test_merge_case(name: str, tmp_path: Path) -> None:
    case: dict[str, Any] = json.loads((HERE / f"{name}.json").read_text())
    assert name.endswith(("_ok", "_fail")), name
    names = []
    if case.get("copies"):
        spec = case["records"][0]
        data = _record(spec)
        for i in range(case["copies"]):
            if case.get("reword"):
                data = _record(spec, {"observed.duration_s": i + 1})
            (tmp_path / f"n{i}.json").write_bytes(data)
            names.append(f"n{i}.json")
    else:
        for i, spec in enumerate(case["records"]):
            (tmp_path / f"n{i}.json").write_bytes(_record(spec))
            names.append(f"n{i}.json")
    started = time.monotonic()
    proc = manifest_cli("merge", *names, cwd=tmp_path, timeout=LIMIT_S * 3)
    elapsed = time.monotonic() - started
    print(f"merge/{name}: exit {proc.returncode} in {elapsed:.3f} s")
    err = proc.stderr.decode()
    assert proc.returncode == case["exit"], err
    assert "Traceback" not in err and "internal error" not in err
    if case["exit"] == 0:
        merged = json.loads(proc.stdout)
        assert merged["command"]["topology"].get("node") is None  # the whole run
        return
    assert elapsed < LIMIT_S, elapsed
    assert proc.stdout == b""
    assert_one_sentence(err)
    if case.get("stderr"):
        assert case["stderr"] in err, err


def test_merge_api_refuses_as_the_cli_does() -> None:
    """The intake is the merge's own first step, not only the verb's."""
    from manifest.canonical import load_manifest
    from manifest.nodes.merge import MergeRefused, merge_nodes

    for name in ("node_99_of_2_fail", "world_size_2_53_fail", "two_records_claim_node0_fail"):
        case = json.loads((HERE / f"{name}.json").read_text())
        records = [(f"n{i}", load_manifest(_record(s))) for i, s in enumerate(case["records"])]
        started = time.monotonic()
        with pytest.raises(MergeRefused, match=case["stderr"]):
            merge_nodes(records)
        assert time.monotonic() - started < LIMIT_S


def test_missing_ranks_are_found_from_the_ranks_held() -> None:
    from manifest.nodes.intake import missing_ranks

    assert missing_ranks({0, 1}, 4) == [2, 3]
    assert missing_ranks({1, 3}, 5) == [0, 2, 4]
    assert missing_ranks({0, 1}, 2**53 - 1) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert missing_ranks(set(range(10)), 10) == []


def test_control_a_set_sized_by_the_claimed_world_runs_out_of_memory() -> None:
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "world = 10 ** 8\nset(range(world)) - {0, 1, 2, 3}\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode != 0 and "MemoryError" in proc.stderr, proc.stderr
