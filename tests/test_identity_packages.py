"""run_id counts the distributions the run imported (plus torch's family), not the whole install."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from manifest import canonical
from manifest.canonical import canonical_bytes, compute_run_id, load_manifest, seal
from manifest.errors import TamperedManifestError

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


def _golden() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GOLDEN.read_text(encoding="utf-8"))
    return doc


def _with(doc: dict[str, Any], **packages: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["env"]["packages"].update(packages)
    out["env"]["packages_digest"] = "blake3:" + "1" * 64  # the whole set moved
    return out


def test_old_manifest_without_imported_counts_every_package() -> None:
    doc = _golden()
    assert compute_run_id(doc) == doc["run_id"]  # the golden run_id is unchanged
    assert compute_run_id(_with(doc, rich="13.7.1")) != doc["run_id"]


def test_unrelated_package_keeps_the_run_id_and_an_imported_one_changes_it() -> None:
    doc = _golden()
    doc["env"]["imported"] = ["numpy", "torch"]
    base = compute_run_id(doc)
    assert base != _golden()["run_id"]  # pydantic, installed but not imported, left out
    assert compute_run_id(_with(doc, rich="13.7.1")) == base
    assert compute_run_id(_with(doc, pydantic="2.99.0")) == base
    assert compute_run_id(_with(doc, numpy="9.9.9")) != base
    # torch's family counts even when not in the imported list (CUDA libraries are loaded,
    # never imported).
    assert compute_run_id(_with(doc, **{"nvidia-cudnn-cu12": "9.1.0"})) != base
    assert compute_run_id(_with(doc, torch="9.9.9")) != base


def test_a_prefix_lookalike_installed_but_not_imported_keeps_the_run_id() -> None:
    """torchvision, torchmetrics and tritonclient share torch's and triton's prefix: they
    count like any package (only imported); triton itself counts unimported (the control)."""
    doc = _golden()
    doc["env"]["imported"] = ["numpy", "torch"]
    base = compute_run_id(doc)
    for lookalike in ("torchvision", "torchmetrics", "tritonclient", "nvidia-ml-py"):
        assert compute_run_id(_with(doc, **{lookalike: "1.0"})) == base, lookalike
    assert compute_run_id(_with(doc, triton="3.5.0")) != base
    doc["env"]["imported"].append("torchvision")
    assert compute_run_id(_with(doc, torchvision="0.20.0")) != compute_run_id(doc)


def test_sealed_manifest_with_imported_loads_and_keeps_everything_recorded() -> None:
    doc = _golden()
    doc["env"]["imported"] = ["numpy", "torch"]
    a = seal(_with(doc, rich="13.7.1"))
    b = seal(doc)
    assert a.run_id == b.run_id
    assert a.digest != b.digest  # the installed set is still recorded and tamper-evident
    assert a.env.packages["rich"] == "13.7.1"


def test_a_manifest_named_by_the_earlier_prefix_rule_still_loads() -> None:
    """A manifest sealed when torchvision counted by its prefix (installed, never
    imported) keeps its run_id: that rule named the same content. The control: the
    same file with torchvision's version edited is refused, by digest and by run_id."""
    doc = _with(_golden(), torchvision="0.20.0")
    doc["env"]["imported"] = ["numpy", "torch"]
    sealed = canonical.to_document(seal(doc))
    sealed["run_id"] = canonical.compute_run_id(sealed, counts=canonical._counted_by_prefix)
    sealed["digest"] = canonical.compute_digest(sealed)
    assert sealed["run_id"] != canonical.compute_run_id(sealed)  # the rules name it apart
    loaded = load_manifest(canonical_bytes(sealed))
    assert loaded.run_id == sealed["run_id"]
    edited = {**sealed, "env": {**sealed["env"], "packages": {**sealed["env"]["packages"],
                                                               "torchvision": "0.21.0"}}}
    edited["digest"] = canonical.compute_digest(edited)  # digest recomputed: run_id catches it
    with pytest.raises(TamperedManifestError, match="run_id"):
        load_manifest(canonical_bytes(edited))
