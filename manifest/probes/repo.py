"""What git says about the repository around a directory: read only, no models.

Split from the code probe so that ``manifest capture`` can start these git
calls (``rev-parse``, ``config``, ``ls-files`` and, for a tree with nothing
untracked, the ``diff``) on a thread before it imports pydantic: each call is
a child process the thread only waits on, and the ~50 ms of imports run
meanwhile. :func:`prefetch` starts it; :func:`repo_facts` takes the answer
(or reads it now when nothing was started). Every call goes through the one
hardened git runner (``manifest.gitrun``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from manifest.gitrun import EMPTY_TREE, read_config, run_git


def working_patch(root: Path, head: str | None, git_dir: Path, untracked: list[bytes],
                  no_filters: Sequence[str] = ()) -> tuple[bytes, int]:
    """The binary patch from ``head`` (or the empty tree) to the working tree.

    ``untracked`` are the untracked, not-ignored paths to include as
    additions (:func:`index_listing` lists them); the filter drivers in
    ``no_filters`` are switched off for the diff. Returns (patch bytes,
    number of untracked files included).
    """
    config = [f"filter.{name}.{kind}=" for name in no_filters for kind in ("clean", "process")]
    base = head or EMPTY_TREE
    diff_args = ["diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color",
                 "--full-index", "--ignore-submodules=none", base, "--"]
    if not untracked:
        return run_git(diff_args, root, config=config).stdout, 0
    import shutil  # here, not at the top: a tree with nothing untracked needs neither
    import tempfile

    # A private index: copy of the user's, plus intent-to-add entries, so the
    # user's own index is never written. ``add -N`` also writes the empty blob
    # into the object store: a private object directory (the repository's own
    # as an alternate) receives it, so nothing is written into .git and a
    # read-only checkout works.
    with tempfile.TemporaryDirectory(prefix="manifest-index-") as tmp:
        index = Path(tmp) / "index"
        if (git_dir / "index").exists():
            # copy2 keeps the index's mtime: git re-reads an entry whose file is no older
            # than the index ("racily clean"). A fresh mtime on the copy would make git
            # trust stat data that cannot tell a same-size edit within that instant.
            shutil.copy2(git_dir / "index", index)
        objects = Path(tmp) / "objects"
        objects.mkdir()
        env = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1",
               "GIT_OBJECT_DIRECTORY": str(objects),
               "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(_objects_dir(git_dir))}
        run_git(["add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul"],
                root, env=env, input_bytes=b"\0".join(untracked) + b"\0")
        return run_git(diff_args, root, env=env, config=config).stdout, len(untracked)


def _objects_dir(git_dir: Path) -> Path:
    """The object directory of the repository (a linked worktree's is in the common dir)."""
    try:
        common = (git_dir / "commondir").read_text(encoding="utf-8").strip()
    except OSError:
        return git_dir / "objects"
    base = Path(common)
    return (base if base.is_absolute() else git_dir / base) / "objects"


@dataclass(frozen=True)
class RepoState:
    """Where the repository is and what HEAD is, from one ``git rev-parse``."""

    root: Path
    git_dir: Path
    shallow: bool
    head: str | None
    branch: str | None
    detached: bool
    head_problem: str | None


def _not_a_repo_reason(stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace")
    if "dubious ownership" in text:
        return ("git refuses to read the repository because another user owns it "
                "(see git's safe.directory)")
    if "not a git repository" in text:
        return "not inside a git repository"
    if "work tree" in text:
        return "not inside a git work tree (a bare repository or a .git directory)"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return f"git cannot read the repository ({lines[-1] if lines else 'no message'})"


def read_repo_state(cwd: Path) -> RepoState | str:
    """The repository around ``cwd``, or the reason there is none.

    One ``rev-parse`` answers root, git dir, shallowness, HEAD's commit and
    its symbolic name; only an unborn or broken HEAD needs a second call.
    Raises :class:`GitMissingError` when git is not installed.
    """
    proc = run_git(["rev-parse", "--show-toplevel", "--absolute-git-dir",
                    "--is-shallow-repository", "HEAD^{commit}", "--symbolic-full-name", "HEAD",
                    "--"], cwd, check=False)
    lines = proc.stdout.split(b"\n")
    if len(lines) < 4:
        return _not_a_repo_reason(proc.stderr)
    root = Path(os.fsdecode(lines[0]))
    git_dir = Path(os.fsdecode(lines[1]))
    shallow = lines[2] == b"true"
    if proc.returncode == 0 and len(lines) >= 5:
        head = lines[3].decode("ascii", "replace")
        name = lines[4].decode("utf-8", "replace")
        detached = name == "HEAD"
        branch = None if detached else name.removeprefix("refs/heads/")
        return RepoState(root, git_dir, shallow, head, branch, detached, None)
    sym = run_git(["symbolic-ref", "-q", "HEAD"], root, check=False)
    if sym.returncode == 0:
        branch = sym.stdout.decode("utf-8", "replace").strip().removeprefix("refs/heads/")
        problem = "the repository has no commits yet (unborn HEAD)"
        return RepoState(root, git_dir, shallow, None, branch, False, problem)
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    problem = f"HEAD does not name a commit ({err[-1] if err else 'git rev-parse failed'})"
    return RepoState(root, git_dir, shallow, None, None, True, problem)


def index_listing(root: Path) -> tuple[list[tuple[str, str]], list[bytes]]:
    """Gitlinks (path, recorded commit) and untracked-not-ignored paths, in one call."""
    out = run_git(["ls-files", "-z", "-t", "--stage", "--others", "--exclude-standard"],
                  root).stdout
    gitlinks: list[tuple[str, str]] = []
    untracked: list[bytes] = []
    for entry in out.split(b"\0"):
        if not entry:
            continue
        tag, body = entry[:2], entry[2:]
        if tag == b"? ":
            untracked.append(body)
        elif body.startswith(b"160000 "):
            meta, _, path_b = body.partition(b"\t")
            gitlinks.append((os.fsdecode(path_b), meta.split(b" ")[1].decode("ascii")))
    return gitlinks, untracked


@dataclass(frozen=True)
class RepoConfig:
    """What the code probe needs from git config, read in one call."""

    remote_urls: dict[str, str]
    """Remote name -> URL (raw: strip credentials before recording)."""
    untrusted_filters: list[str]
    """Filter drivers named in the repository's own config (local/worktree scope)."""


def read_repo_config(root: Path) -> RepoConfig:
    """Remote URLs and the repository-local filter drivers.

    A ``filter.<name>.clean``/``process`` command set in ``.git/config`` runs
    whenever ``git diff`` reads a matching worktree file: as much a command
    the repository chose as ``core.fsmonitor``. Those are switched off for our
    diff; drivers from the user's own (global) config, such as git-lfs, stay.
    With a git older than 2.26 (no ``--show-scope``) every filter is off.
    """
    urls: dict[str, str] = {}
    filters: list[str] = []
    for scope, key_b, value_b in read_config(root):
        key = key_b.decode("utf-8", "replace")
        if key.startswith("remote."):
            name = key.removeprefix("remote.").removesuffix(".url")
            urls.setdefault(name, value_b.decode("utf-8", "replace").strip())
        elif scope in (b"local", b"worktree") and not key.endswith(".smudge"):
            name = key.removeprefix("filter.").rsplit(".", 1)[0]
            if name not in filters:
                filters.append(name)
    return RepoConfig(urls, filters)


@dataclass(frozen=True)
class RepoFacts:
    """The repository's state, config and index listing, before any file is filtered."""

    state: RepoState
    config: RepoConfig
    gitlinks: list[tuple[str, str]]
    """Submodules: (path, recorded commit)."""
    untracked: list[bytes]
    """Untracked, not-ignored paths, as git lists them."""
    clean_patch: bytes | None
    """The patch when nothing is untracked (the same ``git diff`` the probe would run)."""


def read_repo_facts(cwd: Path) -> RepoFacts | str:
    """Everything the code probe asks git before it filters untracked files.

    Returns the reason when ``cwd`` is not in a readable repository; raises
    ``GitMissingError`` when git is not installed.
    """
    state = read_repo_state(cwd)
    if isinstance(state, str):
        return state
    config = read_repo_config(state.root)
    gitlinks, untracked = index_listing(state.root)
    clean_patch = None
    if not untracked:
        clean_patch, _ = working_patch(state.root, state.head, state.git_dir, [],
                                       config.untrusted_filters)
    return RepoFacts(state, config, gitlinks, untracked, clean_patch)


class _Prefetch(threading.Thread):
    def __init__(self, cwd: Path) -> None:
        super().__init__(name="manifest-repo-prefetch", daemon=True)
        self.cwd = cwd
        self.result: RepoFacts | str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = read_repo_facts(self.cwd)
        except BaseException as exc:  # handed to the thread that takes the facts
            self.error = exc


_pending: dict[str, _Prefetch] = {}


def prefetch(cwd: Path) -> None:
    """Start :func:`read_repo_facts` for ``cwd`` on a daemon thread.

    The first :func:`repo_facts` for the same directory takes the answer; a
    process that exits first leaves only read-only git children behind.
    """
    key = os.path.abspath(cwd)
    if key not in _pending:
        thread = _Prefetch(Path(key))
        _pending[key] = thread
        thread.start()


def repo_facts(cwd: Path) -> RepoFacts | str:
    """The prefetched facts for ``cwd`` (waiting for them), else read now."""
    pending = _pending.pop(os.path.abspath(cwd), None)
    if pending is None:
        return read_repo_facts(cwd)
    pending.join()
    if pending.error is not None:
        raise pending.error
    assert pending.result is not None
    return pending.result
