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
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from manifest.gitrun import EMPTY_TREE, GitMissingError, run_git
from manifest.models import Code, Submodule
from manifest.redact import is_secret_file, strip_url_credentials
from manifest.store import BlobStore

LOCKFILE_NAMES = ("uv.lock", "poetry.lock", "Pipfile.lock", "pdm.lock", "environment.yml",
                  "environment.yaml", "conda-lock.yml")
LARGE_UNTRACKED = 1 << 20
"""An untracked file above 1 MiB is named in a note, not packed: an un-ignored ``mlruns/``
(50 MB) once became a 64 MB patch blob; code is rarely that large, run output often is."""
LOCKFILE_PREFIXES = ("requirements", "constraints")
"""``requirements*.txt`` and ``constraints*.txt`` (plain string tests: no regex to compile)."""


@dataclass(frozen=True)
class CodeProbe:
    """The code section plus the facts that go to ``observed``."""

    code: Code
    root: Path | None
    branch: str | None
    remote_url: str | None
    patch: bytes | None
    large: dict[str, int] = field(default_factory=dict)
    """Untracked, not-ignored files over :data:`LARGE_UNTRACKED` bytes, left out of the patch."""


def strip_credentials(url: str) -> str:
    """A remote URL without userinfo, query and fragment (tokens travel there too:
    ``?private_token=``); the one redactor does it (``manifest.redact``)."""
    return strip_url_credentials(url)


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
        if name in LOCKFILE_NAMES or (name.startswith(LOCKFILE_PREFIXES)
                                      and name.endswith(".txt")):
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


def working_patch(root: Path, head: str | None, git_dir: Path | None = None,
                  untracked: list[bytes] | None = None,
                  no_filters: Sequence[str] = ()) -> tuple[bytes, int]:
    """The binary patch from ``head`` (or the empty tree) to the working tree.

    ``untracked`` (the untracked, not-ignored paths) is listed with git when
    not given; the filter drivers in ``no_filters`` are switched off for the
    diff. Returns (patch bytes, number of untracked files included).
    """
    config = [f"filter.{name}.{kind}=" for name in no_filters for kind in ("clean", "process")]
    if untracked is None:
        listing = run_git(["ls-files", "--others", "--exclude-standard", "-z"], root).stdout
        untracked = [p for p in listing.split(b"\0") if p]
    base = head or EMPTY_TREE
    diff_args = ["diff", "--binary", "--no-ext-diff", "--no-textconv", "--no-color",
                 "--full-index", "--ignore-submodules=none", base, "--"]
    if not untracked:
        return run_git(diff_args, root, config=config).stdout, 0
    if git_dir is None:
        git_dir = Path(os.fsdecode(
            run_git(["rev-parse", "--absolute-git-dir"], root).stdout.strip()))
    # A private index: copy of the user's, plus intent-to-add entries, so the
    # user's own index is never written. ``add -N`` also writes the empty blob
    # into the object store: a private object directory (the repository's own
    # as an alternate) receives it, so nothing is written into .git and a
    # read-only checkout works.
    with tempfile.TemporaryDirectory(prefix="manifest-index-") as tmp:
        index = Path(tmp) / "index"
        if (git_dir / "index").exists():
            shutil.copyfile(git_dir / "index", index)
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


def _index_listing(root: Path) -> tuple[list[tuple[str, str]], list[bytes]]:
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


def _submodules(root: Path, gitlinks: list[tuple[str, str]]) -> list[Submodule]:
    """Each submodule's checked-out commit (the recorded one if not checked out)."""
    subs: list[Submodule] = []
    for path, recorded in gitlinks:
        commit: str | None = recorded
        sub = root / path
        if (sub / ".git").exists():
            got = run_git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], sub, check=False)
            if got.returncode == 0:
                commit = got.stdout.decode("ascii", "replace").strip()
        subs.append(Submodule(path=path, commit=commit))
    return subs


@dataclass(frozen=True)
class RepoConfig:
    """What the code probe needs from git config, read in one call."""

    remote_urls: dict[str, str]
    """Remote name -> URL (raw: strip credentials before recording)."""
    untrusted_filters: list[str]
    """Filter drivers named in the repository's own config (local/worktree scope)."""


_CONFIG_KEYS = r"^(remote\..*\.url|filter\..*\.(clean|process))$"


def read_repo_config(root: Path) -> RepoConfig:
    """Remote URLs and the repository-local filter drivers.

    A ``filter.<name>.clean``/``process`` command set in ``.git/config`` runs
    whenever ``git diff`` reads a matching worktree file: as much a command
    the repository chose as ``core.fsmonitor``. Those are switched off for our
    diff; drivers from the user's own (global) config, such as git-lfs, stay.
    With a git older than 2.26 (no ``--show-scope``) every filter is off.
    """
    got = run_git(["config", "-z", "--show-scope", "--get-regexp", _CONFIG_KEYS], root,
                  check=False)
    scoped = got.returncode != 129
    if not scoped:
        got = run_git(["config", "-z", "--get-regexp", _CONFIG_KEYS], root, check=False)
    items = [item for item in got.stdout.split(b"\0") if item]
    urls: dict[str, str] = {}
    filters: list[str] = []
    scope = b"local"
    for item in items:
        if scoped and b"\n" not in item:
            scope = item
            continue
        key_b, _, value_b = item.partition(b"\n")
        key = key_b.decode("utf-8", "replace")
        if key.startswith("remote."):
            name = key.removeprefix("remote.").removesuffix(".url")
            urls.setdefault(name, value_b.decode("utf-8", "replace").strip())
        elif scope in (b"local", b"worktree"):
            name = key.removeprefix("filter.").rsplit(".", 1)[0]
            if name not in filters:
                filters.append(name)
    return RepoConfig(urls, filters)


