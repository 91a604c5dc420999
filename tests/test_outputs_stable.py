"""Two captures of one run have equal ``outputs`` sections.

What a run produced (its artifacts, trails, per-rank outcomes) is in ``outputs``; what it
cost in time (the trails' recording cost, the compute record) is in ``observed``. So two
captures of the same commit, command and seed differ only in ``observed`` (and the digest
over it), and a script comparing ``outputs`` sections needs no list of fields to ignore.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from manifest.canonical import canonical_bytes, dumps, load_manifest, seal
from tests.runs import capture, make_repo


@pytest.mark.slow
def test_two_captures_of_one_run_have_equal_outputs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {})
    args = ("--seed", "0", "--threads", "1")
    _, first = capture(repo, *args, command=["python", "train.py", "--steps", "5"])
    _, second = capture(repo, *args, command=["python", "train.py", "--steps", "5"],
                        name="again.json")
    assert first["outputs"]["status"] == "ok" and first["outputs"]["processes"]
    assert canonical_bytes(first["outputs"]) == canonical_bytes(second["outputs"])
    assert first["run_id"] == second["run_id"]
    # Positive control: the timings are recorded, in observed, and they differ run to run.
    assert first["observed"]["recording"][0]["seconds"] > 0
    assert first["observed"]["recording"] != second["observed"]["recording"]

    # A manifest that keeps each process's cost in outputs (as made before it moved) loads.
    old = {k: v for k, v in first.items() if k not in ("run_id", "digest")}
    cost = old["observed"].pop("recording")[0]
    old["outputs"]["processes"][0]["recording"] = {"seconds": cost["seconds"],
                                                   "share": cost["share"]}
    loaded = load_manifest(dumps(seal(old)))
    assert loaded.outputs is not None and loaded.outputs.processes[0].recording is not None
    assert loaded.run_id == first["run_id"]  # outputs are outside identity
