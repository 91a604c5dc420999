"""``manifest env lock|build``: exit statuses, one sentence per refusal, the proof printed."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from manifest.cli.app import main
from tests.pyenv_wheels import install, manifest_recording, standard_wheels, write_manifest

pytest.importorskip("uv")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheelhouse, RUN.json) of an environment of two wheels."""
    root = tmp_path_factory.mktemp("cli-env")
    wheels = standard_wheels(root / "wheels")
    site = install(root / "venv", list(wheels.values()))
    return root / "wheels", write_manifest(manifest_recording(site), root / "run.json")


@pytest.fixture(autouse=True)
def _own_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)


def test_env_build_prints_the_python_and_the_proof(run: tuple[Path, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    wheels, manifest = run
    assert main(["env", "build", str(manifest), "--find-links", str(wheels)]) == 0
    out = capsys.readouterr().out
    assert "rebuilt: 2 distributions, files identical to the run's" in out
    assert main(["env", "build", str(manifest), "--find-links", str(wheels), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["proven"] and doc["cached"] and Path(doc["python"]).exists()
    assert [d["status"] for d in doc["distributions"]] == ["identical", "identical"]


def test_env_build_with_a_vanished_wheel_builds_nothing_and_exits_3(
        run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, manifest = run
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["env", "build", str(manifest), "--find-links", str(empty)]) == 3
    out = capsys.readouterr().out
    assert "python: none (not built)" in out
    assert "alpha 1.0: vanished (no source serves its file)" in out


def test_env_lock_writes_a_pylock(run: tuple[Path, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    wheels, manifest = run
    out = tmp_path / "pylock.toml"
    assert main(["env", "lock", str(manifest), "--find-links", str(wheels), "-o", str(out)]) == 0
    assert [p["name"] for p in tomllib.loads(out.read_text())["packages"]] == ["alpha",
                                                                               "beta-lib"]
    assert "locked 2 distributions" in capsys.readouterr().err
    assert main(["env", "lock", str(manifest)]) == 3  # no source: nothing is served
    err = capsys.readouterr().err
    assert "no lock written" in err and "alpha==1.0" in err


def test_env_without_uv_says_how_to_install_it(run: tuple[Path, Path],
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    wheels, manifest = run
    monkeypatch.setitem(sys.modules, "uv", None)  # ``import uv`` raises ImportError
    assert main(["env", "build", str(manifest), "--find-links", str(wheels)]) == 2
    err = capsys.readouterr().err
    assert "torch-manifest[rebuild]" in err and err.count("\n") == 1 and "Traceback" not in err


def test_env_refuses_a_hostile_index_and_a_missing_folder(
        run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, manifest = run
    assert main(["env", "build", str(manifest), "--index-url",
                 "https://user:hunter2@example.org/simple"]) == 2
    err = capsys.readouterr().err
    assert "carries credentials" in err and "hunter2" not in err and err.count("\n") == 1
    assert main(["env", "build", str(manifest), "--find-links", "/nonexistent"]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["env"]) == 2
    assert "needs an action" in capsys.readouterr().err


def test_the_cli_reference_lists_the_env_actions_and_their_options() -> None:
    from tests.test_docs_reference import _gen_ref

    page = _gen_ref().render("reference/cli.md")
    for heading in ("### env lock", "### env build"):
        assert heading in page
    for option in ("--find-links DIR", "--index-url URL", "--trust", "-o, --out FILE"):
        assert option in page
