"""Code probe against real git repositories: every state a user's tree can be in."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import blake3
import pytest

from manifest.gitrun import HARDENING, git_env, run_git
from manifest.probes.code import (
    find_lockfiles,
    probe_code,
    strip_credentials,
)
from manifest.probes.repo import _not_a_repo_reason, _pending, prefetch
from manifest.store import BlobStore
from tests.conftest import GitRepo, RepoFactory

TOKEN = "ghp_S3cr3tT0kenValue0123456789"


def _store(repo: GitRepo) -> BlobStore:
    return BlobStore(repo.path / ".manifest")


def _tree_files(root: Path) -> dict[str, bytes]:
    """Every file under root except .git and the store, by relative path."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".manifest")]
        for name in filenames:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


# ---------------------------------------------------------------- the basics


def test_clean_repository(repo: GitRepo) -> None:
    repo.write("requirements-dev.txt", "pytest\n")
    repo.write("uv.lock", "version = 1\n")
    head = repo.commit("lockfiles")
    probe = probe_code(repo.path / "", _store(repo))
    code = probe.code
    assert code.commit == head
    assert code.dirty is False
    assert code.diff_digest is None
    assert code.untracked_files == 0
    assert code.detached is False
    assert code.shallow is False
    assert code.submodules == []
    assert code.unavailable == {}
    assert probe.branch == "main"
    assert probe.root == repo.path
    assert probe.patch is None
    assert set(code.lockfiles) == {"requirements-dev.txt", "uv.lock"}
    expected = "blake3:" + blake3.blake3(b"version = 1\n").hexdigest()
    assert code.lockfiles["uv.lock"] == expected
    assert not (repo.path / ".manifest").exists(), "a clean capture writes nothing"


def test_probe_from_a_subdirectory_finds_the_root(repo: GitRepo) -> None:
    sub = repo.path / "src" / "pkg"
    sub.mkdir(parents=True)
    probe = probe_code(sub)
    assert probe.root == repo.path
    assert probe.code.commit == repo.head()


def test_not_a_git_repository(tmp_path: Path, home: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    probe = probe_code(plain)
    assert probe.root is None
    assert probe.code.commit is None
    assert probe.code.dirty is None
    assert probe.code.unavailable == {"commit": "not inside a git repository"}


def test_git_missing(repo: GitRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    probe = probe_code(repo.path)
    assert probe.code.commit is None
    assert probe.code.unavailable == {"commit": "git is not installed"}


def test_inherited_git_variables_are_ignored(
    repo: GitRepo, repos: RepoFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = repos.with_commit("other")
    monkeypatch.setenv("GIT_DIR", str(other.path / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other.path))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other.path / ".git" / "index"))
    probe = probe_code(repo.path)
    assert probe.root == repo.path
    assert probe.code.commit == repo.head()
    assert "GIT_DIR" not in git_env()


@pytest.mark.parametrize("untracked", [False, True])
def test_prefetched_facts_give_the_same_code(repo: GitRepo, untracked: bool) -> None:
    """``manifest capture`` starts the git calls on a thread; the probe's answer is unchanged."""
    repo.write("train.py", "print('edited')\n")
    if untracked:
        repo.write("new_module.py", "X = 1\n")
    direct = probe_code(repo.path)
    prefetch(repo.path)
    assert os.path.abspath(repo.path) in _pending
    fetched = probe_code(repo.path)
    assert not _pending, "the prefetched answer is taken once"
    assert fetched.code == direct.code
    assert fetched.patch == direct.patch
    assert fetched.code.dirty is True
    assert fetched.code.untracked_files == (1 if untracked else 0)


def test_prefetched_facts_are_not_reused(repo: GitRepo) -> None:
    """A second probe reads git again: a change after the first is seen."""
    prefetch(repo.path)
    assert probe_code(repo.path).code.dirty is False
    repo.write("train.py", "print('edited')\n")
    assert probe_code(repo.path).code.dirty is True


def test_prefetch_outside_a_repository_and_without_git(
    tmp_path: Path, home: Path, repo: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    prefetch(plain)
    assert probe_code(plain).code.unavailable == {"commit": "not inside a git repository"}
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    prefetch(repo.path)  # the thread's GitMissingError reaches the probe
    assert probe_code(repo.path).code.unavailable == {"commit": "git is not installed"}


def test_dubious_ownership_reason_is_specific() -> None:
    reason = _not_a_repo_reason(b"fatal: detected dubious ownership in repository at '/x'\n")
    assert "another user owns it" in reason
    assert "safe.directory" in reason


# -------------------------------------------------------------- HEAD states


def test_unborn_head(repos: RepoFactory) -> None:
    repo = repos.empty()
    repo.write("train.py", "print(1)\n")
    repo.git("add", "train.py")
    repo.write("notes.txt", "untracked\n")
    probe = probe_code(repo.path, _store(repo))
    code = probe.code
    assert code.commit is None
    assert code.unavailable == {"commit": "the repository has no commits yet (unborn HEAD)"}
    assert probe.branch == "main"
    assert code.detached is False
    assert code.dirty is True
    assert code.untracked_files == 1
    # The patch is against the empty tree: it rebuilds the files from nothing.
    assert probe.patch is not None
    target = repos.empty("rebuilt")
    subprocess.run(["git", "apply", "--binary", "-"], input=probe.patch, cwd=target.path,
                   check=True, env=target.env)
    assert _tree_files(target.path) == _tree_files(repo.path)


def test_detached_head(repo: GitRepo) -> None:
    first = repo.head()
    repo.write("train.py", "print('v2')\n")
    repo.commit("v2")
    repo.git("checkout", "-q", "--detach", first)
    probe = probe_code(repo.path)
    assert probe.code.commit == first
    assert probe.code.detached is True
    assert probe.branch is None
    assert probe.code.dirty is False


def test_branch_with_slash(repo: GitRepo) -> None:
    repo.git("checkout", "-q", "-b", "feature/seeds")
    assert probe_code(repo.path).branch == "feature/seeds"


def test_shallow_clone(repo: GitRepo, repos: RepoFactory) -> None:
    repo.write("train.py", "print('v2')\n")
    head = repo.commit("v2")
    clone = repos.base / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo.path}", str(clone)],
                   check=True, env=repos.env, capture_output=True)
    probe = probe_code(clone)
    assert probe.code.shallow is True
    assert probe.code.commit == head
    assert probe.code.dirty is False
    assert probe.remote_url == f"file://{repo.path}"


