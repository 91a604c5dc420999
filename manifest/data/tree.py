r"""Dataset digests: one BLAKE3 root for a file or a directory tree.

What a root proves
==================

**A regular file** has as root the plain BLAKE3 of its bytes, so
``manifest hash FILE`` prints what ``b3sum FILE`` prints (with ``blake3:``
in front).

**A directory** has as root the BLAKE3 *derive-key* hash, context
``"manifest dataset-tree v1"``, of its *listing* (below); the file digests in
the listing are the leaves, so this is a two-level Merkle tree. Keyed this
way a tree root can never equal the plain digest of some file. It can be
recomputed with the reference tool::

    b3sum --derive-key "manifest dataset-tree v1" listing.txt

The listing (format ``manifest-tree/v1``) is UTF-8 text: the header line
``manifest-tree/v1`` and then one line per entry below the root (the root
itself is not an entry), fields separated by TAB, each line ended by LF::

    f <size> <blake3 hex of content> <path>    regular file
    l <target> <path>                           symbolic link (never followed)
    d <path>                                    directory (so empty ones count)
    p <path> | s <path> | c <path> | b <path>   FIFO, socket, char/block device
                                                (recorded, never opened)

* ``<path>`` is relative to the root, components joined by ``/``.
* Entries are sorted by the raw *bytes* of that relative path (so by neither
  locale nor walk order nor filesystem), which makes the root independent of
  the machine and of the order the directory was read in.
* ``<path>`` and ``<target>`` are written in the *path text* encoding: the
  name decoded as UTF-8; each byte that is not part of valid UTF-8, each
  control character (U+0000-U+001F, U+007F) and the backslash are written as
  ``\xHH`` (backslash as ``\\``). The encoding is reversible, so names that
  are not UTF-8 survive without loss, and its output is valid UTF-8 that
  RFC 8785 accepts; the same encoding is used for ``Dataset.path`` and
  ``Dataset.name``. A name containing no byte listed above is written as is.
* Not in a digest: permissions (the executable bit included), owners,
  timestamps, hard-link identity, extended attributes. A dataset is its
  names and its bytes; permission bits vary with umask and copy tools.
* Hard links are listed, and hashed, once per path. Sizes are decimal.
* The top-level path is followed if it is a symbolic link; links below it
  are recorded as links (``l``), whether their target is inside the dataset,
  outside it, dangling, or a loop, and their target is never hashed.
* The repository's own store (``.manifest/``) is skipped when it lies inside
  the dataset: it changes while the dataset is being hashed.

``files`` counts regular files, ``bytes`` sums their sizes (a hard-linked
file counts once per path). The listing is kept as a blob in the store
(``Dataset.listing``) so ``verify`` can name the files that changed.

Refused, with one sentence and exit status 2 (a root is never recorded for
a tree it could not read completely): a path that does not exist, a dangling
top-level link or a link loop, a top-level FIFO/socket/device, files or
directories this user cannot read (all named), a file removed while the
dataset was hashed, a file that kept changing after :data:`ATTEMPTS` reads
(each read is checked by ``stat`` before and after), a directory that is
its own ancestor (a bind-mount loop).

How the bytes are read (fork pool, mmap only in disposable workers, stat
checks) is explained in ``manifest.data.pool``; the cache that lets a second
capture skip unchanged files in ``manifest.data.cache``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import time
from collections.abc import Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import blake3

from manifest.data.cache import DigestCache
from manifest.data.pool import (
    ATTEMPTS,
    Entries,
    FileResult,
    Status,
    cpu_count,
    hash_entries,
)
from manifest.errors import DataError

if TYPE_CHECKING:
    from manifest.models import Dataset
    from manifest.store import BlobStore

LISTING_HEADER = "manifest-tree/v1"
TREE_CONTEXT = "manifest dataset-tree v1"
PROGRESS_AFTER_S = 1.0

__all__ = [
    "DatasetDigest",
    "compare_listing",
    "diff_listings",
    "digest_datasets",
    "digest_path",
    "hash_from_cli",
    "listing_root",
    "parse_data_spec",
    "path_bytes",
    "path_text",
]


# ---------------------------------------------------------------- path text

_NEEDS_ESCAPE = re.compile(rb"[\x00-\x1f\x7f\\\x80-\xff]")
_ESCAPE_CHARS = re.compile("[\x00-\x1f\x7f\\\\\udc80-\udcff]")
_UNESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|(\\))")


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group()
    if ch == "\\":
        return "\\\\"
    code = ord(ch)
    return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"


def path_text(name: bytes) -> str:
    """The reversible, valid-UTF-8 text of a file name (see the module docstring)."""
    if not _NEEDS_ESCAPE.search(name):
        return name.decode("ascii")
    return _ESCAPE_CHARS.sub(_escape_char, name.decode("utf-8", "surrogateescape"))


def path_bytes(text: str) -> bytes:
    """The inverse of :func:`path_text`."""
    out = bytearray()
    pos = 0
    for match in _UNESCAPE.finditer(text):
        out += text[pos:match.start()].encode("utf-8")
        out += b"\\" if match.group(2) else bytes([int(match.group(1), 16)])
        pos = match.end()
    out += text[pos:].encode("utf-8")
    return bytes(out)


# ------------------------------------------------------------------ digests


class DatasetDigest(NamedTuple):
    """The digest of one path: root, counts, and the listing it was computed from.

    (A NamedTuple, immutable: ``dataclasses`` would add ~8 ms of imports to
    every ``manifest hash``.)
    """

    root: str
    files: int
    total_bytes: int
    listing: bytes
    is_dir: bool


def _tree_root(listing: bytes) -> str:
    return "blake3:" + blake3.blake3(listing, derive_key_context=TREE_CONTEXT).hexdigest()


def listing_root(listing: bytes) -> str:
    """Recompute the root a listing blob stands for (raises DataError if malformed)."""
    entries = parse_listing(listing)
    if len(entries) == 1 and b"" in entries:
        kind, fields = entries[b""]
        if kind != "f":
            raise DataError("the recorded listing is malformed: an unnamed entry is not a file.")
        return "blake3:" + fields[1]
    return _tree_root(listing)


_SPECIAL_KIND = {stat.S_IFIFO: "p", stat.S_IFSOCK: "s", stat.S_IFCHR: "c", stat.S_IFBLK: "b"}
_KIND_WORD = {"f": "file", "l": "symlink", "d": "directory", "p": "FIFO", "s": "socket",
              "c": "character device", "b": "block device"}


class _Progress:
    """A rich progress bar on stderr, shown only once hashing has taken a second.

    Counts files against the number the walk found (bytes, for a single
    file). It is redrawn from the hashing loop (``auto_refresh=False``): a
    refresh thread would make the process multi-threaded when workers fork.
    """

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self.started = time.monotonic()
        self.files = 0
        self.bytes = 0
        self.total: int | None = None
        self.by_bytes = False
        self._bar: Any = None
        self._task: Any = None
        self._next = self.started + PROGRESS_AFTER_S

    def __call__(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + 0.1
            self._draw(now)

    def _draw(self, now: float) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[files]} files  {task.fields[size]}  "
                           "{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True), auto_refresh=False, transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(f"hashing {self.label}", total=self.total,
                                            files="0", size="", rate="")
        rate = self.bytes / max(now - self.started, 1e-9)
        self._bar.update(
            self._task, total=self.total,
            completed=self.bytes if self.by_bytes else self.files,
            files=f"{self.files:,}" if self.total is None or self.by_bytes
            else f"{self.files:,}/{self.total:,}",
            size=f"{self.bytes / 1e9:.2f} GB", rate=f"{rate / 1e9:.2f} GB/s",
        )
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


_EXPAND_LEVELS = 3
"""The parent scans at most this many levels looking for subtrees to hand out."""
_TREES_PER_JOB = 4
"""Subtrees per worker that make the walk worth splitting (enough to balance)."""
_EXPAND_FILES = 2048
"""More files than this in the levels the parent scanned: a flat tree, split by chunks."""
_TREE = "\x01"
"""The line that stands for a subtree walked by a worker; never in a line."""

_Found = list[tuple[bytes, str | None, int, bytes]]
_DirIds = list[tuple[bytes, int, int]]


def _scan(abs_dir: bytes, rel_dir: bytes, found: _Found, problems: list[tuple[bytes, str]],
          dirs: list[bytes], seen: set[tuple[int, int]], skip: set[tuple[int, int]],
          stack: list[tuple[bytes, bytes]], dir_ids: _DirIds) -> int:
    """List one directory into ``found``; its subdirectories go on ``stack``. Returns files."""
    folder = len(dirs)
    dirs.append(abs_dir)
    prefix = rel_dir + b"/" if rel_dir else b""
    append = found.append
    files = 0
    try:
        with os.scandir(abs_dir) as it:
            for entry in it:
                name = entry.name
                try:
                    # Regular files first: most entries are, and with
                    # follow_symlinks=False the three tests are exclusive.
                    if entry.is_file(follow_symlinks=False):
                        append((prefix + name, None, folder, name))
                        files += 1
                    else:
                        _classify(entry, prefix + name, found, problems, seen, skip, stack,
                                  dir_ids)
                except OSError as exc:
                    problems.append((prefix + name, _reason(exc)))
    except OSError as exc:
        problems.append((rel_dir, _reason(exc)))
    return files


def _entries(found: _Found, dirs: list[bytes]) -> Entries:
    found.sort(key=itemgetter(0))
    # Columns by map(itemgetter): zip(*found) would build a 4-tuple of 50k arguments.
    columns = [list(map(itemgetter(k), found)) for k in range(4)]
    return Entries(columns[0], columns[1], columns[2], columns[3], dirs)


def _walk(top: bytes, top_st: os.stat_result, skip: set[tuple[int, int]],
          progress: _Progress, jobs: int
          ) -> tuple[Entries, list[tuple[bytes, bytes]], list[tuple[bytes, str]],
                     set[tuple[int, int]]]:
    """Entries below ``top`` sorted by relative path bytes, subtrees left to workers,
    and what went wrong.

    The parent scans the first levels only; when they hold enough directories
    (and few files), each directory below them is a subtree that a worker
    walks, hashes and renders by itself: it is an entry ``_TREE`` sorted at
    ``rel + b"/"``, where its lines go (every path below ``rel`` starts with
    that, and no other path does). Otherwise (a flat tree, or one with too
    few directories to balance) the parent walks everything.
    """
    found: _Found = []
    problems: list[tuple[bytes, str]] = []
    dirs: list[bytes] = []
    ids: _DirIds = []
    seen = {(top_st.st_dev, top_st.st_ino)}
    level: list[tuple[bytes, bytes]] = [(top, b"")]
    files = 0
    trees: list[tuple[bytes, bytes]] = []
    for _ in range(_EXPAND_LEVELS):
        below: list[tuple[bytes, bytes]] = []
        for abs_dir, rel_dir in level:
            files += _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, below, ids)
        level = below
        if not below or files > _EXPAND_FILES:
            break
        if len(below) >= _TREES_PER_JOB * jobs and hasattr(os, "fork"):
            trees, level = sorted(below, key=lambda t: t[1] + b"/"), []
            break
    stack = level
    while stack:
        abs_dir, rel_dir = stack.pop()
        _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, stack, ids)
        progress(0, 0)
    found += [(rel + b"/", _TREE, -1, b"") for _, rel in trees]
    return _entries(found, dirs), trees, problems, seen


def _walk_tree(abs_dir: bytes, rel_dir: bytes, seen: set[tuple[int, int]],
               skip: set[tuple[int, int]]) -> tuple[Entries, list[tuple[bytes, str]], _DirIds]:
    """Everything below one subtree (in a worker): entries, problems, directories seen."""
    found: _Found = []
    problems: list[tuple[bytes, str]] = []
    dirs: list[bytes] = []
    ids: _DirIds = []
    seen = set(seen)
    stack = [(abs_dir, rel_dir)]
    while stack:
        abs_dir, rel_dir = stack.pop()
        _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, stack, ids)
    return _entries(found, dirs), problems, ids


def _classify(entry: os.DirEntry[bytes], rel: bytes, found: _Found,
              problems: list[tuple[bytes, str]], seen: set[tuple[int, int]],
              skip: set[tuple[int, int]], stack: list[tuple[bytes, bytes]],
              dir_ids: _DirIds) -> None:
    """An entry that is not a regular file: link, directory or special file."""
    if entry.is_symlink():
        target = os.readlink(entry.path)
        found.append((rel, f"l\t{path_text(target)}\t{path_text(rel)}\n", -1, b""))
    elif entry.is_dir(follow_symlinks=False):
        st = entry.stat(follow_symlinks=False)
        ident = (st.st_dev, st.st_ino)
        if ident in skip:
            return
        if ident in seen:
            problems.append((rel, "is a directory already seen above it (a bind-mount loop)"))
            return
        seen.add(ident)
        dir_ids.append((rel, st.st_dev, st.st_ino))
        found.append((rel, f"d\t{path_text(rel)}\n", -1, b""))
        stack.append((entry.path, rel))
    else:
        kind = _SPECIAL_KIND.get(stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode), "p")
        found.append((rel, f"{kind}\t{path_text(rel)}\n", -1, b""))


def _seen_twice(dir_ids: _DirIds) -> list[tuple[bytes, str]]:
    """Directories that two workers each walked (one is a bind mount of the other).

    Within one subtree the walk refuses a directory it has seen; across
    subtrees walked apart, the second of a pair in path order is named (not
    its subdirectories, which are their pair's subdirectories too).
    """
    first: set[tuple[int, int]] = set()
    named: list[bytes] = []
    problems: list[tuple[bytes, str]] = []
    for rel, dev, ino in sorted(dir_ids):
        if (dev, ino) not in first:
            first.add((dev, ino))
        elif not any(rel.startswith(above + b"/") for above in named):
            named.append(rel)
            problems.append((rel, "is a directory already seen above it (a bind-mount loop)"))
    return problems


def _file_line(size: int, digest: bytes, rel: bytes) -> str:
    return f"f\t{size}\t{digest.hex()}\t{path_text(rel)}\n"


def _reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "was removed while the dataset was being hashed"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return (exc.strerror or str(exc)).lower()


def _result_reason(res: FileResult) -> str:
    if res.status == Status.GONE:
        return "was removed while the dataset was being hashed"
    if res.status == Status.CHANGED:
        return f"kept changing while it was being hashed ({ATTEMPTS} attempts)"
    if res.errno in (errno.EPERM, errno.EACCES):
        return "permission denied"
    return os.strerror(res.errno).lower()


def _refuse(label: str, problems: list[tuple[bytes, str]]) -> DataError:
    problems.sort()
    shown = "; ".join(f"{path_text(rel) or '.'} {why}" if why.startswith(("was", "kept", "is"))
                      else f"{path_text(rel) or '.'} ({why})" for rel, why in problems[:5])
    more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
    if all(why == "permission denied" for _, why in problems):
        return DataError(
            f"cannot read {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} "
            f"of dataset {label}: {shown}{more}.",
            hint="Make them readable by this user, or move them out of the dataset.",
        )
    return DataError(f"dataset {label} cannot be hashed: {shown}{more}.",
                     hint="Capture again once nothing is writing to the dataset; "
                          "fix permissions for entries that cannot be read.")


def _open_top(path: Path, label: str) -> tuple[bytes, os.stat_result]:
    raw = os.fsencode(path)
    try:
        return raw, os.stat(raw)
    except FileNotFoundError:
        if os.path.islink(raw):
            target = path_text(os.readlink(raw))
            raise DataError(f"dataset {label} is a symbolic link to {target}, "
                            "which does not exist.") from None
        raise DataError(f"dataset path {label} does not exist.",
                        hint="Check the path, or the data list in [tool.manifest].") from None
    except PermissionError:
        raise DataError(f"cannot access dataset {label}: permission denied.") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DataError(f"dataset {label} is a symbolic link loop.") from None
        raise DataError(f"cannot access dataset {label}: {exc.strerror or exc}.") from None


def digest_path(path: Path, *, cache: DigestCache | None, no_cache: bool = False,
                quiet: bool = True, label: str | None = None,
                skip: Sequence[Path] = ()) -> DatasetDigest:
    """Digest a file or a directory tree (see the module docstring for what is hashed).

    ``cache`` is consulted unless ``no_cache``, and refreshed either way;
    ``skip`` names directories left out of a tree (the store). Raises
    :class:`DataError` for anything that prevents a complete, stable read.
    """
    label = label if label is not None else path_text(os.fsencode(path))
    started_ns = time.time_ns()
    top, top_st = _open_top(path, label)
    progress = _Progress(label, enabled=not quiet and sys.stderr.isatty())
    try:
        trees: list[tuple[bytes, bytes]] = []
        seen: set[tuple[int, int]] = set()
        skip_ids: set[tuple[int, int]] = set()
        if stat.S_ISREG(top_st.st_mode):
            # One unnamed entry; the top-level link, if any, is resolved first.
            parent, name = os.path.split(os.path.realpath(top))
            entries = Entries([b""], [None], [0], [name], [parent])
            progress.total, progress.by_bytes = top_st.st_size, True
            problems: list[tuple[bytes, str]] = []
        elif stat.S_ISDIR(top_st.st_mode):
            for folder in skip:
                with contextlib.suppress(OSError):
                    st = os.stat(folder)
                    skip_ids.add((st.st_dev, st.st_ino))
            jobs = cpu_count()
            entries, trees, problems, seen = _walk(top, top_st, skip_ids, progress, jobs)
            if not trees:  # with subtrees, the count is known only once they are walked
                progress.total = entries.lines.count(None)
        else:
            kind = _KIND_WORD[_SPECIAL_KIND.get(stat.S_IFMT(top_st.st_mode), "p")]
            raise DataError(f"dataset {label} is a {kind}, not a file or directory; "
                            "it is never opened.")
        hashed = hash_entries(entries, cache=cache, lookup=not no_cache, render=_file_line,
                              started_ns=started_ns, progress=progress, trees=trees,
                              walk=lambda path, rel: _walk_tree(path, rel, seen, skip_ids))
    finally:
        progress.close()
    problems += hashed.walk_problems
    problems += _seen_twice(hashed.dir_ids)
    problems += [(rel, _result_reason(res)) for rel, res in hashed.problems]
    if problems:
        raise _refuse(label, problems)
    listing = LISTING_HEADER.encode() + b"\n" + hashed.body
    if not stat.S_ISDIR(top_st.st_mode):
        hexd = hashed.body.split(b"\t")[2].decode()
        return DatasetDigest("blake3:" + hexd, 1, hashed.total_bytes, listing, is_dir=False)
    return DatasetDigest(_tree_root(listing), hashed.files, hashed.total_bytes, listing,
                         is_dir=True)


# ----------------------------------------------------------------- listings


def parse_listing(listing: bytes) -> dict[bytes, tuple[str, list[str]]]:
    """Entries of a listing blob: relative path bytes -> (kind, other fields)."""
    try:
        text = listing.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError("the recorded dataset listing is not UTF-8 text.") from None
    lines = text.split("\n")
    if lines[0] != LISTING_HEADER or lines[-1] != "":
        raise DataError(f"the recorded dataset listing is not a {LISTING_HEADER} listing.")
    entries: dict[bytes, tuple[str, list[str]]] = {}
    arity = {"f": 4, "l": 3, "d": 2, "p": 2, "s": 2, "c": 2, "b": 2}
    for line in lines[1:-1]:
        fields = line.split("\t")
        if arity.get(fields[0]) != len(fields):
            raise DataError("the recorded dataset listing has a malformed line.")
        entries[path_bytes(fields[-1])] = (fields[0], fields[1:-1])
    return entries


def diff_listings(old: bytes, new: bytes, *, label: str = ".") -> list[str]:
    """One line per entry added, removed or changed between two listings."""
    before, after = parse_listing(old), parse_listing(new)
    changes: list[str] = []
    for rel in sorted(before.keys() | after.keys()):
        name = path_text(rel) or label
        if rel not in after:
            changes.append(f"removed: {name} ({_KIND_WORD[before[rel][0]]})")
        elif rel not in before:
            changes.append(f"added: {name} ({_KIND_WORD[after[rel][0]]})")
        elif before[rel] != after[rel]:
            (k0, f0), (k1, f1) = before[rel], after[rel]
            if k0 != k1:
                why = f"{_KIND_WORD[k0]} -> {_KIND_WORD[k1]}"
            elif k0 == "f":
                why = "content" if f0[0] == f1[0] else f"content, {f0[0]} -> {f1[0]} bytes"
            else:
                why = f"link target {f0[0]} -> {f1[0]}"
            changes.append(f"changed: {name} ({why})")
    return changes


def compare_listing(recorded_listing: bytes, path: Path, *, store: BlobStore | None = None,
                    no_cache: bool = False, quiet: bool = True) -> list[str]:
    """Name what differs between a recorded listing and the tree at ``path`` today.

    An empty list means the dataset is unchanged. Uses the store's cache
    when ``store`` is given. Raises :class:`DataError` if ``path`` cannot be
    digested today (missing, unreadable) or the listing is malformed.
    """
    parse_listing(recorded_listing)
    cache = DigestCache.in_store(store.root) if store is not None else None
    label = path_text(os.fsencode(path))
    skip = [store.root] if store is not None else []
    today = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                        skip=skip)
    return diff_listings(recorded_listing, today.listing, label=label)


# ----------------------------------------------------------------- datasets


def parse_data_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` or ``PATH`` -> (name, path).

    ``NAME=`` is recognised when the text before the first ``=`` is not empty
    and has no ``/``; write ``./a=b`` for a path that contains ``=``. Without
    a name, the name is the path's last component (of the absolute path for
    ``.`` or ``..``).
    """
    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name:
        if not rest:
            raise DataError(f"dataset {spec!r} names no path; write NAME=PATH.")
        return path_text(os.fsencode(name)), Path(rest)
    if not spec:
        raise DataError("an empty dataset path was given.")
    path = Path(spec)
    base = path.name or Path(os.path.abspath(path)).name or "root"
    return path_text(os.fsencode(base)), path


def recorded_path(path: Path, repo_root: Path | None) -> str:
    """How a dataset path is written in the manifest.

    Inside ``repo_root``: relative to it, with ``/`` separators ("." for the
    root itself), so the manifest is the same on every clone. Elsewhere: the
    absolute path (symlinks not resolved). Both in the path text encoding.
    """
    absolute = os.path.abspath(path)
    if repo_root is not None:
        parent, leaf = os.path.split(absolute)
        for root, candidate in (
            (os.path.abspath(repo_root), absolute),
            (os.path.realpath(repo_root), os.path.join(os.path.realpath(parent), leaf)),
        ):
            rel = os.path.relpath(candidate, root)
            if rel != ".." and not rel.startswith("../"):
                return path_text(os.fsencode(Path(rel).as_posix()))
    return path_text(os.fsencode(absolute))


def digest_datasets(specs: list[str], *, repo_root: Path | None, store: BlobStore,
                    no_cache: bool, quiet: bool, base: Path | None = None) -> list[Dataset]:
    """Digest each ``[NAME=]PATH``; store each listing blob; return the data section.

    Relative paths are taken from ``base`` (default: the working directory);
    pass the pyproject.toml folder for paths from ``[tool.manifest] data``.
    """
    from manifest.models import Dataset

    store.ensure()
    cache = DigestCache.in_store(store.root)
    datasets: list[Dataset] = []
    names: set[str] = set()
    for spec in specs:
        name, path = parse_data_spec(spec)
        if name in names:
            raise DataError(f"two datasets are named {name!r}.",
                            hint="Name them apart with NAME=PATH.")
        names.add(name)
        if base is not None and not path.is_absolute():
            path = base / path
        label = path_text(os.fsencode(path))
        found = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                            skip=[store.root])
        datasets.append(Dataset(name=name, path=recorded_path(path, repo_root), root=found.root,
                                files=found.files, bytes=found.total_bytes,
                                listing=store.put(found.listing)))
    return datasets


