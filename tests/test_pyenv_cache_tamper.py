"""A cached rebuilt environment that was tampered with is never reported "files identical":
each attack is planted in a real venv built by uv from small local wheels, and the honest
cache beside it (built, then found again and proven) is the positive control.

Planted: a ``.pth`` (runs at every start) and a distribution the record lacks; a ``.pyc``
in ``__pycache__`` that replaces a module; ``bin/python`` and ``pyvenv.cfg`` edited; a whole
venv with no stamp of this user's under the key's folder; a group-writable cache folder;
a recorded file edited with its size and mtime put back.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.models import Manifest
from manifest.pyenv.prove import Status, site_packages
from manifest.pyenv.rebuild import BuiltEnvironment, build_environment
from manifest.trust import TrustDecision
from tests.pyenv_wheels import install, manifest_recording, standard_wheels

pytest.importorskip("uv")

TRUSTED = TrustDecision(True, "--trust", "user")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    root = tmp_path_factory.mktemp("tamper")
    wheels = standard_wheels(root / "wheels")
    return root / "wheels", manifest_recording(install(root / "venv", list(wheels.values())))


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def _build(recorded: tuple[Path, Manifest], envs: Path,
           said: list[str] | None = None) -> BuiltEnvironment:
    wheels, m = recorded
    return build_environment(m, trust=TRUSTED, find_links=[wheels], cache_dir=envs,
                             note=(said if said is not None else []).append)


def _honest(recorded: tuple[Path, Manifest], envs: Path) -> tuple[BuiltEnvironment, Path]:
    """The positive control: built, then found in the cache, proven both times."""
    first = _build(recorded, envs)
    again = _build(recorded, envs)
    assert first.proof.proven and not first.cached, first.proof.to_json()
    assert again.proof.proven and again.cached and again.python == first.python
    assert again.python is not None
    return again, again.python.parent.parent


def test_the_stamp_is_kept_outside_the_venv(recorded: tuple[Path, Manifest],
                                            tmp_path: Path) -> None:
    _, venv = _honest(recorded, tmp_path / "envs")
    assert not list(venv.glob("manifest-env*.json"))
    stamps = list((tmp_path / "xdg" / "manifest" / "env-stamps").glob("*.json"))
    assert len(stamps) == 1
    assert (stamps[0].parent.stat().st_mode & 0o777) == 0o700


def test_a_planted_pth_and_an_unrecorded_distribution_fail_the_proof(
        recorded: tuple[Path, Manifest], tmp_path: Path) -> None:
    _, venv = _honest(recorded, tmp_path / "envs")
    site = site_packages(venv)
    (site / "zz_hook.pth").write_text("import sys; sys.stderr.write('HOOK RAN\\n')\n")
    used = _build(recorded, tmp_path / "envs")
    assert used.python is None, "a venv with a planted .pth was handed out to run"
    assert used.proof.unexpected == ("zz_hook.pth",)
    assert used.proof.line() == "not proven: unexpected files: zz_hook.pth"
    assert not used.proof.proven
    (site / "zz_hook.pth").unlink()
    assert _build(recorded, tmp_path / "envs").proof.proven  # control: removed, proven again
    extra = site / "evil-1.0.dist-info"
    extra.mkdir()
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    used = _build(recorded, tmp_path / "envs")
    assert "evil-1.0.dist-info (a distribution not in the record)" in used.proof.unexpected
    assert "evil-1.0.dist-info/METADATA" in used.proof.unexpected


def _plant_pyc(source: Path) -> None:
    """Bytecode for ``source`` whose header matches it (mtime, size): Python would load it."""
    st = source.stat()
    code = compile("X = 1\nimport sys; sys.stderr.write('PLANTED BYTECODE RAN\\n')\n",
                   str(source), "exec")
    pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
                    + int(st.st_mtime).to_bytes(4, "little")
                    + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))


def test_a_planted_pyc_is_never_read(recorded: tuple[Path, Manifest], tmp_path: Path) -> None:
    """The re-run's environment (``RunEnvironment.apply``) and the probe's ``-X
    pycache_prefix`` keep the venv's ``__pycache__`` out of reach."""
    from manifest.rerun.environment import RunEnvironment
    from manifest.rerun.interpreter import probe_env_in

    used, venv = _honest(recorded, tmp_path / "envs")
    assert used.python is not None
    _plant_pyc(site_packages(venv) / "alpha" / "__init__.py")
    plain = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # positive control: without the prefix the planted bytecode runs
    ran = subprocess.run([str(used.python), "-c", "import alpha"], env=plain,
                         capture_output=True, text=True, timeout=120, check=True)
    assert "PLANTED BYTECODE RAN" in ran.stderr
    again = _build(recorded, tmp_path / "envs")
    assert again.proof.proven and again.python == used.python  # __pycache__: not the proof's
    env = RunEnvironment("rebuilt", again.python).apply(plain)
    assert env["PYTHONPYCACHEPREFIX"] and os.path.isdir(env["PYTHONPYCACHEPREFIX"])
    ran = subprocess.run([str(again.python), "-c", "import alpha; print(alpha.X)"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert ran.stdout.strip() == "1" and "PLANTED" not in ran.stderr
    doc = probe_env_in(again.python, {})
    assert "alpha" in (doc.get("distributions") or {})


def test_an_edited_bin_python_or_pyvenv_cfg_is_rebuilt(recorded: tuple[Path, Manifest],
                                                       tmp_path: Path) -> None:
    _, venv = _honest(recorded, tmp_path / "envs")
    python = venv / "bin" / "python"
    real = os.path.realpath(python)
    python.unlink()
    python.write_text(f"#!/bin/sh\necho WRAPPER RAN >&2\nexec {real} \"$@\"\n")
    python.chmod(0o755)
    said: list[str] = []
    again = _build(recorded, tmp_path / "envs", said)
    assert not again.cached and again.proof.proven
    assert any("bin/python does not resolve to the interpreter it was built from" in s
               for s in said), said
    assert os.path.realpath(venv / "bin" / "python") == real
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("include-system-site-packages = false",
                                           "include-system-site-packages = true"))
    said.clear()
    again = _build(recorded, tmp_path / "envs", said)
    assert not again.cached and again.proof.proven
    assert any("its pyvenv.cfg is not what a fresh build writes" in s for s in said), said
    assert "include-system-site-packages = false" in cfg.read_text()


def test_a_venv_with_no_stamp_of_this_users_is_used_only_when_proven(
        recorded: tuple[Path, Manifest], tmp_path: Path) -> None:
    _, venv = _honest(recorded, tmp_path / "envs")
    # control: an honest copy elsewhere (another node's shared cache) is hashed and used
    honest = tmp_path / "honest"
    honest.mkdir(mode=0o755)
    shutil.copytree(venv, honest / venv.name, symlinks=True)
    used = _build(recorded, honest)
    assert used.cached and used.proof.proven
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    shutil.copytree(venv, planted / venv.name, symlinks=True)
    (site_packages(planted / venv.name) / "alpha" / "data.txt").write_text("attacker\n")
    said: list[str] = []
    used = _build(recorded, planted, said)
    assert not used.cached and used.proof.proven, used.proof.to_json()
    assert any("it is no copy this user built" in s for s in said), said
    assert (site_packages(planted / venv.name) / "alpha" / "data.txt").read_text() == "weights\n"


def test_a_group_writable_cache_is_not_used(recorded: tuple[Path, Manifest],
                                            tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    said: list[str] = []
    used = _build(recorded, shared, said)
    assert used.proof.proven and used.python is not None
    assert any(s.startswith(f"not using the environment cache {shared}: it is writable by "
                            "its group or by others") for s in said), said
    assert shared not in used.python.parents
    assert (tmp_path / "xdg" / "manifest" / "envs") in used.python.parents
    shared.chmod(0o755)  # control: private, it is used
    used = _build(recorded, shared)
    assert used.python is not None and shared in used.python.parents


def test_an_edit_with_size_and_mtime_put_back_is_named(recorded: tuple[Path, Manifest],
                                                       tmp_path: Path) -> None:
    _, venv = _honest(recorded, tmp_path / "envs")
    data = site_packages(venv) / "alpha" / "data.txt"
    st = data.stat()
    data.write_text("WEIGHTS\n")  # same size
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    used = _build(recorded, tmp_path / "envs")
    found = {f.name: f.status for f in used.proof.findings}
    assert found == {"alpha": Status.OTHER_BUILD, "beta-lib": Status.IDENTICAL}


def test_a_jobs_own_env_folder_is_made_private_and_used(recorded: tuple[Path, Manifest],
                                                       tmp_path: Path) -> None:
    """``--env-cache`` (Kubernetes' emptyDir is 0777): owned by this user, it is made 0700
    and used; the test above is the control (a cache folder not given as the job's own is
    not changed, and not used)."""
    from manifest.rerun.environment import RebuildOptions, for_cluster, on_node

    wheels, m = recorded
    mount = tmp_path / "manifest-env"
    mount.mkdir()
    mount.chmod(0o777)
    tree = tmp_path / "tree"
    tree.mkdir()
    _, request = for_cluster(m, RebuildOptions(find_links=(str(wheels),)), trust=TRUSTED,
                             tree=tree)
    used = on_node(request, tree=tree, cache_dir=mount)
    assert used.venv is not None and mount in used.venv.parents
    assert (mount.stat().st_mode & 0o777) == 0o700
    assert used.proof is not None and used.proof["proven"]
