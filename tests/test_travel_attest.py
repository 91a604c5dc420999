"""``manifest attest``: the in-toto Statement and the OMS weight signature (issue 12).

Checked by the reference libraries, not by this project's code: the Statement
by ``in_toto_attestation`` (its protobuf schema and ``validate``), the weight
signature by ``model_signing``'s own verifier (key method), in Python and with
the ``model_signing verify key`` command a reader would run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.travel.sign import pae
from tests.runs import manifest_cli
from tests.travel import capture_run, dirty_repo, write_keys


@pytest.fixture(scope="module")
def attested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(repo, public key, folder with run.intoto.jsonl and model.sig)."""
    base = tmp_path_factory.mktemp("attest")
    repo = dirty_repo(base / "repo")
    capture_run(repo)
    private, public = write_keys(base / "keys", "lab")
    out = base / "out"
    out.mkdir()
    proc = manifest_cli("attest", "run.json", "--key", str(private), "-o",
                        str(out / "run.intoto.jsonl"), "--oms", str(out / "model.sig"), cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    return repo, public, out


def _statement(line: bytes, public: Path) -> dict[str, object]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    bundle = json.loads(line)
    envelope = bundle["dsseEnvelope"]
    payload = base64.b64decode(envelope["payload"])
    key = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    key.verify(base64.b64decode(envelope["signatures"][0]["sig"]),
               pae(envelope["payloadType"], payload), ec.ECDSA(hashes.SHA256()))
    statement: dict[str, object] = json.loads(payload)
    return statement


def test_statement_validates_with_in_toto_attestation(attested: tuple[Path, Path, Path]) -> None:
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    repo, public, out = attested
    lines = (out / "run.intoto.jsonl").read_bytes().splitlines()
    assert len(lines) == 1
    statement = _statement(lines[0], public)
    parsed = Statement.copy_from_pb(json_format.ParseDict(statement, statement_pb2.Statement()))
    parsed.validate()
    assert statement["predicateType"] == "https://manifest.dev/predicates/training-run/v1"
    manifest = json.loads((repo / "run.json").read_bytes())
    assert statement["predicate"] == manifest  # the manifest, integers intact
    model = repo / "out" / "model.bin"
    assert statement["subject"] == [{"name": "out/model.bin", "digest": {
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest()}}]
    # Positive control: the reference validator rejects a statement without subjects.
    empty = Statement.copy_from_pb(json_format.ParseDict({**statement, "subject": []},
                                                         statement_pb2.Statement()))
    with pytest.raises(ValueError, match="subject"):
        empty.validate()


def test_weight_signature_verifies_with_model_signing(attested: tuple[Path, Path, Path],
                                                      tmp_path: Path) -> None:
    import model_signing.verifying

    repo, public, out = attested
    model = tmp_path / "download" / "model.bin"  # what a reader downloaded, elsewhere
    model.parent.mkdir()
    shutil.copy(repo / "out" / "model.bin", model)
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(  # type: ignore[no-untyped-call]
        public_key=public)
    verifier.verify(model, out / "model.sig")
    reader = [sys.executable, "-m", "model_signing", "verify", "key", str(model),
              "--signature", str(out / "model.sig"), "--public_key", str(public)]
    proc = subprocess.run(reader, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    payload = json.loads(base64.b64decode(json.loads((out / "model.sig").read_bytes())[
        "dsseEnvelope"]["payload"]))
    run = json.loads((repo / "run.json").read_bytes())
    assert payload["predicate"]["manifest"]["run_id"] == run["run_id"]
    assert payload["predicate"]["manifest"]["blake3"] == {
        ".": run["outputs"]["artifacts"][0]["digest"]}
    # Positive control: one changed byte and model_signing's verifier refuses.
    model.write_bytes(model.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ValueError, match="mismatch"):
        model_signing.verifying.Config().use_elliptic_key_verifier(  # type: ignore[no-untyped-call]
            public_key=public).verify(
            model, out / "model.sig")
    assert subprocess.run(reader, capture_output=True, check=False).returncode == 1


def test_attest_refuses_outputs_changed_since_the_run(tmp_path: Path) -> None:
    repo = dirty_repo(tmp_path / "repo")
    capture_run(repo)
    private, _ = write_keys(tmp_path / "keys", "lab")
    (repo / "out" / "model.bin").write_bytes(b"other weights")
    for extra in ([], ["--oms", str(tmp_path / "model.sig")]):
        proc = manifest_cli("attest", "run.json", "--key", str(private), *extra, cwd=repo)
        assert proc.returncode == 2
        assert "changed since the run" in proc.stderr.decode()
        assert proc.stdout == b""
    assert not (tmp_path / "model.sig").exists()


def test_oms_needs_an_ecdsa_key(tmp_path: Path) -> None:
    repo = dirty_repo(tmp_path / "repo")
    capture_run(repo)
    private, _ = write_keys(tmp_path / "keys", "ed", "ed25519")
    proc = manifest_cli("attest", "run.json", "--key", str(private), "--oms",
                        str(tmp_path / "m.sig"), "-o", str(tmp_path / "a.jsonl"), cwd=repo)
    # Ed25519 is fine for the attestation; model_signing's key method reads ECDSA only.
    assert proc.returncode == 2, proc.stderr.decode()
    assert "ECDSA" in proc.stderr.decode()
