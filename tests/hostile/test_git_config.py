"""A repository's own git config never makes us run a command (issue 10, item 3).

Each test plants one thing git runs by itself (fsmonitor, a hook, a textconv
driver, a clean filter, a long-running process filter) in a real repository
and first shows **plain git running it** with the very argv our code uses
(the positive control: the plant works), then that the same argv through
:func:`manifest.gitrun.run_git`, and the verbs that use it (capture's code
probe on the racily-clean and intent-to-add path, gate's baseline diff,
verify's checkout), leave no mark. The plant writes a marker file; the
marker is the evidence.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from manifest.gitrun import run_git
from manifest.probes.code import probe_code
from manifest.store import BlobStore
from tests.conftest import GitRepo, RepoFactory

PLANTS = ("clean", "process", "textconv", "fsmonitor", "hook", "command")


def _plant(repo: GitRepo, marks: Path) -> None:
    """Every self-running command git knows of, each touching ``marks/<kind>``."""
    marks.mkdir()
    for kind in PLANTS:
        script = marks.parent / f"evil-{kind}.sh"
        # A clean filter and a textconv must still behave like one (cat), so git goes on.
        script.write_text(f"#!/bin/sh\ntouch '{marks}/{kind}'\n"
                          + ("cat \"$@\"\n" if kind in ("clean", "textconv") else "exit 0\n"))
        script.chmod(0o755)
    repo.write(".gitattributes", "*.txt filter=evil diff=evil\n*.dat filter=proc\n"
                                 "*.bin diff=ext\n")
    repo.write("a.txt", "alpha\n")
    repo.write("b.dat", "bravo\n")
    repo.write("c.bin", "charlie\n")
    repo.commit("tracked files with drivers", ".gitattributes", "a.txt", "b.dat", "c.bin")
    ev = marks.parent
    # ctime off: _make_racy keeps size and mtime but cannot keep ctime. When the rewrite's
    # ctime fell in the next second from the one the index held, git saw a stat change,
    # skipped the racy re-read of the file (and the clean filter with it) on add -N, and the
    # positive control failed (about 1 run in 40 here, more under load; 0 in 300 with this).
    repo.git("config", "core.trustctime", "false")
    repo.git("config", "filter.evil.clean", f"{ev}/evil-clean.sh")
    repo.git("config", "filter.proc.process", f"{ev}/evil-process.sh")
    repo.git("config", "diff.evil.textconv", f"{ev}/evil-textconv.sh")
    repo.git("config", "diff.ext.command", f"{ev}/evil-command.sh")
    repo.git("config", "core.fsmonitor", f"{ev}/evil-fsmonitor.sh")
    hook = repo.path / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch '{marks}/hook'\n")
    hook.chmod(0o755)


def _make_racy(repo: GitRepo) -> None:
    """Change tracked files without changing their size and give the index the same
    mtime, so git must re-read them (through the clean filter) to know."""
    for name, text in (("a.txt", "ALPHA\n"), ("b.dat", "BRAVO\n"), ("c.bin", "CHARL!\n")):
        path = repo.path / name
        st = path.stat()
        path.write_text(text)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    st = (repo.path / "a.txt").stat()
    os.utime(repo.path / ".git" / "index", ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def planted(repos: RepoFactory, tmp_path: Path) -> tuple[GitRepo, Path]:
    repo = repos.with_commit("planted")
    marks = tmp_path / "marks"
    _plant(repo, marks)
    _make_racy(repo)
    repo.write("new.txt", "untracked, not ignored\n")  # the intent-to-add path
    return repo, marks


def _plain(repo: GitRepo, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(["git", *args], cwd=repo.path, env={**repo.env, **(env or {})},
                   capture_output=True, check=False)


def _marks(marks: Path) -> set[str]:
    found = {p.name for p in marks.iterdir()}
    for p in marks.iterdir():
        p.unlink()
    return found


QUIET_FSMONITOR = ["-c", "core.fsmonitor=false"]

# The argv our code runs, and what the plant needs to fire (besides the racy tree).
CASES: dict[str, tuple[list[str], str]] = {
    "capture diff (clean filter, racily clean)": (
        ["diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color", "--full-index",
         "HEAD", "--"], "clean"),
    "capture diff (process filter)": (
        ["diff", "--binary", "--no-ext-diff", "--no-textconv", "HEAD", "--"], "process"),
    "gate baseline diff --name-only": (["diff", "--name-only", "-z", "HEAD~1", "--", "."],
                                       "clean"),
    "intent-to-add": (["add", "--intent-to-add", "--", "new.txt"], "clean"),
    "textconv in a diff": (["diff", "HEAD", "--", "a.txt"], "textconv"),
    "external diff driver": (["diff", "--ext-diff", "HEAD", "--", "c.bin"], "command"),
    "fsmonitor in status": (["status", "--porcelain"], "fsmonitor"),
}


def _racy_copy(repo: GitRepo, index: Path) -> None:
    """A private copy of the index whose entries are racily clean (the index no newer than
    a.txt), so git re-reads the file and a clean filter runs. The index as written is racy
    only when it lands in a.txt's timestamp."""
    index.write_bytes((repo.path / ".git" / "index").read_bytes())
    a = (repo.path / "a.txt").stat()
    os.utime(index, ns=(a.st_atime_ns, a.st_mtime_ns))


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_git_runs_the_plant_and_ours_does_not(planted: tuple[GitRepo, Path],
                                                    tmp_path: Path, case: str) -> None:
    repo, marks = planted
    argv, kind = CASES[case]
    # add -N writes into an index: give both runs a private copy, like capture does.
    index = tmp_path / "index"
    env = {"GIT_INDEX_FILE": str(index)} if argv[0] == "add" else {}
    if env:
        _racy_copy(repo, index)
    # The fsmonitor plant answers "nothing changed" at random times relative to the racy
    # index and could let plain git skip the re-read the other plants need: off for them.
    quiet_fsmonitor = [] if kind == "fsmonitor" else QUIET_FSMONITOR
    _plain(repo, *quiet_fsmonitor, *argv, env=env)
    assert kind in _marks(marks), f"positive control: plain git did not run the {kind} plant"
    if env:
        _racy_copy(repo, index)
    run_git(argv, repo.path, env=env, check=False)
    assert _marks(marks) == set(), f"{case}: our runner ran a planted command"


