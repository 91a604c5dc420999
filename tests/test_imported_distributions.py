"""``imported_distributions`` gives importlib.metadata's answer at a tenth of its cost.

``env.imported`` is in the run's identity, so the fast lookup
(``manifest/capture/observed.py``) must name exactly the distributions
``importlib.metadata.packages_distributions()`` maps the modules to. Checked
on this environment's real distributions (every module whose distribution
declares no ``top_level.txt`` is looked up alone, so one found through
another cannot hide a miss) and on planted ones whose file lists take each
of the paths importlib.metadata reads a top-level name from.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from manifest.capture.observed import _top_lines, imported_distributions
from manifest.probes.env import normalise_name


def _reference(modules: list[str]) -> list[str]:
    mapping = importlib.metadata.packages_distributions()
    return sorted({normalise_name(d) for m in modules for d in mapping.get(m, ())})


def test_every_module_of_this_environment_maps_as_importlib_maps_it() -> None:
    mapping = importlib.metadata.packages_distributions()
    assert len(mapping) > 20  # the environment has real distributions to compare on
    assert imported_distributions(list(mapping)) == _reference(list(mapping))
    undeclared = {d.metadata["Name"] for d in importlib.metadata.distributions()
                  if not (d.read_text("top_level.txt") or "").split()}
    inferred = {m for m, dists in mapping.items() if undeclared.intersection(dists)}
    assert inferred  # some distributions name their modules only through their files
    for module in sorted(inferred):
        expected = sorted({normalise_name(d) for d in mapping[module]})
        assert imported_distributions([module]) == expected, module
    assert imported_distributions(["no_such_module_anywhere"]) == []


PLANTED = {
    # name: (top_level.txt or None, RECORD lines)
    "lone-file": (None, ["lonemod.py,sha256=x,1", "lone_file-1.0.dist-info/RECORD,,"]),
    "dot-slash": (None, ["./dotmod/__init__.py,sha256=x,1"]),
    "quoted": (None, ['"quotedmod/a,b.py",sha256=x,1']),
    "package": (None, ["pkgmod/__init__.py,sha256=x,1", "../../bin/pkgmod,sha256=x,1"]),
    "declared": ("decl_mod\n", ["somewhere/else.py,sha256=x,1"]),
    "mid-path": (None, ["other/lonemod.py,sha256=x,1", "other/pkgmod/x.py,sha256=x,1"]),
    "no-record": (None, None),
    # lines split by U+2028, which splitlines() splits and a regex's ^ does not
    "line-sep": (None, "lsmod.py,sha256=x,1\u2028other.txt,,"),
    # an empty RECORD: importlib.metadata reads egg-info's SOURCES.txt instead
    "empty-record": (None, ""),
}
SOURCES = {"empty-record": "emptymod.py\n"}
ON_DISK = ["lonemod.py", "dotmod/__init__.py", "quotedmod/a,b.py", "pkgmod/__init__.py",
           "somewhere/else.py", "other/lonemod.py", "other/pkgmod/x.py", "lsmod.py",
           "emptymod.py"]
"""The listed files exist: the importlib_metadata backport (9.x), once a library imports
it, replaces the standard library's finder and drops listed files that are missing."""
MODULES = ["lonemod", "dotmod", "quotedmod", "pkgmod", "decl_mod", "other", "bin", "lsmod",
           "emptymod"]


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, (top, record) in PLANTED.items():
        info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        if top is not None:
            (info / "top_level.txt").write_text(top)
        if isinstance(record, str):
            (info / "RECORD").write_text(record)
        elif record is not None:
            (info / "RECORD").write_text("\n".join(record) + "\n")
        if name in SOURCES:
            (info / "SOURCES.txt").write_text(SOURCES[name])
    for listed in ON_DISK:
        (tmp_path / listed).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / listed).write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    return tmp_path


def test_planted_file_lists_map_as_importlib_maps_them(planted: Path) -> None:
    expected = _reference(MODULES)
    # importlib finds each of these through a different kind of path, and never
    # through a name that only appears further down a path
    assert expected == ["declared", "dot-slash", "empty-record", "line-sep", "lone-file",
                        "mid-path", "package", "quoted"]
    assert imported_distributions(MODULES) == expected
    for module in MODULES:
        assert imported_distributions([module]) == _reference([module]), module


def test_the_text_search_never_says_no_where_importlib_says_yes(planted: Path) -> None:
    record = (planted / "lone_file-1.0.dist-info" / "RECORD").read_text()
    # the unsafe twin: a search for "<name>/" alone misses a single-file module
    assert re.search(r"^lonemod/", record, re.MULTILINE) is None
    assert _top_lines(frozenset({"lonemod"})).search(record) is not None
    quoted = (planted / "quoted-1.0.dist-info" / "RECORD").read_text()
    assert _top_lines(frozenset({"quotedmod"})).search(quoted) is not None
    assert _top_lines(frozenset()).search(record) is None
