"""The documentation as a reader meets it: built with the ``docs`` extra alone, and read
on GitHub, where nothing is built.

The build imports ``docs/gen_*.py`` hooks; the session filler borrows the docs tests'
runner, which needs pytest (the ``dev`` extra). These tests build the site with pytest
made unimportable and follow every relative link of README and docs/ as GitHub does,
to a file in the repository.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.runs import REPO

DOCS = REPO / "docs"

# mkdocs in a process where pytest cannot be imported, as after `pip install '.[docs]'`.
BUILD_WITHOUT_PYTEST = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"pytest", "_pytest"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from mkdocs.__main__ import cli
sys.argv = ["mkdocs", "build", "--strict", "-q", "--site-dir", sys.argv[1]]
cli()
"""

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _gen_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_with_the_docs_extra_alone(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-c", BUILD_WITHOUT_PYTEST, str(site)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The generated reference replaced its committed stand-in: the options are there.
    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert "--artifact" in page and "stands in for it" not in page
    # Control: the stand-in itself has no option table (it is what GitHub shows).
    assert "--artifact" not in (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, spaces to hyphens, punctuation dropped."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_relative_link_resolves_where_docs_are_read_unbuilt() -> None:
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    dead = []
    checked = 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in LINK.findall(text):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve()
            checked += 1
            if not resolved.exists():
                dead.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.parent == (DOCS / "reference").resolve() \
                    and anchor not in _anchors(resolved):
                dead.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 50
    assert dead == []


def test_each_generated_page_has_its_stand_in_committed() -> None:
    gen_ref = _gen_ref()
    for page in gen_ref.GENERATED:
        committed = (DOCS / page).read_text(encoding="utf-8")
        assert committed.startswith("# "), page
        assert "generated from" in committed, page
    # The CLI's stand-in has a heading for every verb a guide may link to.
    anchors = _anchors(DOCS / "reference" / "cli.md")
    assert {"capture", "verify", "diff", "gate", "lab", "explain", "sign"} <= anchors


def test_readme_names_every_exit_status_and_a_fresh_venv_for_the_tests() -> None:
    import manifest.errors as errors

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = readme[readme.index("Exit status for every verb"):].split("\n\n", 1)[0]
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert codes == {0, 1, 2, 3, 4}
    for code in sorted(codes):
        assert re.search(rf"\b{code} ", line), (code, line)
    # The demo's venv and the tests' venv are two: the tests start from a fresh one.
    section = readme.split("## Set up and run (developers)", 1)[1].split("\n## ", 1)[0]
    venvs = re.findall(r"```\npython3 -m venv (\S+) ", section)
    assert len(venvs) == 2 and venvs[0] != venvs[1], venvs
    assert f"{venvs[1]}/" in (REPO / ".gitignore").read_text(encoding="utf-8")
    # The Quick start names no placeholder repository.
    assert "OWNER" not in readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "extra" in readme and "'.[docs]'" in readme
