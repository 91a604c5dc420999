"""An OpenSSF model-signing (OMS) signature of the weights, naming the run.

Whoever downloads a model checks it with the standard tool::

    model_signing verify key model.safetensors --signature model.sig --public_key key.pub

The signature is the OMS v1.0 format: a Sigstore bundle holding a DSSE
envelope around an in-toto Statement whose predicate type is
``https://model_signing/signature/v1.0``, whose ``predicate.resources`` list
every file of the model with its sha256 (computed by ``model_signing``'s own
hashing API, so the verifier recomputes exactly the same list), and whose one
subject is the sha256 over those digests in order. The OMS spec says verifiers
of v1.0 ignore other predicate fields; this one adds ``predicate.manifest``:
``run_id``, ``digest`` and the BLAKE3 of each file the run recorded, so the
weights trace back to the run that produced them (``manifest verify`` then
proves that run reproduces). sha256 and not BLAKE3 for the resources because
``model_signing verify`` (1.1.1) hashes with its default, sha256, whatever
the signature used.

Signing refuses weights whose bytes are not the ones the manifest recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

from manifest.errors import DataError, UsageError
from manifest.models import Manifest

OMS_PREDICATE = "https://model_signing/signature/v1.0"


def default_model_path(manifest: Manifest, root: Path) -> Path:
    from manifest.travel.attest import artifact_path

    artifacts = manifest.outputs.artifacts if manifest.outputs is not None else []
    if len(artifacts) != 1:
        raise UsageError(f"the run recorded {len(artifacts)} outputs; name the model to sign "
                         "with --model PATH (a file or a directory).")
    return artifact_path(manifest, artifacts[0], root)


def oms_statement(manifest: Manifest, model_path: Path, root: Path,
                  signature_path: Path) -> bytes:
    """The OMS statement for ``model_path``, checked against the run's recorded outputs."""
    import model_signing.hashing

    from manifest.travel.attest import _digests, artifact_path
    from manifest.travel.sign import statement_bytes

    if not model_path.exists():
        raise UsageError(f"the model {model_path} does not exist.")
    ignored = []
    if model_path.is_dir():
        with contextlib.suppress(ValueError):  # a signature outside the model is not hashed
            ignored.append(signature_path.resolve().relative_to(model_path.resolve()))
    config = model_signing.hashing.Config().set_ignored_paths(  # type: ignore[no-untyped-call]
        paths=ignored)
    try:
        hashed = config.hash(model_path)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot hash the model {model_path}: {exc}.") from exc
    recorded = {artifact_path(manifest, a, root).resolve(): a
                for a in (manifest.outputs.artifacts if manifest.outputs else [])}
    resources: list[dict[str, Any]] = []
    traced: dict[str, str] = {}
    root_hash = hashlib.sha256()
    for item in hashed.resource_descriptors():
        root_hash.update(item.digest.digest_value)
        resources.append({"name": item.identifier, "algorithm": item.digest.algorithm,
                          "digest": item.digest.digest_hex})
        file = model_path if item.identifier == "." else model_path / item.identifier
        artifact = recorded.get(file.resolve())
        if artifact is not None:
            b3, _ = _digests(file)
            if b3 != artifact.digest:
                raise DataError(f"the weights {file} are not the bytes the run recorded "
                                f"for {artifact.path} (blake3 {b3[:19]}…).")
            traced[item.identifier] = artifact.digest
    if not traced:
        raise UsageError(f"{model_path} holds none of the run's recorded outputs.")
    predicate = {
        "serialization": hashed.serialization_type,
        "resources": resources,
        "manifest": {"run_id": manifest.run_id, "digest": manifest.digest, "blake3": traced},
    }
    subject = {"name": hashed.model_name, "digest": {"sha256": root_hash.hexdigest()}}
    return statement_bytes([subject], OMS_PREDICATE, predicate)


def check_oms_key(key_path: Path) -> None:
    """model_signing's key method reads ECDSA keys only (P-256, P-384, P-521)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from manifest.travel.sign import load_private_key

    if not isinstance(load_private_key(key_path), ec.EllipticCurvePrivateKey):
        raise UsageError(f"the key {key_path} is not ECDSA: OMS signatures checked with "
                         "'model_signing verify key' need an ECDSA P-256 key.")