# -------------------------------------------------------------- dirty trees


def test_dirty_tree_with_untracked_files_round_trips_through_git_apply(
    repo: GitRepo, repos: RepoFactory
) -> None:
    head = repo.head()
    repo.write("train.py", "print('changed')\n")
    repo.git("add", "train.py")
    repo.write("README.md", "# edited, not staged\n")
    repo.write("new dir/ünïcode name.py", "x = 1\n")
    repo.write("weights.bin", bytes(range(256)) * 4)
    repo.write("empty.txt", "")
    repo.write("run.log", "ignored by .gitignore\n")
    index_before = (repo.path / ".git" / "index").read_bytes()
    status_before = repo.git("status", "--porcelain")

    store = _store(repo)
    probe = probe_code(repo.path, store)
    code = probe.code
    assert code.commit == head
    assert code.dirty is True
    assert code.untracked_files == 3
    assert probe.patch is not None
    assert code.diff_digest == "blake3:" + blake3.blake3(probe.patch).hexdigest()
    assert b"run.log" not in probe.patch
    # The blob is stored under its name and reads back verified.
    assert store.get(code.diff_digest) == probe.patch
    assert store.path_for(code.diff_digest).name == code.diff_digest.replace(":", "-")
    # The user's index and status are untouched (the private index did the work).
    assert (repo.path / ".git" / "index").read_bytes() == index_before
    assert repo.git("status", "--porcelain") == status_before

    # Applying the stored blob to a clean checkout of the commit gives the same tree.
    clone = repos.base / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True,
                   env=repos.env, capture_output=True)
    subprocess.run(["git", "checkout", "-q", head], cwd=clone, check=True, env=repos.env)
    blob = store.get(code.diff_digest)
    assert blob is not None
    subprocess.run(["git", "apply", "--binary", "-"], input=blob, cwd=clone, check=True,
                   env=repos.env)
    expected = {k: v for k, v in _tree_files(repo.path).items() if k != "run.log"}
    assert _tree_files(clone) == expected


