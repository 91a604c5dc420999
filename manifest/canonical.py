"""Canonical bytes and the two names of a manifest.

All hashing of manifests goes through :func:`~manifest.jcs.canonical_bytes`, which
is RFC 8785 (JSON Canonicalization Scheme): the ``rfc8785`` package's bytes. On top
of it:

* ``run_id`` = ``blake3:<hex>`` of the canonical JSON of the object holding
  only the identity sections (:data:`IDENTITY_SECTIONS`). It names *what was
  run*: the same inputs give the same run_id on any machine that records the
  same facts; ``outputs`` and ``observed`` are outside it. When ``env``
  records which distributions the run imported (``env.imported``), only
  those and torch's family (:func:`~manifest.models.always_counts`)
  enter the run_id, and the digest of the whole installed set stays out: a
  package nobody imported cannot change the bits, so installing one must not
  rename the run. It is still recorded (and covered by ``digest``).
* ``digest`` = ``blake3:<hex>`` of the canonical JSON of the whole document
  minus the ``digest`` field (``run_id`` included). It is tamper evidence:
  any edit anywhere changes it.

Loading (:func:`load_manifest`) refuses anything this module would not have
written: non-UTF-8, NaN/Infinity, duplicate keys, integers beyond 4300
digits, lone surrogates, NUL characters (outside ``outputs.error``), unknown
schema, wrong types, and a ``run_id`` or ``digest`` that does not match the
content. Files are read by :func:`read_manifest_file`, which hands them to
the one bounded reader (:mod:`manifest.bounded`): a regular file (a FIFO
would block forever, ``/dev/zero`` would never end) of at most
``MANIFEST_MAX_BYTES`` (default 64 MiB: a manifest of 100,000 tensors is
about 25 MiB).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import rfc8785
from pydantic import ValidationError

from manifest.errors import (
    InvalidManifestError,
    TamperedManifestError,
    UnsupportedSchemaError,
)
from manifest.jcs import canonical_bytes as canonical_bytes  # hashes import it from here
from manifest.models import SCHEMA_V1, Manifest, always_counts

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


def blake3_name(data: bytes) -> str:
    """``blake3:<hex>`` of some bytes."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def identity_of(doc: dict[str, Any], *,
                counts: Callable[[str], bool] = always_counts) -> dict[str, Any]:
    """The object whose canonical bytes the run_id names (see the module docstring).

    ``counts`` says which distributions count for the bits though never imported;
    :func:`check_names` also accepts :func:`_counted_by_prefix`, the rule manifests
    sealed before :func:`~manifest.models.always_counts` were named by.
    """
    identity = {k: doc[k] for k in IDENTITY_SECTIONS if k in doc}
    env = identity.get("env")
    if isinstance(env, dict) and ("distributions" in env or "sources" in env):
        env = identity["env"] = _env_identity(env)
    if isinstance(env, dict) and isinstance(env.get("imported"), list):
        used = {name for name in env["imported"] if isinstance(name, str)}
        packages = env.get("packages")
        if isinstance(packages, dict):
            identity["env"] = {
                **{k: v for k, v in env.items() if k != "packages_digest"},
                "packages": {name: version for name, version in packages.items()
                             if name in used or counts(name)},
            }
        distributions = env.get("distributions")
        if isinstance(distributions, dict):
            identity["env"]["distributions"] = {
                name: record for name, record in distributions.items()
                if name in used or counts(name)}
    return identity


