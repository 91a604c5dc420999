"""Environment probe: versions, the installed-distribution set, allow-listed variables."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import blake3_name, canonical_bytes
from manifest.probes import env as env_probe
from manifest.probes.env import (
    NUMERICS_VARIABLES,
    distribution_paths,
    installed_distributions,
    normalise_name,
    numerics_variables,
    probe_container,
    probe_env,
    python_version,
    torch_build_info,
)

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345",
    "GITHUB_TOKEN": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
}


def _metadata_view(paths: list[str]) -> dict[str, str]:
    """importlib.metadata's answer: first distribution of each name on ``paths`` wins."""
    found: dict[str, str] = {}
    # The standard library's finder alone: importing the importlib_metadata backport
    # (mlflow and transformers do, in the integration tests) adds its own finder to
    # sys.meta_path, whose distributions raise on an empty dist-info.
    context = importlib.metadata.DistributionFinder.Context(path=paths)
    for dist in importlib.metadata.MetadataPathFinder.find_distributions(context):
        name = dist.metadata["Name"]
        if name and dist.version:
            found.setdefault(normalise_name(name), dist.version)
    found.pop("manifest", None)
    return found


def test_fast_scan_agrees_with_importlib_metadata_on_this_environment() -> None:
    paths = distribution_paths()
    fast = installed_distributions()
    assert fast == _metadata_view(paths)
    assert "pydantic" in fast
    assert "manifest" not in fast, "our own version belongs to observed, not identity"


def test_fast_scan_agrees_on_odd_layouts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    plain = site / "Plain_Pkg-1.2.3.dist-info"
    plain.mkdir()
    (plain / "METADATA").write_text("Metadata-Version: 2.1\nName: Plain.Pkg\nVersion: 1.2.3\n\n")
    egg_dir = site / "legacy_pkg.egg-info"
    egg_dir.mkdir()
    (egg_dir / "PKG-INFO").write_text(
        "Metadata-Version: 1.1\nName: legacy-pkg\nVersion: 0.9.dev1\nSummary: x\n\nbody\n")
    (site / "flat_egg-2.0-py3.11.egg-info").write_text(
        "Metadata-Version: 1.0\nName: flat-egg\nVersion: 2.0\n")
    broken = site / "broken-0.1.dist-info"
    broken.mkdir()
    first = tmp_path / "first"
    first.mkdir()
    shadow = first / "plain_pkg-9.9.dist-info"
    shadow.mkdir()
    (shadow / "METADATA").write_text("Name: plain-pkg\nVersion: 9.9\n")
    paths = [str(first), str(site)]
    fast = installed_distributions(paths)
    assert fast["plain-pkg"] == "9.9", "first on the path wins"
    assert fast["legacy-pkg"] == "0.9.dev1"
    assert fast["flat-egg"] == "2.0"
    view = _metadata_view(paths)
    assert {k: v for k, v in fast.items() if k != "broken"} == view


def test_working_directory_does_not_change_the_package_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "intruder.egg-info").mkdir()
    (tmp_path / "intruder.egg-info" / "PKG-INFO").write_text("Name: intruder\nVersion: 1\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path[1:]])
    if sys.flags.safe_path:  # pragma: no cover - python -P
        pytest.skip("sys.path[0] is not the script directory under -P")
    assert "intruder" not in installed_distributions()
    assert str(tmp_path) not in distribution_paths()


def test_python_version_matches_platform() -> None:
    assert python_version() == platform.python_version()


def test_probe_env_records_this_interpreter() -> None:
    env = probe_env()
    assert env.python == platform.python_version()
    assert env.implementation == sys.implementation.name
    listing = sorted(f"{n}=={v}" for n, v in env.packages.items())
    assert env.packages_digest == blake3_name(canonical_bytes(listing))
    assert env.numpy == env.packages.get("numpy")
    assert env.blas is None
    assert "blas" in env.unavailable
    if env.cuda_driver is None:
        assert "cuda_driver" in env.unavailable


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_build_facts_match_torch_itself() -> None:
    import torch

    facts = torch_build_info()
    assert facts is not None
    env = probe_env()
    assert env.torch == torch.__version__
    assert env.torch_cuda == torch.version.cuda
    assert env.torch_hip == torch.version.hip
    assert env.torch_git == torch.version.git_version


def test_no_torch_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    from manifest.probes.distributions import locate_distributions as real_scan

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "torch" else real_find_spec(name, *args, **kwargs)

    def without_torch(paths: Any) -> dict[str, Any]:
        return {k: v for k, v in real_scan(paths).items() if k != "torch"}

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(env_probe, "locate_distributions", without_torch)
    env = probe_env()
    assert env.torch is None
    assert env.torch_cuda is None
    assert env.torch_git is None
    assert env.unavailable["torch"] == "torch is not installed"
    assert "torch" not in env.packages


def test_only_allow_listed_variables_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = probe_env()
    assert env.variables["OMP_NUM_THREADS"] == "2"
    assert env.variables["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert set(env.variables) <= NUMERICS_VARIABLES
    dumped = env.model_dump_json()
    for key, value in SECRETS.items():
        assert key not in dumped
        assert value not in dumped


def test_allow_list_holds_no_secret_looking_names() -> None:
    for name in NUMERICS_VARIABLES:
        assert not any(word in name for word in ("TOKEN", "SECRET", "KEY", "PASSWORD")), name
    assert numerics_variables({"HF_TOKEN": "x", "PYTHONHASHSEED": "0"}) == {"PYTHONHASHSEED": "0"}


def test_container_from_variable(tmp_path: Path) -> None:
    given = "sha256:" + "ab" * 32
    got = probe_container({"MANIFEST_CONTAINER_IMAGE_DIGEST": given}, root=tmp_path)
    assert (got.runtime, got.image_digest, got.source) == (
        None, given, "MANIFEST_CONTAINER_IMAGE_DIGEST")


def test_container_podman(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text(f'engine="podman"\nimageid="{"cd" * 32}"\n')
    got = probe_container({}, root=tmp_path)
    assert got.runtime == "podman"
    assert got.image_digest == "sha256:" + "cd" * 32
    assert got.source == "/run/.containerenv"


def test_container_docker_and_kubernetes_have_no_digest(tmp_path: Path) -> None:
    (tmp_path / ".dockerenv").touch()
    assert probe_container({}, root=tmp_path).runtime == "docker"
    bare = tmp_path / "bare"
    bare.mkdir()
    k8s = probe_container({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, root=bare)
    assert (k8s.runtime, k8s.image_digest) == ("kubernetes", None)
    assert probe_container({}, root=bare).runtime is None
