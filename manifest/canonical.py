"""Canonical bytes and the two names of a manifest.

All hashing of manifests goes through :func:`canonical_bytes`, which is RFC
8785 (JSON Canonicalization Scheme) as implemented by the ``rfc8785``
package. On top of it:

* ``run_id`` = ``blake3:<hex>`` of the canonical JSON of the object holding
  only the identity sections (:data:`IDENTITY_SECTIONS`). It names *what was
  run*: the same inputs give the same run_id on any machine that records the
  same facts; ``outputs`` and ``observed`` are outside it.
* ``digest`` = ``blake3:<hex>`` of the canonical JSON of the whole document
  minus the ``digest`` field (``run_id`` included). It is tamper evidence:
  any edit anywhere changes it.

Loading (:func:`load_manifest`) refuses anything this module would not have
written: non-UTF-8, NaN/Infinity, duplicate keys, unknown schema, wrong
types, and a ``run_id`` or ``digest`` that does not match the content.
"""

from __future__ import annotations

import json
from typing import Any

import blake3
import rfc8785
from pydantic import ValidationError

from manifest.errors import (
    InvalidManifestError,
    TamperedManifestError,
    UnsupportedSchemaError,
)
from manifest.models import SCHEMA_V1, Manifest

IDENTITY_SECTIONS = (
    "schema",
    "code",
    "data",
    "env",
    "hardware",
    "randomness",
    "determinism",
    "command",
)
"""Sections whose content names a run. Changing this tuple is a schema bump."""

SUPPORTED_SCHEMAS = (SCHEMA_V1,)


def canonical_bytes(obj: Any) -> bytes:
    """RFC 8785 bytes of a JSON-compatible value."""
    try:
        return rfc8785.dumps(obj)
    except rfc8785.CanonicalizationError as exc:
        raise InvalidManifestError(f"value cannot be written as canonical JSON: {exc}.") from exc


def blake3_name(data: bytes) -> str:
    """``blake3:<hex>`` of some bytes."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def compute_run_id(doc: dict[str, Any]) -> str:
    """run_id of a manifest given as a JSON-compatible dict."""
    return blake3_name(canonical_bytes({k: doc[k] for k in IDENTITY_SECTIONS if k in doc}))


def compute_digest(doc: dict[str, Any]) -> str:
    """digest of a manifest given as a JSON-compatible dict."""
    return blake3_name(canonical_bytes({k: v for k, v in doc.items() if k != "digest"}))


_PLACEHOLDER = "blake3:" + "0" * 64


def seal(doc: dict[str, Any]) -> Manifest:
    """Fill in ``run_id`` and ``digest`` of an unsealed document and validate it.

    The names are computed over the *validated* document (defaults filled
    in), i.e. exactly the bytes :func:`dumps` will write, so a document that
    leaves out a defaulted field still loads as untampered.
    """
    body = {k: v for k, v in doc.items() if k not in ("run_id", "digest")}
    try:
        draft = Manifest.model_validate({**body, "run_id": _PLACEHOLDER, "digest": _PLACEHOLDER})
    except ValidationError as exc:
        raise InvalidManifestError(_first_error(exc)) from exc
    full = to_document(draft)
    full["run_id"] = compute_run_id(full)
    full["digest"] = compute_digest(full)
    return draft.model_copy(update={"run_id": full["run_id"], "digest": full["digest"]})


def to_document(manifest: Manifest) -> dict[str, Any]:
    """The JSON-compatible dict of a manifest (aliases applied)."""
    return manifest.model_dump(mode="json", by_alias=True)


def dumps(manifest: Manifest) -> bytes:
    """The canonical bytes of a manifest, as written to disk and stdout."""
    return canonical_bytes(to_document(manifest))


def _reject_constant(name: str) -> Any:
    raise InvalidManifestError(f"manifest contains {name}, which JSON does not allow.")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # the rare case: find the key to name it
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidManifestError(f"manifest has the key {key!r} twice in one object.")
            seen.add(key)
    return out


def parse_json(data: bytes, *, what: str = "manifest") -> Any:
    """Strict JSON parse: UTF-8 only, no NaN/Infinity, no duplicate keys."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidManifestError(f"{what} is not UTF-8 text.") from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidManifestError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    except RecursionError as exc:
        raise InvalidManifestError(f"{what} is nested too deeply to be a manifest.") from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    extra = f" and {exc.error_count() - 1} more problem(s)" if exc.error_count() > 1 else ""
    return f"manifest field {where}: {err['msg']}{extra}."


def load_manifest(data: bytes, *, verify: bool = True) -> Manifest:
    """Parse, validate and check a manifest; raise the project's errors only."""
    doc = parse_json(data)
    if not isinstance(doc, dict):
        raise InvalidManifestError("manifest is not a JSON object.")
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise UnsupportedSchemaError(
            f"manifest schema {schema!r} is not supported by this version "
            f"(supported: {', '.join(SUPPORTED_SCHEMAS)}).",
            hint="Upgrade manifest to read it.",
        )
    try:
        manifest = Manifest.model_validate(doc)
    except ValidationError as exc:
        raise InvalidManifestError(_first_error(exc)) from exc
    if verify:
        check_names(doc, raw=data)
    return manifest


def _top_level_member(raw: bytes, key: bytes) -> tuple[int, int] | None:
    """Byte span of ``,"key":"..."`` at depth 1 of a JSON object, if present.

    JSON strings cannot hold an unescaped quote, so the pattern only occurs as
    a real member; the depth scan rejects a nested object's member.
    """
    needle = b',"' + key + b'":"'
    start = raw.find(needle)
    if start == -1:
        return None
    depth, in_string, escaped = 0, False, False
    for byte in raw[:start]:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            depth += 1
        elif byte in (0x7D, 0x5D):
            depth -= 1
    if depth != 1 or in_string:
        return None
    end = raw.find(b'"', start + len(needle))
    return (start, end + 1) if end != -1 else None


def _digest_matches(doc: dict[str, Any], raw: bytes | None) -> bool:
    """Whether ``digest`` matches the document.

    Fast path for files this tool wrote (canonical bytes): hash the file's
    own bytes minus the top-level digest member, which are then exactly the
    canonical bytes of the rest. Anything else (re-indented, reordered) falls
    back to canonicalising the parsed document.
    """
    claimed = doc.get("digest")
    if raw is not None and isinstance(claimed, str):
        span = _top_level_member(raw, b"digest")
        if span is not None and blake3_name(raw[: span[0]] + raw[span[1] :]) == claimed:
            return True
    return compute_digest(doc) == claimed


def check_names(doc: dict[str, Any], *, raw: bytes | None = None) -> None:
    """Raise :class:`TamperedManifestError` if run_id or digest do not match."""
    if not _digest_matches(doc, raw):
        raise TamperedManifestError(
            "manifest digest does not match its content: the file was edited or corrupted.",
            hint="Refusing to use it; re-capture the run.",
        )
    if compute_run_id(doc) != doc.get("run_id"):
        raise TamperedManifestError(
            "manifest run_id does not match its identity sections: the file was edited.",
            hint="Refusing to use it; re-capture the run.",
        )