# ---------------------------------------------------------------------- CLI


def find_repo_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``.git`` (no git process)."""
    start = Path(os.path.abspath(start))
    for folder in (start, *start.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def _cli_store_root(store_dir: str | None, cwd: Path) -> Path | None:
    if store_dir:
        return Path(os.path.abspath(store_dir))
    from manifest.config import load_config
    from manifest.store import STORE_DIRNAME

    repo = find_repo_root(cwd)
    table, origin = load_config(cwd)
    configured = table.get("store")
    if isinstance(configured, str) and configured:
        base = repo or (origin.parent if origin else cwd)
        return Path(os.path.abspath(base / configured))
    return repo / STORE_DIRNAME if repo is not None else None


def hash_from_cli(path: Path, *, no_cache: bool, store_dir: str | None, quiet: bool,
                  as_json: bool) -> str:
    """``manifest hash PATH``: the root alone, or with ``--json`` the dataset entry.

    The cache lives in ``--store``, else the configured store, else the
    enclosing git repository's ``.manifest/``; outside a repository without
    ``--store`` nothing is cached (nothing is written next to user files).
    """
    from manifest.errors import OutputError
    from manifest.store import BlobStore

    cwd = Path.cwd()
    store_root = _cli_store_root(store_dir, cwd)
    cache = None
    if store_root is not None:
        try:
            # Creates the store with its self-ignoring .gitignore, so the cache
            # never shows up as an untracked change of the repository.
            BlobStore(store_root).ensure()
            cache = DigestCache.in_store(store_root)
        except OutputError:
            store_root = None  # an unwritable store only costs the cache
    label = path_text(os.fsencode(path))
    found = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                        skip=[store_root] if store_root is not None else [])
    if not as_json:
        return found.root
    from manifest.canonical import canonical_bytes
    from manifest.models import Dataset

    name, _ = parse_data_spec(str(path))
    listing = BlobStore(store_root).put(found.listing) if store_root is not None else None
    entry = Dataset(name=name, path=recorded_path(path, find_repo_root(cwd)), root=found.root,
                    files=found.files, bytes=found.total_bytes, listing=listing)
    return canonical_bytes(entry.model_dump(mode="json")).decode("utf-8")
