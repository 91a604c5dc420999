"""Which files make two runs' code differ: for merge's refusal and for diff's report.

Merge refuses node records whose ``code`` differs. ``code.diff_digest`` alone
says only that the patches differ; the user needs the files. Each patch is
read from the local blob store (never from a location a record names), split
per file at its ``diff --git a/… b/…`` headers, and the two are compared file by
file. In one shared checkout (the usual multi-node set-up) every node's patch is
in the same store; a patch that is not there is said, not guessed.

The usual cause is a file the run itself writes into the repository while the
other node captures: a log redirected into the checkout is an untracked file,
and untracked files are code (they may be imported). The fix is to write logs
outside the repository or into a directory git ignores.

``diff`` says the same of two runs (:func:`code_report`): the files that differ
between the commits (git, in the repository holding the manifest) and between
the stored patches, with +/- line counts and, for a change of at most
:data:`SMALL_CHANGE` lines, the first changed line; a new file that the
repository still holds untracked and not ignored is named as such, with the
fix. An uncommitted one-line edit read ``uncommitted changes false → true``
without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from manifest.models import Manifest
from manifest.store import BlobStore

_HEADER = re.compile(rb"^diff --git a/(.*?) b/(.*)$", re.MULTILINE)
SHOWN = 10
"""Files named in a refusal; the rest are counted."""


def files_of(patch: bytes) -> dict[str, bytes]:
    """Path → that file's part of a ``git diff --binary`` patch (headers included)."""
    starts = list(_HEADER.finditer(patch))
    parts: dict[str, bytes] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(patch)
        path = match.group(2).decode("utf-8", "replace")
        parts[path] = patch[match.start():end]
    return parts


def differing_files(a: bytes, b: bytes) -> list[str]:
    """Files changed in one patch and not the other, or changed differently, sorted."""
    one, two = files_of(a), files_of(b)
    return sorted(p for p in one.keys() | two.keys() if one.get(p) != two.get(p))


def code_difference(a: Manifest, b: Manifest, store: BlobStore | None) -> str | None:
    """A sentence naming the files whose uncommitted changes differ between ``a`` and
    ``b``, or None when the records agree on the patch (another code field differs)."""
    da, db = a.code.diff_digest, b.code.diff_digest
    if da == db or a.code.commit != b.code.commit:
        return None
    patches = [store.get(d) if store is not None and d else b"" for d in (da, db)]
    if any(p is None for p in patches):
        return ("their uncommitted changes differ; the patches are not in this "
                "repository's store, so the files cannot be named here (run merge in the "
                "checkout the nodes captured from, or compare the nodes' `git status`)")
    files = differing_files(patches[0] or b"", patches[1] or b"")
    if not files:
        return None
    shown = ", ".join(files[:SHOWN]) + (f" and {len(files) - SHOWN} more"
                                         if len(files) > SHOWN else "")
    return f"their uncommitted changes differ in {len(files)} file(s): {shown}"


# ----------------------------------------------------------- what diff says

SMALL_CHANGE = 10
"""A file with at most this many changed lines gets its first changed line quoted: a
one-line edit is then read in the report, a rewrite is only counted."""
QUOTED = 80
"""Characters of a quoted line kept."""


@dataclass(frozen=True)
class FileChange:
    """One file's change in a patch (or between two commits): +/- line counts, whether
    the file is new to the commit, and for a small text change its first changed line."""

    path: str
    added: int
    removed: int
    new: bool = False
    binary: bool = False
    first: str | None = None
    """``line 12: + lr = 0.2`` (the new file's line number; ``-`` lines number the old)."""

    @property
    def counts(self) -> str:
        return "binary" if self.binary else f"+{self.added} -{self.removed}"


