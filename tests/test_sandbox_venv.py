"""A virtual environment inside the repository (README's ``.venv``) or under /tmp stays
visible to the confined re-run: the scratch tree is mounted over the repository and
/tmp is private, which hid it (verify then failed with "No module named 'torch'")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import manifest
from manifest.rerun.sandbox import SandboxSpec, interpreter_binds, wrap


def _ro_binds(args: list[str]) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == "--ro-bind"]


def test_a_venv_inside_the_repository_is_bound_back(tmp_path: Path) -> None:
    prefix = Path(sys.prefix).resolve()
    repo = prefix.parent  # as if the venv were <repo>/.venv
    args = wrap(SandboxSpec(scratch=tmp_path, mount_at=repo), ["python", "-c", "1"], repo)
    assert (str(prefix), str(prefix)) in _ro_binds(args)
    # After the tree's own bind, so it lands on top of the scratch clone.
    assert args.index("--bind") < args.index(str(prefix))


def test_a_venv_outside_the_repository_and_tmp_is_left_to_the_system_bind(
        tmp_path: Path) -> None:
    prefix = Path(sys.prefix).resolve()
    elsewhere = tmp_path / "repo"
    binds = interpreter_binds(elsewhere)
    if prefix.is_relative_to("/tmp"):
        assert prefix in binds
    else:
        assert prefix not in binds


def _checkout(base: Path) -> Path:
    init = base / "manifest" / "__init__.py"
    init.parent.mkdir(parents=True)
    init.write_text("")
    return base


def test_this_package_installed_from_a_checkout_under_tmp_is_bound_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI clones under /tmp and installs editable: hidden, the launcher's sitecustomize
    # would not load and the script's `import manifest` would fail.
    checkout = _checkout(tmp_path / "checkout")
    monkeypatch.setattr(manifest, "__file__", str(checkout / "manifest" / "__init__.py"))
    assert checkout.resolve() in interpreter_binds(tmp_path / "repo")


def test_nothing_inside_or_around_the_repository_is_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "outer" / "repo"
    (repo / "src").mkdir(parents=True)
    # The package's checkout holds the repository: binding it would cover the scratch tree.
    _checkout(tmp_path / "outer")
    monkeypatch.setattr(manifest, "__file__", str(tmp_path / "outer" / "manifest" / "x.py"))
    # sys.path entries in the user's tree (cwd, PYTHONPATH=src) must not replace the
    # scratch clone's files.
    monkeypatch.setattr(sys, "path", [str(repo), str(repo / "src"), *sys.path])
    binds = interpreter_binds(repo)
    assert all(not b.is_relative_to(repo.resolve()) or b == Path(sys.prefix).resolve()
               for b in binds)
    assert (tmp_path / "outer").resolve() not in binds
