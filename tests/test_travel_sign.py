"""``manifest sign`` and the trust policy: who vouches for a manifest (issue 12).

Offline and real: keys are made with ``cryptography``, signatures checked by
the same code verify uses; the keyless Sigstore round trip needs an OIDC token
and the network, so it is marked ``network`` and skipped without them.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
from pathlib import Path

import pytest

from manifest.canonical import seal
from tests.runs import manifest_cli
from tests.travel import capture_run, clone, dirty_repo, write_keys


def cli(cwd: Path, *args: str, home: Path) -> tuple[int, str, str]:
    # ``home`` is the verifying machine: its own trust policy, no record of sealed digests.
    proc = manifest_cli(*args, cwd=cwd, env={"XDG_CONFIG_HOME": str(home),
                                             "XDG_DATA_HOME": str(home / "data")})
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr, stderr
    return proc.returncode, proc.stdout.decode(), stderr


def trust_file(home: Path, *keys: Path, identities: str = "") -> None:
    folder = home / "manifest"
    folder.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(json.dumps(str(k)) for k in keys)
    (folder / "trust.toml").write_text(f"keys = [{listed}]\n{identities}")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """(repo, manifest, alice's private key, alice's public key); run.json.sig by alice."""
    base = tmp_path_factory.mktemp("sign")
    repo = dirty_repo(base / "repo")
    manifest = capture_run(repo)
    private, public = write_keys(base / "keys", "alice")
    code, _, stderr = cli(repo, "sign", "run.json", "--key", str(private), home=base / "home")
    assert code == 0, stderr
    return repo, manifest, private, public


@pytest.mark.parametrize("kind", ["ecdsa", "ed25519"])
def test_signed_by_a_trusted_key_is_shown_and_checked(tmp_path: Path, kind: str,
                                                      signed: tuple[Path, Path, Path, Path]
                                                      ) -> None:
    _, manifest, _, _ = signed
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(manifest, work / "run.json")
    private, public = write_keys(tmp_path / "keys", "bob", kind)
    home = tmp_path / "home"
    assert cli(work, "sign", "run.json", "--key", str(private), home=home)[0] == 0
    code, out, _ = cli(work, "show", "run.json", home=home)
    assert code == 0
    assert "signed by key sha256:" in out and "not in your trust policy" in out
    trust_file(home, public)
    code, out, _ = cli(work, "show", "run.json", home=home)
    assert code == 0 and "trusted by your policy" in out


def test_repository_policy_trusts_a_key_by_name(signed: tuple[Path, Path, Path, Path],
                                                tmp_path: Path) -> None:
    repo, _, _, public = signed
    shutil.copy(public, repo / "alice.pub")
    (repo / "pyproject.toml").write_text(
        '[tool.manifest.trust]\nkeys = [{ name = "alice", path = "alice.pub" }]\n')
    try:
        # A checked-out pull request could write this table: alone, it trusts nobody.
        code, out, _ = cli(repo, "show", "run.json", home=tmp_path)
        assert code == 0 and "not in your trust policy" in out
        code, _, stderr = cli(repo, "verify", "run.json", "--no-rerun", home=tmp_path)
        assert code == 2 and "which no trust policy lists" in stderr
        # The user's own file opts in to the repository's table.
        (tmp_path / "manifest").mkdir(exist_ok=True)
        (tmp_path / "manifest" / "trust.toml").write_text("repository_policy = true\n")
        code, out, _ = cli(repo, "show", "run.json", home=tmp_path)
        assert code == 0 and "signed by alice (key; trusted by your policy)" in out
        code, _, stderr = cli(repo, "verify", "run.json", "--no-rerun", home=tmp_path)
        assert code == 0 and "signed by alice" in stderr
        (tmp_path / "manifest" / "trust.toml").write_text("repository_policy = 1\n")
        code, _, stderr = cli(repo, "verify", "run.json", "--no-rerun", home=tmp_path)
        assert code == 2 and "repository_policy must be true or false" in stderr
    finally:
        (repo / "pyproject.toml").unlink()
        (tmp_path / "manifest" / "trust.toml").unlink(missing_ok=True)


def test_untrusted_key_is_exit_2_unless_trust(signed: tuple[Path, Path, Path, Path],
                                             tmp_path: Path) -> None:
    repo, _, _, _ = signed
    code, _, stderr = cli(repo, "verify", "run.json", "--no-rerun", home=tmp_path)
    assert code == 2
    assert "which no trust policy lists" in stderr and stderr.count("\n") == 1
    code, _, stderr = cli(repo, "verify", "run.json", "--no-rerun", "--trust", home=tmp_path)
    assert code == 0 and "not in your trust policy" in stderr


def test_edited_and_resealed_signed_manifest_is_exit_2(signed: tuple[Path, Path, Path, Path],
                                                       tmp_path: Path) -> None:
    repo, manifest, _, public = signed
    home = tmp_path / "home"
    trust_file(home, public)
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(repo / "run.json.sig", work / "run.json.sig")
    doc = json.loads(manifest.read_bytes())
    artifact = doc["outputs"]["artifacts"][0]
    artifact["digest"] = "blake3:" + "0" * 64  # an edited tensor/file digest, re-sealed
    from manifest.canonical import dumps

    (work / "run.json").write_bytes(dumps(seal(doc)))
    # Positive control: without the signature the re-sealed manifest passes as untampered.
    (work / "alone.json").write_bytes((work / "run.json").read_bytes())
    assert cli(work, "show", "alone.json", home=home)[0] == 0
    for verb in (["verify", "--no-rerun"], ["show"]):
        code, _, stderr = cli(work, *verb, "run.json", home=home)
        assert code == 2, stderr
        assert "covers a different manifest" in stderr and "changed after" in stderr


def test_valid_signature_over_a_different_manifest(signed: tuple[Path, Path, Path, Path],
                                                   tmp_path: Path) -> None:
    repo, _, private, public = signed
    home = tmp_path / "home"
    trust_file(home, public)
    other = capture_run(repo, name="other.json")
    assert cli(repo, "sign", "other.json", "--key", str(private), home=home)[0] == 0
    code, _, _ = cli(repo, "verify", "other.json", "--no-rerun", home=home)
    assert code == 0  # positive control: the signature is good for its own manifest
    code, _, stderr = cli(repo, "verify", "run.json", "--signature", "other.json.sig",
                          "--no-rerun", home=home)
    assert other.exists()
    assert code == 2 and "covers a different manifest" in stderr


def test_altered_signature_value_does_not_verify(signed: tuple[Path, Path, Path, Path],
                                                 tmp_path: Path) -> None:
    repo, _, _, public = signed
    home = tmp_path / "home"
    trust_file(home, public)
    bundle = json.loads((repo / "run.json.sig").read_bytes())
    sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-1] ^= 1
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    (tmp_path / "bad.sig").write_text(json.dumps(bundle))
    code, _, stderr = cli(repo, "verify", "run.json", "--signature", str(tmp_path / "bad.sig"),
                          "--no-rerun", home=home)
    assert code == 2 and "does not verify" in stderr


def _certificate(not_before: datetime.datetime, minutes: int) -> bytes:
    """A self-made certificate shaped like Fulcio's (SAN e-mail, issuer extension)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sigstore-intermediate")])
    issuer = b"https://accounts.example.com"
    cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_before + datetime.timedelta(minutes=minutes))
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name("eve@example.com")]),
                           critical=True)
            .add_extension(x509.UnrecognizedExtension(
                x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8"),
                bytes([0x0C, len(issuer)]) + issuer), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def _keyless_bundle(signed_bundle: bytes, der: bytes, logged: int) -> str:
    bundle = json.loads(signed_bundle)
    bundle["verificationMaterial"] = {
        "certificate": {"rawBytes": base64.b64encode(der).decode()},
        "tlogEntries": [{"logIndex": "1", "integratedTime": str(logged)}],
    }
    return json.dumps(bundle)


def test_expired_and_malformed_certificates_are_exit_2(signed: tuple[Path, Path, Path, Path],
                                                      tmp_path: Path) -> None:
    repo, _, _, _ = signed
    home = tmp_path / "home"
    trust_file(home, identities='identities = [{ subject = "eve@example.com", '
               'issuer = "https://accounts.example.com" }]\n')
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    der = _certificate(start, 10)
    raw = (repo / "run.json.sig").read_bytes()
    cases = {
        "expired": (_keyless_bundle(raw, der, int(start.timestamp()) + 3600), "had expired"),
        "malformed": (_keyless_bundle(raw, b"\x30\x03not a certificate", 0), "malformed"),
    }
    for name, (bundle, expected) in cases.items():
        (tmp_path / f"{name}.sig").write_text(bundle)
        code, _, stderr = cli(repo, "verify", "run.json", "--signature", f"{tmp_path}/{name}.sig",
                              "--no-rerun", home=home)
        assert code == 2, (name, stderr)
        assert expected in stderr and stderr.count("\n") == 1, stderr
    # Inside its window and listed, a certificate that Fulcio did not issue reaches
    # sigstore's own bundle reader and verifier (trust root bundled with sigstore, no
    # network), which refuse it.
    (tmp_path / "forged.sig").write_text(_keyless_bundle(raw, der, int(start.timestamp()) + 60))
    proc = manifest_cli("verify", "run.json", "--signature", f"{tmp_path}/forged.sig",
                        "--no-rerun", cwd=repo, env={"XDG_CONFIG_HOME": str(home),
                                                     "MANIFEST_SIGSTORE_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr.decode()
    assert "not a valid Sigstore bundle" in proc.stderr.decode()
    # Positive control for the identity read from the certificate: logged inside its
    # window, the signer is named; a signer outside the policy is then refused.
    trust_file(home)
    (tmp_path / "inside.sig").write_text(_keyless_bundle(raw, der, int(start.timestamp()) + 60))
    code, _, stderr = cli(repo, "verify", "run.json", "--signature", f"{tmp_path}/inside.sig",
                          "--no-rerun", home=home)
    assert code == 2
    assert "eve@example.com (https://accounts.example.com)" in stderr
    assert "no trust policy lists" in stderr


@pytest.mark.parametrize("where", ["user", "repository"])
def test_policy_syntax_error_is_exit_2(signed: tuple[Path, Path, Path, Path], tmp_path: Path,
                                       where: str) -> None:
    repo, _, _, _ = signed
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(repo / "run.json", work / "run.json")
    shutil.copy(repo / "run.json.sig", work / "run.json.sig")
    home = tmp_path / "home"
    broken = '[tool.manifest.trust]\nkeys = ["a.pub"\n'
    if where == "user":
        (home / "manifest").mkdir(parents=True)
        (home / "manifest" / "trust.toml").write_text(broken.split("\n", 1)[1])
    else:
        (work / "pyproject.toml").write_text(broken)
    code, _, stderr = cli(work, "verify", "run.json", "--no-rerun", home=home)
    assert code == 2 and "is not valid TOML" in stderr and stderr.count("\n") == 1


@pytest.mark.slow
def test_signed_pack_trusted_by_policy_reruns_without_trust(tmp_path: Path) -> None:
    origin = dirty_repo(tmp_path / "origin")
    capture_run(origin, "--pack", "run.mfpack")
    private, public = write_keys(tmp_path / "keys", "ci")
    home = tmp_path / "home"
    assert cli(origin, "sign", "run.mfpack", "--key", str(private), home=home)[0] == 0
    elsewhere = clone(origin, tmp_path / "elsewhere")
    shutil.copy(origin / "run.mfpack", elsewhere / "run.mfpack")
    code, _, stderr = cli(elsewhere, "verify", "run.mfpack", home=home)
    assert code == 2 and "no trust policy lists" in stderr  # positive control
    trust_file(home, public)
    code, out, stderr = cli(elsewhere, "verify", "run.mfpack", "--json", home=home)
    assert code == 0, stderr
    assert json.loads(out)["verdict"] == "identical"
    assert "signed by key sha256:" in stderr and "re-running" in stderr


def _sigstore_credential() -> str | None:
    if os.environ.get("MANIFEST_NETWORK_TESTS") != "1":
        return None
    from sigstore import oidc

    return os.environ.get("SIGSTORE_ID_TOKEN") or oidc.detect_credential()


@pytest.mark.network
@pytest.mark.skipif(_sigstore_credential() is None,
                    reason="keyless Sigstore needs the network and an OIDC identity "
                    "(MANIFEST_NETWORK_TESTS=1 with SIGSTORE_ID_TOKEN or a CI credential)")
def test_sigstore_keyless_round_trip(signed: tuple[Path, Path, Path, Path],
                                     tmp_path: Path) -> None:
    from sigstore import oidc

    from manifest.travel.sign import certificate_identity

    repo, _, _, _ = signed
    token = oidc.IdentityToken(_sigstore_credential() or "")
    home = tmp_path / "home"
    code, _, stderr = cli(repo, "sign", "run.json", "--sigstore", "-o",
                          str(tmp_path / "keyless.sig"), home=home)
    assert code == 0, stderr
    bundle = json.loads((tmp_path / "keyless.sig").read_bytes())
    der = base64.b64decode(bundle["verificationMaterial"]["certificate"]["rawBytes"])
    subject, issuer, _ = certificate_identity(der)
    assert issuer == token.issuer
    trust_file(home, identities=f'identities = [{{ subject = "{subject}", '
               f'issuer = "{issuer}" }}]\n')
    code, _, stderr = cli(repo, "verify", "run.json", "--signature", str(tmp_path / "keyless.sig"),
                          "--no-rerun", home=home)
    assert code == 0, stderr
    assert f"signed by {subject}" in stderr
