"""Reading one file, or one chunk of a listing, the way every digest must be read.

Why each file is read this way (figures from a 2-core machine, page cache warm):

* **Every digest is checked against ``stat`` before and after**: the file is
  ``lstat``-ed, opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO or symlink
  swapped in after the walk is never followed or waited on), read, and
  ``fstat``-ed; any change of device, inode, size, mtime or ctime, or a read
  that does not return exactly ``size`` bytes, makes the result
  :attr:`Status.CHANGED`, which is retried (:data:`ATTEMPTS`) and then
  reported.
* **Small files: one ``read`` of ``size + 1`` bytes.** The cold loop
  (:func:`read_chunk`) is open, fstat, read, fstat, close per file, the
  fewest syscalls a checked read needs, with one hasher reused and no object
  made for a file that hashes cleanly beyond its listing line.
* **Big files: ``mmap`` + BLAKE3's own threads, only inside a worker.**
  Hashing a memory map with ``max_threads`` runs at ~9-10 GB/s against ~5
  GB/s for one-shot buffered reads. But if another process truncates a
  mapped file, touching the lost pages raises SIGBUS and kills the process
  that mapped it. So :func:`hash_mapped` is only ever called in a disposable
  worker (``manifest.data.pool``); the parent reads with
  :func:`hash_buffered`, which sees a truncation as a short read, never a
  signal. Files of at least :data:`BIG_FILE` bytes are left to their own
  task (:attr:`Status.BIG`) so they spread over workers.
* **The cache is consulted before any file is opened**
  (:func:`lookup_chunk`), so a warm re-hash reads no file contents.
"""

from __future__ import annotations

import errno
import io
import marshal
import mmap
import os
import stat
import time
from collections.abc import Callable
from enum import IntEnum
from typing import NamedTuple

import blake3

from manifest.data.cache import DigestCache, Key, StatKey
from manifest.data.walk import Entries

BIG_FILE = 4 << 20
"""Files at least this large are hashed one per task with mmap and threads."""
SLICE = 256 << 20
"""A big file is hashed in slices of this size, with a progress message after each."""
READ_BLOCK = 4 << 20
"""Block size of buffered reads of big files in the parent (the SIGBUS-safe path)."""
ATTEMPTS = 3
"""How many times a file is read before it is reported as changing under us."""

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
PLACEHOLDER = "\0"
"""Stands for a file line not yet known; never in a line (control chars are escaped)."""


class Status(IntEnum):
    OK = 0
    """Hashed now."""
    CACHED = 1
    """Digest taken from the cache; the file was not opened."""
    BIG = 2
    """Deferred: to be hashed as its own task."""
    GONE = 3
    """Removed (or renamed away) after the walk listed it."""
    UNREADABLE = 4
    """open/read failed (``errno`` says why)."""
    CHANGED = 5
    """Not the same regular file before and after reading it."""
    SIZE_MISMATCH = 6
    """Reading gave another length than ``st_size`` while stat stayed the same (pseudo-files)."""


class FileResult(NamedTuple):
    """What became of one file (a tuple: one is made per file, so it must be cheap)."""

    status: Status
    key: StatKey | None
    digest: bytes | None
    errno: int = 0


Keys = list[Key]
"""Stat keys as plain tuples: (device, inode, size, mtime_ns, ctime_ns)."""
RenderFile = Callable[[int, bytes, bytes], str]
"""(size, digest, relative path) -> the listing line of a regular file."""


