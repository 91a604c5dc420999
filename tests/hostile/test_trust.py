"""Verify runs a manifest's command only when trusted (issue 10, item 1).

The command of every manifest here, if it ever ran, would create a marker
file outside the repository; "commands run without trust" is the number of
markers found, and must be 0. Positive controls: the same edited manifest
does run (the marker appears) once ``--trust`` is given, and a manifest
sealed by capture on this machine runs with no flag at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, load_manifest, seal, to_document
from manifest.trust import (
    check_trust,
    escape_text,
    record_sealed,
    sealed_record,
    was_sealed_here,
)
from tests.runs import capture, make_repo, manifest_cli, tree_state

pytestmark = pytest.mark.slow

SCRIPT = """
import os, pathlib, sys
pathlib.Path('out').mkdir(exist_ok=True)
pathlib.Path('out/w.bin').write_bytes(b'weights')
if len(sys.argv) > 1:
    pathlib.Path(sys.argv[1]).write_text('ran')
"""


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    repo = make_repo(tmp_path_factory.mktemp("trust") / "repo", {"w.py": SCRIPT}, example=False)
    path, _ = capture(repo, command=["python", "w.py"], outputs="out/*.bin")
    return repo, path


def _resealed(path: Path, target: Path, edit: dict[str, Any]) -> Path:
    """The manifest with ``command`` fields replaced and re-sealed, as anyone can."""
    doc = to_document(load_manifest(path.read_bytes()))
    doc["command"].update(edit)
    target.write_bytes(dumps(seal(doc)))
    return target


def _verify(repo: Path, manifest: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    proc = manifest_cli("verify", str(manifest), "--json", "--no-sandbox", *args, cwd=repo)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, proc.stderr.decode(), report


def test_sealed_here_runs_without_flag(sealed: tuple[Path, Path]) -> None:
    repo, manifest = sealed
    code, stderr, report = _verify(repo, manifest)
    assert code == 0, stderr
    assert report["trust"] == "sealed here"
    assert "would run" not in stderr  # nothing to decide: no plan shown


@pytest.mark.parametrize("argv", [
    ["python", "w.py", "{marker}"],
    ["python", "w.py", "{marker}", "\x1b[2K\rpython train.py"],  # disguised on a terminal
    ["python", "-c", "import sys; exec(open('w.py').read())", "{marker}"],
    ["sh", "-c", "python w.py {marker}"],
])
def test_edited_argv_is_refused_before_anything_runs(sealed: tuple[Path, Path], tmp_path: Path,
                                                     argv: list[str]) -> None:
    repo, manifest = sealed
    marker = tmp_path / "marker"
    argv = [a.replace("{marker}", str(marker)) for a in argv]
    edited = _resealed(manifest, tmp_path / "edited.json", {"argv": argv})
    before = tree_state(repo)
    code, stderr, _ = _verify(repo, edited)
    assert code == 2, stderr
    assert "refusing to run" in stderr and "--trust" in stderr
    assert "re-running" not in stderr
    assert "would run" in stderr and "command:" in stderr
    assert "\x1b" not in stderr and "\r" not in stderr  # escaped in the plan
    assert not marker.exists(), "a command ran without trust"
    assert tree_state(repo) == before
    # Positive control: the user reads the plan and trusts it; now it runs.
    code, stderr, report = _verify(repo, edited, "--trust")
    assert marker.exists(), stderr
    assert report["trust"] == "--trust"
    assert "will run (--trust)" in stderr


def test_in_place_needs_trust_too(sealed: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = sealed
    marker = tmp_path / "marker"
    edited = _resealed(manifest, tmp_path / "e.json", {"argv": ["python", "w.py", str(marker)]})
    code, stderr, _ = _verify(repo, edited, "--in-place")
    assert code == 2 and not marker.exists(), stderr


def test_plan_names_cwd_variables_and_datasets(sealed: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = sealed
    edited = _resealed(manifest, tmp_path / "e.json", {"argv": ["python", "w.py", "x\u202ey"]})
    _, stderr, _ = _verify(repo, edited)
    assert "in: ." in stderr
    assert "sets: OMP_NUM_THREADS=" in stderr and "sets: MANIFEST_LAUNCH=" in stderr
    assert "x\\u202ey" in stderr and "\u202e" not in stderr  # bidi override shown escaped


# ------------------------------------------------------------ unit level


def test_record_lives_in_the_user_data_dir(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    digest = "blake3:" + "ab" * 32
    assert not was_sealed_here(digest)
    assert record_sealed(digest)
    assert was_sealed_here(digest)
    assert sealed_record() == tmp_path / "data" / "manifest" / "sealed"
    assert not was_sealed_here("blake3:" + "cd" * 32)
    assert not record_sealed("not a digest\nblake3:" + "ab" * 32)  # no line injection
    # A relative XDG_DATA_HOME is ignored (the spec says so): never a path in the repo.
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sealed_record() == tmp_path / "home" / ".local" / "share" / "manifest" / "sealed"


def test_record_is_not_followed_through_a_symlink(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (tmp_path / "data" / "manifest").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    os.symlink(elsewhere, sealed_record())
    assert not record_sealed("blake3:" + "ab" * 32)
    assert elsewhere.read_text() == ""


def test_signer_and_flag_decisions(sealed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                   tmp_path: Path) -> None:
    _, manifest = sealed
    recorded = load_manifest(manifest.read_bytes())
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "another-machine"))
    refused = check_trust(recorded)
    assert not refused.allowed and refused.basis == "refused"
    signed = check_trust(recorded, signer="alice@example.com (https://issuer)")
    assert (signed.allowed, signed.basis) == (True, "signed")
    assert signed.reason == "signed by alice@example.com (https://issuer)"
    assert check_trust(recorded, user_trusted=True).reason == "--trust"
    record_sealed(recorded.digest)
    assert check_trust(recorded).reason == "sealed here"


def test_escape_text_cannot_be_forged() -> None:
    assert escape_text("a\x1b[31mb") == "a\\e[31mb"
    assert escape_text("\\e") == "\\\\e"  # a literal backslash-e is not an escape
    assert escape_text("tab\there\r\n") == "tab\\there\\r\\n"
    assert escape_text("\x00\x7f\x9b") == "\\x00\\x7f\\x9b"
    assert escape_text("caf\u00e9 \u6f22") == "caf\u00e9 \u6f22"
