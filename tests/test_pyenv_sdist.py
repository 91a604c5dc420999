"""A distribution built here from an sdist: named ``built-here`` before anything trains, and
rebuilt from the same sdist only when a source serves it with the recorded sha256.

The sdist is real: a project with an in-tree PEP 517 backend (``backend-path``, no build
requirements, so it builds offline), packed as ``gamma-1.0.tar.gz`` in a local find-links
folder, installed by uv into the run's venv and recorded by the capture probe. uv leaves
``archive_info`` empty; pip records the archive's hash there, which the tests put in the
record as pip would.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from manifest.models import Manifest
from manifest.pyenv.prove import Status
from manifest.pyenv.rebuild import build_environment
from manifest.trust import TrustDecision, check_trust
from tests.pyenv_wheels import install, manifest_recording, standard_wheels, uv_bin

pytest.importorskip("uv")

BACKEND = '''\
import base64, hashlib, zipfile
from pathlib import Path

FILES = {"gamma/__init__.py": b"Z = 3\\n"}


def _hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "gamma-1.0.dist-info"
    entries = dict(FILES)
    entries[info + "/METADATA"] = b"Metadata-Version: 2.1\\nName: gamma\\nVersion: 1.0\\n\\n"
    entries[info + "/WHEEL"] = (b"Wheel-Version: 1.0\\nGenerator: backend\\n"
                                b"Root-Is-Purelib: true\\nTag: py3-none-any\\n\\n")
    lines = ["%s,%s,%d" % (p, _hash(d), len(d)) for p, d in entries.items()]
    entries[info + "/RECORD"] = ("\\n".join(lines + [info + "/RECORD,,"]) + "\\n").encode()
    name = "gamma-1.0-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w") as archive:
        for member, data in entries.items():
            archive.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), data)
    return name
'''


def make_sdist(folder: Path, *, payload: bytes = b"Z = 3\n") -> Path:
    """``gamma-1.0.tar.gz``: pyproject.toml naming the in-tree backend, the backend, the
    package. ``payload`` changes the package's source (another file of the same name)."""
    files = {
        "pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                          b'backend-path = ["."]\n\n[project]\nname = "gamma"\n'
                          b'version = "1.0"\n',
        "backend.py": BACKEND.encode(),
        "PKG-INFO": b"Metadata-Version: 2.1\nName: gamma\nVersion: 1.0\n",
        "gamma/__init__.py": payload,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gamma-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(f"gamma-1.0/{name}")
            member.size, member.mtime = len(data), 1577836800
            tar.addfile(member, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(wheel folder, sdist folder, the run's site-packages): two wheels and gamma, built
    by uv from its sdist, in one venv."""
    root = tmp_path_factory.mktemp("sdist-env")
    wheels = standard_wheels(root / "wheels")
    site = install(root / "venv", list(wheels.values()))
    sdist = make_sdist(root / "sdists")
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--no-config", "--no-index",
                    "--no-deps", "--python", str(root / "venv" / "bin" / "python"),
                    str(sdist)], check=True, timeout=300)
    return root / "wheels", root / "sdists", site


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def _trust(m: Manifest) -> TrustDecision:
    """Trusted (as ``--trust``): an sdist is built only for a trusted manifest
    (``tests/test_pyenv_trust_first.py`` has the untrusted side)."""
    return check_trust(m, user_trusted=True)


def _with_hash(site: Path, sdist: Path) -> Manifest:
    """The record as pip writes it: the sdist's URL and its sha256 in ``archive_info``."""
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    return manifest_recording(site, edit={"gamma": {"direct_url": {
        "url": "file:///home/author/sdists/gamma-1.0.tar.gz", "archive_hash": f"sha256={sha}"}}})


def test_an_sdist_with_its_hash_is_rebuilt_from_it_and_proven(
        recorded: tuple[Path, Path, Path]) -> None:
    wheels, sdists, site = recorded
    m = _with_hash(site, sdists / "gamma-1.0.tar.gz")
    said: list[str] = []
    built = build_environment(m, trust=_trust(m), find_links=[wheels, sdists], note=said.append)
    found = {f.name: f for f in built.proof.findings}
    assert built.proof.proven, built.proof.to_json()
    assert found["gamma"].status is Status.IDENTICAL
    assert found["gamma"].reason.startswith("built here from its recorded sdist")
    assert any("built here from the recorded sdist: gamma" in s for s in said), said
    assert built.python is not None
    assert list(built.python.parent.parent.glob("lib/python*/site-packages/gamma/__init__.py"))


def test_another_file_of_the_sdists_name_is_not_it(recorded: tuple[Path, Path, Path],
                                                   tmp_path: Path) -> None:
    """The control of the one above: the same name with other bytes is vanished, said
    before anything is built."""
    wheels, sdists, site = recorded
    m = _with_hash(site, sdists / "gamma-1.0.tar.gz")
    other = make_sdist(tmp_path / "other", payload=b"Z = 4\n").parent
    built = build_environment(m, trust=_trust(m), find_links=[wheels, other])
    assert built.python is None and not built.proof.built
    (gamma,) = built.proof.findings
    assert gamma.status is Status.VANISHED
    assert "no source serves gamma-1.0.tar.gz with the recorded sha256" in gamma.reason


def test_an_sdist_without_a_hash_is_built_here_and_said(
        recorded: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """uv's own record (no hash), and an sdist an index served (only its wheel tag,
    linux_x86_64, says it was built here): neither is rebuilt, each is said plainly."""
    wheels, sdists, site = recorded
    for n, edit in enumerate(
            ({}, {"gamma": {"direct_url": None, "tags": ["cp311-cp311-linux_x86_64"]}})):
        m = manifest_recording(site, edit=edit)
        built = build_environment(m, trust=_trust(m), find_links=[wheels, sdists],
                                  cache_dir=tmp_path / f"envs-{n}")
        found = {f.name: f for f in built.proof.findings}
        assert found["gamma"].status is Status.BUILT_HERE
        assert "not rebuilt" in found["gamma"].reason or "no hash" in found["gamma"].reason
        assert found["alpha"].status is Status.IDENTICAL  # the rest is rebuilt
        assert built.proof.line() == "not proven: 2 of 3 identical, 1 built-here"
    assert "wheel tag cp311-cp311-linux_x86_64" in found["gamma"].reason


def test_the_lock_names_the_sdist_with_its_hash(recorded: tuple[Path, Path, Path]) -> None:
    """pylock.toml: a ``[packages.sdist]`` with the recorded sha256; an sdist with no hash
    is left out with its reason (a lock entry without a hash would install anything)."""
    import tomllib

    from manifest.pyenv.lock import build_lock

    wheels, sdists, site = recorded
    m = _with_hash(site, sdists / "gamma-1.0.tar.gz")
    lock = build_lock(m, trust=_trust(m), find_links=[wheels, sdists])
    packages = {p["name"]: p for p in tomllib.loads(lock.text)["packages"]}
    sha = hashlib.sha256((sdists / "gamma-1.0.tar.gz").read_bytes()).hexdigest()
    assert packages["gamma"]["sdist"]["hashes"] == {"sha256": sha}
    assert "wheels" in packages["alpha"]
    bare = manifest_recording(site, edit={"gamma": {"direct_url": None,
                                                    "tags": ["cp311-cp311-linux_x86_64"]}})
    lock = build_lock(bare, trust=_trust(bare), find_links=[wheels, sdists])
    assert "gamma" not in {p["name"] for p in tomllib.loads(lock.text)["packages"]}
    assert any(line.startswith("gamma==1.0: built here from an sdist") for line in lock.left_out)