class _DirFd:
    """The open descriptor of the directory of the files being hashed."""

    def __init__(self, dirs: list[bytes]) -> None:
        self.dirs = dirs
        self.index = -1
        self.fd = -1

    def get(self, index: int) -> int:
        if index != self.index:
            self.close()
            self.fd = os.open(self.dirs[index], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.index = index
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.index = -1, -1


# ------------------------------------------------------------- one file


def errno_status(exc: OSError) -> Status:
    return Status.GONE if exc.errno in (errno.ENOENT, errno.ENOTDIR) else Status.UNREADABLE


def lstat_file(path: bytes, dir_fd: int | None = None
               ) -> tuple[StatKey | None, FileResult | None]:
    """The key of a regular file, or the result that says why there is none."""
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return None, FileResult(errno_status(exc), None, None, exc.errno or 0)
    key = StatKey.of(st)
    if not stat.S_ISREG(st.st_mode):
        return None, FileResult(Status.CHANGED, key, None)
    return key, None


def _same_after(fd: int, key: StatKey, got: int) -> bool:
    """Whether the open file is still the version ``key`` describes, read in full."""
    if got != key.size:
        return False
    st = os.fstat(fd)
    return (st.st_mtime_ns == key.mtime_ns and st.st_ctime_ns == key.ctime_ns
            and st.st_ino == key.ino and st.st_dev == key.dev and st.st_size == key.size)


def hash_small(path: bytes, key: StatKey, dir_fd: int | None = None) -> FileResult:
    """Hash a file below :data:`BIG_FILE` with one buffered read."""
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return FileResult(errno_status(exc), key, None, exc.errno or 0)
    try:
        # One byte more than stat promised: growth shows as a long read.
        data = os.read(fd, key.size + 1)
        if 0 < len(data) < key.size:
            parts = [data]
            got = len(data)
            while got <= key.size:
                more = os.read(fd, key.size + 1 - got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        if not _same_after(fd, key, len(data)):
            return FileResult(Status.CHANGED, key, None)
        return FileResult(Status.OK, key, blake3.blake3(data).digest())
    except OSError as exc:
        return FileResult(Status.UNREADABLE, key, None, exc.errno or 0)
    finally:
        os.close(fd)


def hash_buffered(path: bytes, key: StatKey, dir_fd: int | None = None,
                  progress: Callable[[int], None] | None = None) -> FileResult:
    """Hash a file of any size with buffered reads on one thread (the parent's way)."""
    if key.size < BIG_FILE:
        return hash_small(path, key, dir_fd)
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return FileResult(errno_status(exc), key, None, exc.errno or 0)
    try:
        hasher = blake3.blake3()
        with io.FileIO(fd, "rb", closefd=False) as fh, memoryview(bytearray(READ_BLOCK)) as view:
            got = 0
            while got <= key.size:
                n = fh.readinto(view)
                if not n:
                    break
                hasher.update(view[:n])
                got += n
                if progress is not None:
                    progress(n)
        if not _same_after(fd, key, got):
            return FileResult(Status.CHANGED, key, None)
        return FileResult(Status.OK, key, hasher.digest())
    except OSError as exc:
        return FileResult(Status.UNREADABLE, key, None, exc.errno or 0)
    finally:
        os.close(fd)


def hash_mapped(path: bytes, key: StatKey, hasher: blake3.blake3,
                progress: Callable[[int], None]) -> FileResult:
    """Hash a big file through a memory map. Only ever called in a worker (SIGBUS)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return FileResult(errno_status(exc), key, None, exc.errno or 0)
    try:
        if StatKey.of(os.fstat(fd)) != key:
            return FileResult(Status.CHANGED, key, None)
        hasher.reset()
        with mmap.mmap(fd, key.size, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
            for offset in range(0, key.size, SLICE):
                hasher.update(view[offset:offset + SLICE])
                progress(min(SLICE, key.size - offset))
        if not _same_after(fd, key, key.size):
            return FileResult(Status.CHANGED, key, None)
        return FileResult(Status.OK, key, hasher.digest())
    except (OSError, ValueError) as exc:
        code = exc.errno if isinstance(exc, OSError) else 0
        return FileResult(Status.UNREADABLE, key, None, code or 0)
    finally:
        os.close(fd)


def retry_changed(path: bytes, res: FileResult) -> FileResult:
    """Read a file that changed under us again, up to :data:`ATTEMPTS` reads in all."""
    for attempt in range(1, ATTEMPTS):
        if res.status != Status.CHANGED:
            return res
        key, failed = lstat_file(path)
        if key is not None and key == res.key:
            # stat says nothing changed, yet the read did not give st_size bytes:
            # a file whose size lies (/proc, /sys report 4096 or 0). Sleeping and
            # reading again cannot help (it cost 0.15 s per file, minutes on /sys).
            return FileResult(Status.SIZE_MISMATCH, key, None)
        time.sleep(0.05 * attempt)
        key, failed = lstat_file(path)
        res = failed or hash_buffered(path, key or StatKey(0, 0, 0, 0, 0))
    return res


# ---------------------------------------------------------------- chunks


class Chunk:
    """A rendered chunk: text with a placeholder for each file in ``pending``."""

    __slots__ = ("files", "fresh", "hashed_bytes", "keys", "pending", "text", "total_bytes")

    def __init__(self, text: bytes, files: int, hashed_bytes: int, total_bytes: int,
                 pending: list[tuple[int, FileResult]],
                 fresh: list[tuple[Key, bytes]]) -> None:
        self.text, self.files, self.hashed_bytes = text, files, hashed_bytes
        self.total_bytes, self.pending, self.fresh = total_bytes, pending, fresh
        self.keys: Keys | None = None
        """The key of every file, in order, when every file has its line (else None)."""


def run_chunk(entries: Entries, start: int, end: int, cache: DigestCache | None,
              render: RenderFile, *, defer_big: bool, keep: bool = True) -> Chunk:
    """Hash and render ``entries[start:end]``: cold (no cache) or warm (cache first).

    ``keep``: whether fresh digests are wanted (for a cache to store them).
    """
    if cache is None or not cache.path.exists():
        return read_chunk(entries, start, end, render, defer_big=defer_big, keep=keep)
    return lookup_chunk(entries, start, end, cache, render, defer_big=defer_big)


def read_chunk(entries: Entries, start: int, end: int, render: RenderFile, *,
               defer_big: bool, keep: bool = True) -> Chunk:
    """The cold path: open, fstat, read, fstat, close, the fewest syscalls a checked read
    needs (the fstat before reading replaces the lstat that the warm path needs).

    ``keep``: collect ``(key, digest)`` of fresh reads for the cache. The loop is
    written for speed (it runs once per file): locals only, one hasher reused,
    no objects made for a file that hashes cleanly beyond its line.
    """
    rel, lines, names, folder, dirs = (entries.rel, entries.lines, entries.names,
                                       entries.folder, entries.dirs)
    chunk = Chunk(b"", 0, 0, 0, [], [])
    out: list[str] = []
    append = out.append
    fresh, pending = chunk.fresh, chunk.pending
    hasher = blake3.blake3()
    reset, update, digest_of = hasher.reset, hasher.update, hasher.digest
    open_, fstat, read, close = os.open, os.fstat, os.read, os.close
    flags, big, s_ifmt, s_ifreg = _OPEN_FLAGS, BIG_FILE, 0o170000, stat.S_IFREG
    files = nbytes = 0
    dfd, current = -1, -1
    try:
        for i in range(start, end):
            line = lines[i]
            if line is not None:
                append(line)
                continue
            try:
                if folder[i] != current:
                    if dfd >= 0:
                        close(dfd)
                        dfd = -1
                    dfd = open_(dirs[folder[i]], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    current = folder[i]
                fd = open_(names[i], flags, dir_fd=dfd)
            except OSError as exc:
                if dfd < 0:
                    current = -1  # the folder could not be opened: try again next time
                pending.append((i, FileResult(errno_status(exc), None, None, exc.errno or 0)))
                append(PLACEHOLDER)
                continue
            try:
                st = fstat(fd)
                size = st.st_size
                if st.st_mode & s_ifmt == s_ifreg and size < big:
                    data = read(fd, size + 1)
                    # The same descriptor: device and inode cannot have changed.
                    after = fstat(fd)
                    if (len(data) == size and after.st_mtime_ns == st.st_mtime_ns
                            and after.st_ctime_ns == st.st_ctime_ns and after.st_size == size):
                        reset()
                        update(data)
                        digest = digest_of()
                        if keep:
                            fresh.append(((st.st_dev, st.st_ino, size, st.st_mtime_ns,
                                                  st.st_ctime_ns), digest))
                        append(render(size, digest, rel[i]))
                        files += 1
                        nbytes += size
                        continue
            except OSError as exc:
                pending.append((i, FileResult(Status.UNREADABLE, None, None, exc.errno or 0)))
                append(PLACEHOLDER)
                continue
            finally:
                close(fd)
            # Not the common case: a big file, a short read, a change, not a regular file.
            key = StatKey.of(st)
            if not stat.S_ISREG(st.st_mode):
                res = FileResult(Status.CHANGED, key, None)
            elif defer_big and key.size >= BIG_FILE:
                res = FileResult(Status.BIG, key, None)
            else:
                path = entries.path(i)
                fresh_key, failed = lstat_file(path)
                res = failed or hash_buffered(path, fresh_key or key)
                if res.status == Status.CHANGED:
                    res = retry_changed(path, res)
            if res.key is not None and res.digest is not None:
                if keep:
                    k = res.key
                    fresh.append(((k.dev, k.ino, k.size, k.mtime_ns, k.ctime_ns), res.digest))
                append(render(res.key.size, res.digest, rel[i]))
                files += 1
                nbytes += res.key.size
            else:
                pending.append((i, res))
                append(PLACEHOLDER)
    finally:
        if dfd >= 0:
            close(dfd)
    chunk.files, chunk.hashed_bytes, chunk.total_bytes = files, nbytes, nbytes
    chunk.text = "".join(out).encode("utf-8")
    if keep and not pending and len(fresh) == files:
        chunk.keys = [key for key, _ in fresh]
    return chunk


def lookup_chunk(entries: Entries, start: int, end: int, cache: DigestCache,
                 render: RenderFile, *, defer_big: bool) -> Chunk:
    """The warm path: lstat everything, consult the cache, open only what it lacks."""
    lines, names, folder = entries.lines, entries.names, entries.folder
    keys: dict[int, StatKey] = {}
    results: dict[int, FileResult] = {}
    dirfd = _DirFd(entries.dirs)
    get, lstat, is_reg = dirfd.get, os.stat, stat.S_ISREG
    try:
        for i in range(start, end):
            if lines[i] is not None:
                continue
            try:
                st = lstat(names[i], dir_fd=get(folder[i]), follow_symlinks=False)
            except OSError as exc:
                results[i] = FileResult(errno_status(exc), None, None, exc.errno or 0)
                continue
            key = StatKey(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if is_reg(st.st_mode):
                keys[i] = key
            else:
                results[i] = FileResult(Status.CHANGED, key, None)
        return _finish_chunk(entries, start, end, cache, render, keys, results, dirfd,
                             defer_big=defer_big)
    finally:
        dirfd.close()


def _finish_chunk(entries: Entries, start: int, end: int, cache: DigestCache | None,
                  render: RenderFile, keys: dict[int, StatKey], results: dict[int, FileResult],
                  dirfd: _DirFd, *, defer_big: bool) -> Chunk:
    rel, lines, names, folder = entries.rel, entries.lines, entries.names, entries.folder
    if cache is not None and keys:
        order = list(keys)
        for i, digest in zip(order, cache.lookup([keys[i] for i in order]), strict=True):
            if digest is not None:
                results[i] = FileResult(Status.CACHED, keys[i], digest)
    chunk = Chunk(b"", 0, 0, 0, [], [])
    out: list[str] = []
    files = total = 0
    for i in range(start, end):
        line = lines[i]
        if line is not None:
            out.append(line)
            continue
        res = results.get(i)
        if (res is not None and res.status == Status.CACHED  # the common warm case
                and res.key is not None and res.digest is not None):
            size = res.key.size
            out.append(render(size, res.digest, rel[i]))
            files += 1
            total += size
            continue
        if res is None:
            key = keys[i]
            if defer_big and key.size >= BIG_FILE:
                res = FileResult(Status.BIG, key, None)
            else:
                res = hash_buffered(names[i], key, dirfd.get(folder[i]))
                if res.status == Status.CHANGED:
                    res = retry_changed(entries.path(i), res)
                if res.key is not None:
                    keys[i] = res.key  # the version that was read, if it moved
                if res.status == Status.OK and res.key is not None and res.digest is not None:
                    chunk.fresh.append((res.key, res.digest))
                    chunk.hashed_bytes += res.key.size
        if res.digest is not None and res.key is not None:
            out.append(render(res.key.size, res.digest, rel[i]))
            chunk.files += 1
            chunk.total_bytes += res.key.size
        else:
            out.append(PLACEHOLDER)
            chunk.pending.append((i, res))
    chunk.files += files
    chunk.total_bytes += total
    chunk.text = "".join(out).encode("utf-8")
    if not chunk.pending and len(keys) == chunk.files:
        chunk.keys = [(k.dev, k.ino, k.size, k.mtime_ns, k.ctime_ns) for k in keys.values()]
    return chunk


def stat_keys(entries: Entries) -> Keys | None:
    """The key of every file of ``entries``, in order, by ``lstat`` alone (no file is
    opened); None if one is gone or no longer a regular file."""
    lines, names, folder = entries.lines, entries.names, entries.folder
    keys: Keys = []
    append = keys.append
    dirfd = _DirFd(entries.dirs)
    get, lstat, s_ifmt, s_ifreg = dirfd.get, os.stat, 0o170000, stat.S_IFREG
    try:
        for i in range(len(lines)):
            if lines[i] is None:
                st = lstat(names[i], dir_fd=get(folder[i]), follow_symlinks=False)
                if st.st_mode & s_ifmt != s_ifreg:
                    return None
                append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except OSError:
        return None
    finally:
        dirfd.close()
    return keys


def tree_fingerprint(entries: Entries, keys: Keys) -> bytes:
    """What a subtree's listing lines are rendered from: its entries and file keys.

    marshal version 2 writes no back-references, so the bytes depend on the
    values alone, never on how many references an object had.
    """
    data = marshal.dumps(("manifest-tree/v1", entries.rel, entries.lines, keys), 2)
    return blake3.blake3(data).digest()

