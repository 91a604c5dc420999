"""A manifest whose step trail was fingerprinted another way (an older launcher) verifies by
its outputs, not by trail points that could never agree.

The launcher's automatic step fingerprint changed (two word sums mod 2^32 per parameter
group, ``_manifest_trail.optimizer_fingerprint``), and a manifest made before it has other
digests at every step. Without a marker a re-run would part from it at step 1 whatever
its weights. The marker (``ProcessOutcome.trail_scheme``) lets verify leave such a trail
out and say so. The control keeps the marker on the same tampered trail: then the points
are compared, and they part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, seal
from tests.runs import capture, make_repo, manifest_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    repo = make_repo(tmp_path_factory.mktemp("scheme"), {})
    return capture(repo, "--threads", "1", command=["python", "train.py", "--steps", "6"])


def _older(doc: dict[str, Any], *, keep_marker: bool) -> dict[str, Any]:
    """The same run as an older launcher would have recorded it: other digests at every
    step (its fingerprint was computed another way), and no marker."""
    doc = json.loads(json.dumps(doc))
    for proc in doc["outputs"]["processes"]:
        for point in proc["trail"]:
            point["digest"] = "blake3:" + format(point["step"], "064x")
        if not keep_marker:
            proc.pop("trail_scheme", None)
    doc.pop("run_id", None)
    doc.pop("digest", None)
    return doc


def test_a_trail_fingerprinted_another_way_is_left_out_and_the_outputs_decide(
        captured: tuple[Path, dict[str, Any]]) -> None:
    path, doc = captured
    assert all(p.get("trail") for p in doc["outputs"]["processes"])
    assert {p.get("trail_scheme") for p in doc["outputs"]["processes"]} == {"word-sums-32"}
    repo = path.parent
    old = repo / "older.json"
    old.write_bytes(dumps(seal(_older(doc, keep_marker=False))))
    proc = manifest_cli("verify", "--trust", "--format", "json", str(old), cwd=repo)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (0, "identical"), proc.stderr.decode()
    assert any("fingerprinted another way" in n for n in report["notes"])

    # Control: the same foreign digests with the marker kept are compared, and part.
    marked = repo / "marked.json"
    marked.write_bytes(dumps(seal(_older(doc, keep_marker=True))))
    proc = manifest_cli("verify", "--trust", "--format", "json", str(marked), cwd=repo)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (1, "differs"), proc.stderr.decode()
    assert report["reason"] == "outputs match but the step trails part"
