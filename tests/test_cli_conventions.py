"""The CLI's conventions hold for every verb: help everywhere, one ``--format`` option
on every verb that reports, reports on stdout and notes on stderr, one sentence for a
failure.

The parser is walked, not listed by hand, so a verb added later is checked too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from manifest.cli.app import build_parser
from tests.conftest import GitRepo, assert_one_sentence, run_cli
from tests.runs import REPO

GOLDEN = REPO / "tests" / "golden" / "manifest_v1.json"

REPORTING = {"show", "hash", "diff", "verify", "gate", "explain"}
"""Verbs that print a report (as opposed to a document such as a manifest or a schema)."""


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def test_every_verb_and_argument_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {choice.dest for choice in sub._choices_actions if choice.help}
    verbs = _verbs()
    assert set(verbs) >= REPORTING | {"capture", "schema"}
    assert helped == set(verbs), f"verbs without help: {set(verbs) - helped}"
    missing = [f"{verb} {action.option_strings or action.dest}"
               for verb, p in verbs.items() for action in _options(p)
               if not (action.help and action.help.strip())]
    assert missing == []


def test_the_walk_finds_a_missing_help() -> None:
    """Positive control: an argument added without help is caught by the same walk."""
    verbs = _verbs()
    verbs["show"].add_argument("--undocumented")
    assert [a for a in _options(verbs["show"]) if not a.help]


def test_a_verb_on_the_command_line_gets_the_same_parser_alone() -> None:
    """``build_parser(argv)`` registers only the verb argv names: the same parser as in the
    full set (help and defaults), and no other verb; no verb, or an unknown one, gets all."""
    full = _verbs()
    for verb, parser in full.items():
        alone = build_parser([verb, "--help"])
        sub = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
        assert list(sub.choices) == [verb]
        assert sub.choices[verb].format_help() == parser.format_help()
        assert sub.choices[verb]._defaults == parser._defaults  # the verb's func
        assert [(a.dest, a.default) for a in sub.choices[verb]._actions] == [
            (a.dest, a.default) for a in parser._actions]
    for argv in ([], ["--help"], ["nosuchverb"], ["--version", "capture"]):
        sub = next(a for a in build_parser(argv)._actions
                   if isinstance(a, argparse._SubParsersAction))
        assert list(sub.choices) == list(full)


@pytest.mark.parametrize("verb", sorted(REPORTING))
def test_reporting_verbs_take_format_and_the_json_alias(verb: str) -> None:
    parser = _verbs()[verb]
    fmt = next(a for a in parser._actions if "--format" in a.option_strings)
    assert [str(c) for c in fmt.choices or ()] == ["table", "json", "markdown"]
    alias = next(a for a in parser._actions if "--json" in a.option_strings)
    assert alias.dest == "format"
    assert alias.const == "json"


def test_any_verb_with_json_also_takes_format() -> None:
    for verb, parser in _verbs().items():
        flags = {s for a in parser._actions for s in a.option_strings}
        if "--json" in flags:
            assert "--format" in flags, verb


def test_show_in_three_formats(tmp_path: Path) -> None:
    table = run_cli("show", str(GOLDEN), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert b"run_id" in table.stdout
    as_json = run_cli("show", "--json", str(GOLDEN), cwd=tmp_path)
    doc = json.loads(as_json.stdout)
    assert doc["run_id"] == json.loads(GOLDEN.read_bytes())["run_id"]
    markdown = run_cli("show", "--format", "markdown", str(GOLDEN), cwd=tmp_path)
    text = markdown.stdout.decode()
    assert text.startswith("## Manifest `blake3:")
    assert "| section | fact | value |" in text
    for result in (table, as_json, markdown):
        assert result.stderr == ""


def test_diff_format_json_is_understood(tmp_path: Path) -> None:
    # `diff --format json` used to be an unrecognised argument.
    result = run_cli("diff", "--format", "json", str(GOLDEN), str(GOLDEN), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["differences"] == []
    markdown = run_cli("diff", "--format", "markdown", str(GOLDEN), str(GOLDEN), cwd=tmp_path)
    assert markdown.stdout.decode().startswith("## Diff: no difference")


def test_json_and_format_together_are_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("diff", "--json", "--format", "markdown", str(GOLDEN), str(GOLDEN),
                     cwd=tmp_path)
    assert result.returncode == 2
    assert_one_sentence(result.stderr)


def test_hash_in_three_formats(tmp_path: Path) -> None:
    data = tmp_path / "d.bin"
    data.write_bytes(b"abc")
    root = run_cli("hash", "-q", str(data), cwd=tmp_path).stdout.decode().strip()
    assert root.startswith("blake3:")
    entry = json.loads(run_cli("hash", "-q", "--json", str(data), cwd=tmp_path).stdout)
    assert entry["root"] == root
    markdown = run_cli("hash", "-q", "--format", "markdown", str(data), cwd=tmp_path)
    assert f"| root | {root} |" in markdown.stdout.decode()


def test_capture_artifact_option_and_the_old_spelling(repo: GitRepo,
                                                      cli_env: dict[str, str]) -> None:
    script = ("import pathlib; pathlib.Path('out').mkdir(); "
              "pathlib.Path('out/a.bin').write_bytes(b'x')")
    new = run_cli("capture", "--artifact", "out/*.bin", "--", "python", "-c", script,
                  cwd=repo.path, env=cli_env)
    assert new.returncode == 0, new.stderr
    assert "deprecated" not in new.stderr
    paths = [a["path"] for a in json.loads(new.stdout)["outputs"]["artifacts"]]
    assert paths == ["out/a.bin"]
    old = run_cli("capture", "--output", "out/*.bin", "--", "python", "-c",
                  script.replace("mkdir()", "mkdir(exist_ok=True)"), cwd=repo.path, env=cli_env)
    assert old.returncode == 0, old.stderr
    assert "--output GLOB is deprecated" in old.stderr
    assert "use --artifact GLOB" in old.stderr
    assert [a["path"] for a in json.loads(old.stdout)["outputs"]["artifacts"]] == paths


def test_failed_command_gives_its_status_in_one_sentence(repo: GitRepo,
                                                         cli_env: dict[str, str]) -> None:
    result = run_cli("capture", "-q", "--", "python", "-c", "raise SystemExit(7)",
                     cwd=repo.path, env=cli_env)
    assert result.returncode == 3
    assert_one_sentence(result.stderr)
    assert "exit status 7" in result.stderr
    assert json.loads(result.stdout)["outputs"]["exit_code"] == 7


def test_unmatched_artifact_glob_gives_one_sentence(repo: GitRepo,
                                                    cli_env: dict[str, str]) -> None:
    result = run_cli("capture", "-q", "--artifact", "out/*.pt", "--", "python", "-c", "pass",
                     cwd=repo.path, env=cli_env)
    assert result.returncode == 3
    assert_one_sentence(result.stderr)
    assert "matched no file" in result.stderr


def test_usage_error_names_the_program_once(tmp_path: Path) -> None:
    result = run_cli("diff", "--bogus", str(GOLDEN), str(GOLDEN), cwd=tmp_path)
    assert result.returncode == 2
    assert_one_sentence(result.stderr)
    assert result.stderr.startswith("manifest: unrecognized arguments: --bogus")
    assert "manifest: manifest" not in result.stderr
