"""The house stays one way up: no import circles, rooms in layers, the CLI on top.

Read from the source with ``ast`` (nothing is imported), counting every import: at
module level, inside functions (the lazy ones) and under ``TYPE_CHECKING``, since a
lazy import that runs back up is still a dependency that runs back up. A *room* is a
first-level package of ``manifest`` (``verify/``, ``rerun/`` …) or a top-level module
(``models.py``). ``docs/architecture.md`` draws the layers of :data:`LAYERS`; a new
room must be placed there, and an import that points to a higher layer, or a new
circle, fails here with the file, line and names involved.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "manifest"

LAYERS: list[set[str]] = [
    {"cli/", "__main__"},
    {"explain/", "lab/", "gate/", "integrations/"},
    {"verify/"},
    {"rerun/"},
    {"capture/", "diff/", "travel/", "pyenv/"},
    {"numeric/", "judge/", "nodes/", "data/", "probes/", "ops/", "export/", "launch/", "trust",
     "__init__"},
    {"canonical", "jcs", "store", "config", "weights/", "gitrun", "bounded", "schema"},
    {"models", "redact", "errors"},
]
"""Rooms from the top (index 0) down: a room imports only rooms of its own layer or below,
and rooms of one layer never import each other in a loop. ``docs/architecture.md``."""


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports() -> Iterator[Import]:
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                # ``from pkg import sub`` depends on ``pkg.sub``, not on ``pkg/__init__``
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target == "manifest" or target.startswith("manifest."):
                    resolved = _resolve(target)
                    if resolved is not None and resolved != name:
                        yield Import(name, resolved, node.lineno)


IMPORTS = list(_imports())


def room(module: str) -> str:
    """``manifest.verify.rerun`` → ``verify/``; ``manifest.models`` → ``models``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1] + "/"
    return parts[1]


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(circle: list[str], key: str) -> str:
    members = set(circle)
    ties = [f"{i.source}:{i.line} -> {i.target}" for i in IMPORTS
            if (i.source if key == "module" else room(i.source)) in members
            and (i.target if key == "module" else room(i.target)) in members
            and (key == "module" or room(i.source) != room(i.target))]
    return f"{circle}: " + "; ".join(sorted(set(ties))[:12])


def test_no_module_imports_itself_back_through_others() -> None:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        edges[i.source].add(i.target)
    circles = _circles(edges)
    assert not circles, "import circles:\n" + "\n".join(_describe(c, "module") for c in circles)


def test_rooms_do_not_import_each_other_in_a_loop() -> None:
    edges: dict[str, set[str]] = {room(m): set() for m in MODULES}
    for i in IMPORTS:
        if room(i.source) != room(i.target):
            edges[room(i.source)].add(room(i.target))
    circles = _circles(edges)
    assert not circles, "rooms in a circle:\n" + "\n".join(_describe(c, "room") for c in circles)


def _layer(name: str) -> int:
    for depth, rooms in enumerate(LAYERS):
        if name in rooms:
            return depth
    pytest.fail(f"room {name} is in no layer: place it in LAYERS and docs/architecture.md")


def test_every_room_has_a_layer_and_imports_only_down() -> None:
    upward = sorted({f"{i.source}:{i.line} ({room(i.source)}) -> {i.target} ({room(i.target)})"
                     for i in IMPORTS
                     if _layer(room(i.source)) > _layer(room(i.target))})
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_library_never_imports_the_cli() -> None:
    wrong = sorted({f"{i.source}:{i.line}" for i in IMPORTS
                    if room(i.target) == "cli/" and room(i.source) not in ("cli/", "__main__")})
    assert not wrong, "the CLI parses and renders; the library must not import it: " + ", ".join(
        wrong)


def test_the_layers_page_lists_the_same_layers() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for depth, rooms in enumerate(LAYERS):
        for name in rooms:
            shown = f"`{name}`" if name.endswith("/") or name.startswith("__") else f"`{name}.py`"
            assert shown in page, f"docs/architecture.md does not place {shown} (layer {depth})"


def test_the_checks_would_catch_a_circle() -> None:
    """Positive control: the circle finder sees a planted loop and a planted climb."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    assert room("manifest.verify.rerun") == "verify/"
    assert _layer("cli/") < _layer("verify/") < _layer("models")