def remote_url(config: RepoConfig) -> str | None:
    """URL of ``origin`` (else of the first remote configured), credentials stripped.

    ``url.*.insteadOf`` rewriting is not applied (the URL is an observed fact,
    outside the run's identity).
    """
    urls = config.remote_urls
    if not urls:
        return None
    return strip_credentials(urls.get("origin") or next(iter(urls.values())))


_MANIFEST_HEAD = b'{"code":{'
_MANIFEST_TAIL = b'"schema":"manifest/v1"}'


def is_manifest_file(path: Path) -> bool:
    """Whether ``path`` is a canonical manifest this tool wrote (by its first and last bytes).

    Canonical JSON sorts keys, so every manifest starts with the ``code``
    section and ends with the ``schema`` member.
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_MANIFEST_HEAD))
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size < len(_MANIFEST_HEAD) + len(_MANIFEST_TAIL):
                return False
            fh.seek(size - len(_MANIFEST_TAIL))
            tail = fh.read()
    except OSError:
        return False
    return head == _MANIFEST_HEAD and tail == _MANIFEST_TAIL


def _without(untracked: list[bytes], root: Path, exclude: frozenset[tuple[int, int]],
             written: frozenset[str] = frozenset()) -> tuple[list[bytes], dict[str, int]]:
    """Untracked paths that are code, and the large ones left out (path -> bytes).

    Not code: the files this capture writes (by device and inode in
    ``exclude``: the manifest, a ``2> cap.err``; they may still be empty),
    manifests of earlier captures (by content), and files an earlier captured
    run wrote (``written``, remembered by the store: TensorBoard events, logs).
    """
    kept: list[bytes] = []
    large: dict[str, int] = {}
    for rel in untracked:
        path = root / os.fsdecode(rel)
        try:
            st = os.lstat(path)
        except OSError:
            kept.append(rel)
            continue
        if (st.st_dev, st.st_ino) in exclude or os.fsdecode(rel) in written:
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_size > LARGE_UNTRACKED:
                large[os.fsdecode(rel)] = st.st_size
                continue
            if is_manifest_file(path):
                continue
        kept.append(rel)
    return kept, large


def probe_code(cwd: Path, store: BlobStore | None = None, *,
               exclude: frozenset[tuple[int, int]] = frozenset(),
               written: Callable[[Path], frozenset[str]] | None = None) -> CodeProbe:
    """Record the code state of the repository containing ``cwd``.

    Never raises for a missing git or a non-repository: records the reason.
    Writes the patch blob into ``store`` when the tree is dirty. Untracked
    manifests are left out of the patch: the file ``manifest capture >
    run.json`` is writing into (named by (device, inode) in ``exclude``) and
    manifests of earlier captures, which must not change the run they describe.
    ``written(root)`` names the files earlier captured runs wrote (not code either).
    """
    try:
        state = read_repo_state(cwd)
    except GitMissingError:
        return CodeProbe(_none("commit", "git is not installed"), None, None, None, None)
    if isinstance(state, str):
        return CodeProbe(_none("commit", state), None, None, None, None)
    root = state.root
    unavailable: dict[str, str] = {}
    if state.head_problem:
        unavailable["commit"] = state.head_problem
    config = read_repo_config(root)
    gitlinks, untracked = _index_listing(root)
    untracked, large = _without(untracked, root, exclude,
                                written(root) if written is not None else frozenset())
    withheld = [p for p in untracked if is_secret_file(p)]
    if withheld:
        # Credentials by name (.env, .netrc, *.pem …) never enter a blob: a
        # manifest and its store are meant to be shared.
        untracked = [p for p in untracked if not is_secret_file(p)]
        names = ", ".join(sorted(os.fsdecode(p) for p in withheld))
        unavailable["untracked_secrets"] = (
            f"{len(withheld)} untracked file(s) left out of the patch because their names "
            f"say they hold credentials: {names}")
    patch, n_untracked = working_patch(root, state.head, state.git_dir, untracked,
                                       config.untrusted_filters)
    diff_digest = "blake3:" + blake3.blake3(patch).hexdigest() if patch else None
    if patch and store is not None:
        store.put(patch)
    code = Code(
        commit=state.head,
        dirty=bool(patch),
        diff_digest=diff_digest,
        untracked_files=n_untracked,
        submodules=_submodules(root, gitlinks),
        shallow=state.shallow,
        detached=state.detached,
        lockfiles=find_lockfiles(root),
        unavailable=unavailable,
    )
    return CodeProbe(code, root, state.branch, remote_url(config), patch or None, large)
