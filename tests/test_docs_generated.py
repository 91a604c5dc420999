"""The numbers a page quotes from a command's output come from a real run
(``docs/gen_sessions.py``), not from the page: the filler keeps the page's shape and
takes every line from the output."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.runs import REPO
from tests.test_docs_examples import _sessions, normalise, steps


@pytest.fixture(scope="module")
def gen_sessions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_sessions",
                                                  REPO / "docs" / "gen_sessions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fill_takes_every_line_from_the_output(gen_sessions: ModuleType) -> None:
    page = ["a run.json  run_id blake3:f0f0ac9fc5c8…", "...",
            "79 differences can change the bits, 6 cannot."]
    printed = ("a run.json  run_id blake3:1234abcd5678…\n│ bits │ seed 0 → 1\n"
               "76 differences can change the bits, 11 cannot.\n")
    assert gen_sessions.fill(page, printed, normalise) == [
        "a run.json  run_id blake3:1234abcd5678…", "...",
        "76 differences can change the bits, 11 cannot."]
    # A page whose shape the output no longer has is not filled (the build fails).
    assert gen_sessions.fill(["79 differences can change the bits."], printed,
                             normalise) is None


class _Page:
    class file:  # the shape of mkdocs' Page.file
        src_uri = "getting-started.md"


def test_the_page_shows_what_the_run_printed(gen_sessions: ModuleType, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MANIFEST_DOCS_SESSIONS", raising=False)
    source = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    blocks = _sessions()["getting-started"]
    diff_block = next(b for b in blocks if "manifest diff" in b.body)
    # Without a stored run the page keeps its typed lines (and the build says so).
    assert gen_sessions.on_page_markdown(source, _Page(), None, None) == source
    # A stored run: each output line is the printed one (the diff's count made 1234).
    printed: dict[str, list[str]] = {}
    for block in blocks:
        printed[block.name] = []
        for step in steps(block):
            lines = [line.replace("...", "x") for line in step.expected or []
                     if line.strip() != "..."]
            if block is diff_block:
                lines = [re.sub(r"^\d+ differences", "1234 differences", line)
                         for line in lines]
            printed[block.name].append("".join(line + "\n" for line in lines))
    gen_sessions.store("getting-started", printed)
    built: Any = gen_sessions.on_page_markdown(source, _Page(), None, None)
    assert "1234 differences can change the bits" in built
    assert "1234 differences" not in source
    assert built.count("```") == source.count("```")

