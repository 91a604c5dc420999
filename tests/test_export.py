"""``manifest export``: CycloneDX 1.6 and SPDX 3.0.1 documents that the reference
validators accept, mapping code, data (BLAKE3), environment, hardware, output
models and the compute record.

CycloneDX: ``cyclonedx-python-lib``'s strict JSON validator (the 1.6 schema).
SPDX 3.0.1: the SPDX project's model bindings (``spdx-python-model``, generated
from the 3.0.1 SHACL model) deserialise the document, resolve every reference
and serialise it again, which enforces every required property and
cardinality; ``spdx-tools`` 0.8 implements only a pre-release SPDX 3 prototype.
Each validator is shown to reject a broken document first (positive control).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import load_manifest, seal
from manifest.export import ExportFormat, export_manifest
from manifest.models import Manifest
from tests.conftest import run_cli

cyclonedx_json = pytest.importorskip("cyclonedx.validation.json")
cyclonedx_schema = pytest.importorskip("cyclonedx.schema")
spdx3 = pytest.importorskip("spdx_python_model").v3_0_1

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"
BLAKE = "ab" * 32


def _rich_manifest() -> Manifest:
    """The golden run plus a dataset, an output model, a GPU and a compute record."""
    doc: dict[str, Any] = json.loads(GOLDEN.read_bytes())
    doc["data"] = [{"name": "mnist", "path": "data/mnist", "root": f"blake3:{BLAKE}",
                    "files": 3, "bytes": 1234}]
    doc["hardware"]["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                "memory_bytes": 85_520_809_984, "compute_capability": "9.0",
                                "mig_mode": False, "ecc_mode": True}]
    doc["hardware"]["gpu_count"] = 1
    doc["outputs"] = {"status": "ok", "exit_code": 0, "artifacts": [
        {"path": "out/model.safetensors", "digest": f"blake3:{'cd' * 32}", "bytes": 4096,
         "format": "safetensors", "tensors": {}}], "processes": []}
    doc["observed"]["compute"] = {"wall_s": 12.5, "ranks": [{"rank": 0, "wall_s": 12.0}],
                                  "gpu_count": 1, "gpu_hours": 0.003472222,
                                  "energy_j": 3600.0, "gpus": [{"index": 0, "energy_j": 3600.0}],
                                  "unavailable": {}}
    return seal(doc)


def validate_cyclonedx(doc: bytes) -> object:
    validator = cyclonedx_json.JsonStrictValidator(cyclonedx_schema.SchemaVersion.V1_6)
    return validator.validate_str(doc.decode())


def validate_spdx3(doc: bytes) -> set[str]:
    """Raise on a bad type, value or missing required property; return unresolved ids."""
    objects = spdx3.SHACLObjectSet()
    spdx3.JSONLDDeserializer().read(io.BytesIO(doc), objects)
    missing: set[str] = objects.link()
    spdx3.JSONLDSerializer().write(objects, io.BytesIO())
    return missing


@pytest.mark.parametrize("manifest", [load_manifest(GOLDEN.read_bytes()), _rich_manifest()],
                         ids=["golden", "rich"])
def test_cyclonedx_is_valid_1_6(manifest: Manifest) -> None:
    doc = export_manifest(manifest, ExportFormat.CYCLONEDX)
    assert validate_cyclonedx(doc) is None
    bom = json.loads(doc)
    assert bom["specVersion"] == "1.6"
    assert bom["metadata"]["component"]["version"] == manifest.run_id


def test_cyclonedx_maps_every_part_of_the_run() -> None:
    bom = json.loads(export_manifest(_rich_manifest(), ExportFormat.CYCLONEDX))
    by_ref = {c["bom-ref"]: c for c in bom["components"]}
    assert by_ref["data:mnist"]["type"] == "data"
    assert by_ref["data:mnist"]["hashes"] == [{"alg": "BLAKE3", "content": BLAKE}]
    model = by_ref["model:out/model.safetensors"]
    assert model["type"] == "machine-learning-model"
    assert model["hashes"] == [{"alg": "BLAKE3", "content": "cd" * 32}]
    assert by_ref["gpu:0"] == {"type": "device", "bom-ref": "gpu:0",
                               "name": "NVIDIA H100 80GB HBM3", "properties": [
                                   {"name": "manifest:gpu:memory_bytes", "value": "85520809984"},
                                   {"name": "manifest:gpu:compute_capability", "value": "9.0"},
                                   {"name": "manifest:gpu:driver", "value": "550.54.15"}]}
    assert any(c["type"] == "library" and c["purl"].startswith("pkg:pypi/")
               for c in bom["components"])
    props = {p["name"]: p["value"] for p in bom["metadata"]["component"]["properties"]}
    assert props["manifest:compute:energy_j"] == "3600.0"
    assert props["manifest:compute:gpu_hours"] == "0.003472222"
    assert props["manifest:env:torch"]
    run = next(d for d in bom["dependencies"] if d["ref"] == "run")
    assert "data:mnist" in run["dependsOn"]


def test_cyclonedx_validator_rejects_a_broken_bom() -> None:
    bom = json.loads(export_manifest(_rich_manifest(), ExportFormat.CYCLONEDX))
    bom["components"][0]["hashes"] = [{"alg": "BLAKE3", "content": "not hex"}]
    assert validate_cyclonedx(json.dumps(bom).encode()) is not None


@pytest.mark.parametrize("manifest", [load_manifest(GOLDEN.read_bytes()), _rich_manifest()],
                         ids=["golden", "rich"])
def test_spdx3_is_valid_3_0_1(manifest: Manifest) -> None:
    doc = export_manifest(manifest, ExportFormat.SPDX3)
    assert validate_spdx3(doc) == set()


def test_spdx3_maps_build_inputs_outputs_and_energy() -> None:
    graph = json.loads(export_manifest(_rich_manifest(), ExportFormat.SPDX3))["@graph"]
    kinds = {e["type"] for e in graph}
    assert {"build_Build", "dataset_DatasetPackage", "ai_AIPackage", "software_Package",
            "Relationship", "SpdxDocument"} <= kinds
    dataset = next(e for e in graph if e["type"] == "dataset_DatasetPackage")
    assert dataset["verifiedUsing"] == [{"type": "Hash", "algorithm": "blake3",
                                         "hashValue": BLAKE}]
    model = next(e for e in graph if e["type"] == "ai_AIPackage")
    energy = model["ai_energyConsumption"]["ai_trainingEnergyConsumption"][0]
    assert energy["ai_energyQuantity"] == 0.001  # 3600 J
    assert energy["ai_energyUnit"] == "kilowattHour"
    build = next(e for e in graph if e["type"] == "build_Build")
    env = {d["key"]: d["value"] for d in build["build_environment"]}
    assert env["hardware:gpu:0"] == "NVIDIA H100 80GB HBM3"
    assert env["compute:gpu_hours"] == "0.003472222"


@pytest.mark.parametrize("breakage", ["bad enum", "missing required"])
def test_spdx3_validator_rejects_a_broken_document(breakage: str) -> None:
    doc = json.loads(export_manifest(_rich_manifest(), ExportFormat.SPDX3))
    for e in doc["@graph"]:
        if breakage == "bad enum" and e["type"] == "Relationship":
            e["relationshipType"] = "madeUp"
        if breakage == "missing required" and e["type"] == "dataset_DatasetPackage":
            del e["dataset_datasetType"]
    with pytest.raises(ValueError):  # noqa: PT011 - the bindings raise plain ValueError
        validate_spdx3(json.dumps(doc).encode())


def test_export_cli_writes_deterministic_documents(tmp_path: Path) -> None:
    first = run_cli("export", "--format", "cyclonedx", str(GOLDEN), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    again = run_cli("export", "--format", "cyclonedx", str(GOLDEN), cwd=tmp_path)
    assert again.stdout == first.stdout
    out = tmp_path / "run.spdx.json"
    written = run_cli("export", "--format", "spdx3", str(GOLDEN), "-o", str(out), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert validate_spdx3(out.read_bytes()) == set()


def test_export_refuses_a_tampered_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(GOLDEN.read_bytes().replace(b'"tool_version":"', b'"tool_version":"x', 1))
    result = run_cli("export", "--format", "spdx3", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == b""
