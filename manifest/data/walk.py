"""The walk: every entry below a dataset's top, sorted by the bytes of its path.

The listing's order (raw bytes of the relative path) makes a root independent
of the machine and of the order a directory was read in; see
``manifest.data.listing`` for the format. Links are recorded, never followed;
a directory seen twice (a bind-mount loop) is refused by name.

Why the walk is shared with the workers: on a tree of many directories the
parent only scans the first levels (at most :data:`EXPAND_LEVELS`) and hands
each directory below them to a forked worker as a *subtree*, which walks,
hashes and renders it alone (``manifest.data.pool``), so the walk runs beside
the hashing instead of before it. A flat tree (more than
:data:`EXPAND_FILES` files in the scanned levels) is walked by the parent and
handed out in chunks instead. The parent keeps only the first levels' entries
in memory, so a tree of a million files in many directories costs the parent
little more than one subtree's worth.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from operator import itemgetter

from manifest.data.listing import SPECIAL_KIND, path_text

EXPAND_LEVELS = 3
"""The parent scans at most this many levels looking for subtrees to hand out."""
TREES_PER_JOB = 4
"""Subtrees per worker that make the walk worth splitting (enough to balance)."""
EXPAND_FILES = 2048
"""More files than this in the levels the parent scanned: a flat tree, split by chunks."""
TREE = "\x01"
"""The line that stands for a subtree walked by a worker; never in a line."""


_Found = list[tuple[bytes, str | None, int, bytes]]
DirIds = list[tuple[bytes, int, int]]
"""(relative path, device, inode) of each directory a walk entered."""
Problems = list[tuple[bytes, str]]
"""(relative path, why) of each entry a walk could not read."""


class Entries:
    """The sorted entries of a listing, in parallel lists.

    ``lines[i]`` is the finished line of a non-file entry, or None for a
    regular file, which is ``names[i]`` in directory ``dirs[folder[i]]``.
    Files are opened relative to a descriptor of their directory: a lookup
    of one name instead of a walk of the whole path, from every worker.

    (Plain classes here, not dataclasses: importing ``dataclasses`` costs
    ``manifest hash`` ~8 ms of start-up.)
    """

    __slots__ = ("dirs", "folder", "lines", "names", "rel")

    def __init__(self, rel: list[bytes], lines: list[str | None], folder: list[int],
                 names: list[bytes], dirs: list[bytes]) -> None:
        self.rel, self.lines, self.folder, self.names, self.dirs = rel, lines, folder, names, dirs

    def path(self, i: int) -> bytes:
        return os.path.join(self.dirs[self.folder[i]], self.names[i])


def _scan(abs_dir: bytes, rel_dir: bytes, found: _Found, problems: Problems,
          dirs: list[bytes], seen: set[tuple[int, int]], skip: set[tuple[int, int]],
          stack: list[tuple[bytes, bytes]], dir_ids: DirIds) -> int:
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
                    problems.append((prefix + name, reason(exc)))
    except OSError as exc:
        problems.append((rel_dir, reason(exc)))
    return files


def _sorted_entries(found: _Found, dirs: list[bytes]) -> Entries:
    found.sort(key=itemgetter(0))
    # Columns by map(itemgetter): zip(*found) would build a 4-tuple of 50k arguments.
    columns = [list(map(itemgetter(k), found)) for k in range(4)]
    return Entries(columns[0], columns[1], columns[2], columns[3], dirs)


def walk(top: bytes, top_st: os.stat_result, skip: set[tuple[int, int]],
         progress: Callable[[int, int], None], jobs: int
         ) -> tuple[Entries, list[tuple[bytes, bytes]], Problems, set[tuple[int, int]]]:
    """Entries below ``top`` sorted by relative path bytes, subtrees left to workers,
    and what went wrong.

    The parent scans the first levels only; when they hold enough directories
    (and few files), each directory below them is a subtree that a worker
    walks, hashes and renders by itself: it is an entry ``TREE`` sorted at
    ``rel + b"/"``, where its lines go (every path below ``rel`` starts with
    that, and no other path does). Otherwise (a flat tree, or one with too
    few directories to balance) the parent walks everything.
    """
    found: _Found = []
    problems: Problems = []
    dirs: list[bytes] = []
    ids: DirIds = []
    seen = {(top_st.st_dev, top_st.st_ino)}
    level: list[tuple[bytes, bytes]] = [(top, b"")]
    files = 0
    trees: list[tuple[bytes, bytes]] = []
    for _ in range(EXPAND_LEVELS):
        below: list[tuple[bytes, bytes]] = []
        for abs_dir, rel_dir in level:
            files += _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, below, ids)
        level = below
        if not below or files > EXPAND_FILES:
            break
        if len(below) >= TREES_PER_JOB * jobs and hasattr(os, "fork"):
            trees, level = sorted(below, key=lambda t: t[1] + b"/"), []
            break
    stack = level
    while stack:
        abs_dir, rel_dir = stack.pop()
        _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, stack, ids)
        progress(0, 0)
    found += [(rel + b"/", TREE, -1, b"") for _, rel in trees]
    return _sorted_entries(found, dirs), trees, problems, seen


def walk_tree(abs_dir: bytes, rel_dir: bytes, seen: set[tuple[int, int]],
              skip: set[tuple[int, int]]) -> tuple[Entries, Problems, DirIds]:
    """Everything below one subtree (in a worker): entries, problems, directories seen."""
    found: _Found = []
    problems: Problems = []
    dirs: list[bytes] = []
    ids: DirIds = []
    seen = set(seen)
    stack = [(abs_dir, rel_dir)]
    while stack:
        abs_dir, rel_dir = stack.pop()
        _scan(abs_dir, rel_dir, found, problems, dirs, seen, skip, stack, ids)
    return _sorted_entries(found, dirs), problems, ids


def _classify(entry: os.DirEntry[bytes], rel: bytes, found: _Found,
              problems: Problems, seen: set[tuple[int, int]],
              skip: set[tuple[int, int]], stack: list[tuple[bytes, bytes]],
              dir_ids: DirIds) -> None:
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
        kind = SPECIAL_KIND.get(stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode), "p")
        found.append((rel, f"{kind}\t{path_text(rel)}\n", -1, b""))


def seen_twice(dir_ids: DirIds) -> Problems:
    """Directories that two workers each walked (one is a bind mount of the other).

    Within one subtree the walk refuses a directory it has seen; across
    subtrees walked apart, the second of a pair in path order is named (not
    its subdirectories, which are their pair's subdirectories too).
    """
    first: set[tuple[int, int]] = set()
    named: list[bytes] = []
    problems: Problems = []
    for rel, dev, ino in sorted(dir_ids):
        if (dev, ino) not in first:
            first.add((dev, ino))
        elif not any(rel.startswith(above + b"/") for above in named):
            named.append(rel)
            problems.append((rel, "is a directory already seen above it (a bind-mount loop)"))
    return problems


def reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "was removed while the dataset was being hashed"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return (exc.strerror or str(exc)).lower()


WalkFn = Callable[[bytes, bytes], tuple[Entries, Problems, DirIds]]
"""(directory, its relative path) -> (its sorted entries, walk problems, directories seen)."""
