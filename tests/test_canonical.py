"""Canonical bytes and the two names of a manifest, and refusing bad manifests.

* JCS: the RFC 8785 vectors (cyberphone/json-canonicalization) go through
  ``canonical_bytes`` byte for byte.
* Golden: ``tests/golden/manifest_v1.json`` pins the canonical bytes, run_id
  and digest of a known manifest. A change here is a schema version bump.
* Properties: key order never matters; every identity leaf matters to
  run_id; ``observed`` matters to digest only.
* Bad files: each is refused with one sentence and exit 2 by ``manifest show``.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest.canonical import (
    IDENTITY_SECTIONS,
    blake3_name,
    canonical_bytes,
    check_names,
    compute_digest,
    compute_run_id,
    dumps,
    load_manifest,
    parse_json,
    seal,
)
from manifest.errors import (
    InvalidManifestError,
    ManifestError,
    TamperedManifestError,
    UnsupportedSchemaError,
)
from tests.conftest import assert_one_sentence, run_cli

TESTS = Path(__file__).resolve().parent
JCS = TESTS / "vectors" / "jcs" / "testdata"
GOLDEN = TESTS / "golden" / "manifest_v1.json"

GOLDEN_RUN_ID = "blake3:b48d08017ec090020b25deca128aa1c712708aa3fc756482cf4717341bc8321d"
GOLDEN_DIGEST = "blake3:7436a5857e258abd767cf48ef4f67420c93228572b7831a315627752a69de335"
GOLDEN_FILE_BLAKE3 = "blake3:81f23110cef9a71ca8600f2d2ac9f34d2bd14085f7a7924f7d5163ed4eebb5ae"

JCS_NAMES = ("arrays", "french", "structures", "unicode", "values", "weird")


def golden_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GOLDEN.read_bytes())
    return doc


# ----------------------------------------------------------------------- JCS


def test_all_jcs_vectors_are_present() -> None:
    assert sorted(p.stem for p in (JCS / "input").glob("*.json")) == sorted(JCS_NAMES)


@pytest.mark.parametrize("name", JCS_NAMES)
def test_jcs_vector(name: str) -> None:
    source = json.loads((JCS / "input" / f"{name}.json").read_bytes())
    expected = (JCS / "output" / f"{name}.json").read_bytes()
    assert canonical_bytes(source) == expected
    hex_text = (JCS / "outhex" / f"{name}.txt").read_text(encoding="ascii")
    assert bytes.fromhex(hex_text.replace(" ", "").replace("\n", "")) == expected


def test_canonical_bytes_refuses_nan() -> None:
    with pytest.raises(InvalidManifestError, match="canonical JSON"):
        canonical_bytes({"x": float("nan")})


# -------------------------------------------------------------------- golden


def test_golden_bytes_round_trip_exactly() -> None:
    data = GOLDEN.read_bytes()
    manifest = load_manifest(data)
    assert dumps(manifest) == data
    assert blake3_name(data) == GOLDEN_FILE_BLAKE3


def test_golden_names_are_pinned() -> None:
    manifest = load_manifest(GOLDEN.read_bytes())
    assert manifest.run_id == GOLDEN_RUN_ID
    assert manifest.digest == GOLDEN_DIGEST
    doc = golden_doc()
    assert compute_run_id(doc) == GOLDEN_RUN_ID
    assert compute_digest(doc) == GOLDEN_DIGEST


def test_run_id_is_blake3_of_identity_sections_only() -> None:
    doc = golden_doc()
    identity = {k: doc[k] for k in IDENTITY_SECTIONS}
    assert set(doc) - set(identity) == {"outputs", "observed", "run_id", "digest"}
    assert compute_run_id(doc) == blake3_name(canonical_bytes(identity))
    whole = {k: v for k, v in doc.items() if k != "digest"}
    assert compute_digest(doc) == blake3_name(canonical_bytes(whole))


def test_seal_recomputes_names_of_an_unsealed_document() -> None:
    doc = golden_doc()
    doc["run_id"] = doc["digest"] = "stale"
    sealed = seal(doc)
    assert (sealed.run_id, sealed.digest) == (GOLDEN_RUN_ID, GOLDEN_DIGEST)


# ---------------------------------------------------------------- properties


def _shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


def _leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a scalar, plus every container (which can grow a member)."""
    paths: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            paths.extend(_leaf_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths.extend(_leaf_paths(child, (*prefix, index)))
    return paths


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _changed(value: Any, salt: str) -> Any:
    """A JSON value that is certainly different from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + (salt or "x")
    if isinstance(value, list):
        return [*value, salt]
    if isinstance(value, dict):
        return {**value, f"added-{salt}": salt}
    return salt or "x"  # None


def _replace(doc: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    parent = _get(out, path[:-1])
    parent[path[-1]] = new
    return out


GOLDEN_DOC = json.loads(GOLDEN.read_bytes())
IDENTITY_PATHS = [p for p in _leaf_paths(GOLDEN_DOC) if p[0] in IDENTITY_SECTIONS]
NON_IDENTITY_PATHS = [p for p in _leaf_paths(GOLDEN_DOC) if p[0] in ("observed", "outputs")]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_key_order_never_changes_names(seed: int) -> None:
    shuffled = _shuffled(GOLDEN_DOC, random.Random(seed))
    assert compute_run_id(shuffled) == GOLDEN_RUN_ID
    assert compute_digest(shuffled) == GOLDEN_DIGEST
    assert canonical_bytes(shuffled) == canonical_bytes(GOLDEN_DOC)
    check_names(shuffled)


@settings(max_examples=150, deadline=None)
@given(path=st.sampled_from(IDENTITY_PATHS), salt=st.text(max_size=3))
def test_any_identity_change_changes_run_id(path: tuple[Any, ...], salt: str) -> None:
    changed = _replace(GOLDEN_DOC, path, _changed(_get(GOLDEN_DOC, path), salt))
    assert compute_run_id(changed) != GOLDEN_RUN_ID
    assert compute_digest(changed) != GOLDEN_DIGEST
    with pytest.raises(InvalidManifestError):
        check_names(changed)


@settings(max_examples=80, deadline=None)
@given(path=st.sampled_from(NON_IDENTITY_PATHS), salt=st.text(max_size=3))
def test_observed_or_outputs_change_keeps_run_id_changes_digest(
    path: tuple[Any, ...], salt: str
) -> None:
    changed = _replace(GOLDEN_DOC, path, _changed(_get(GOLDEN_DOC, path), salt))
    assert compute_run_id(changed) == GOLDEN_RUN_ID
    assert compute_digest(changed) != GOLDEN_DIGEST


@settings(max_examples=40, deadline=None)
@given(duration=st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
       branch=st.one_of(st.none(), st.text(max_size=20)))
def test_valid_observed_edits_reseal_to_the_same_run_id(
    duration: float, branch: str | None
) -> None:
    doc = copy.deepcopy(GOLDEN_DOC)
    doc["observed"]["duration_s"] = duration
    doc["observed"]["branch"] = branch
    sealed = seal(doc)
    assert sealed.run_id == GOLDEN_RUN_ID
    # What is written loads back to the same bytes (floats survive canonical form).
    assert dumps(load_manifest(dumps(sealed))) == dumps(sealed)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**53 - 1))
def test_valid_identity_edits_reseal_to_a_new_run_id(seed: int) -> None:
    doc = copy.deepcopy(GOLDEN_DOC)
    doc["randomness"]["seed"] = seed
    sealed = seal(doc)
    assert (sealed.run_id == GOLDEN_RUN_ID) == (seed == GOLDEN_DOC["randomness"]["seed"])


# --------------------------------------------------------------- bad input


def _golden_text() -> str:
    return GOLDEN.read_text(encoding="utf-8")


def _resealed(mutate: Any) -> bytes:
    doc = golden_doc()
    mutate(doc)
    doc["run_id"] = compute_run_id(doc)
    doc["digest"] = compute_digest(doc)
    return json.dumps(doc).encode()


def _fix_forged() -> bytes:
    """A manifest whose digest matches but whose run_id was forged."""
    doc = golden_doc()
    doc["run_id"] = "blake3:" + "1" * 64
    doc["digest"] = compute_digest(doc)
    return json.dumps(doc).encode()


BAD_FILES: dict[str, tuple[bytes, type[ManifestError], str]] = {
    "not-json": (b"this is not json\n", InvalidManifestError, "not valid JSON"),
    "empty": (b"", InvalidManifestError, "not valid JSON"),
    "not-utf8": (b"\xff\xfe{}", InvalidManifestError, "not UTF-8"),
    "not-object": (b"[1, 2, 3]", InvalidManifestError, "not a JSON object"),
    "nan": (_golden_text().replace('"duration_s":2.499994', '"duration_s":NaN').encode(),
            InvalidManifestError, "NaN"),
    "infinity": (_golden_text().replace('"duration_s":2.499994', '"duration_s":Infinity')
                 .encode(), InvalidManifestError, "Infinity"),
    "huge-float": (_golden_text().replace('"duration_s":2.499994', '"duration_s":1e999')
                   .encode(), InvalidManifestError, "duration_s"),
    "duplicate-key": (_golden_text().replace('{"code":', '{"code":{},"code":', 1).encode(),
                      InvalidManifestError, "twice"),
    "unknown-schema": (_resealed(lambda d: d.update(schema="manifest/v9")),
                       UnsupportedSchemaError, "manifest/v9"),
    "no-schema": (_resealed(lambda d: d.pop("schema")), UnsupportedSchemaError, "schema"),
    "wrong-digest": (_golden_text().replace(GOLDEN_DIGEST, "blake3:" + "0" * 64).encode(),
                     TamperedManifestError, "digest"),
    "edited-identity": (_golden_text().replace('"seed":42', '"seed":43', 1).encode(),
                        TamperedManifestError, "digest"),
    "forged-digest-wrong-run-id": (_fix_forged(), TamperedManifestError, "run_id"),
    "wrong-type": (_resealed(lambda d: d["env"].update(python=3.11)),
                   InvalidManifestError, "env.python"),
    "bool-as-int": (_resealed(lambda d: d["code"].update(untracked_files=True)),
                    InvalidManifestError, "code.untracked_files"),
    # Past 2^53-1 a JSON integer literal is the double it stands for (RFC 8785 numbers are
    # doubles): where the model wants an integer, it is refused as not one.
    "unsafe-integer": (_golden_text().replace('"seed":42', '"seed":9007199254740993', 1).encode(),
                       InvalidManifestError, "seed: Input should be a valid integer"),
    "unknown-field": (_resealed(lambda d: d["env"].update(secrets="x")),
                      InvalidManifestError, "env.secrets"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_load_refuses_bad_manifest(case: str) -> None:
    data, error, phrase = BAD_FILES[case]
    with pytest.raises(error) as info:
        load_manifest(data)
    assert phrase in info.value.diagnostics()
    assert "\n" not in info.value.diagnostics()


def test_parse_json_rejects_duplicate_keys_in_nested_objects() -> None:
    with pytest.raises(InvalidManifestError, match="'a' twice"):
        parse_json(b'{"x": {"a": 1, "a": 2}}')


def test_deep_nesting_is_a_clear_error() -> None:
    with pytest.raises(InvalidManifestError):
        load_manifest(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("case", ["not-json", "nan", "duplicate-key", "unknown-schema",
                                  "wrong-digest", "wrong-type", "forged-digest-wrong-run-id"])
def test_show_refuses_bad_manifest_with_one_sentence(
    case: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    data, _error, phrase = BAD_FILES[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(data)
    result = run_cli("show", str(path), cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    assert result.stdout == b""
    assert_one_sentence(result.stderr)
    assert phrase in result.stderr


def test_show_missing_file_is_exit_2(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli("show", str(tmp_path / "absent.json"), cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    assert_one_sentence(result.stderr)
    assert "does not exist" in result.stderr


def test_show_golden(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result = run_cli("show", str(GOLDEN), cwd=tmp_path, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert GOLDEN_RUN_ID in result.text
    assert "NVIDIA H100" in result.text
    assert result.stderr == ""


def test_show_reads_stdin(tmp_path: Path, cli_env: dict[str, str]) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "manifest.cli", "show", "-"],
                          input=GOLDEN.read_bytes(), capture_output=True, cwd=tmp_path,
                          env=cli_env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert GOLDEN_RUN_ID.encode() in proc.stdout
