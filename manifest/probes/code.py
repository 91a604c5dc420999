"""Code probe: which source bytes ran.

What the digest proves: ``diff_digest`` is the blake3 of the patch that turns
the commit into the working tree as it was: ``git diff --binary HEAD`` over
a private copy of the index in which every untracked, not-ignored file is
marked intent-to-add, so new files (binary ones too) appear as additions.
The user's own index is never written. The patch bytes are stored in the
blob store so ``manifest verify`` can re-create the exact tree.

The store directory itself is excluded (it ignores itself via .gitignore).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import blake3

from manifest.gitrun import EMPTY_TREE, GitFailedError, GitMissingError, run_git
from manifest.models import Code, Submodule
from manifest.store import BlobStore

LOCKFILE_NAMES = ("uv.lock", "poetry.lock", "Pipfile.lock", "pdm.lock", "environment.yml",
                  "environment.yaml", "conda-lock.yml")
LOCKFILE_PATTERNS = (re.compile(r"^requirements.*\.txt$"), re.compile(r"^constraints.*\.txt$"))


@dataclass(frozen=True)
class CodeProbe:
    """The code section plus the facts that go to ``observed``."""

    code: Code
    root: Path | None
    branch: str | None
    remote_url: str | None
    patch: bytes | None


def strip_credentials(url: str) -> str:
    """Remove userinfo (user:token@) from a URL; scp-style ``git@host:path`` is kept.

    Query strings are dropped too: tokens travel there as well (``?token=``).
    """
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _file_digest(path: Path) -> str:
    h = blake3.blake3()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "blake3:" + h.hexdigest()


def find_lockfiles(root: Path) -> dict[str, str]:
    """Digests of the lockfiles at the repository root, by file name."""
    found: dict[str, str] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        if name in LOCKFILE_NAMES or any(p.match(name) for p in LOCKFILE_PATTERNS):
            path = root / name
            if path.is_file():
                try:
                    found[name] = _file_digest(path)
                except OSError:
                    continue
    return found


def _none(reason_field: str, reason: str) -> Code:
    return Code(
        commit=None,
        dirty=None,
        diff_digest=None,
        untracked_files=None,
        submodules=[],
        shallow=None,
        detached=None,
        lockfiles={},
        unavailable={reason_field: reason},
    )


def working_patch(root: Path, head: str | None) -> tuple[bytes, int]:
    """The binary patch from ``head`` (or the empty tree) to the working tree.

    Returns (patch bytes, number of untracked files included).
    """
    untracked = run_git(["ls-files", "--others", "--exclude-standard", "-z"], root).stdout
    paths = [p for p in untracked.split(b"\0") if p]
    base = head or EMPTY_TREE
    diff_args = ["diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color",
                 "--full-index", base, "--"]
    if not paths:
        return run_git(diff_args, root).stdout, 0
    # A private index: copy of the user's, plus intent-to-add entries.
    git_dir = Path(os.fsdecode(run_git(["rev-parse", "--absolute-git-dir"], root).stdout.strip()))
    with tempfile.TemporaryDirectory(prefix="manifest-index-") as tmp:
        index = Path(tmp) / "index"
        if (git_dir / "index").exists():
            shutil.copyfile(git_dir / "index", index)
        env = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1"}
        run_git(["add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul"],
                root, env=env, input_bytes=b"\0".join(paths) + b"\0")
        return run_git(diff_args, root, env=env).stdout, len(paths)


def _submodules(root: Path) -> list[Submodule]:
    out = run_git(["ls-files", "--stage", "-z"], root).stdout
    subs: list[Submodule] = []
    for entry in out.split(b"\0"):
        if not entry.startswith(b"160000 "):
            continue
        meta, _, path_b = entry.partition(b"\t")
        recorded = meta.split(b" ")[1].decode()
        path = os.fsdecode(path_b)
        commit: str | None = recorded
        sub = root / path
        if (sub / ".git").exists():
            try:
                commit = run_git(["rev-parse", "HEAD"], sub).stdout.decode().strip()
            except GitFailedError:
                commit = recorded
        subs.append(Submodule(path=path, commit=commit))
    return subs


def probe_code(cwd: Path, store: BlobStore | None = None) -> CodeProbe:
    """Record the code state of the repository containing ``cwd``.

    Never raises for a missing git or a non-repository: records the reason.
    Writes the patch blob into ``store`` when the tree is dirty.
    """
    try:
        top = run_git(["rev-parse", "--show-toplevel"], cwd, check=False)
    except GitMissingError:
        return CodeProbe(_none("commit", "git is not installed"), None, None, None, None)
    if top.returncode != 0:
        return CodeProbe(_none("commit", "not inside a git repository"), None, None, None, None)
    root = Path(os.fsdecode(top.stdout.strip()))
    lockfiles = find_lockfiles(root)
    unavailable: dict[str, str] = {}

    head_proc = run_git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], root, check=False)
    head = head_proc.stdout.decode().strip() if head_proc.returncode == 0 else None
    if head is None:
        unavailable["commit"] = "the repository has no commits yet (unborn HEAD)"
    branch_proc = run_git(["symbolic-ref", "-q", "--short", "HEAD"], root, check=False)
    branch = branch_proc.stdout.decode("utf-8", "replace").strip() or None
    detached = branch_proc.returncode != 0
    shallow = run_git(["rev-parse", "--is-shallow-repository"], root).stdout.strip() == b"true"

    patch, n_untracked = working_patch(root, head)
    diff_digest = "blake3:" + blake3.blake3(patch).hexdigest() if patch else None
    if patch and store is not None:
        store.put(patch)

    remote_url = None
    remotes = run_git(["remote"], root).stdout.decode().split()
    if remotes:
        name = "origin" if "origin" in remotes else remotes[0]
        got = run_git(["remote", "get-url", name], root, check=False)
        if got.returncode == 0:
            remote_url = strip_credentials(got.stdout.decode("utf-8", "replace").strip())

    code = Code(
        commit=head,
        dirty=bool(patch),
        diff_digest=diff_digest,
        untracked_files=n_untracked,
        submodules=_submodules(root),
        shallow=shallow,
        detached=detached,
        lockfiles=lockfiles,
        unavailable=unavailable,
    )
    return CodeProbe(code, root, branch, remote_url, patch or None)
