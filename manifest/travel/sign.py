"""``manifest sign``: who vouches for a manifest, checked by verify and show.

A manifest's ``digest`` is an unkeyed hash: anyone can edit a field and
re-seal. A signature binds the canonical bytes to a key or a Sigstore identity.

Format: one Sigstore bundle (v0.3 JSON), the same container OpenSSF
model-signing writes, holding a DSSE envelope around an in-toto Statement v1:

* subject: ``{"name": "manifest.json", "digest": {"sha256": <sha256 of the
  manifest's canonical RFC 8785 bytes>}}`` (sha256 because Sigstore's verifier
  accepts no other digest name in a subject);
* predicateType :data:`SIGNATURE_PREDICATE`, predicate ``{run_id, digest}``.

Two methods:

* **key** (offline): ECDSA P-256/P-384 or Ed25519 PEM through ``cryptography``;
  ``verificationMaterial.publicKey.hint`` is the sha256 of the public key's PEM
  (what model-signing writes), matched against the keys of the trust policy.
* **keyless**: ``sigstore`` signs with a short-lived Fulcio certificate logged in
  Rekor; verify checks it against Sigstore's trust root (network) and the
  policy's identities (subject + issuer).

Checking order, each a sentence and exit 2: malformed bundle or certificate,
certificate expired at its log time, signer not in the policy (unless the
caller accepts untrusted signers), cryptographic failure, statement that covers
another manifest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from manifest.errors import NoVerdictError, SignatureError, UntrustedSignerError, UsageError
from manifest.travel.policy import TrustPolicy, key_name, untrusted_hint

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
SIGNATURE_PREDICATE = "https://manifest.dev/predicates/manifest-signature/v1"
KEY_PASSWORD_ENV = "MANIFEST_KEY_PASSWORD"  # noqa: S105 (a variable name)
OFFLINE_ENV = "MANIFEST_SIGSTORE_OFFLINE"
_FULCIO_ISSUER_V2 = "1.3.6.1.4.1.57264.1.8"
_FULCIO_ISSUER_V1 = "1.3.6.1.4.1.57264.1.1"


@dataclass(frozen=True)
class SignatureCheck:
    """A signature that verified: who made it, and whether the policy trusts them."""

    signer: str
    method: str
    trusted: bool
    statement: dict[str, Any]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature is computed over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def statement_bytes(subjects: list[dict[str, Any]], predicate_type: str,
                    predicate: dict[str, Any]) -> bytes:
    """An in-toto Statement v1 as canonical JSON (RFC 8785): integers stay integers."""
    from manifest.canonical import canonical_bytes

    return canonical_bytes({"_type": STATEMENT_TYPE, "subject": subjects,
                            "predicateType": predicate_type, "predicate": predicate})


def manifest_statement(manifest_canonical: bytes, run_id: str, digest: str) -> bytes:
    return statement_bytes(
        [{"name": "manifest.json", "digest": {"sha256": sha256_hex(manifest_canonical)}}],
        SIGNATURE_PREDICATE, {"run_id": run_id, "digest": digest})


# --------------------------------------------------------------------- keys


def load_private_key(path: Path) -> Any:
    """An ECDSA or Ed25519 private key from PEM (password from $MANIFEST_KEY_PASSWORD)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from manifest.bounded import InputKind, read_user_file

    data = read_user_file(path, InputKind.KEY)
    password = os.environ.get(KEY_PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(
            data, password.encode() if password is not None else None)
    except TypeError as exc:
        raise UsageError(f"the key {path} is encrypted: set {KEY_PASSWORD_ENV}.") from exc
    except ValueError as exc:
        raise UsageError(f"{path} is not a PEM private key (or the password is wrong).") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise UsageError(f"the key {path} is a {type(key).__name__}; use ECDSA P-256 or Ed25519.")
    return key


def public_pem(private_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def _ec_hash(curve: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}.get(
        curve.key_size, hashes.SHA256())


def _raw_sign(private_key: Any, message: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        sig: bytes = private_key.sign(message, ec.ECDSA(_ec_hash(private_key.curve)))
        return sig
    sig = private_key.sign(message)
    return sig


def _raw_verify(public_key: Any, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, message, ec.ECDSA(_ec_hash(public_key.curve)))
        else:
            public_key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _one_line(bundle: dict[str, Any]) -> bytes:
    """A bundle as one JSON line: a .sig file, and one line of a .intoto.jsonl."""
    return json.dumps(bundle, separators=(",", ":")).encode() + b"\n"


def sign_with_key(statement: bytes, key_path: Path) -> bytes:
    """A Sigstore bundle (public-key hint, no log entry) around a DSSE-signed statement."""
    key = load_private_key(key_path)
    sig = _raw_sign(key, pae(PAYLOAD_TYPE, statement))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": sha256_hex(public_pem(key))},
                                 "tlogEntries": []},
        "dsseEnvelope": {"payload": base64.b64encode(statement).decode(),
                         "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]},
    }
    return _one_line(bundle)


def sign_keyless(statement: bytes, *, staging: bool = False) -> bytes:
    """Sign with Sigstore (Fulcio certificate + Rekor entry); needs the network and an
    OIDC identity: $SIGSTORE_ID_TOKEN, an ambient CI credential, or the browser flow."""
    from sigstore import dsse, oidc
    from sigstore.models import ClientTrustConfig
    from sigstore.sign import SigningContext

    try:
        config = ClientTrustConfig.staging() if staging else ClientTrustConfig.production()
        context = SigningContext.from_trust_config(config)
        raw = os.environ.get("SIGSTORE_ID_TOKEN") or oidc.detect_credential()
        if raw is None:
            issuer = oidc.Issuer(config.signing_config.get_oidc_url())
            token = issuer.identity_token()
        else:
            token = oidc.IdentityToken(raw)
        with context.signer(token) as signer:
            bundle = signer.sign_dsse(dsse.Statement(statement))
    except (OSError, ValueError) as exc:
        raise NoVerdictError(f"Sigstore signing failed: {exc}.") from exc
    except Exception as exc:  # sigstore's errors share no base class worth naming
        raise NoVerdictError(f"Sigstore signing failed ({type(exc).__name__}: {exc}).") from exc
    return _one_line(json.loads(bundle.to_json()))


def sign_statement(statement: bytes, *, key: Path | None, keyless: bool,
                   staging: bool = False) -> bytes:
    if (key is None) == (not keyless):
        raise UsageError("choose one signing method: --key FILE or --sigstore.")
    return sign_with_key(statement, key) if key is not None else sign_keyless(
        statement, staging=staging)


# ------------------------------------------------------------------- verify


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise SignatureError(f"the signature's {what} is missing.")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError(f"the signature's {what} is not base64.") from exc


def _certificate_der(material: dict[str, Any]) -> bytes | None:
    if "certificate" in material:
        return _b64((material["certificate"] or {}).get("rawBytes"), "certificate")
    chain = material.get("x509CertificateChain")
    if chain is not None:
        certs = chain.get("certificates") or [{}]
        return _b64(certs[0].get("rawBytes"), "certificate")
    return None


def certificate_identity(der: bytes) -> tuple[str, str, Any]:
    """(subject, issuer, certificate) of a Fulcio certificate; malformed → SignatureError."""
    from cryptography import x509

    try:
        cert = x509.load_der_x509_certificate(der)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = (san.get_values_for_type(x509.RFC822Name)
                 + san.get_values_for_type(x509.UniformResourceIdentifier))
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise SignatureError(f"the signature's certificate is malformed ({exc}).") from exc
    issuer = ""
    for ext in cert.extensions:
        if ext.oid.dotted_string == _FULCIO_ISSUER_V2:
            value = ext.value.value
            # DER UTF8String: tag, length (short form below 128), bytes
            issuer = value[2:].decode("utf-8", "replace") if len(value) > 2 else ""
        elif ext.oid.dotted_string == _FULCIO_ISSUER_V1 and not issuer:
            issuer = ext.value.value.decode("utf-8", "replace")
    if not names:
        raise SignatureError("the signature's certificate names no identity.")
    return names[0], issuer, cert


def _check_validity(cert: Any, material: dict[str, Any]) -> None:
    entries = material.get("tlogEntries") or []
    try:
        logged = int(entries[0]["integratedTime"]) if entries else None
    except (KeyError, TypeError, ValueError) as exc:
        raise SignatureError("the signature's transparency log entry is malformed.") from exc
    when = datetime.fromtimestamp(logged, UTC) if logged is not None else datetime.now(UTC)
    if when > cert.not_valid_after_utc:
        raise SignatureError(
            f"the signing certificate had expired ({cert.not_valid_after_utc:%Y-%m-%d %H:%M} "
            f"UTC) when the signature was logged ({when:%Y-%m-%d %H:%M} UTC).")
    if when < cert.not_valid_before_utc:
        raise SignatureError("the signature was logged before its certificate was valid.")


def _parse_bundle(raw: bytes) -> dict[str, Any]:
    from manifest.canonical import parse_json
    from manifest.errors import InvalidManifestError

    try:
        doc = parse_json(raw, what="signature")
    except InvalidManifestError as exc:
        raise SignatureError(exc.message) from exc
    if (not isinstance(doc, dict) or not isinstance(doc.get("verificationMaterial"), dict)
            or not isinstance(doc.get("dsseEnvelope"), dict)):
        raise SignatureError("the signature is not a Sigstore bundle with a DSSE envelope.")
    return doc


def verify_bundle(raw: bytes, policy: TrustPolicy, *, accept_untrusted: bool = False,
                  offline: bool = False) -> tuple[str, str, bool, bytes]:
    """(signer, method, trusted, payload) of a bundle whose signature checks out."""
    doc = _parse_bundle(raw)
    material = doc["verificationMaterial"]
    envelope = doc["dsseEnvelope"]
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureError(f"the signature's payload is not an in-toto statement "
                             f"({envelope.get('payloadType')!r}).")
    payload = _b64(envelope.get("payload"), "payload")
    der = _certificate_der(material)
    if der is None:
        hint = (material.get("publicKey") or {}).get("hint")
        sigs = envelope.get("signatures")
        if not isinstance(hint, str) or not isinstance(sigs, list) or len(sigs) != 1:
            raise SignatureError("the signature names no key and carries no certificate.")
        sig = _b64(sigs[0].get("sig") if isinstance(sigs[0], dict) else None, "signature value")
        trusted = policy.key_for(hint)
        if trusted is None:
            if accept_untrusted:
                return key_name(hint), "key", False, payload
            raise UntrustedSignerError(
                f"the manifest is signed by {key_name(hint)}, which no trust policy lists.",
                hint=untrusted_hint("key"))
        from cryptography.hazmat.primitives import serialization

        public = serialization.load_pem_public_key(trusted.pem)
        if not _raw_verify(public, sig, pae(PAYLOAD_TYPE, payload)):
            raise SignatureError(f"the signature does not verify with {trusted.name}'s key: "
                                 "the signed statement or the signature was altered.")
        return trusted.name, "key", True, payload
    subject, issuer, cert = certificate_identity(der)
    _check_validity(cert, material)
    signer = f"{subject} ({issuer})"
    listed = [i for i in policy.identities if i.subject == subject and i.issuer == issuer]
    if not listed and not accept_untrusted:
        raise UntrustedSignerError(
            f"the manifest is signed by {signer}, which no trust policy lists.",
            hint=untrusted_hint("identity"))
    _verify_keyless(raw, subject, issuer, offline=offline)
    return signer, "sigstore", bool(listed), payload


def _verify_keyless(raw: bytes, subject: str, issuer: str, *, offline: bool) -> None:
    """Sigstore's own verifier: chain to Fulcio, Rekor inclusion, SCT, signature."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.errors import VerificationError
    from sigstore.models import Bundle
    from sigstore.verify import Verifier, policy

    try:
        bundle = Bundle.from_json(raw)
    except Exception as exc:  # sigstore raises InvalidBundle, ValueError, pydantic errors
        raise SignatureError(f"the signature is not a valid Sigstore bundle ({exc}).") from exc
    offline = offline or os.environ.get(OFFLINE_ENV) == "1"
    try:
        verifier = Verifier.production(offline=offline)
    except Exception as exc:
        raise NoVerdictError(
            f"cannot load Sigstore's trust root to check a keyless signature "
            f"({type(exc).__name__}: {exc}).",
            hint=None if offline else f"Without the network, set {OFFLINE_ENV}=1 to use the "
            "trust root cached here or bundled with sigstore.") from exc
    try:
        verifier.verify_dsse(bundle, policy.Identity(identity=subject, issuer=issuer))
    except VerificationError as exc:
        raise SignatureError(f"the Sigstore signature does not verify: {exc}.") from exc
    except SigstoreError as exc:
        raise NoVerdictError(f"could not check the Sigstore signature: {exc}.") from exc


def parse_statement(payload: bytes) -> dict[str, Any]:
    from manifest.canonical import parse_json
    from manifest.errors import InvalidManifestError

    try:
        doc = parse_json(payload, what="signed statement")
    except InvalidManifestError as exc:
        raise SignatureError(exc.message) from exc
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        raise SignatureError("the signed payload is not an in-toto Statement v1.")
    return doc


def check_manifest_signature(manifest_canonical: bytes, signature: bytes, policy: TrustPolicy,
                             *, accept_untrusted: bool = False,
                             offline: bool = False) -> SignatureCheck:
    """Check that ``signature`` is a valid signature over exactly this manifest."""
    signer, method, trusted, payload = verify_bundle(
        signature, policy, accept_untrusted=accept_untrusted, offline=offline)
    statement = parse_statement(payload)
    if statement.get("predicateType") != SIGNATURE_PREDICATE:
        raise SignatureError(f"the signed statement is not a manifest signature "
                             f"(predicate {statement.get('predicateType')!r}).")
    subjects = statement.get("subject")
    want = sha256_hex(manifest_canonical)
    got = [s.get("digest", {}).get("sha256") for s in subjects if isinstance(s, dict)] if (
        isinstance(subjects, list)) else []
    if got != [want]:
        predicate = statement.get("predicate")
        other = predicate.get("run_id", "?") if isinstance(predicate, dict) else "?"
        raise SignatureError(
            f"the signature by {signer} is valid but covers a different manifest (run_id "
            f"{str(other)[:19]}…): this manifest was changed after it was signed.")
    return SignatureCheck(signer, method, trusted, statement)


def sibling_signature(path: Path) -> Path:
    """Where ``manifest sign run.json`` writes, and verify/show look: ``run.json.sig``."""
    return path.with_name(path.name + ".sig")


def signature_covers(manifest_canonical: bytes, signature: bytes) -> bool:
    """Whether a bundle's statement names this manifest (no key check: for packing)."""
    try:
        doc = _parse_bundle(signature)
        statement = parse_statement(_b64(doc["dsseEnvelope"].get("payload"), "payload"))
    except SignatureError:
        return False
    subjects = statement.get("subject")
    return isinstance(subjects, list) and [
        s.get("digest", {}).get("sha256") for s in subjects if isinstance(s, dict)
    ] == [sha256_hex(manifest_canonical)]


def find_signature(file: str, data: bytes, explicit: str | None) -> tuple[bytes, str] | None:
    """The signature of an input and where it came from: ``--signature FILE``, the
    pack's own entry, or ``FILE.sig`` beside a manifest file; None if unsigned."""
    from manifest.bounded import InputKind, read_user_file, read_user_file_if_exists
    from manifest.travel.pack import is_pack, read_pack

    if explicit is not None:
        return read_user_file(explicit, InputKind.SIGNATURE), explicit
    if is_pack(data):
        embedded = read_pack(data).signature
        return (embedded, f"{file} (embedded)") if embedded is not None else None
    if file == "-":
        return None
    # The sidecar may be committed next to a received manifest: a symlink to a device
    # or a FIFO there is refused like one given by name, and a dangling one too.
    sibling = sibling_signature(Path(file))
    found = read_user_file_if_exists(sibling, InputKind.SIGNATURE)
    return (found, str(sibling)) if found is not None else None


def check_input_signature(file: str, data: bytes, *, cwd: Path, explicit: str | None = None,
                          accept_untrusted: bool = False) -> SignatureCheck | None:
    """Find and check the signature of a manifest file or pack against the user's policy."""
    found = find_signature(file, data, explicit)
    if found is None:
        return None
    return _check_found(found, data, cwd=cwd, accept_untrusted=accept_untrusted)


@dataclass(frozen=True)
class InputSignature:
    """What the signature found with an input says, for a verb that runs nothing (diff,
    gate's baseline): it covers this manifest (else the verb refused), who made it, and
    whether that was checked cryptographically."""

    source: str
    """Where it was found: ``--signature FILE``, ``FILE.sig`` or ``PACK (embedded)``."""
    signer: str
    method: str
    trusted: bool
    verified: bool
    """False only for a key signature whose key no policy lists: nothing to check it with."""

    def to_json(self) -> dict[str, str | bool]:
        return {"source": self.source, "signer": self.signer, "method": self.method,
                "trusted": self.trusted, "verified": self.verified}

    def describe(self) -> str:
        """One clause: ``signed by S (in your trust policy); covers this manifest``."""
        if self.trusted:
            who = "in your trust policy"
        elif self.verified:
            who = "not in your trust policy"
        else:
            who = "not in your trust policy, so its key could not check the signature"
        return f"signed by {self.signer} ({who}); the signature covers this manifest"


def input_signature(file: str, data: bytes, *, cwd: Path,
                    explicit: str | None = None) -> InputSignature | None:
    """The signature of an input a verb reads without running it; None when it has none.

    A signature that is malformed, fails its cryptographic check, or covers
    another manifest raises :class:`~manifest.errors.SignatureError` (exit 2),
    naming where it was found, as for ``verify`` and ``show``: a pack whose
    signature vouches for a different manifest was altered or assembled from
    parts, and a report that compared it anyway would lend it the signer's
    name. An untrusted signer is not refused (nothing runs), only reported.
    """
    found = find_signature(file, data, explicit)
    if found is None:
        return None
    check = _check_found(found, data, cwd=cwd, accept_untrusted=True)
    return InputSignature(found[1], check.signer, check.method, check.trusted,
                          check.trusted or check.method == "sigstore")


def _check_found(found: tuple[bytes, str], data: bytes, *, cwd: Path,
                 accept_untrusted: bool) -> SignatureCheck:
    from manifest.canonical import dumps, load_manifest
    from manifest.travel.pack import manifest_bytes_of
    from manifest.travel.policy import load_policy

    canonical = dumps(load_manifest(manifest_bytes_of(data)))
    policy = load_policy(cwd)
    try:
        return check_manifest_signature(canonical, found[0], policy,
                                        accept_untrusted=accept_untrusted)
    except SignatureError as exc:
        # Name the file: a stale run.json.sig beside a re-captured run.json is the
        # common case, and the user needs to know which file to re-sign or remove.
        raise SignatureError(exc.message, hint=f"(signature: {found[1]})") from exc
