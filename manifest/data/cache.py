"""The file-digest cache that makes a second capture of unchanged data nearly free.

A row maps what ``stat`` says about a regular file to the BLAKE3 digest of
its bytes::

    (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) -> blake3(content)

The row is found by ``(dev, ino)`` and used only when size, mtime and ctime
are all equal. ctime is in the key because it cannot be set from user space:
``touch -d``/``os.utime`` can forge an old mtime after a rewrite, but every
such change moves ctime to "now".

Racily clean files (git's term) are never written: if a file's mtime or
ctime lies within :data:`RACY_WINDOW_NS` of the moment hashing started, a
write in the same timestamp tick as our read could leave every field of the
key unchanged while the bytes differ. Such files are re-read on every
capture until they have been quiet for the window. The window (2 s) covers
FAT's 2 s and HFS+'s 1 s timestamps, the coarse kernel clock that ext4, xfs
and btrfs stamp with, and modest clock skew of a network filesystem.

A second table, ``trees``, holds the rendered listing lines of each subtree a
worker walked (:class:`TreeRecord`), under the fingerprint of its entries and
of every file's key. A warm subtree then costs its walk and one ``lstat`` per
file, and no row per file: on 50,000 files in 100 folders the per-file rows
cost about as much CPU as the ``lstat`` calls, and rendering the lines again
nearly as much. A record is kept only when none of its files is racily clean.

The cache is an optimisation only: any SQLite error (locked, read-only,
corrupted) is treated as a miss on lookup and ignored on store, so a broken
cache costs time, never a wrong digest. Entries are not pruned by age; the
file is small (about 200 bytes per file ever hashed, rows and records) and
``rm`` is safe.

A connection is never carried across ``fork``: each process that looks up
opens its own, and :meth:`DigestCache.close` must be called before forking.
Forked workers only read; they send their fresh rows (:func:`pack_rows`) to
the parent, the one writer (:meth:`DigestCache.store_packed`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

CACHE_FILENAME = "datacache-v1.sqlite"
RACY_WINDOW_NS = 2_000_000_000
_QUERY_BATCH = 500
_ROW = struct.Struct("<qqqqq32s")
"""One row as a forked worker sends it to the parent: the columns of ``files``."""
ROW_SIZE = _ROW.size
_ROWS_PER_INSERT = 100
_ROWS = struct.Struct("<" + "qqqqq32s" * _ROWS_PER_INSERT)
_INSERT = "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)"
_INSERT_MANY = "INSERT OR REPLACE INTO files VALUES " + ", ".join(  # noqa: S608
    ["(?, ?, ?, ?, ?, ?)"] * _ROWS_PER_INSERT)

_TREES = """
CREATE TABLE IF NOT EXISTS trees (
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    fingerprint BLOB NOT NULL,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    text BLOB NOT NULL,
    PRIMARY KEY (dev, ino)
) WITHOUT ROWID
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    digest BLOB NOT NULL,
    PRIMARY KEY (dev, ino)
) WITHOUT ROWID
"""


Key = tuple[int, int, int, int, int]
"""A :class:`StatKey` as a plain tuple, as the hot loops make them (cheaper to build)."""


class StatKey(NamedTuple):
    """The fields of ``stat`` that identify one version of one file."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> StatKey:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def is_racy(self, started_ns: int) -> bool:
        """Whether a write could have hit the same timestamp tick as our read."""
        return max(self.mtime_ns, self.ctime_ns) >= started_ns - RACY_WINDOW_NS


_TOP, _WRAP = 1 << 63, 1 << 64


def _s64(value: int) -> int:
    """st_dev/st_ino are unsigned 64-bit; SQLite integers are signed."""
    return value - _WRAP if value >= _TOP else value


class TreeRecord(NamedTuple):
    """The rendered listing lines of a whole subtree, and what they were rendered from.

    ``fingerprint`` is the BLAKE3 of the subtree's entries (paths, the lines of
    links, directories and special files) and of the stat key of each of its
    files, in order. A subtree whose walk and stat give the same fingerprint
    has the same lines: every file has the key it had when it was read, which
    is the promise of a row of ``files``, for all of them at once.
    """

    dev: int
    ino: int
    fingerprint: bytes
    files: int
    total_bytes: int
    text: bytes


