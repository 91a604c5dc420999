"""The documentation site: its generated reference covers the code, and what the pages
name (files, modules, pages, README's test command) exists.

The reference pages are written by ``docs/gen_ref.py`` at every ``mkdocs build`` (run
with ``--strict`` by .ci/run), so they cannot drift; these tests check that each
generator covers all of what it describes, without a build.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.runs import REPO

DOCS = REPO / "docs"


def _gen_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen_ref() -> ModuleType:
    return _gen_ref()


def test_cli_reference_has_every_verb_and_option(gen_ref: ModuleType) -> None:
    from manifest.cli.app import build_parser

    page = gen_ref.render("reference/cli.md")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices
    for name, verb in sub.choices.items():
        assert f"\n## {name}\n" in page, name
        for action in verb._actions:
            for option in action.option_strings:
                assert option in page, (name, option)


def test_impact_rules_page_has_every_rule(gen_ref: ModuleType) -> None:
    from manifest.diff.rules import REFINED, RULES

    page = gen_ref.render("reference/impact-rules.md")
    for path, rule in [*RULES.items(), *REFINED.items()]:
        assert f"| `{path}` | **{rule.impact.value}** |" in page, path


def test_schema_page_has_every_definition_and_field(gen_ref: ModuleType) -> None:
    schema = json.loads((REPO / "schemas" / "manifest.v1.schema.json").read_text())
    page = gen_ref.render("reference/schema.md")
    for name, node in schema["$defs"].items():
        assert f"\n## {name}\n" in page, name
        for field in node.get("properties", {}):
            assert f"| `{field}` |" in page, (name, field)


def test_exit_status_page_has_the_four_statuses(gen_ref: ModuleType) -> None:
    import manifest.errors as errors

    page = gen_ref.render("reference/exit-status.md")
    for name in ("EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_NO_VERDICT"):
        assert f"| {getattr(errors, name)} | `manifest.errors.{name}` |" in page
    for cls in ("UsageError", "TamperedManifestError", "NoVerdictError"):
        assert cls in page


def test_nav_prunes_only_missing_pages(gen_ref: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("# here\n")
    nav = [{"Home": "here.md"}, {"Later": "not-yet.md"},
           {"Group": [{"A": "not-yet.md"}]}, {"CLI": "reference/cli.md"}]
    assert gen_ref._prune(nav, tmp_path) == [{"Home": "here.md"}, {"CLI": "reference/cli.md"}]


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_named_source_files_exist() -> None:
    """A page that names ``manifest/…/x.py`` or ``tests/…`` names a file that exists
    (modules move between packages; the prose must follow)."""
    missing = []
    for page in _markdown_files():
        text = page.read_text(encoding="utf-8")
        for name in re.findall(r"`((?:manifest|tests|benchmarks|examples|schemas)/[\w./-]+)`",
                               text):
            is_path = name.endswith("/") or "." in name.rsplit("/", 1)[1]  # not `manifest/v1`
            if is_path and "*" not in name and not (REPO / name.rstrip("/")).exists():
                missing.append(f"{page.relative_to(REPO)}: {name}")
    assert missing == []


def test_readme_links_into_the_site_exist() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 10
    assert [link for link in links if not (REPO / link).exists()] == []


def test_readme_test_command_is_what_ci_runs() -> None:
    """README's "Set up and run (developers)" test command is .ci/run's line, byte for byte."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set up and run (developers)", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```\n(python3 -m venv .*)\n```", section)
    assert len(commands) == 2
    assert commands[0].endswith("&& bash examples/demo.sh")
    # The main job installs what the demo needs (the tool, torch, safetensors), not the
    # dev extra's integrations and docs toolchain.
    assert "pip install -c constraints-dev.txt -e '.[torch]' &&" in commands[0]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci
    # A failure of pip, ruff or mypy (not the last command of the && list) does not stop
    # `set -e`: the status is checked before anything else runs, or a later line hides it.
    after = [line for line in ci[ci.index(commands[1]) + 1:] if not line.startswith("#")]
    assert after[0] == 'rc=$?; [ "$rc" -eq 0 ] || exit "$rc"', after[:1]
    assert any(line.startswith("NO_MKDOCS_2_WARNING=1 mkdocs build --strict") for line in ci)


def test_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 220, lines