def file_change(path: str, part: bytes) -> FileChange:
    """Parse one file's part of a ``git diff`` patch."""
    added = removed = 0
    first: str | None = None
    new = binary = False
    old_line = new_line = 0
    in_hunk = replaced = False
    for raw in part.split(b"\n"):
        if raw.startswith(b"@@ "):
            in_hunk = True
            hunk = _HUNK.match(raw)
            if hunk is not None:
                old_line, new_line = int(hunk.group(1)), int(hunk.group(2))
            continue
        if not in_hunk:
            new = new or raw.startswith(b"new file mode")
            binary = binary or raw.startswith((b"GIT binary patch", b"Binary files "))
            continue
        if raw.startswith(b"+"):
            added += 1
            if first is None:
                first = f"line {new_line}: + {_quote(raw[1:])}"
            elif replaced:  # the line that replaced the first removed one
                first += f" + {_quote(raw[1:])}"
            replaced = False
            new_line += 1
        elif raw.startswith(b"-"):
            removed += 1
            replaced = first is None
            if first is None:
                first = f"line {old_line}: - {_quote(raw[1:])}"
            old_line += 1
        elif raw.startswith(b" "):
            old_line += 1
            new_line += 1
    small = added + removed <= SMALL_CHANGE
    return FileChange(path, added, removed, new=new, binary=binary,
                      first=first if small else None)


_HUNK = re.compile(rb"^@@ -(\d+)(?:,\d+)? \+(\d+)")


