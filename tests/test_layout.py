"""README's "Layout" block names every module and package of ``manifest/``, and nothing else."""

from __future__ import annotations

import re

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