def _env_identity(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` as the run_id sees its distribution records: version and files only.

    The installer, wheel tags, direct URL and configured indexes say how and
    from where a distribution came, not what its files are (the files digest
    does), so they and the environment digest (a summary of the records,
    recorded and covered by ``digest``) stay out. An editable install's files
    are a ``.pth`` naming the checkout's absolute path: they count as
    ``editable``, and the code itself is named by the ``code`` section.
    """
    out = {k: v for k, v in env.items() if k not in ("sources", "environment_digest")}
    distributions = env.get("distributions")
    if isinstance(distributions, dict):
        projected: dict[str, Any] = {}
        for name, record in distributions.items():
            if not isinstance(record, dict):
                projected[name] = record
                continue
            direct = record.get("direct_url")
            editable = isinstance(direct, dict) and direct.get("editable") is True
            projected[name] = {"version": record.get("version"),
                               "files": "editable" if editable else record.get("files")}
        out["distributions"] = projected
    return out


def compute_run_id(doc: dict[str, Any], *,
                   counts: Callable[[str], bool] = always_counts) -> str:
    """run_id of a manifest given as a JSON-compatible dict."""
    return blake3_name(canonical_bytes(identity_of(doc, counts=counts)))


_EARLIER_PREFIXES = ("torch", "nvidia-", "triton", "pytorch-triton")


def _counted_by_prefix(name: str) -> bool:
    """The earlier rule: a name starting with torch, nvidia-, triton or pytorch-triton
    counted though never imported (torchvision and nvidia-ml-py too). A manifest sealed
    under it keeps its run_id: it names the same content, and ``digest`` covers all of it."""
    return name.startswith(_EARLIER_PREFIXES)


def compute_digest(doc: dict[str, Any]) -> str:
    """digest of a manifest given as a JSON-compatible dict."""
    return blake3_name(canonical_bytes({k: v for k, v in doc.items() if k != "digest"}))


_PLACEHOLDER = "blake3:" + "0" * 64


def seal(doc: dict[str, Any]) -> Manifest:
    """Fill in ``run_id`` and ``digest`` of an unsealed document and validate it.

    The names are computed over the *validated* document (defaults filled
    in), i.e. exactly the bytes :func:`dumps` will write, so a document that
    leaves out a defaulted field still loads as untampered.

    Each top-level member is canonicalised once: RFC 8785 writes an object as
    its sorted members joined, so the run_id's identity sections, the digest's
    body and the bytes :func:`dumps` writes share those members' bytes (only
    ``env``, which the run_id sees projected, is written twice). The written
    bytes are kept for :func:`dumps` of the manifest returned (models are
    frozen): 1 canonicalisation of the document per capture instead of 3.
    """
    body = {k: v for k, v in doc.items() if k not in ("run_id", "digest")}
    try:
        draft = Manifest.model_validate({**body, "run_id": _PLACEHOLDER, "digest": _PLACEHOLDER})
    except ValidationError as exc:
        raise InvalidManifestError(_first_error(exc)) from exc
    full = to_document(draft)
    if not all(key.isascii() for key in full):  # not a manifest's fields: no member reuse
        full["run_id"] = compute_run_id(full)
        full["digest"] = compute_digest(full)
        return draft.model_copy(update={"run_id": full["run_id"], "digest": full["digest"]})
    members = {key: _member(key, value) for key, value in full.items()
               if key not in ("run_id", "digest")}
    identity = identity_of(full)
    run_id = blake3_name(_joined({
        key: members[key] if value is full[key] else _member(key, value)
        for key, value in identity.items()}))
    members["run_id"] = _member("run_id", run_id)
    digest = blake3_name(_joined(members))
    members["digest"] = _member("digest", digest)
    sealed = draft.model_copy(update={"run_id": run_id, "digest": digest})
    global _LAST_SEALED
    _LAST_SEALED = (sealed, _joined(members))
    return sealed


_LAST_SEALED: tuple[Manifest, bytes] | None = None
"""The manifest :func:`seal` returned last and its canonical bytes."""


def _member(key: str, value: Any) -> bytes:
    """``"key":value`` as RFC 8785 writes an object's member."""
    return canonical_bytes(key) + b":" + canonical_bytes(value)


def _joined(members: dict[str, bytes]) -> bytes:
    """The canonical object of these members; keys ASCII, so code point order is RFC
    8785's UTF-16 order."""
    return b"{" + b",".join(members[key] for key in sorted(members)) + b"}"


def to_document(manifest: Manifest) -> dict[str, Any]:
    """The JSON-compatible dict of a manifest (aliases applied)."""
    return manifest.model_dump(mode="json", by_alias=True)


def dumps(manifest: Manifest) -> bytes:
    """The canonical bytes of a manifest, as written to disk and stdout."""
    if _LAST_SEALED is not None and _LAST_SEALED[0] is manifest:
        return _LAST_SEALED[1]
    return canonical_bytes(to_document(manifest))


def read_manifest_file(path: str | Path, *, what: str = "manifest file") -> bytes:
    """The bytes of a manifest file or pack (``-`` reads stdin), through the bounded reader.

    A regular file under ``MANIFEST_MAX_BYTES`` (64 MiB), or one sentence and
    exit 2: see :mod:`manifest.bounded`, which reads every file the tool reads
    for a user. ``what="baseline manifest"`` names a gate baseline.
    """
    from manifest.bounded import InputKind, read_user_file

    kind = InputKind.BASELINE if what == "baseline manifest" else InputKind.MANIFEST
    return read_user_file(path, kind)


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


def _json_int(token: str) -> int | float:
    """A JSON integer literal: an int, or the double it stands for past 2^53-1.

    RFC 8785 writes every number as an IEEE double, an integral one below 10^21
    without an exponent: a loss of 4.088e16 is written ``40880508040642560``. Read
    back as a Python int, it could not be written again (canonical JSON has no
    integers past 2^53-1), and a manifest holding it failed its own digest check
    (a diverging CUDA run on an H100: explain answered exit 2). A sealed manifest
    can hold no such integer, so such a literal is the double it was written from.
    """
    value = int(token)  # over 4300 digits: ValueError, named by the caller
    if -SAFE_INT <= value <= SAFE_INT:
        return value
    try:
        return float(value)
    except OverflowError:  # beyond any double: left an int, refused when written
        return value


SAFE_INT = 2**53 - 1


def parse_json(data: bytes, *, what: str = "manifest", floats: list[str] | None = None) -> Any:
    """Strict JSON parse: UTF-8 only, no NaN/Infinity, no duplicate keys.

    ``floats`` collects the literal text of every non-integer number.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidManifestError(f"{what} is not UTF-8 text.") from exc
    try:
        if floats is None:
            return json.loads(text, object_pairs_hook=_no_duplicates,
                              parse_constant=_reject_constant, parse_int=_json_int)

        def literal(token: str) -> float:
            floats.append(token)
            return float(token)

        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant,
                          parse_float=literal, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InvalidManifestError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from exc
    except RecursionError as exc:
        raise InvalidManifestError(f"{what} is nested too deeply to be a manifest.") from exc
    except ValueError as exc:  # an integer over Python's 4300-digit conversion limit
        raise InvalidManifestError(f"{what} holds an integer too long to be a manifest value "
                                   "(over 4300 digits).") from exc


_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
"""``\\u0000`` or a UTF-16 surrogate escape: the only ways a JSON text can carry
a NUL or a lone surrogate (raw bytes for either are rejected by the decoder)."""


def _bad_string(value: Any) -> str | None:
    """Where a lone surrogate, or a NUL that could reach a path or an exec, sits in a
    parsed document. ``observed`` and ``outputs.error`` are free text (a branch
    name, a child's message): a NUL there is only shown, escaped."""
    stack: list[tuple[Any, str, bool]] = [(value, "", False)]
    while stack:
        item, at, nul_ok = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                problem = _bad_text(k, f"{at or 'the document'} key", nul_ok)
                if problem:
                    return problem
                free = nul_ok or (not at and k == "observed") or (at == "outputs" and k == "error")
                stack.append((v, f"{at}.{k}" if at else k, free))
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]", nul_ok) for i, v in enumerate(item))
        elif isinstance(item, str):
            problem = _bad_text(item, at, nul_ok)
            if problem:
                return problem
    return None


def _bad_text(text: str, at: str, nul_ok: bool) -> str | None:
    if not nul_ok and "\0" in text:
        return f"a NUL character in {at or 'the document'}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"a lone UTF-16 surrogate in {at or 'the document'}"
    return None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    extra = f" and {exc.error_count() - 1} more problem(s)" if exc.error_count() > 1 else ""
    return f"manifest field {where}: {err['msg']}{extra}."


def load_manifest(data: bytes, *, verify: bool = True) -> Manifest:
    """Parse, validate and check a manifest; raise the project's errors only."""
    floats: list[str] = []
    doc = parse_json(data, floats=floats)
    if not isinstance(doc, dict):
        raise InvalidManifestError("manifest is not a JSON object.")
    if _SUSPECT_ESCAPE.search(data):
        problem = _bad_string(doc)
        if problem:
            raise InvalidManifestError(f"manifest holds {problem}, which no manifest can "
                                       "contain.")
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
        check_names(doc, raw=data if _floats_canonical(floats) else None)
    return manifest


def _floats_canonical(floats: list[str]) -> bool:
    """Whether every float literal is written as RFC 8785 writes it (``1`` not ``1.0``,
    ``0.00001`` not ``1e-05``): a precondition of hashing the file's own bytes."""
    try:
        return all(rfc8785.dumps(float(token)) == token.encode() for token in floats)
    except (rfc8785.CanonicalizationError, ValueError, OverflowError):
        return False


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
    canonical bytes of the rest. ``digest`` is defined over the canonical
    form, so the fast path also checks that those bytes *are* canonical: the
    C encoder's sorted compact output must equal them (RFC 8785 differs from
    it only in float formatting, checked by the caller, and in the key order
    of characters beyond the BMP, which sends a file to the slow path).
    Anything else (re-indented, reordered) is canonicalised in full.
    """
    claimed = doc.get("digest")
    if raw is not None and isinstance(claimed, str) and not _ASTRAL.search(raw):
        span = _top_level_member(raw, b"digest")
        if span is not None:
            rest = raw[: span[0]] + raw[span[1] :]
            if blake3_name(rest) == claimed:
                compact = json.dumps({k: v for k, v in doc.items() if k != "digest"},
                                     sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                if compact.encode("utf-8", "surrogatepass") == rest:
                    return True
    return compute_digest(doc) == claimed


_ASTRAL = re.compile(rb"[\xf0-\xf4]")
"""The lead byte of a 4-byte UTF-8 sequence (a character beyond U+FFFF)."""


def check_names(doc: dict[str, Any], *, raw: bytes | None = None) -> None:
    """Raise :class:`TamperedManifestError` if run_id or digest do not match."""
    if not _digest_matches(doc, raw):
        raise TamperedManifestError(
            "manifest digest does not match its content: the file was edited or corrupted.",
            hint="Refusing to use it; re-capture the run.",
        )
    claimed = doc.get("run_id")
    if compute_run_id(doc) != claimed and compute_run_id(doc, counts=_counted_by_prefix) != claimed:
        raise TamperedManifestError(
            "manifest run_id does not match its identity sections: the file was edited.",
            hint="Refusing to use it; re-capture the run.",
        )
