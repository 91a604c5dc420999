"""Golden manifest pairs for ``manifest diff`` (written by tests/golden/diff/make_pairs.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.cli import main

GOLDEN = Path(__file__).parent / "golden" / "diff"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "expected.json").is_file())

EXIT = {
    "identical": 0, "observed_only": 0, "container_metadata": 0, "reordered": 0,
    "seed_change": 1, "dataset_changed": 1, "torch_version": 1, "gpu_sku": 1,
    "thread_count": 1, "packages": 1, "dirty_diff": 1, "same_run_id_outputs": 1,
    "tampered": 2, "schema_v2": 2,
}
"""Exit status per case, stated here by hand rather than read from the snapshot."""

REASONS = {
    "seed_change": ["seed 42 → 43", "rank 0 seed 42 → 43"],
    "dataset_changed": ["dataset mnist content changed: different training data"],
    "torch_version": ["torch 2.4.0 → 2.5.1: kernels and defaults may change",
                      "cuDNN 9.1.0 → 9.3.0: convolution kernels may change"],
    "gpu_sku": ["GPU 0 NVIDIA A100-SXM4-80GB → NVIDIA H100 80GB HBM3: kernel selection and "
                "arithmetic differ"],
    "thread_count": ["OMP_NUM_THREADS 2 → 1: CPU reduction order changes",
                     "torch threads 2 → 1: CPU reduction order changes"],
    "packages": ["package rich not installed → 13.7.1: installed libraries differ",
                 "package tqdm 4.66.4 → not installed: installed libraries differ"],
    "dirty_diff": ["uncommitted diff changed: different source code"],
    "same_run_id_outputs": ["tensor fc.weight of model.safetensors changed: different weights"],
}


def test_every_case_is_on_disk() -> None:
    assert set(CASES) == set(EXIT)


@pytest.mark.parametrize("case", CASES)
def test_golden_pair(
    case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(GOLDEN / case)
    expected = json.loads(Path("expected.json").read_text())
    code = main(["diff", "a.json", "b.json", "--json"])
    captured = capsys.readouterr()
    assert code == EXIT[case]
    if code == 2:
        assert expected == {"exit": 2, "stderr": captured.err}
        assert captured.out == ""
        return
    doc = json.loads(captured.out)
    assert doc == expected
    assert doc["verdict"] == ("bits" if code else "benign" if doc["differences"] else "identical")
    reasons = [d["reason"] for d in doc["differences"]]
    for reason in REASONS.get(case, []):
        assert reason in reasons
    if case == "observed_only":
        assert {d["section"] for d in doc["differences"]} == {"observed"}
    if case == "same_run_id_outputs":
        assert doc["same_run_id"] is True
        assert doc["nondeterminism"]["message"] == (
            "same inputs, different weights: not deterministic, or an input the record "
            "misses")


@pytest.mark.parametrize("case", ["same_run_id_outputs", "observed_only", "tampered"])
def test_golden_table(
    case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(GOLDEN / case)
    code = main(["diff", "a.json", "b.json"])
    out = capsys.readouterr().out
    assert code == EXIT[case]
    if case == "same_run_id_outputs":
        assert out.startswith("same inputs, different weights: not deterministic, or an "
                              "input the record misses\n")
        assert "differing tensors: fc.weight (model.safetensors)" in out
        assert "first divergent step: 200" in out
    if case == "observed_only":
        assert "No difference that can change the bits (8 benign)." in out
    if case == "tampered":
        assert out == ""


def test_golden_files_match_their_generator(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GOLDEN / "make_pairs.py"), "--out", str(tmp_path)],
                   check=True, timeout=120)
    for case in CASES:
        for name in ("a.json", "b.json", "expected.json"):
            fresh = (tmp_path / case / name).read_bytes()
            assert fresh == (GOLDEN / case / name).read_bytes(), (
                f"{case}/{name} drifted: run python tests/golden/diff/make_pairs.py and review")