@pytest.mark.parametrize("untracked", [False, True], ids=["user index", "private index"])
def test_racily_clean_same_size_edit_is_in_the_patch(repo: GitRepo, untracked: bool) -> None:
    """An edit that keeps size and mtime, made in the instant the index was written, is seen.

    git trusts an entry's stat data unless the file is no older than the index ("racily
    clean"); ctime is switched off here so only that rule can find the edit. With an
    untracked file the diff runs on a private copy of the index, which must keep the
    index's mtime: a fresh one made git trust the entry and drop the edit from the patch.
    """
    repo.git("config", "core.trustctime", "false")
    repo.write("data.txt", "alpha\n")
    repo.commit("data", "data.txt")
    path = repo.path / "data.txt"
    stamp = path.stat().st_mtime_ns - 5_000_000_000
    os.utime(path, ns=(stamp, stamp))
    repo.git("update-index", "--refresh")  # the entry now holds the file's stat data
    path.write_text("ALPHA\n")  # same size, same inode
    os.utime(path, ns=(stamp, stamp))
    index = repo.path / ".git" / "index"
    os.utime(index, ns=(stamp, stamp))  # written "in the same instant" as the file
    if untracked:
        repo.write("new.txt", "new\n")
    probe = probe_code(repo.path, _store(repo))
    assert probe.code.dirty
    assert probe.patch is not None and b"+ALPHA" in probe.patch
    assert index.stat().st_mtime_ns == stamp  # the user's index was not written


def test_same_tree_same_digest_and_store_is_not_counted(repo: GitRepo) -> None:
    repo.write("train.py", "print('changed')\n")
    repo.write("extra.py", "y = 2\n")
    store = _store(repo)
    first = probe_code(repo.path, store).code
    assert (repo.path / ".manifest" / "blobs").is_dir()
    second = probe_code(repo.path, store).code
    assert first == second
    assert first.untracked_files == 1


def test_file_being_written_by_capture_is_excluded(repo: GitRepo) -> None:
    out = repo.path / "run.json"
    with out.open("wb") as fh:
        st = os.fstat(fh.fileno())
        probe = probe_code(repo.path, exclude=frozenset({(st.st_dev, st.st_ino)}))
    assert probe.code.dirty is False
    assert probe.code.untracked_files == 0


# ---------------------------------------------------------------- submodules


def test_submodule_commit_is_recorded(repo: GitRepo, repos: RepoFactory) -> None:
    lib = repos.with_commit("lib")
    first = lib.head()
    lib.write("lib.py", "VALUE = 2\n")
    second = lib.commit("v2")
    repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q",
             f"file://{lib.path}", "third_party/lib")
    repo.commit("add submodule")
    probe = probe_code(repo.path)
    assert [(s.path, s.commit) for s in probe.code.submodules] == [("third_party/lib", second)]
    assert probe.code.dirty is False
    # Checking out another commit inside the submodule is recorded, and dirties the parent.
    repo.git("checkout", "-q", first, cwd=repo.path / "third_party" / "lib")
    probe = probe_code(repo.path)
    assert [(s.path, s.commit) for s in probe.code.submodules] == [("third_party/lib", first)]
    assert probe.code.dirty is True
    assert probe.patch is not None
    assert f"Subproject commit {first}".encode() in probe.patch


def test_uninitialised_submodule_records_the_gitlink(repo: GitRepo, repos: RepoFactory) -> None:
    lib = repos.with_commit("lib")
    repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q",
             f"file://{lib.path}", "lib")
    repo.commit("add submodule")
    clone = repos.base / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True,
                   env=repos.env, capture_output=True)
    probe = probe_code(clone)
    assert [(s.path, s.commit) for s in probe.code.submodules] == [("lib", lib.head())]


# ----------------------------------------------------------------- hardening


def test_fsmonitor_command_in_repo_config_never_runs(repo: GitRepo, tmp_path: Path) -> None:
    marker = tmp_path / "fsmonitor-ran"
    script = tmp_path / "fsmonitor.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n", encoding="utf-8")
    script.chmod(0o755)
    repo.git("config", "core.fsmonitor", str(script))
    repo.write("train.py", "print('dirty')\n")
    repo.write("untracked.py", "z = 3\n")
    # Control: plain git does run it, so the assertion below means something.
    subprocess.run(["git", "status", "--porcelain"], cwd=repo.path, env=repo.env,
                   capture_output=True, check=False)
    assert marker.exists(), "the fsmonitor hook should fire for plain git"
    marker.unlink()

    probe_code(repo.path, _store(repo))
    assert not marker.exists()


def test_filter_driver_in_repo_config_never_runs(repo: GitRepo, tmp_path: Path) -> None:
    marker = tmp_path / "filter-ran"
    repo.write(".gitattributes", "*.py filter=evil\n")
    repo.commit("attributes")
    repo.git("config", "filter.evil.clean", f"sh -c 'touch {marker}; cat'")
    repo.git("config", "filter.evil.process", f"sh -c 'touch {marker}'")
    repo.write("train.py", "print('dirty')\n")
    repo.write("new.py", "n = 1\n")
    # Control: plain git diff runs it, so the assertion below means something.
    subprocess.run(["git", "diff", "HEAD"], cwd=repo.path, env=repo.env, capture_output=True,
                   check=False)
    assert marker.exists(), "the clean filter should fire for plain git"
    marker.unlink()
    probe = probe_code(repo.path, _store(repo))
    assert not marker.exists()
    assert probe.code.dirty is True
    assert probe.patch is not None
    assert b"+print('dirty')" in probe.patch
    assert b"+n = 1" in probe.patch


