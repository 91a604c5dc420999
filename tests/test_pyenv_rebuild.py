"""Rebuild a recorded environment with uv and prove it, offline: wheels made here, served
from a find-links folder and from a simple index on 127.0.0.1, installed into a real venv,
recorded by the capture probe, rebuilt and proven."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from manifest.models import Manifest
from manifest.pyenv.cache import cache_root
from manifest.pyenv.prove import Status
from manifest.pyenv.rebuild import build_environment, scrubbed_environment
from manifest.trust import TrustDecision, check_trust
from tests.pyenv_wheels import (
    install,
    make_wheel,
    manifest_recording,
    serving,
    simple_index,
    standard_wheels,
    uv_bin,
)

pytest.importorskip("uv")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheelhouse, the run's site-packages): two wheels installed by uv into a venv."""
    root = tmp_path_factory.mktemp("run-env")
    wheels = standard_wheels(root / "wheels")
    site = install(root / "venv", list(wheels.values()))
    return root / "wheels", site


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache and a data dir of the test's own: nothing sealed here, uv's cache empty."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def _untrusted(m: Manifest) -> TrustDecision:
    return check_trust(m)


def test_rebuild_from_find_links_is_identical_and_the_second_is_cached(
        recorded: tuple[Path, Path]) -> None:
    wheels, site = recorded
    m = manifest_recording(site)
    built = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert built.proof.proven, built.proof.to_json()
    assert built.proof.line() == "rebuilt: 2 distributions, files identical to the run's"
    assert [f.name for f in built.proof.findings] == ["alpha", "beta-lib"]
    assert built.python is not None and built.python.is_relative_to(cache_root())
    out = subprocess.run([str(built.python), "-c", "import alpha, beta_lib; "
                          "print(alpha.X + beta_lib.Y)"], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "3"
    again = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert again.cached and again.python == built.python and again.proof.proven


def test_rebuild_from_a_simple_index_on_localhost(recorded: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    wheels, site = recorded
    index = simple_index(tmp_path / "index", sorted(wheels.glob("*.whl")))
    m = manifest_recording(site)
    with serving(index) as base:
        built = build_environment(m, trust=_untrusted(m), index_urls=[f"{base}/simple"])
    assert built.proof.proven, built.proof.to_json()
    assert built.plan.index_urls == (f"{base}/simple",)


def test_a_file_edited_in_the_rebuilt_env_is_named_and_never_reaches_uvs_cache(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    """A script that edits an installed file edits the venv's copy (--link-mode copy): the
    cached venv's next proof names the distribution, and a fresh rebuild from uv's cache
    is identical again."""
    wheels, site = recorded
    m = manifest_recording(site)
    built = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert built.python is not None
    edited = next(built.python.parent.parent.glob("lib/python*/site-packages/alpha/data.txt"))
    edited.write_text("other weights\n")
    again = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert again.cached and not again.proof.proven
    assert [(f.name, f.status) for f in again.proof.differing()] == [
        ("alpha", Status.OTHER_BUILD)]
    assert again.proof.line() == "not proven: 1 of 2 identical, 1 other-build"
    fresh = build_environment(m, trust=_untrusted(m), find_links=[wheels],
                              cache_dir=tmp_path / "elsewhere")
    assert not fresh.cached and fresh.proof.proven


def test_the_same_version_with_other_files_is_an_other_build(recorded: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    wheels, site = recorded
    m = manifest_recording(site)
    other = tmp_path / "other"
    shutil.copytree(wheels, other)
    make_wheel(other, "alpha", "1.0", {"alpha/__init__.py": b"X = 1\n",
                                       "alpha/data.txt": b"retrained\n"})
    built = build_environment(m, trust=_untrusted(m), find_links=[other])
    assert built.python is not None
    assert {f.name: f.status for f in built.proof.findings} == {
        "alpha": Status.OTHER_BUILD, "beta-lib": Status.IDENTICAL}


def test_a_vanished_wheel_is_named_before_anything_is_built(recorded: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    wheels, site = recorded
    m = manifest_recording(site)
    partial = tmp_path / "partial"
    shutil.copytree(wheels, partial)
    next(partial.glob("beta_lib-*.whl")).unlink()
    # positive control: with the wheel there, the same folder builds
    built = build_environment(m, trust=_untrusted(m), find_links=[partial])
    assert built.python is None and not built.proof.built
    assert [(f.name, f.status) for f in built.proof.findings] == [
        ("beta-lib", Status.VANISHED)]
    assert built.proof.line() == "not rebuilt: 1 vanished; no environment was built"
    assert not any(cache_root().glob("*/bin/python")), "something was built"
    shutil.copy2(next(wheels.glob("beta_lib-*.whl")), partial)
    assert build_environment(m, trust=_untrusted(m), find_links=[partial]).proof.proven


def test_recorded_sources_are_used_only_when_trusted(recorded: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    wheels, site = recorded
    index = simple_index(tmp_path / "index", sorted(wheels.glob("*.whl")))
    with serving(index) as base:
        m = manifest_recording(site, sources={"indexes": [f"{base}/simple"], "find_links": [],
                                              "origin": "test"})
        untrusted = build_environment(m, trust=_untrusted(m))
        assert untrusted.python is None
        assert untrusted.plan.withheld == (f"{base}/simple",)
        assert {f.status for f in untrusted.proof.findings} == {Status.VANISHED}
        assert f"recorded, not used: {base}/simple" in untrusted.plan.lines()
        trusted = build_environment(m, trust=check_trust(m, user_trusted=True))
        assert trusted.proof.proven and trusted.plan.index_urls == (f"{base}/simple",)


def test_the_machines_pip_and_uv_configuration_never_leaks_in(
        recorded: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A uv.toml, UV_* and PIP_* variables naming another build of alpha 1.0 and a
    constraint that excludes it: plain uv follows them (positive control); the rebuild
    does not."""
    wheels, site = recorded
    m = manifest_recording(site)
    evil = tmp_path / "evil"
    make_wheel(evil, "alpha", "1.0", {"alpha/__init__.py": b"X = 666\n",
                                      "alpha/data.txt": b"planted\n"})
    config = tmp_path / "config"
    (config / "uv").mkdir(parents=True)
    (config / "uv" / "uv.toml").write_text(f'find-links = ["{evil}"]\n')
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("beta-lib<2\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("UV_FIND_LINKS", str(evil))
    monkeypatch.setenv("UV_CONSTRAINT", str(constraints))
    monkeypatch.setenv("PIP_FIND_LINKS", str(evil))
    monkeypatch.setenv("PIP_CONSTRAINT", str(constraints))
    # positive control: plain uv, in this environment, takes the planted wheel first
    plain = tmp_path / "plain"
    uv = uv_bin()
    subprocess.run([uv, "venv", "--quiet", str(plain)], check=True, timeout=300)
    leaked = subprocess.run([uv, "pip", "install", "--no-deps", "--python",
                             str(plain / "bin" / "python"), "--find-links", str(wheels),
                             "alpha==1.0", "beta-lib==2.0+cpu"], capture_output=True,
                            text=True, timeout=300, check=False)
    assert leaked.returncode != 0 and "beta-lib" in leaked.stderr, leaked.stderr  # constraint
    subprocess.run([uv, "pip", "install", "--quiet", "--no-deps", "--python",
                    str(plain / "bin" / "python"), "alpha==1.0"], check=True, timeout=300)
    assert "666" in next(plain.glob("lib/python*/site-packages/alpha/__init__.py")).read_text()
    built = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert built.proof.proven, built.proof.to_json()
    assert "evil" not in " ".join(built.plan.lines())
    assert not any(k.startswith(("UV_", "PIP_")) for k in scrubbed_environment())


def test_a_hostile_name_is_refused_before_uv_runs(recorded: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    from manifest.pyenv.sources import HostileRecordError

    wheels, site = recorded
    m = manifest_recording(site, edit={"--index-url=http://127.0.0.1:9/": {
        "version": "1.0", "tags": ["py3-none-any"], "installer": "pip", "direct_url": None,
        "files": None}})
    with pytest.raises(HostileRecordError, match="read as an option"):
        build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert not cache_root().exists() or not any(cache_root().iterdir())


def test_the_lock_reads_back_and_uv_installs_it_without_manifest(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    from manifest.pyenv.lock import build_lock

    wheels, site = recorded
    m = manifest_recording(site)
    lock = build_lock(m, trust=_untrusted(m), find_links=[wheels])
    assert lock.vanished == ()
    data = tomllib.loads(lock.text)
    assert data["lock-version"] == "1.0" and data["created-by"] == "torch-manifest"
    assert [p["name"] for p in data["packages"]] == ["alpha", "beta-lib"]
    beta = data["packages"][1]
    assert beta["version"] == "2.0+cpu"
    assert beta["wheels"][0]["name"] == "beta_lib-2.0+cpu-py3-none-any.whl"
    assert len(beta["wheels"][0]["hashes"]["sha256"]) == 64
    assert beta["tool"]["manifest"]["files"] == m.env.distributions["beta-lib"].files  # type: ignore[index]
    assert data["tool"]["manifest"]["run-id"] == m.run_id
    path = tmp_path / "pylock.toml"
    path.write_text(lock.text)
    venv = tmp_path / "from-lock"
    uv = uv_bin()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    subprocess.run([uv, "venv", "--quiet", "--no-config", str(venv)], check=True, timeout=300,
                   env=env)
    subprocess.run([uv, "pip", "install", "--quiet", "--no-config", "--preview-features",
                    "pylock", "--python", str(venv / "bin" / "python"), "-r", str(path)],
                   check=True, timeout=300, env=env)
    from manifest.probes.distributions import probe_distributions

    site2 = next(venv.glob("lib/python*/site-packages"))
    assert {k: d.files for k, d in probe_distributions([str(site2)]).items()} == {
        k: d.files for k, d in m.env.distributions.items()}  # type: ignore[union-attr]


def test_a_vanished_wheel_leaves_no_partial_lock(recorded: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    from manifest.pyenv.lock import build_lock

    wheels, site = recorded
    m = manifest_recording(site)
    only_alpha = tmp_path / "only-alpha"
    only_alpha.mkdir()
    shutil.copy2(next(wheels.glob("alpha-*.whl")), only_alpha)
    lock = build_lock(m, trust=_untrusted(m), find_links=[only_alpha])
    assert lock.vanished == ("beta-lib==2.0+cpu",)


def test_an_editable_install_is_built_here_and_not_claimed(recorded: tuple[Path, Path]) -> None:
    """The project's own checkout (an editable install) is built from code by the verb that
    re-runs it: the rebuild installs the rest, names it, and does not call itself proven."""
    wheels, site = recorded
    m = manifest_recording(site, edit={"alpha": {"direct_url": {
        "url": "file:///home/author/alpha", "editable": True}}})
    built = build_environment(m, trust=_untrusted(m), find_links=[wheels])
    assert built.python is not None
    assert {f.name: f.status for f in built.proof.findings} == {
        "alpha": Status.BUILT_HERE, "beta-lib": Status.IDENTICAL}
    assert built.proof.line() == "not proven: 1 of 2 identical, 1 built-here"
    assert not list(built.python.parent.parent.glob("lib/python*/site-packages/alpha"))


def test_a_lock_against_an_index_names_it_and_its_files(recorded: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    from manifest.pyenv.lock import build_lock

    wheels, site = recorded
    index = simple_index(tmp_path / "index", sorted(wheels.glob("*.whl")))
    m = manifest_recording(site)
    with serving(index) as base:
        lock = build_lock(m, trust=_untrusted(m), index_urls=[f"{base}/simple"])
    packages = tomllib.loads(lock.text)["packages"]
    assert {p["index"] for p in packages} == {f"{base}/simple"}
    assert packages[1]["wheels"][0]["url"] == f"{base}/files/beta_lib-2.0%2Bcpu-py3-none-any.whl"
    found = tomllib.loads(build_lock(m, trust=_untrusted(m), find_links=[wheels]).text)
    assert not any("index" in p for p in found["packages"])  # a folder is no index


def test_a_broken_cache_entry_is_replaced_and_a_raced_one_kept(tmp_path: Path) -> None:
    from manifest.pyenv import cache

    root = tmp_path / "envs"
    key = "blake3:" + "f" * 64
    (root / ("f" * 64) / "junk").mkdir(parents=True)  # no stamp: never trusted
    first = cache.staging(root)
    (first / "one").write_text("1")
    assert cache.publish(root, key, first, {"proof": None}) == root / ("f" * 64)
    assert (root / ("f" * 64) / "one").exists() and not (root / ("f" * 64) / "junk").exists()
    second = cache.staging(root)  # a rebuild that lost the race
    (second / "two").write_text("2")
    assert cache.publish(root, key, second, {"proof": None}) == root / ("f" * 64)
    assert not second.exists() and not (root / ("f" * 64) / "two").exists()
    assert cache.lookup(root, key) is not None
