"""Code probe: which source bytes ran.

What the digest proves: ``diff_digest`` is the blake3 of the patch that turns
the commit into the working tree as it was: ``git diff --binary HEAD`` over
a private copy of the index in which every untracked, not-ignored file is
marked intent-to-add, so new files (binary ones too) appear as additions.
The user's own index is never written. The patch bytes are stored in the
blob store so ``manifest verify`` can re-create the exact tree.

The store directory itself is excluded (it ignores itself via .gitignore).
What git is asked, and the thread that asks it early, is ``probes/repo.py``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from manifest.gitrun import GitMissingError, run_git
from manifest.models import Code, Submodule
from manifest.probes.repo import RepoConfig, repo_facts, working_patch
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


def is_bytecode_cache(rel: bytes) -> bool:
    """Whether a repo-relative path is a CPython bytecode cache (derived from the source)."""
    parts = rel.split(b"/")
    return (len(parts) >= 2 and parts[-2] == b"__pycache__"
            and parts[-1].endswith((b".pyc", b".pyo")))


def _without(untracked: list[bytes], root: Path, exclude: frozenset[tuple[int, int]],
             written: frozenset[str] = frozenset()) -> tuple[list[bytes], dict[str, int]]:
    """Untracked paths that are code, and the large ones left out (path -> bytes).

    Not code: the files this capture writes (by device and inode in
    ``exclude``: the manifest, a ``2> cap.err``; they may still be empty),
    manifests of earlier captures (by content), files an earlier captured
    run wrote (``written``, remembered by the store: TensorBoard events, logs),
    and Python's bytecode caches (``__pycache__/*.pyc``): the interpreter
    writes them beside any imported module of a tree whose ``.gitignore``
    does not name them, so the first run of a script made the next run's
    code differ (a lab, then a lab on SLURM, of one tree: two run_ids).
    """
    kept: list[bytes] = []
    large: dict[str, int] = {}
    for rel in untracked:
        if is_bytecode_cache(rel):
            continue
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
        facts = repo_facts(cwd)
    except GitMissingError:
        return CodeProbe(_none("commit", "git is not installed"), None, None, None, None)
    if isinstance(facts, str):
        return CodeProbe(_none("commit", facts), None, None, None, None)
    state, config, gitlinks = facts.state, facts.config, facts.gitlinks
    root = state.root
    unavailable: dict[str, str] = {}
    if state.head_problem:
        unavailable["commit"] = state.head_problem
    untracked, large = _without(facts.untracked, root, exclude,
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
    if facts.clean_patch is not None and not untracked:
        patch, n_untracked = facts.clean_patch, 0
    else:
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


# ------------------------------------------------------------------ lockfile pins

LOCK_PIN_FILES = ("uv.lock", "poetry.lock")
"""TOML lockfiles whose ``[[package]]`` tables give each package's locked version."""


def lockfile_pins(root: Path, names: list[str]) -> dict[str, dict[str, set[str]]]:
    """Exact versions the lockfiles at ``root`` pin: lockfile -> package -> versions.

    Only what needs no resolver: ``name==version`` lines of ``requirements*.txt``
    (``constraints*.txt`` too), without environment markers, wildcards or ``===``,
    and the ``[[package]]`` name and version of ``uv.lock`` and ``poetry.lock``
    (a lock that forks per platform lists several versions of one package: any of
    them agrees). An unreadable file pins nothing.
    """
    from manifest.probes.env import normalise_name

    out: dict[str, dict[str, set[str]]] = {}
    for name in names:
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        pins: dict[str, set[str]] = {}
        if name in LOCK_PIN_FILES:
            import tomllib

            try:
                packages = tomllib.loads(text).get("package", [])
            except tomllib.TOMLDecodeError:
                continue
            for table in packages if isinstance(packages, list) else []:
                pkg, version = (table.get("name"), table.get("version")) if isinstance(
                    table, dict) else (None, None)
                if isinstance(pkg, str) and isinstance(version, str):
                    pins.setdefault(normalise_name(pkg), set()).add(version)
        elif name.endswith(".txt"):
            for raw in text.splitlines():
                line = raw.split(" #", 1)[0].strip().rstrip("\\").strip()
                if not line or line.startswith(("#", "-")) or ";" in line:
                    continue
                pkg, sep, version = line.partition("==")
                version = version.split()[0] if version.split() else ""
                if not sep or not version or "*" in version or version.startswith("="):
                    continue
                pkg = pkg.split("[", 1)[0].strip()
                if pkg and "," not in version:
                    pins.setdefault(normalise_name(pkg), set()).add(version)
        if pins:
            out[name] = pins
    return out


def _agrees(installed: str, pinned: str) -> bool:
    """``==2.13.0`` admits ``2.13.0+cpu`` (PEP 440: a pin without a local label
    matches any local label)."""
    return installed == pinned or ("+" not in pinned and installed.split("+", 1)[0] == pinned)


def lockfile_disagreements(root: Path, names: list[str],
                           installed: dict[str, str]) -> list[dict[str, str]]:
    """Installed packages whose version no pin of a lockfile names, one entry each:
    ``{"package", "lockfile", "locked", "installed"}``, sorted by package then lockfile.
    A pinned package that is not installed is not listed (the run did not use it)."""
    found: list[dict[str, str]] = []
    for lockfile, pins in lockfile_pins(root, names).items():
        for pkg, versions in pins.items():
            have = installed.get(pkg)
            if have is None or any(_agrees(have, v) for v in versions):
                continue
            found.append({"package": pkg, "lockfile": lockfile,
                          "locked": " or ".join(sorted(versions)), "installed": have})
    return sorted(found, key=lambda f: (f["package"], f["lockfile"]))