def test_capture_code_probe_runs_nothing(planted: tuple[GitRepo, Path], tmp_path: Path) -> None:
    repo, marks = planted
    # fsmonitor off for the controls, as in the cases above: its plant may answer "nothing
    # changed" and let plain git skip the re-read the other plants need.
    _plain(repo, *QUIET_FSMONITOR, "diff", "HEAD", "--", "a.txt")
    _plain(repo, *QUIET_FSMONITOR, "diff", "HEAD", "--", "b.dat")
    assert {"clean", "process", "textconv"} <= _marks(marks)  # positive control
    _make_racy(repo)  # plain git refreshed the index; make the entries racy again
    probe = probe_code(repo.path, BlobStore(tmp_path / "store"))
    assert probe.code.dirty and probe.code.untracked_files == 1
    assert probe.patch is not None and b"ALPHA" in probe.patch and b"new.txt" in probe.patch
    assert _marks(marks) == set()


def test_gate_baseline_diff_runs_nothing(planted: tuple[GitRepo, Path]) -> None:
    from manifest.canonical import load_manifest
    from manifest.gate.baseline import code_changes
    from manifest.gate.policy import load_project
    from tests.runs import REPO

    repo, marks = planted
    _plain(repo, *QUIET_FSMONITOR, "diff", "--name-only", "HEAD~1", "--", ".")
    assert "clean" in _marks(marks)  # positive control (seen flaky with fsmonitor on)
    _make_racy(repo)
    repo.write("pyproject.toml", "[tool.manifest]\ncommand = ['true']\n")
    golden = load_manifest((REPO / "tests/golden/manifest_v1.json").read_bytes(), verify=False)
    old_commit = repo.git("rev-parse", "HEAD~1")

    def at(commit: str | None) -> object:
        return golden.model_copy(update={"code": golden.code.model_copy(
            update={"commit": commit, "dirty": False, "diff_digest": None})})

    project = load_project(repo.path)
    lines = code_changes(project, at(old_commit), at(repo.head()))  # type: ignore[arg-type]
    assert any("a.txt" in line for line in lines)
    assert _marks(marks) == set()


