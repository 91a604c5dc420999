"""README's "Layout" block names every module and package of ``manifest/``, and nothing else;
no module outgrows what a reader holds in mind (500 lines) without saying why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.runs import REPO


def _layout_names() -> set[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names = set()
    for line in block.splitlines()[2:]:
        match = re.match(r"\s+(\S+)", line)
        if match:
            names.add(match.group(1).rstrip("/"))
    return names


def test_readme_layout_matches_the_package() -> None:
    package = REPO / "manifest"
    present = {
        p.name for p in package.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__main__.py")
    }
    assert _layout_names() == present


def test_layers_point_down_only() -> None:
    """The core modules import no verb, and no verb imports the CLI."""
    core = ["errors", "models", "canonical", "schema", "config", "store", "gitrun"]
    upper = ("manifest.cli", "manifest.capture", "manifest.verify", "manifest.diff",
             "manifest.gate")
    for name in core:
        source = (REPO / "manifest" / f"{name}.py").read_text(encoding="utf-8")
        for target in upper:
            assert f"from {target}" not in source, f"{name}.py imports {target}"
    for package in ("capture", "verify", "diff", "gate", "data", "weights", "probes", "launch"):
        for path in (REPO / "manifest" / package).rglob("*.py"):
            assert "from manifest.cli" not in path.read_text(encoding="utf-8"), path


def _package_lines() -> dict[str, str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    lines = {}
    for line in block.splitlines()[2:]:
        match = re.match(r"\s+(\S+)/\s+(.*)", line)
        if match:
            lines[match.group(1)] = match.group(2)
    return lines


def test_each_package_line_names_its_modules() -> None:
    """A newcomer finds every module from the listing: a package's line names each one
    (``render*`` stands for the renderers)."""
    lines = _package_lines()
    missing = []
    for package, description in lines.items():
        for path in (REPO / "manifest" / package).rglob("*.py"):
            name = path.stem
            if name in ("__init__", "__main__") or (name.startswith("render")
                                                    and "render*" in description):
                continue
            if not re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", description):
                missing.append(f"{package}/{path.relative_to(REPO / 'manifest' / package)}")
    assert missing == []


MAX_LINES = 500
LONG_MARK = "Longer than 500 lines because"


def oversized(root: Path) -> list[str]:
    """Modules over :data:`MAX_LINES` whose docstring does not say why (``LONG_MARK``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_LINES and LONG_MARK not in (ast.get_docstring(ast.parse(text)) or ""):
            found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_no_module_over_500_lines_unless_its_docstring_says_why(tmp_path: Path) -> None:
    assert oversized(REPO / "manifest") == []
    # Positive control: a long module is caught, and its reason lets it pass.
    (tmp_path / "long.py").write_text('"""A module."""\n' + "x = 1\n" * 600)
    assert oversized(tmp_path) == ["long.py (601 lines)"]
    (tmp_path / "long.py").write_text(f'"""A module. {LONG_MARK} ..."""\n' + "x = 1\n" * 600)
    assert oversized(tmp_path) == []
