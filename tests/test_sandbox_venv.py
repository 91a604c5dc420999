"""A virtual environment inside the repository (README's ``.venv``) or under /tmp stays
visible to the confined re-run: the scratch tree is mounted over the repository and
/tmp is private, which hid it (verify then failed with "No module named 'torch'")."""

from __future__ import annotations

import sys
from pathlib import Path

from manifest.verify.sandbox import SandboxSpec, interpreter_binds, wrap


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