class DigestCache:
    """File digests in ``<store>/datacache-v1.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._pid = 0

    @classmethod
    def in_store(cls, store_root: Path) -> DigestCache:
        return cls(store_root / CACHE_FILENAME)

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # A connection inherited through fork is abandoned, never used or closed.
        self._conn = None
        if not create and not self.path.exists():
            return None
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # Checkpoints of a quarter of the default size: a big capture writes
            # its rows in steps while workers hash, not all at its end.
            conn.execute("PRAGMA wal_autocheckpoint=256")
            conn.execute(_SCHEMA)
            conn.execute(_TREES)
        except (sqlite3.Error, OSError):
            return None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None

    def lookup(self, keys: Sequence[StatKey]) -> list[bytes | None]:
        """The cached digest for each key, or None where there is no valid entry."""
        found: list[bytes | None] = [None] * len(keys)
        conn = self._connect(create=False)
        if conn is None or not keys:
            return found
        # Grouped by device, then inode (hard links share one): plain dicts and
        # ints, as this runs once per file of a warm re-hash.
        by_dev: dict[int, dict[int, list[int]]] = {}
        for i, key in enumerate(keys):
            dev, ino = key[0], key[1]
            if dev >= _TOP:
                dev -= _WRAP
            if ino >= _TOP:
                ino -= _WRAP
            wanted = by_dev.get(dev)
            if wanted is None:
                wanted = by_dev[dev] = {}
            same = wanted.get(ino)
            if same is None:
                wanted[ino] = [i]
            else:
                same.append(i)
        try:
            for dev, wanted in by_dev.items():
                inos = list(wanted)
                for start in range(0, len(inos), _QUERY_BATCH):
                    part = inos[start:start + _QUERY_BATCH]
                    marks = ",".join("?" * len(part))
                    rows = conn.execute(
                        "SELECT ino, size, mtime_ns, ctime_ns, digest FROM files "  # noqa: S608
                        f"WHERE dev = ? AND ino IN ({marks})",
                        (dev, *part),
                    ).fetchall()
                    for ino, size, mtime_ns, ctime_ns, digest in rows:
                        for i in wanted[ino]:
                            key = keys[i]
                            if (key[2] == size and key[3] == mtime_ns and key[4] == ctime_ns
                                    and len(digest) == 32):
                                found[i] = bytes(digest)
        except sqlite3.Error:
            return [None] * len(keys)
        return found

    def store(self, entries: Iterable[tuple[Key, bytes]], *, started_ns: int) -> int:
        """Record fresh digests, skipping racily clean files; return how many were kept."""
        return self.store_packed(pack_rows(entries, started_ns=started_ns))

    def store_packed(self, data: bytes) -> int:
        """Record rows made by :func:`pack_rows` (already filtered); return how many."""
        count = len(data) // _ROW.size
        if not count:
            return 0
        conn = self._connect(create=True)
        if conn is None:
            return 0
        try:
            # Many rows per statement: per-row overhead is most of an insert's cost.
            whole = len(data) - len(data) % _ROWS.size
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT_MANY, _ROWS.iter_unpack(memoryview(data)[:whole]))
            conn.executemany(_INSERT, _ROW.iter_unpack(memoryview(data)[whole:]))
            conn.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return 0
        return count

    def tree_lookup(self, dev: int, ino: int) -> TreeRecord | None:
        """The record of the subtree whose directory is (dev, ino), if any."""
        conn = self._connect(create=False)
        if conn is None:
            return None
        try:
            row = conn.execute("SELECT fingerprint, files, bytes, text FROM trees "
                               "WHERE dev = ? AND ino = ?", (_s64(dev), _s64(ino))).fetchone()
        except sqlite3.Error:
            return None
        if row is None:
            return None
        return TreeRecord(dev, ino, bytes(row[0]), row[1], row[2], bytes(row[3]))


    def store_trees(self, records: Sequence[TreeRecord]) -> int:
        """Record subtrees (already checked not to be racily clean); return how many."""
        if not records:
            return 0
        conn = self._connect(create=True)
        if conn is None:
            return 0
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO trees VALUES (?, ?, ?, ?, ?, ?)",
                             [(_s64(r.dev), _s64(r.ino), r.fingerprint, r.files, r.total_bytes,
                               r.text) for r in records])
            conn.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            return 0
        return len(records)


def pack_rows(entries: Iterable[tuple[Key, bytes]], *, started_ns: int) -> bytes:
    """The cache rows of fresh digests, racily clean files left out, as compact bytes.

    A forked worker sends these to the parent, which alone writes the cache
    (:meth:`DigestCache.store_packed`): one writer, so no turns on SQLite's lock.
    """
    limit = started_ns - RACY_WINDOW_NS
    pack = _ROW.pack
    return b"".join([
        pack(_s64(k[0]), _s64(k[1]), k[2], k[3], k[4], digest)
        for k, digest in entries
        if k[3] < limit and k[4] < limit and len(digest) == 32
    ])
