"""SPDX 3.0.1 JSON-LD of a run (Core, Software, Build, AI and Dataset profiles).

The run is a ``build_Build`` (``buildId`` = ``run_id``; parameters = seed,
flags and command; environment = the software and hardware facts and the
compute record). Its inputs are the source tree (``software_Package``, commit
as SHA-1), each dataset (``dataset_DatasetPackage``, BLAKE3 root) and each
installed distribution (``software_Package`` with a ``pkg:pypi`` URL); its
outputs are ``ai_AIPackage`` elements with the BLAKE3 of the file and, where
NVML's counter gave it, the training energy (``ai_energyConsumption``, kWh).
Relationships ``hasInput`` / ``hasOutput`` tie them to the build.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from manifest.export.mapping import Item, RunBill, hex_of, run_bill
from manifest.models import Manifest

CONTEXT = "https://spdx.org/rdf/3.0.1/spdx-context.jsonld"
CREATION = "_:creationinfo"


def _seconds(stamp: str) -> str:
    """SPDX 3 DateTime: UTC to the second (``2026-11-21T11:59:24Z``)."""
    return stamp.split(".", 1)[0].rstrip("Z") + "Z"


def _entries(facts: dict[str, str]) -> list[dict[str, str]]:
    return [{"type": "DictionaryEntry", "key": k, "value": v} for k, v in facts.items()]


def spdx3_document(manifest: Manifest) -> dict[str, Any]:
    bill: RunBill = run_bill(manifest)
    base = f"urn:manifest:{hex_of(bill.run_id)}"

    def sid(key: str) -> str:
        return f"{base}#{quote(key, safe=':/._-')}"

    def element(kind: str, item: Item, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind, "spdxId": sid(item.key), "creationInfo": CREATION,
                               "name": item.name}
        hashes = []
        if item.blake3:
            hashes.append({"type": "Hash", "algorithm": "blake3", "hashValue": item.blake3})
        if item.sha1:
            hashes.append({"type": "Hash", "algorithm": "sha1", "hashValue": item.sha1})
        if hashes:
            out["verifiedUsing"] = hashes
        if item.props:
            out["comment"] = "; ".join(f"{k}={v}" for k, v in item.props.items())
        out.update(extra)
        return out

    tool = {"type": "Tool", "spdxId": sid("tool"), "creationInfo": CREATION,
            "name": f"manifest {bill.tool_version}"}
    agent = {"type": "SoftwareAgent", "spdxId": sid("agent"), "creationInfo": CREATION,
             "name": "manifest"}
    creation = {"type": "CreationInfo", "@id": CREATION, "specVersion": "3.0.1",
                "created": _seconds(bill.finished), "createdBy": [agent["spdxId"]],
                "createdUsing": [tool["spdxId"]]}
    inputs: list[dict[str, Any]] = []
    if bill.code is not None:
        inputs.append(element("software_Package", bill.code,
                              software_packageVersion=bill.code.version,
                              software_primaryPurpose="source"))
    inputs += [element("dataset_DatasetPackage", d, software_primaryPurpose="data",
                       dataset_datasetType=["other"]) for d in bill.data]
    inputs += [element("software_Package", p, software_packageVersion=p.version,
                       software_packageUrl=f"pkg:pypi/{quote(p.name.lower())}@"
                       f"{quote(p.version or '')}",
                       software_primaryPurpose="library") for p in bill.packages]
    outputs = []
    for m in bill.models:
        extra: dict[str, Any] = {"software_primaryPurpose": "model"}
        if bill.energy_kwh is not None:
            extra["ai_energyConsumption"] = {
                "type": "ai_EnergyConsumption",
                "ai_trainingEnergyConsumption": [{
                    "type": "ai_EnergyConsumptionDescription",
                    "ai_energyQuantity": round(bill.energy_kwh, 9),
                    "ai_energyUnit": "kilowattHour"}]}
        outputs.append(element("ai_AIPackage", m, **extra))
    environment = dict(bill.env)
    for h in bill.hardware:
        environment[f"hardware:{h.key}"] = h.name
    environment.update({f"compute:{k}": v for k, v in bill.compute.items()})
    build = {"type": "build_Build", "spdxId": sid("run"), "creationInfo": CREATION,
             "build_buildType": "https://github.com/OWNER/manifest/run/v1",
             "build_buildId": bill.run_id,
             "build_buildStartTime": _seconds(bill.started),
             "build_buildEndTime": _seconds(bill.finished),
             "build_parameter": _entries(bill.parameters),
             "build_environment": _entries(environment)}
    relationships = []
    if inputs:
        relationships.append({"type": "Relationship", "spdxId": sid("rel:inputs"),
                              "creationInfo": CREATION, "from": build["spdxId"],
                              "relationshipType": "hasInput",
                              "to": [e["spdxId"] for e in inputs]})
    if outputs:
        relationships.append({"type": "Relationship", "spdxId": sid("rel:outputs"),
                              "creationInfo": CREATION, "from": build["spdxId"],
                              "relationshipType": "hasOutput",
                              "to": [e["spdxId"] for e in outputs]})
    elements = [build, *inputs, *outputs, *relationships]
    document = {"type": "SpdxDocument", "spdxId": sid("document"), "creationInfo": CREATION,
                "name": f"training run {bill.run_id}",
                "profileConformance": ["core", "software", "build", "ai", "dataset"],
                "rootElement": [build["spdxId"]],
                "element": [e["spdxId"] for e in elements]}
    return {"@context": CONTEXT, "@graph": [creation, agent, tool, document, *elements]}
