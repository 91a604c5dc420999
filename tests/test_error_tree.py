"""Every error the library defines is in ``manifest/errors.py``'s tree.

The CLI turns a ``ManifestError`` into one sentence and its exit status; an exception
class that derives from ``Exception`` itself would reach the user as an internal error.
The check reads the source (no optional library is imported): a class outside
``errors.py`` whose bases name ``Exception`` or ``BaseException`` is refused, except the
ones below, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "manifest"
ALLOWED = {
    ("verify/conventions.py", "_CannotTell"):
        "private control flow of one function's search; caught in its module",
}
"""(module, class) -> why it may derive from Exception directly."""


def outside_the_tree(source: str) -> list[str]:
    """Classes in ``source`` that derive from Exception or BaseException directly."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                     for b in node.bases}
            if names & {"Exception", "BaseException"}:
                found.append(node.name)
    return found


def test_every_error_class_is_in_the_tree() -> None:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        # errors.py is the tree; launch/boot runs inside the user's process, standard
        # library only, and never raises to the CLI.
        if rel == "errors.py" or rel.startswith("launch/boot/"):
            continue
        stray += [f"{rel}: {name}" for name in outside_the_tree(path.read_text())
                  if (rel, name) not in ALLOWED]
    assert stray == []


def test_the_check_finds_a_class_outside_the_tree() -> None:
    planted = "import builtins\nclass A(Exception): pass\nclass B(builtins.BaseException): pass\n"
    assert outside_the_tree(planted) == ["A", "B"]
    assert outside_the_tree("from manifest.errors import ManifestError\n"
                            "class C(ManifestError): pass\n") == []


@pytest.mark.parametrize(("name", "base", "status"), [
    ("WeightFileError", "ManifestError", 2), ("MalformedWeightsError", "WeightFileError", 2),
    ("MissingSecretsError", "UsageError", 2)])
def test_moved_errors_keep_their_names_and_exit_status(name: str, base: str,
                                                       status: int) -> None:
    import manifest.errors as errors
    from manifest.redact import MissingSecretsError
    from manifest.weights.bounds import MalformedWeightsError, WeightFileError

    cls = getattr(errors, name)
    assert cls.__mro__[1] is getattr(errors, base) and cls.exit_code == status
    assert cls in (MissingSecretsError, MalformedWeightsError, WeightFileError)
