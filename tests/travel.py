"""Helpers for the travel tests (pack, sign, attest): keys, small dirty runs, bad packs."""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path
from typing import Any

from tests.runs import git, make_repo, manifest_cli

# Writes a small output file without importing torch: the runs these tests sign
# need outputs, not training.
WRITER = ("import pathlib\np = pathlib.Path('out'); p.mkdir(exist_ok=True)\n"
          "(p / 'model.bin').write_bytes(bytes(range(256)) * 64)\n")


def write_keys(folder: Path, name: str, kind: str = "ecdsa") -> tuple[Path, Path]:
    """A fresh private/public PEM pair (ECDSA P-256 or Ed25519) made with ``cryptography``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key: Any = (ec.generate_private_key(ec.SECP256R1()) if kind == "ecdsa"
                else ed25519.Ed25519PrivateKey.generate())
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def dirty_repo(path: Path) -> Path:
    """A repository with an uncommitted edit, an untracked file and a tracked dataset."""
    repo = make_repo(path, {"writer.py": WRITER, "corpus/a.txt": "alpha\n",
                            "corpus/b.txt": "beta\n"}, example=False)
    (repo / "writer.py").write_text(WRITER + "# an uncommitted edit\n")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


def other_machine(folder: Path) -> dict[str, str]:
    """The environment of another user or machine: its own record of sealed digests
    (``XDG_DATA_HOME``) and its own user trust policy (``XDG_CONFIG_HOME``)."""
    return {"XDG_DATA_HOME": str(folder / "data"), "XDG_CONFIG_HOME": str(folder / "config")}


def capture_run(repo: Path, *extra: str, name: str = "run.json") -> Path:
    """Capture the writer script with the corpus dataset; the manifest goes to ``name``.

    The capturing machine's record of sealed digests lives beside the repository,
    so the machines the tests verify on have never sealed it.
    """
    proc = manifest_cli("capture", "-q", "--data", "corpus", "--artifact", "out/*.bin", *extra,
                        "--", "python", "writer.py", cwd=repo,
                        env=other_machine(repo.parent / "capturing-machine"))
    assert proc.returncode == 0, proc.stderr.decode()
    (repo / name).write_bytes(proc.stdout)
    return repo / name


def rezip(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        warnings.simplefilter("ignore")  # a duplicated name is what one case wants
        for info, data in entries:
            zf.writestr(info, data)
    return out.getvalue()


def entries_of(pack: bytes) -> list[tuple[zipfile.ZipInfo | str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(pack)) as zf:
        return [(info.filename, zf.read(info)) for info in zf.infolist()]


def clone(origin: Path, to: Path) -> Path:
    """A fresh clone at another path: same history, no store, no untracked files."""
    git(origin.parent, "clone", "-q", str(origin), str(to))
    return to
