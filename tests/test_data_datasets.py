"""The data section: specs, stored listings, naming changed files, and `manifest hash`."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import blake3
import pytest

from manifest.canonical import canonical_bytes
from manifest.data import digest as data
from manifest.data.datasets import (
    compare_listing,
    digest_datasets,
    parse_data_spec,
    recorded_path,
)
from manifest.data.digest import digest_path
from manifest.data.listing import diff_listings, listing_root, path_bytes
from manifest.errors import DataError
from manifest.store import BlobStore
from tests.conftest import GitRepo, assert_one_sentence, run_cli


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.csv").write_bytes(b"a,b\n1,2\n")
    (root / "sub" / "b.bin").write_bytes(b"\0" * 100)
    return root


# ------------------------------------------------------------------ specs


@pytest.mark.parametrize(
    ("spec", "name", "path"),
    [
        ("data/", "data", "data"),
        ("data/train", "train", "data/train"),
        ("labels=meta/labels.csv", "labels", "meta/labels.csv"),
        ("./a=b", "a=b", "a=b"),
        ("dir/x=y", "x=y", "dir/x=y"),
        ("/abs/path", "path", "/abs/path"),
    ],
)
def test_parse_data_spec(spec: str, name: str, path: str) -> None:
    assert parse_data_spec(spec) == (name, Path(path))


def test_parse_data_spec_dot_and_bad_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_data_spec(".") == (tmp_path.name, Path("."))
    with pytest.raises(DataError, match="names no path"):
        parse_data_spec("x=")
    with pytest.raises(DataError, match="empty dataset path"):
        parse_data_spec("")


def test_parse_data_spec_keeps_non_utf8_names() -> None:
    name, path = parse_data_spec(os.fsdecode(b"caf\xe9"))
    assert name == "caf\\xe9"
    assert os.fsencode(path) == b"caf\xe9"


def test_recorded_path_is_repo_relative_inside_the_repo(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    assert recorded_path(repo / "data", repo) == "data"
    assert recorded_path(repo, repo) == "."
    assert recorded_path(tmp_path / "elsewhere", repo) == str(tmp_path / "elsewhere")
    (tmp_path / "alias").symlink_to(repo)
    assert recorded_path(tmp_path / "alias" / "data", repo) == "data"
    assert recorded_path(repo / "data", None) == str(repo / "data")


# --------------------------------------------------------------- datasets


def test_digest_datasets_records_entries_and_listing_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    tree = make_tree(repo / "data")
    (repo / "labels.csv").write_bytes(b"x\n")
    store = BlobStore(repo / ".manifest")
    found = digest_datasets(["data/", "labels=labels.csv"], repo_root=repo, store=store,
                            no_cache=False, quiet=True, base=repo)
    assert [d.name for d in found] == ["data", "labels"]
    assert [d.path for d in found] == ["data", "labels.csv"]
    first = found[0]
    assert (first.files, first.bytes) == (2, 108)
    assert first.root == digest_path(tree, cache=None).root
    assert first.listing is not None
    listing = store.get(first.listing)
    assert listing is not None
    assert listing_root(listing) == first.root
    assert found[1].root == "blake3:" + blake3.blake3(b"x\n").hexdigest()
    # The entries are valid canonical JSON.
    canonical_bytes([d.model_dump(mode="json") for d in found])


def test_digest_datasets_refuses_duplicates_and_missing(tmp_path: Path) -> None:
    make_tree(tmp_path / "data")
    store = BlobStore(tmp_path / ".manifest")
    with pytest.raises(DataError, match="two datasets are named 'data'"):
        digest_datasets([str(tmp_path / "data"), f"data={tmp_path / 'data'}"], repo_root=None,
                        store=store, no_cache=False, quiet=True)
    with pytest.raises(DataError, match="does not exist"):
        digest_datasets([str(tmp_path / "missing")], repo_root=None, store=store,
                        no_cache=False, quiet=True)


def test_non_utf8_dataset_path_is_valid_canonical_json(tmp_path: Path) -> None:
    raw = os.fsencode(tmp_path) + b"/d\xe9"
    try:
        os.mkdir(raw)
    except OSError:
        pytest.skip("this filesystem refuses non-UTF-8 names")
    with open(raw + b"/f\xff", "wb") as fh:
        fh.write(b"1")
    store = BlobStore(tmp_path / ".manifest")
    (entry,) = digest_datasets([os.fsdecode(raw)], repo_root=tmp_path, store=store,
                               no_cache=False, quiet=True)
    assert entry.path == "d\\xe9"
    assert entry.name == "d\\xe9"
    text = canonical_bytes(entry.model_dump(mode="json")).decode("utf-8")
    assert "d\\\\xe9" in text
    assert path_bytes(entry.path) == b"d\xe9"


# ---------------------------------------------------------------- compare


def test_compare_listing_names_each_change(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "data")
    (tree / "link").symlink_to("a.csv")
    store = BlobStore(tmp_path / ".manifest")
    recorded = digest_path(tree, cache=None).listing
    assert compare_listing(recorded, tree, store=store) == []
    (tree / "a.csv").write_bytes(b"a,b\n1,3\n")
    (tree / "sub" / "b.bin").write_bytes(b"\0" * 101)
    (tree / "new.txt").write_bytes(b"")
    (tree / "link").unlink()
    (tree / "link").symlink_to("sub/b.bin")
    (tree / "sub2").mkdir()
    os.unlink(tree / "sub" / "b.bin")
    (tree / "sub" / "b.bin").mkdir()
    assert compare_listing(recorded, tree, store=store) == [
        "changed: a.csv (content)",
        "changed: link (link target a.csv -> sub/b.bin)",
        "added: new.txt (file)",
        "changed: sub/b.bin (file -> directory)",
        "added: sub2 (directory)",
    ]


def test_compare_listing_single_file_and_sizes(tmp_path: Path) -> None:
    path = tmp_path / "one.bin"
    path.write_bytes(b"12345")
    recorded = digest_path(path, cache=None).listing
    path.write_bytes(b"123456")
    assert compare_listing(recorded, path) == [f"changed: {path} (content, 5 -> 6 bytes)"]


def test_diff_listings_removed_and_malformed() -> None:
    old = b"manifest-tree/v1\nf\t1\t" + b"0" * 64 + b"\tx\nd\ty\n"
    new = b"manifest-tree/v1\n"
    assert diff_listings(old, new) == ["removed: x (file)", "removed: y (directory)"]
    with pytest.raises(DataError, match="not a manifest-tree/v1 listing"):
        diff_listings(b"garbage", new)
    with pytest.raises(DataError, match="malformed line"):
        diff_listings(b"manifest-tree/v1\nf\tx\n", new)
    with pytest.raises(DataError, match="not UTF-8"):
        diff_listings(b"\xff", new)


# -------------------------------------------------------------- progress


def test_progress_is_silent_when_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    bar = data._Progress("x", enabled=False)
    bar(10, 100)
    bar.close()
    assert capsys.readouterr().err == ""


def test_progress_draws_on_a_terminal_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    sink = io.StringIO()
    real = Console

    def fake_console(**kwargs: object) -> Console:
        return real(file=sink, force_terminal=True, width=120)

    monkeypatch.setattr("rich.console.Console", fake_console)
    monkeypatch.setattr(data, "PROGRESS_AFTER_S", 0.0)
    bar = data._Progress("data/", enabled=True)
    bar.total = 10
    bar(3, 3_000_000_000)
    bar.close()
    assert "hashing data/" in sink.getvalue()
    assert "3/10 files" in sink.getvalue()


# -------------------------------------------------------------------- CLI


def test_cli_hash_prints_the_root_alone(tmp_path: Path, cli_env: dict[str, str]) -> None:
    tree = make_tree(tmp_path / "data")
    result = run_cli("hash", str(tree), "--store", str(tmp_path / "st"), cwd=tmp_path,
                     env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == digest_path(tree, cache=None).root + "\n"
    assert result.stderr == ""  # not a terminal: no progress


def test_cli_hash_json(tmp_path: Path, cli_env: dict[str, str]) -> None:
    tree = make_tree(tmp_path / "data")
    result = run_cli("hash", "--json", "-q", "data", "--store", str(tmp_path / "st"),
                     cwd=tmp_path, env=cli_env)
    assert result.returncode == 0, result.stderr
    entry = json.loads(result.stdout)
    assert entry["name"] == "data"
    assert entry["files"] == 2
    assert entry["root"] == digest_path(tree, cache=None).root
    assert entry["listing"].startswith("blake3:")


@pytest.mark.parametrize("case", ["missing", "fifo", "unreadable"])
def test_cli_hash_errors_are_one_sentence(tmp_path: Path, cli_env: dict[str, str],
                                          case: str) -> None:
    if case == "missing":
        target = tmp_path / "missing"
    elif case == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their mode")
        target = make_tree(tmp_path / "data")
        (target / "a.csv").chmod(0)
    result = run_cli("hash", str(target), cwd=tmp_path, env=cli_env)
    assert result.returncode == 2
    assert result.stdout == b""
    assert_one_sentence(result.stderr)


def test_cli_hash_outside_a_repo_writes_nothing(tmp_path: Path, cli_env: dict[str, str]
                                                ) -> None:
    tree = make_tree(tmp_path / "data")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli("hash", str(tree), cwd=tmp_path, env=cli_env)
    assert result.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_hash_in_a_repo_caches_in_an_ignored_store(repo: GitRepo, cli_env: dict[str, str]
                                                       ) -> None:
    make_tree(repo.path / "data")
    repo.commit("data", "data")
    result = run_cli("hash", "-q", "data", cwd=repo.path, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert (repo.path / ".manifest" / ".gitignore").exists()
    assert repo.git("status", "--porcelain", "--untracked-files=all") == ""