def _quote(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    if not text:
        return "(blank line)"
    return text if len(text) <= QUOTED else text[:QUOTED - 1] + "…"


def patch_changes(a: bytes, b: bytes) -> list[tuple[str, FileChange]]:
    """(whose, change) for each file that makes two patches against one commit differ:
    ``b`` (changed in b's patch only, or differently in both: b's change is shown),
    ``a`` (in a's patch only)."""
    one, two = files_of(a), files_of(b)
    out: list[tuple[str, FileChange]] = []
    for path in differing_files(a, b):
        if path in two:
            out.append(("b" if path not in one else "both", file_change(path, two[path])))
        else:
            out.append(("a", file_change(path, one[path])))
    return out


def numstat_changes(numstat: bytes, patch: bytes) -> list[FileChange]:
    """Changes between two commits from ``git diff --numstat -z`` and the ``-U0`` patch."""
    parts = files_of(patch)
    out: list[FileChange] = []
    for row in numstat.split(b"\0"):
        fields = row.split(b"\t", 2)
        if len(fields) != 3 or not fields[2]:
            continue
        path = fields[2].decode("utf-8", "replace")
        part = parts.get(path)
        if part is not None:
            out.append(file_change(path, part))
        else:
            binary = fields[0] == b"-"
            out.append(FileChange(path, 0 if binary else int(fields[0]),
                                  0 if binary else int(fields[1]), binary=binary))
    return out


def _line(change: FileChange, whose: str | None = None) -> str:
    where = {"a": " (a's uncommitted change; b has none)", "b": "",
             "both": " (changed differently in both; b's change)"}.get(whose or "", "")
    first = f", {change.first}" if change.first else ""
    return f"  {change.path} {change.counts}{where}{first}"


def _stores(m: Manifest, root: Path | None) -> list[BlobStore]:
    found: list[BlobStore] = []
    if root is not None and m.observed.store and not Path(m.observed.store).is_absolute():
        found.append(BlobStore(root / m.observed.store))
    return found


def _patch(digest: str | None, stores: list[BlobStore]) -> bytes | None:
    if digest is None:
        return b""
    for store in stores:
        data = store.get(digest)
        if data is not None:
            return data
    return None


def _commit_changes(repo: Path, a: str, b: str) -> list[FileChange] | None:
    """The files two commits differ in, or None where git or either commit is missing
    (diff also runs in CI jobs without git: it then names no file)."""
    from manifest.errors import ManifestError
    from manifest.gitrun import run_git

    args = ["--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", a, b, "--"]
    try:
        numstat = run_git(["diff", "--numstat", "-z", *args], repo, check=False)
        if numstat.returncode != 0:
            return None
        patch = run_git(["diff", "-U0", *args], repo, check=False)
    except ManifestError:
        return None
    return numstat_changes(numstat.stdout, patch.stdout if patch.returncode == 0 else b"")


def _untracked(repo: Path | None, paths: list[str]) -> list[str]:
    """Which of these paths the repository holds untracked and not ignored now."""
    if repo is None or not paths:
        return []
    from manifest.errors import ManifestError
    from manifest.gitrun import run_git

    try:
        out = run_git(["ls-files", "-z", "--others", "--exclude-standard", "--", *paths],
                      repo, check=False)
    except ManifestError:
        return []
    found = {p.decode("utf-8", "replace") for p in out.stdout.split(b"\0") if p}
    return [p for p in paths if p in found]


def code_report(a: Manifest, b: Manifest, roots: tuple[Path | None, Path | None], *,
                outputs_identical: bool, only_code: bool) -> list[str]:
    """What diff says about the code: the files that differ between the two commits and
    between the two stored patches, each with +/- line counts and, for a small change,
    its first changed line; untracked files a patch carried, named as such with the
    fix; and, when the code is the only difference that can change the bits and the
    outputs are identical, that plainly. Lines are raw text (the CLI escapes them);
    the first of each group ends in ``:``, the files under it start with two spaces."""
    lines: list[str] = []
    ca, cb = a.code, b.code
    repo = roots[1] or roots[0]
    changed: list[str] = []
    if ca.commit and cb.commit and ca.commit != cb.commit:
        found = _commit_changes(repo, ca.commit, cb.commit) if repo is not None else None
        if found is None:
            lines.append(f"code: the commits differ ({ca.commit[:12]} → {cb.commit[:12]}); "
                         "the files cannot be named: no repository here holds both, or git "
                         "is missing.")
        elif found:
            lines.append(f"code: the commits differ in {len(found)} file(s):")
            lines.extend(_line(c) for c in found[:SHOWN])
            if len(found) > SHOWN:
                lines.append(f"  … and {len(found) - SHOWN} more")
            changed.extend(c.path for c in found)
    if ca.diff_digest != cb.diff_digest:
        stores = [*_stores(a, roots[0]), *_stores(b, roots[1])]
        pa, pb = _patch(ca.diff_digest, stores), _patch(cb.diff_digest, stores)
        if pa is None or pb is None:
            lines.append("code: the uncommitted changes differ; a patch is not in the store "
                         "next to its manifest, so the files cannot be named.")
        else:
            if ca.commit == cb.commit:
                pairs = patch_changes(pa, pb)
                head = "the uncommitted changes differ"
            else:  # against different commits: each side's own patch, listed
                pairs = [("a", file_change(p, part)) for p, part in files_of(pa).items()] + [
                    ("b", file_change(p, part)) for p, part in files_of(pb).items()]
                head = "and each run had uncommitted changes of its own"
            if pairs:
                lines.append(f"code: {head} in {len(pairs)} file(s):")
                lines.extend(_line(c, whose) for whose, c in pairs[:SHOWN])
                if len(pairs) > SHOWN:
                    lines.append(f"  … and {len(pairs) - SHOWN} more")
                changed.extend(c.path for _, c in pairs)
                differ = {c.path for _, c in pairs}
                for side, m, patch, root in (("a", a, pa, roots[0]), ("b", b, pb, roots[1])):
                    fresh = [p for p, part in files_of(patch).items()
                             if p in differ and file_change(p, part).new]
                    # Every new file of the patch was untracked at capture when their count
                    # is the recorded one; else ask the repository about them now.
                    left = fresh if fresh and len(fresh) == m.code.untracked_files else (
                        _untracked(root, fresh))
                    if left:
                        tops = sorted({p.split("/")[0] + ("/" if "/" in p else "")
                                       for p in left})
                        lines.append(f"code: untracked, not ignored, so packed with the code "
                                     f"of {side}: {', '.join(left[:SHOWN])}; if they are not "
                                     f"code, add them to .gitignore ({' '.join(tops[:5])}).")
    if changed and outputs_identical and only_code:
        names = sorted(set(changed))
        what = (f"{names[0]} changed" if len(names) == 1 else
                f"{len(names)} files changed ({', '.join(names[:SHOWN])})")
        lines.append(f"code: only {what}; the outputs are identical.")
    return lines


def repository_of(manifest_file: str) -> Path | None:
    """The repository holding a manifest file (the nearest folder above it with ``.git``):
    where its commit and its store are looked for; None for stdin or outside any."""
    if manifest_file == "-":
        return None
    try:
        here = Path(manifest_file).resolve().parent
    except (OSError, RuntimeError):
        return None
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return None
