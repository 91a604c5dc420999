"""CycloneDX 1.6 JSON of a run.

The run is ``metadata.component`` (an application whose version is the
``run_id``); what it used are components: the source tree (commit as SHA-1),
each dataset (``type: data``, BLAKE3 root), each installed distribution
(``library`` with a ``pkg:pypi`` URL), each GPU and the CPU (``device``);
what it produced are ``machine-learning-model`` components with the BLAKE3 of
the file. Seeds, flags, environment facts and the compute record are
``manifest:*`` properties of the run; ``dependencies`` ties the run to
everything it used. The serial number is a UUID taken from the ``run_id``.
"""

from __future__ import annotations

from typing import Any

from manifest.export.mapping import Item, RunBill, hex_of, run_bill
from manifest.models import Manifest

SPEC_VERSION = "1.6"


def _uuid_from(run_id: str) -> str:
    h = hex_of(run_id)[:32]
    return f"urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _properties(props: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in props.items()]


def _component(item: Item, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "bom-ref": item.key, "name": item.name}
    if item.version is not None:
        out["version"] = item.version
    hashes = []
    if item.blake3:
        hashes.append({"alg": "BLAKE3", "content": item.blake3})
    if item.sha1:
        hashes.append({"alg": "SHA-1", "content": item.sha1})
    if hashes:
        out["hashes"] = hashes
    if item.props:
        out["properties"] = _properties(item.props)
    return out


def _pypi(item: Item) -> dict[str, Any]:
    from urllib.parse import quote

    out = _component(item, "library")
    out["purl"] = f"pkg:pypi/{quote(item.name.lower())}@{quote(item.version or '')}"
    return out


def cyclonedx_document(manifest: Manifest) -> dict[str, Any]:
    bill: RunBill = run_bill(manifest)
    run_props = {f"manifest:parameter:{k}": v for k, v in bill.parameters.items()}
    run_props.update({f"manifest:env:{k}": v for k, v in bill.env.items()})
    run_props.update({f"manifest:compute:{k}": v for k, v in bill.compute.items()})
    run_props["manifest:run_id"] = bill.run_id
    run_props["manifest:digest"] = manifest.digest
    components: list[dict[str, Any]] = []
    if bill.code is not None:
        components.append(_component(bill.code, "application"))
    components += [_component(d, "data") for d in bill.data]
    components += [_component(m, "machine-learning-model") for m in bill.models]
    components += [_pypi(p) for p in bill.packages]
    components += [_component(h, "device") for h in bill.hardware]
    used = [c["bom-ref"] for c in components if c["type"] != "machine-learning-model"]
    dependencies = [{"ref": "run", "dependsOn": used}]
    dependencies += [{"ref": m.key, "dependsOn": ["run"]} for m in bill.models]
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": _uuid_from(bill.run_id),
        "version": 1,
        "metadata": {
            "timestamp": bill.finished,
            "tools": {"components": [{"type": "application", "name": "manifest",
                                      "version": bill.tool_version}]},
            "component": {"type": "application", "bom-ref": "run", "name": "training run",
                          "version": bill.run_id, "properties": _properties(run_props)},
        },
        "components": components,
        "dependencies": dependencies,
    }
