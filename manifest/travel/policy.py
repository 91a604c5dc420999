"""The trust policy: which signers may vouch for a manifest's command.

Two places, merged (either may be absent)::

    # pyproject.toml of the repository being verified
    [tool.manifest.trust]
    keys = ["keys/alice.pub", { name = "ci", path = "keys/ci.pub" }]
    identities = [
      { subject = "alice@example.com", issuer = "https://github.com/login/oauth" },
    ]

    # $XDG_CONFIG_HOME/manifest/trust.toml (default ~/.config/manifest/trust.toml)
    keys = ["~/.keys/team.pub"]
    identities = [{ subject = "...", issuer = "..." }]
    repository_policy = true   # also honour [tool.manifest.trust] of the repository

``keys`` are PEM public keys (ECDSA P-256/P-384 or Ed25519), paths relative
to the file that names them; ``identities`` are Sigstore keyless signers, a
certificate subject (e-mail or workflow URI) and the OIDC issuer, matched
exactly.

The repository's table is honoured only when the user file says
``repository_policy = true``. A signer the policy lists re-runs a manifest
without ``--trust``, and a pull request can edit the repository's
pyproject.toml: checked out, it could list its own key and sign its own
manifest. So by default only the user's file, which no clone can write,
decides; a team that reviews changes to its pyproject.toml opts in.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manifest.bounded import InputKind, read_user_file, read_user_text
from manifest.errors import ConfigError

USER_POLICY = Path("manifest") / "trust.toml"
KNOWN_KEYS = frozenset({"keys", "identities"})
USER_ONLY_KEYS = frozenset({"repository_policy"})


@dataclass(frozen=True)
class TrustedKey:
    name: str
    pem: bytes
    """SubjectPublicKeyInfo PEM, as ``cryptography`` writes it (the hint is its sha256)."""

    @property
    def hint(self) -> str:
        return hashlib.sha256(self.pem).hexdigest()


@dataclass(frozen=True)
class TrustedIdentity:
    subject: str
    issuer: str


@dataclass(frozen=True)
class TrustPolicy:
    keys: tuple[TrustedKey, ...] = ()
    identities: tuple[TrustedIdentity, ...] = ()
    sources: tuple[str, ...] = field(default=())

    def key_for(self, hint: str) -> TrustedKey | None:
        return next((k for k in self.keys if k.hint == hint), None)

    def merged(self, other: TrustPolicy) -> TrustPolicy:
        return TrustPolicy(self.keys + other.keys, self.identities + other.identities,
                           self.sources + other.sources)


def key_name(hint: str) -> str:
    return f"key sha256:{hint[:16]}"


def normalise_public_pem(data: bytes, origin: str) -> bytes:
    """Re-encode a PEM public key (or the public half of a certificate) canonically."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    try:
        if b"BEGIN CERTIFICATE" in data:
            key: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise ConfigError(f"{origin} is not a PEM public key ({exc}).") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        raise ConfigError(f"{origin} is a {type(key).__name__}; trusted keys are ECDSA or Ed25519.")
    pem: bytes = key.public_bytes(serialization.Encoding.PEM,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def _parse_table(table: Any, origin: Path, where: str,
                 allowed: frozenset[str] = KNOWN_KEYS, *, open_keys: bool = True) -> TrustPolicy:
    """The policy a table states; ``open_keys=False`` checks its shape but opens no key
    file (a repository's table the user did not opt into: its paths are the clone's)."""
    from manifest.config import did_you_mean

    if not isinstance(table, dict):
        raise ConfigError(f"{where} in {origin} must be a table.")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where} in {origin} has unknown key(s): {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(allowed))})"
                          f"{did_you_mean(unknown, allowed)}.")
    keys = []
    raw_keys = table.get("keys", [])
    if not isinstance(raw_keys, list):
        raise ConfigError(f"{where} in {origin}: keys must be a list.")
    for entry in raw_keys:
        if isinstance(entry, str):
            name, rel = "", entry
        elif (isinstance(entry, dict) and set(entry) <= {"name", "path"}
              and isinstance(entry.get("path"), str) and isinstance(entry.get("name", ""), str)):
            name, rel = entry.get("name", ""), entry["path"]
        else:
            raise ConfigError(f"{where} in {origin}: each key is a path or "
                              "{ name = \"…\", path = \"…\" }.")
        if not open_keys:
            continue
        path = Path(os.path.expanduser(rel))
        path = path if path.is_absolute() else origin.parent / path
        try:
            data = read_user_file(path, InputKind.TRUSTED_KEY)
        except ConfigError as exc:
            raise ConfigError(f"{where} in {origin}: the key {rel}: {exc.message}") from exc
        pem = normalise_public_pem(data, f"the key {rel} named in {origin}")
        hint = hashlib.sha256(pem).hexdigest()
        keys.append(TrustedKey(name or key_name(hint), pem))
    identities = []
    raw_ids = table.get("identities", [])
    if not isinstance(raw_ids, list):
        raise ConfigError(f"{where} in {origin}: identities must be a list.")
    for entry in raw_ids:
        if (not isinstance(entry, dict) or set(entry) != {"subject", "issuer"}
                or not all(isinstance(v, str) and v for v in entry.values())):
            raise ConfigError(f"{where} in {origin}: each identity is "
                              "{ subject = \"…\", issuer = \"…\" }.")
        identities.append(TrustedIdentity(entry["subject"], entry["issuer"]))
    return TrustPolicy(tuple(keys), tuple(identities), (str(origin),))


def _read_toml(path: Path, kind: InputKind = InputKind.POLICY) -> dict[str, Any] | None:
    text = read_user_text(path, kind, missing_ok=True)
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the trust policy {path} is not valid TOML: {exc}.") from exc


def user_policy_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / USER_POLICY


def untrusted_hint(what: str = "key") -> str:
    """Where to list an untrusted signer so that it is trusted next time: the user's own
    file, by its path on this machine (the repository's ``[tool.manifest.trust]`` counts
    only once that file sets ``repository_policy = true``)."""
    entry = ("its public key's path to keys" if what == "key"
             else "{ subject = \"…\", issuer = \"…\" } to identities")
    return (f"Add {entry} in your trust file {user_policy_path()} (the repository's "
            "[tool.manifest.trust] counts only if that file sets repository_policy = true), "
            "or pass --trust.")


def load_policy(start: Path) -> TrustPolicy:
    """The user file, merged with ``[tool.manifest.trust]`` above ``start`` if it opts in."""
    from manifest.config import find_pyproject

    policy = TrustPolicy()
    user = user_policy_path()
    user_doc = _read_toml(user)
    with_repository = False
    if user_doc is not None:
        opt_in = user_doc.get("repository_policy", False)
        if not isinstance(opt_in, bool):
            raise ConfigError(f"the trust policy {user}: repository_policy must be true or false.")
        with_repository = opt_in
        policy = _parse_table(user_doc, user, "the trust policy", KNOWN_KEYS | USER_ONLY_KEYS)
    project = find_pyproject(start)
    if project is not None:
        doc = _read_toml(project, InputKind.CONFIG) or {}
        tool = doc.get("tool", {})
        table = tool.get("manifest", {}).get("trust") if isinstance(tool, dict) and isinstance(
            tool.get("manifest"), dict) else None
        if table is not None:
            # Checked either way, so a broken table is reported, not silently skipped;
            # its key files are opened only when the user opted in: a clone names them.
            repo_policy = _parse_table(table, project, "[tool.manifest.trust]",
                                       open_keys=with_repository)
            if with_repository:
                policy = repo_policy.merged(policy)
    return policy
