"""An untrusted manifest runs none of its author's code through ``--env run``: its sdist
is not built (``built-here``, said), and verify's rebuild is refused before anything is
rebuilt, built or probed.

The sdist's build backend writes a marker file when it runs, so "it ran" is observed, not
inferred; each refusal has the trusted case beside it, where the marker does appear.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

import tests.test_pyenv_sdist as sdist_fixture
from manifest.errors import UntrustedManifestError
from manifest.models import Manifest
from manifest.pyenv.prove import Status
from manifest.pyenv.rebuild import UNTRUSTED_SDIST, build_environment
from manifest.trust import TrustDecision
from tests.pyenv_wheels import install, manifest_recording, standard_wheels, uv_bin

pytest.importorskip("uv")

TRUSTED = TrustDecision(True, "--trust", "user")
UNTRUSTED = TrustDecision(False, "refusing to run the manifest's command: it was not sealed "
                          "on this machine by manifest and carries no signature you trust",
                          "refused")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """(wheel folder, sdist folder, the run's site-packages, marker): gamma's sdist has a
    backend that writes ``marker`` when it builds; the author's own install ran it, and
    the marker is removed before the tests start."""
    root = tmp_path_factory.mktemp("trust-first")
    marker = root / "BACKEND-RAN"
    patched = sdist_fixture.BACKEND.replace(
        "def build_wheel(", f"Path({str(marker)!r}).write_text('ran')\n\n\ndef build_wheel(", 1)
    assert patched != sdist_fixture.BACKEND
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sdist_fixture, "BACKEND", patched)
        sdist = sdist_fixture.make_sdist(root / "sdists")
    wheels = standard_wheels(root / "wheels")
    site = install(root / "venv", list(wheels.values()))
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--no-config", "--no-index",
                    "--no-deps", "--python", str(root / "venv" / "bin" / "python"),
                    str(sdist)], check=True, timeout=300)
    assert marker.exists()  # the backend does write it when it runs
    return root / "wheels", root / "sdists", site, marker


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              recorded: tuple[Path, Path, Path, Path]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    recorded[3].unlink(missing_ok=True)


def _with_hash(site: Path, sdists: Path) -> Manifest:
    sha = hashlib.sha256((sdists / "gamma-1.0.tar.gz").read_bytes()).hexdigest()
    return manifest_recording(site, edit={"gamma": {"direct_url": {
        "url": "file:///home/author/sdists/gamma-1.0.tar.gz", "archive_hash": f"sha256={sha}"}}})


def test_an_untrusted_manifests_sdist_is_not_built(
        recorded: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    wheels, sdists, site, marker = recorded
    m = _with_hash(site, sdists)
    built = build_environment(m, trust=UNTRUSTED, find_links=[wheels, sdists],
                              cache_dir=tmp_path / "untrusted")
    found = {f.name: f for f in built.proof.findings}
    assert found["gamma"].status is Status.BUILT_HERE
    assert found["gamma"].reason == UNTRUSTED_SDIST
    assert found["alpha"].status is Status.IDENTICAL  # the wheels are still rebuilt
    assert not marker.exists(), "the sdist's build backend ran for an untrusted manifest"
    # positive control: trusted, the same record builds the sdist (the backend runs)
    built = build_environment(m, trust=TRUSTED, find_links=[wheels, sdists],
                              cache_dir=tmp_path / "trusted")
    assert built.proof.proven, built.proof.to_json()
    assert marker.exists()


def test_env_run_refuses_an_untrusted_manifest_before_anything_is_built(
        recorded: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    """verify and explain's path (``environment_for``): refused with one sentence, nothing
    in the cache, the backend never run, the venv's python never started."""
    from manifest.capture.snapshot import probe_machine
    from manifest.rerun.environment import RebuildOptions, environment_for

    wheels, sdists, site, marker = recorded
    m = _with_hash(site, sdists)
    options = RebuildOptions(find_links=(str(wheels), str(sdists)))
    machine = probe_machine()
    with pytest.raises(UntrustedManifestError) as refused:
        environment_for(m, machine, options, tree=tmp_path, trust=lambda: UNTRUSTED)
    assert "its environment is not rebuilt either (--env run)" in refused.value.message
    assert not marker.exists()
    assert not (tmp_path / "cache" / "manifest" / "envs").exists()  # nothing rebuilt
    # positive control: trusted, it is rebuilt (the backend ran), proven and probed
    used, probed = environment_for(m, machine, options, tree=tmp_path, trust=lambda: TRUSTED)
    assert used.python is not None and used.proof is not None
    assert used.line == "the run's environment (rebuilt, files identical)", used.line
    assert marker.exists()
    assert "gamma" in (probed[0].get("distributions") or {})