def test_hook_runs_under_plain_git_not_ours(repos: RepoFactory, tmp_path: Path) -> None:
    """verify checks out the recorded commit: no post-checkout hook runs."""
    repo = repos.with_commit("hooked")
    marks = tmp_path / "marks"
    marks.mkdir()
    hook = repo.path / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch '{marks}/hook'\n")
    hook.chmod(0o700)
    _plain(repo, "checkout", "-q", "-b", "plain")
    assert _marks(marks) == {"hook"}
    run_git(["checkout", "-q", "-b", "ours"], repo.path)
    assert _marks(marks) == set()
    repo.git("config", "core.hooksPath", str(repo.path / ".git" / "hooks"))
    run_git(["checkout", "-q", "--detach", "HEAD"], repo.path)
    assert _marks(marks) == set()


def test_include_from_local_config_is_blanked_too(repos: RepoFactory, tmp_path: Path) -> None:
    """A driver defined in a file the local config includes is still the repository's."""
    repo = repos.with_commit("included")
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marks}/included'\ncat\n")
    script.chmod(0o755)
    (repo.path / "extra.cfg").write_text(f"[filter \"inc\"]\n\tclean = {script}\n")
    repo.write(".gitattributes", "*.md filter=inc\n")
    repo.commit("attrs", ".gitattributes")
    repo.git("config", "include.path", str(repo.path / "extra.cfg"))
    _make_racy_md(repo)
    _plain(repo, "diff", "HEAD")
    assert _marks(marks) == {"included"}
    run_git(["diff", "HEAD"], repo.path)
    assert _marks(marks) == set()


def _make_racy_md(repo: GitRepo) -> None:
    path = repo.path / "README.md"
    st = path.stat()
    path.write_text(path.read_text().upper())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.utime(repo.path / ".git" / "index", ns=(st.st_atime_ns, st.st_mtime_ns))


def _tree_of_git_dir(repo: GitRepo) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for dirpath, _dirs, files in os.walk(repo.path / ".git"):
        for name in files:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(repo.path))] = (st.st_size, st.st_mtime_ns)
    return out


def test_capture_writes_nothing_into_dot_git(repos: RepoFactory, tmp_path: Path) -> None:
    repo = repos.with_commit("quiet")
    repo.write("untracked.py", "print('new')\n")
    repo.write("empty.txt", "")  # add -N stores the empty blob: it must not land in .git
    before = _tree_of_git_dir(repo)
    probe = probe_code(repo.path, BlobStore(tmp_path / "store"))
    assert probe.code.untracked_files == 2
    assert _tree_of_git_dir(repo) == before
    # Positive control: plain intent-to-add does write the empty blob.
    repo.git("add", "--intent-to-add", "empty.txt")
    assert (repo.path / ".git/objects/e6/9de29bb2d1d6434b8b29ae775ad8c2e48c5391").exists()


def test_capture_on_a_read_only_checkout(repos: RepoFactory, tmp_path: Path,
                                         cli_env: dict[str, str]) -> None:
    """A checkout mounted read-only (bubblewrap), or made read-only as a non-root user."""
    import shutil
    import sys

    repo = repos.with_commit("readonly")
    repo.write("untracked.py", "print('new')\n")
    store = tmp_path / "store"
    argv = [sys.executable, "-m", "manifest", "capture", "--store", str(store)]
    probe = subprocess.run(["bwrap", "--bind", "/", "/", "--ro-bind", str(repo.path),
                            str(repo.path), "--dev", "/dev", "--proc", "/proc", "--unshare-all",
                            "--", "touch", str(repo.path / "x")], capture_output=True,
                           check=False) if shutil.which("bwrap") else None
    if probe is not None and probe.returncode != 0 and b"Read-only" in probe.stderr:
        prefix = ["bwrap", "--bind", "/", "/", "--ro-bind", str(repo.path), str(repo.path),
                  "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--"]
    elif os.geteuid() != 0:
        prefix = []
        for dirpath, dirs, files in os.walk(repo.path):
            for name in [*dirs, *files]:
                os.chmod(Path(dirpath, name), 0o555 if Path(dirpath, name).is_dir() else 0o444)
        repo.path.chmod(0o555)
    else:
        pytest.skip("needs bubblewrap (as root, permissions do not make a tree read-only)")
    try:
        proc = subprocess.run([*prefix, *argv], cwd=repo.path, env=cli_env,
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        assert b'"untracked_files":1' in proc.stdout
        assert not (repo.path / "x").exists()
    finally:
        for dirpath, dirs, _files in os.walk(repo.path):
            for name in dirs:
                os.chmod(Path(dirpath, name), 0o700)
        repo.path.chmod(0o700)
