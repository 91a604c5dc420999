"""The digest fast path (hash the file's bytes minus its digest) agrees with the slow path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifest.canonical import _top_level_member, dumps, load_manifest, seal
from manifest.errors import TamperedManifestError

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


def _doc() -> dict[str, object]:
    doc: dict[str, object] = json.loads(GOLDEN.read_bytes())
    return doc


def test_canonical_file_loads_and_edit_after_digest_is_caught() -> None:
    raw = dumps(seal(_doc()))
    assert load_manifest(raw).digest.startswith("blake3:")
    tampered = raw.replace(b'"tool_version":"', b'"tool_version":"x', 1)
    with pytest.raises(TamperedManifestError, match="digest"):
        load_manifest(tampered)


def test_reindented_manifest_falls_back_to_canonicalising() -> None:
    raw = dumps(seal(_doc()))
    pretty = json.dumps(json.loads(raw), indent=2).encode()
    assert load_manifest(pretty).digest == load_manifest(raw).digest


def test_seal_fills_defaults_before_naming() -> None:
    doc = _doc()
    code = dict(doc["code"])  # type: ignore[call-overload]
    del code["unavailable"]  # a defaulted field left out by the caller
    doc["code"] = code
    sealed = seal(doc)
    assert load_manifest(dumps(sealed)) == sealed


def test_member_search_ignores_nested_objects() -> None:
    raw = b'{"a":{"x":1,"digest":"nested"},"b":2,"digest":"top","e":3}'
    assert _top_level_member(raw, b"digest") is None  # first hit is nested: slow path
    flat = b'{"b":2,"digest":"top","e":3}'
    span = _top_level_member(flat, b"digest")
    assert span is not None
    assert flat[: span[0]] + flat[span[1] :] == b'{"b":2,"e":3}'
