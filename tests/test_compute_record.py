"""The compute record (``observed.compute``): wall time per rank, GPU-hours, energy per GPU.

Energy is the delta of NVML's total-energy counter over the run; here NVML is the
fake from conftest, whose counter advances by 250 J per read, as a busy board's
would. The record is additive: a manifest without it keeps its bytes and run_id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifest.canonical import compute_run_id, dumps, load_manifest, seal, to_document
from manifest.capture.run import CaptureOptions, capture_from_cli
from manifest.cli.render import show_rows
from manifest.probes.compute import EnergyReading, compute_record, read_energy, visible_gpus
from tests.conftest import FakeGpu, FakeNvml, GitRepo, _real_nvml_available, run_cli

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


@pytest.mark.fake_gpu
def test_energy_counter_is_read_per_gpu(fake_nvml: FakeNvml) -> None:
    first = read_energy(fake_nvml)
    second = read_energy(fake_nvml)
    assert first.mj == {0: 7_000_000, 1: 7_000_000}
    assert second.mj == {0: 7_250_000, 1: 7_250_000}
    assert first.unavailable == {}
    assert fake_nvml.calls[-1] == "nvmlShutdown"


@pytest.mark.fake_gpu
def test_a_board_without_the_counter_is_named() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(energy_mj=None)])
    reading = read_energy(nvml)
    assert reading.mj == {0: 7_000_000}
    assert "gpu 1" in reading.unavailable
    assert "Not Supported" in reading.unavailable["gpu 1"]


@pytest.mark.fake_gpu
def test_capture_records_energy_gpu_hours_and_rank_time(repo: GitRepo,
                                                       fake_nvml: FakeNvml) -> None:
    manifest, code = capture_from_cli(repo.path, CaptureOptions(
        command=["python", "-c", "import time; time.sleep(0.2)"], seed=0, threads=1,
        quiet=True), nvml=fake_nvml)
    assert code == 0
    compute = manifest.observed.compute
    assert compute is not None
    assert compute.gpu_count == 2
    # One read before the command and one after: 250 J per board.
    assert [(g.index, g.energy_j) for g in compute.gpus] == [(0, 250.0), (1, 250.0)]
    assert compute.energy_j == 500.0
    assert compute.wall_s >= 0.2
    # gpu_hours is rounded to 9 decimals (a nanohour), wall_s to microseconds.
    assert compute.gpu_hours == pytest.approx(2 * compute.wall_s / 3600, abs=2e-9)
    assert [r.rank for r in compute.ranks] == [0]
    assert 0.2 <= compute.ranks[0].wall_s <= compute.wall_s
    rows = {(fact, value) for _, fact, value in show_rows(manifest)}
    assert ("energy", "500 J (0.000139 kWh)") in rows
    assert ("GPU 1 energy", "250 J") in rows
    # Cost, never identity: the same run without the record has the same run_id.
    doc = to_document(manifest)
    del doc["observed"]["compute"]
    assert compute_run_id(doc) == manifest.run_id


def test_cuda_visible_devices_narrows_the_gpus_billed() -> None:
    assert visible_gpus(4, {}) == [0, 1, 2, 3]
    assert visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]
    assert visible_gpus(4, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "1,GPU-abc,2"}) == [1]
    before = EnergyReading({0: 1000, 1: 1000, 2: 5000}, {}, 3)
    after = EnergyReading({0: 3000, 1: 9000, 2: 4000}, {}, 3)
    record = compute_record(wall_s=7200.0, records=[], before=before, after=after,
                            env={"CUDA_VISIBLE_DEVICES": "0,2"})
    assert record["gpu_count"] == 2
    assert record["gpu_hours"] == 4.0
    assert record["gpus"] == [{"index": 0, "energy_j": 2.0}]
    assert "went back" in record["unavailable"]["gpu 2"]


def test_cpu_machine_records_time_and_says_why_no_energy(repo: GitRepo,
                                                          cli_env: dict[str, str]) -> None:
    if _real_nvml_available():
        pytest.skip("this machine has a working NVIDIA driver")
    result = run_cli("capture", "-q", "--", "python", "-c", "pass", cwd=repo.path, env=cli_env)
    assert result.returncode == 0, result.stderr
    compute = json.loads(result.stdout)["observed"]["compute"]
    assert compute["gpu_count"] == 0
    assert compute["gpu_hours"] == 0
    assert compute["energy_j"] is None
    assert "no NVIDIA driver" in compute["unavailable"]["energy"]
    assert [r["rank"] for r in compute["ranks"]] == [0]


def test_old_manifests_keep_their_bytes_and_run_id() -> None:
    raw = GOLDEN.read_bytes()
    manifest = load_manifest(raw)
    assert manifest.observed.compute is None
    assert dumps(manifest) == raw
    assert b'"compute"' not in raw
    resealed = seal(json.loads(raw))
    assert resealed.run_id == manifest.run_id
    assert resealed.digest == manifest.digest