def test_filter_driver_from_user_config_is_kept(repo: GitRepo, home: Path,
                                                tmp_path: Path) -> None:
    """A driver the user configured globally (git-lfs is one) still applies."""
    marker = tmp_path / "user-filter-ran"
    script = tmp_path / "upper.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\ntr a-z A-Z\n", encoding="utf-8")
    script.chmod(0o755)
    (home / ".gitconfig").write_text(f"[filter \"upper\"]\n\tclean = {script}\n")
    repo.write(".gitattributes", "*.txt filter=upper\n")
    repo.write("notes.txt", "lower\n")
    repo.commit("notes")
    repo.write("notes.txt", "lower\nmore\n")
    marker.unlink()
    probe = probe_code(repo.path)
    assert marker.exists()
    assert probe.patch is not None
    assert b"+MORE" in probe.patch


def test_hooks_never_run(repo: GitRepo, tmp_path: Path) -> None:
    marker = tmp_path / "hook-ran"
    hooks = repo.path / ".git" / "hooks"
    for name in ("post-index-change", "post-checkout", "reference-transaction"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch '{marker}'\n", encoding="utf-8")
        hook.chmod(0o755)
    repo.write("untracked.py", "z = 3\n")
    probe_code(repo.path, _store(repo))
    assert not marker.exists()


def test_hardening_flags_come_first() -> None:
    assert "core.fsmonitor=false" in HARDENING
    assert "core.hooksPath=/dev/null" in HARDENING
    proc = run_git(["--version"], Path.cwd())
    assert proc.stdout.startswith(b"git version")


def test_remote_token_is_stripped_everywhere(repo: GitRepo) -> None:
    repo.git("remote", "add", "origin", f"https://ci-user:{TOKEN}@git.example.invalid/x.git")
    repo.git("remote", "add", "backup", f"https://{TOKEN}@mirror.example.invalid/x.git")
    repo.write("train.py", "print('dirty')\n")
    probe = probe_code(repo.path, _store(repo))
    assert probe.remote_url == "https://git.example.invalid/x.git"
    assert probe.patch is not None
    assert TOKEN.encode() not in probe.patch
    for path in (repo.path / ".manifest").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes()


def test_first_remote_when_no_origin(repo: GitRepo) -> None:
    repo.git("remote", "add", "upstream", "git@github.com:org/project.git")
    assert probe_code(repo.path).remote_url == "git@github.com:org/project.git"


def test_no_remote(repo: GitRepo) -> None:
    assert probe_code(repo.path).remote_url is None


@pytest.mark.parametrize(("url", "expected"), [
    (f"https://user:{TOKEN}@host/x.git", "https://host/x.git"),
    (f"https://{TOKEN}@host:8443/x.git", "https://host:8443/x.git"),
    (f"https://host/x.git?private_token={TOKEN}#frag", "https://host/x.git"),
    (f"ssh://git:{TOKEN}@[::1]:2222/x.git", "ssh://[::1]:2222/x.git"),
    ("git@github.com:org/x.git", "git@github.com:org/x.git"),
    ("git@host:path/with@sign.git", "git@host:path/with@sign.git"),
    (f"oauth2:{TOKEN}@gitlab.example:group/x.git", "gitlab.example:group/x.git"),
    ("file:///srv/git/x.git", "file:///srv/git/x.git"),
    ("/srv/git/x.git", "/srv/git/x.git"),
    ("https://host:99999999/x.git", "<unparseable URL>"),
])
def test_strip_credentials(url: str, expected: str) -> None:
    assert strip_credentials(url) == expected
    assert TOKEN not in strip_credentials(url)


def test_lockfiles_only_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "poetry.lock").write_text("a")
    (tmp_path / "requirements.txt").write_text("b")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "uv.lock").write_text("c")
    (tmp_path / "notes.txt").write_text("d")
    assert sorted(find_lockfiles(tmp_path)) == ["poetry.lock", "requirements.txt"]


def test_git_binary_is_the_real_one() -> None:
    assert shutil.which("git") is not None
