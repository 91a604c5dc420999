"""Hashing the files of a dataset listing as fast as the machine allows.

:func:`hash_entries` takes the sorted entries of a listing (found by the
walk in ``manifest.data.tree``), hashes the regular files among them, and returns
the body of the listing with every file line filled in, or the files it
could not hash and why.

Why it is built this way (figures from a 2-core machine, page cache warm):

* **Many small files: a fork pool, not threads.** Per small file the work is
  a handful of syscalls and a few microseconds of hashing, each step holding
  the GIL; a thread pool was 3-6x *slower* than one thread. Forked workers
  (one per CPU) each take chunks of :data:`CHUNK_ENTRIES` entries by index
  into the lists they inherited through ``fork``, so no path is serialised.
  A worker renders the listing lines of its chunk and sends them back as one
  piece of text, so the parent does no per-file work at all; it only
  concatenates chunks in order.
* **Big files: ``mmap`` + BLAKE3's own threads, only inside a worker.**
  Hashing a memory map with ``max_threads`` runs at ~9-10 GB/s against ~5
  GB/s for one-shot buffered reads. But if another process truncates a
  mapped file, touching the lost pages raises SIGBUS and kills the process
  that mapped it. So the parent process never maps a file: only a
  disposable worker does, and a worker that dies for any reason has its
  unfinished files re-hashed by the parent with buffered reads, which see a
  truncation as a short read, never a signal. Files of at least
  :data:`BIG_FILE` bytes are handed out one per task so they spread over
  workers and report progress as they go.
* **BLAKE3's thread pool is created in the worker**, with an explicit thread
  count (never ``AUTO``, which uses the process-global rayon pool): a pool
  inherited through ``fork`` has no threads behind it and would hang.
* **Every digest is checked against ``stat`` before and after**: the file is
  ``lstat``-ed, opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO or symlink
  swapped in after the walk is never followed or waited on), read, and
  ``fstat``-ed; any change of device, inode, size, mtime or ctime, or a read
  that does not return exactly ``size`` bytes, makes the result
  :attr:`Status.CHANGED`, which is retried (:data:`ATTEMPTS`) and then
  reported.
* **The cache is consulted before any file is opened** (in the worker, with
  its own SQLite connection), so a warm re-hash reads no file contents.
  Workers only read it: the fresh digests of a task go back to the parent
  with its result, as packed rows, and the parent alone writes them, in
  transactions of :data:`FLUSH_ROWS` rows while the workers hash on, so no
  two processes take turns on SQLite's write lock.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import io
import marshal
import mmap
import os
import selectors
import signal
import stat
import struct
import time
import warnings
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import NamedTuple

import blake3

from manifest.data.cache import ROW_SIZE, DigestCache, StatKey, pack_rows

BIG_FILE = 4 << 20
"""Files at least this large are hashed one per task with mmap and threads."""
CHUNK_ENTRIES = 512
"""Entries per task: enough to amortise a pipe round trip, few enough to balance."""
IN_PROCESS_MAX = 1024
"""Below this many entries (and with no big file) forking costs more than it saves."""
SLICE = 256 << 20
"""A big file is hashed in slices of this size, with a progress message after each."""
READ_BLOCK = 4 << 20
"""Block size of buffered reads of big files in the parent (the SIGBUS-safe path)."""
ATTEMPTS = 3
"""How many times a file is read before it is reported as changing under us."""
FLUSH_ROWS = 8192
"""Cache rows the parent gathers from workers before it writes them in one transaction."""
_FLUSH_BYTES = FLUSH_ROWS * ROW_SIZE

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PLACEHOLDER = "\0"
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


class FileResult(NamedTuple):
    """What became of one file (a tuple: one is made per file, so it must be cheap)."""

    status: Status
    key: StatKey | None
    digest: bytes | None
    errno: int = 0


RenderFile = Callable[[int, bytes, bytes], str]
"""(size, digest, relative path) -> the listing line of a regular file."""
ProgressFn = Callable[[int, int], None]
"""Called with (files finished, bytes hashed) increments."""
WalkFn = Callable[
    [bytes, bytes], "tuple[Entries, list[tuple[bytes, str]], list[tuple[bytes, int, int]]]"]
"""(directory, its relative path) -> (its sorted entries, walk problems, directories seen)."""
_TREE_MARK = b"\x01"
"""The line of a subtree in the parent's entries (see ``manifest.data.tree._walk``)."""


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


class Hashed:
    """The outcome: listing body (no header), counts, and per-file failures."""

    __slots__ = ("body", "dir_ids", "files", "problems", "total_bytes", "walk_problems")

    def __init__(self, body: bytes, files: int, total_bytes: int,
                 problems: list[tuple[bytes, FileResult]] | None = None) -> None:
        self.body, self.files, self.total_bytes = body, files, total_bytes
        self.problems = problems if problems is not None else []
        self.walk_problems: list[tuple[bytes, str]] = []
        """What the walks of subtrees (in workers) could not read."""
        self.dir_ids: list[tuple[bytes, int, int]] = []
        """(relative path, device, inode) of each directory the subtree walks entered."""


# ------------------------------------------------------------- one file


def _errno_status(exc: OSError) -> Status:
    return Status.GONE if exc.errno in (errno.ENOENT, errno.ENOTDIR) else Status.UNREADABLE


def lstat_file(path: bytes, dir_fd: int | None = None
               ) -> tuple[StatKey | None, FileResult | None]:
    """The key of a regular file, or the result that says why there is none."""
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return None, FileResult(_errno_status(exc), None, None, exc.errno or 0)
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
        return FileResult(_errno_status(exc), key, None, exc.errno or 0)
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
        return FileResult(_errno_status(exc), key, None, exc.errno or 0)
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


def _hash_mapped(path: bytes, key: StatKey, hasher: blake3.blake3,
                 progress: Callable[[int], None]) -> FileResult:
    """Hash a big file through a memory map. Only ever called in a worker (SIGBUS)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return FileResult(_errno_status(exc), key, None, exc.errno or 0)
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
        time.sleep(0.05 * attempt)
        key, failed = lstat_file(path)
        res = failed or hash_buffered(path, key or StatKey(0, 0, 0, 0, 0))
    return res


# ---------------------------------------------------------------- chunks


class _Chunk:
    """A rendered chunk: text with a placeholder for each file in ``pending``."""

    __slots__ = ("files", "fresh", "hashed_bytes", "pending", "text", "total_bytes")

    def __init__(self, text: bytes, files: int, hashed_bytes: int, total_bytes: int,
                 pending: list[tuple[int, FileResult]],
                 fresh: list[tuple[StatKey, bytes]]) -> None:
        self.text, self.files, self.hashed_bytes = text, files, hashed_bytes
        self.total_bytes, self.pending, self.fresh = total_bytes, pending, fresh


def _run_chunk(entries: Entries, start: int, end: int, cache: DigestCache | None,
               render: RenderFile, *, defer_big: bool, keep: bool = True) -> _Chunk:
    """Hash and render ``entries[start:end]``: cold (no cache) or warm (cache first).

    ``keep``: whether fresh digests are wanted (for a cache to store them).
    """
    if cache is None or not cache.path.exists():
        return _read_chunk(entries, start, end, render, defer_big=defer_big, keep=keep)
    return _lookup_chunk(entries, start, end, cache, render, defer_big=defer_big)


def _read_chunk(entries: Entries, start: int, end: int, render: RenderFile, *,
                defer_big: bool, keep: bool = True) -> _Chunk:
    """The cold path: open, fstat, read, fstat, close, the fewest syscalls a checked read
    needs (the fstat before reading replaces the lstat that the warm path needs).

    ``keep``: collect ``(key, digest)`` of fresh reads for the cache. The loop is
    written for speed (it runs once per file): locals only, one hasher reused,
    no objects made for a file that hashes cleanly beyond its line.
    """
    rel, lines, names, folder, dirs = (entries.rel, entries.lines, entries.names,
                                       entries.folder, entries.dirs)
    chunk = _Chunk(b"", 0, 0, 0, [], [])
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
                pending.append((i, FileResult(_errno_status(exc), None, None, exc.errno or 0)))
                append(_PLACEHOLDER)
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
                            fresh.append((StatKey(st.st_dev, st.st_ino, size, st.st_mtime_ns,
                                                  st.st_ctime_ns), digest))
                        append(render(size, digest, rel[i]))
                        files += 1
                        nbytes += size
                        continue
            except OSError as exc:
                pending.append((i, FileResult(Status.UNREADABLE, None, None, exc.errno or 0)))
                append(_PLACEHOLDER)
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
                    fresh.append((res.key, res.digest))
                append(render(res.key.size, res.digest, rel[i]))
                files += 1
                nbytes += res.key.size
            else:
                pending.append((i, res))
                append(_PLACEHOLDER)
    finally:
        if dfd >= 0:
            close(dfd)
    chunk.files, chunk.hashed_bytes, chunk.total_bytes = files, nbytes, nbytes
    chunk.text = "".join(out).encode("utf-8")
    return chunk


def _lookup_chunk(entries: Entries, start: int, end: int, cache: DigestCache,
                  render: RenderFile, *, defer_big: bool) -> _Chunk:
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
                results[i] = FileResult(_errno_status(exc), None, None, exc.errno or 0)
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
                  dirfd: _DirFd, *, defer_big: bool) -> _Chunk:
    rel, lines, names, folder = entries.rel, entries.lines, entries.names, entries.folder
    if cache is not None and keys:
        order = list(keys)
        for i, digest in zip(order, cache.lookup([keys[i] for i in order]), strict=True):
            if digest is not None:
                results[i] = FileResult(Status.CACHED, keys[i], digest)
    chunk = _Chunk(b"", 0, 0, 0, [], [])
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
                if res.status == Status.OK and res.key is not None and res.digest is not None:
                    chunk.fresh.append((res.key, res.digest))
                    chunk.hashed_bytes += res.key.size
        if res.digest is not None and res.key is not None:
            out.append(render(res.key.size, res.digest, rel[i]))
            chunk.files += 1
            chunk.total_bytes += res.key.size
        else:
            out.append(_PLACEHOLDER)
            chunk.pending.append((i, res))
    chunk.files += files
    chunk.total_bytes += total
    chunk.text = "".join(out).encode("utf-8")
    return chunk


class _Tree:
    """A subtree walked, hashed and rendered: text with a placeholder per ``pending``."""

    __slots__ = ("dir_ids", "files", "fresh", "hashed_bytes", "pending", "problems", "text",
                 "total_bytes")

    def __init__(self, text: bytes, files: int, hashed_bytes: int, total_bytes: int,
                 pending: list[tuple[bytes, bytes, FileResult]],
                 problems: list[tuple[bytes, str]], dir_ids: list[tuple[bytes, int, int]],
                 fresh: list[tuple[StatKey, bytes]]) -> None:
        self.text, self.files, self.hashed_bytes = text, files, hashed_bytes
        self.total_bytes, self.pending, self.problems = total_bytes, pending, problems
        self.dir_ids, self.fresh = dir_ids, fresh

    def pack(self) -> bytes:
        pending = [(path, rel, int(r.status), tuple(r.key) if r.key else None, r.digest, r.errno)
                   for path, rel, r in self.pending]
        return marshal.dumps((self.text, pending, self.problems, self.dir_ids))

    @classmethod
    def unpack(cls, data: bytes, files: int, hashed_bytes: int, total_bytes: int) -> _Tree:
        # From our own worker through a pipe only it and the parent hold.
        text, pending, problems, dir_ids = marshal.loads(data)  # noqa: S302
        return cls(text, files, hashed_bytes, total_bytes,
                   [(path, rel, FileResult(Status(st), StatKey(*key) if key else None, digest,
                                           err))
                    for path, rel, st, key, digest, err in pending],
                   [tuple(p) for p in problems], [tuple(d) for d in dir_ids], [])


def _run_tree(walk: WalkFn, path: bytes, rel: bytes, cache: DigestCache | None,
              render: RenderFile, *, keep: bool,
              mapped: Callable[[bytes, StatKey], FileResult] | None) -> _Tree:
    """Walk one subtree, hash its files and render its lines (in a worker, or in the
    parent for a subtree whose worker died: then ``mapped`` is None and big files are
    read with buffered reads).
    """
    entries, problems, dir_ids = walk(path, rel)
    chunk = _run_chunk(entries, 0, len(entries.rel), cache, render,
                       defer_big=mapped is not None, keep=keep)
    tree = _Tree(chunk.text, chunk.files, chunk.hashed_bytes, chunk.total_bytes, [],
                 problems, dir_ids, chunk.fresh)
    if chunk.pending:
        pieces = chunk.text.split(_PLACEHOLDER.encode())
        out = [pieces[0]]
        for (i, res), piece in zip(chunk.pending, pieces[1:], strict=True):
            file_path = entries.path(i)
            if res.status == Status.BIG and mapped is not None:
                key, failed = lstat_file(file_path)
                res = failed or mapped(file_path, key or StatKey(0, 0, 0, 0, 0))
                if res.status == Status.OK and res.key is not None and res.digest is not None:
                    if keep:
                        tree.fresh.append((res.key, res.digest))
                    tree.hashed_bytes += res.key.size
            if res.status == Status.OK and res.key is not None and res.digest is not None:
                out.append(render(res.key.size, res.digest, entries.rel[i]).encode("utf-8"))
                tree.files += 1
                tree.total_bytes += res.key.size
            else:
                tree.pending.append((file_path, entries.rel[i], res))
                out.append(_PLACEHOLDER.encode())
            out.append(piece)
        tree.text = b"".join(out)
    return tree


# ----------------------------------------------------------------- wire

# Worker -> parent: a header, then `text_len` bytes of UTF-8 (or a marshalled
# subtree), then `n_pending` records, then `rows_len` bytes of cache rows
# (``manifest.data.cache.pack_rows``) that the parent writes.
# type, start, end, n_pending, files, hashed_bytes, total_bytes, text_len, rows_len
_HEADER = struct.Struct("<BxxxIIIIQQQQ")
# index, status, errno, dev, ino, size, mtime_ns, ctime_ns, digest
_RECORD = struct.Struct("<IBBxxQQQqq32s")
_TASK = struct.Struct("<BII")
_TASK_CHUNK, _TASK_BIG, _TASK_TREE = 0, 1, 2
_MSG_CHUNK, _MSG_PROGRESS, _MSG_TREE = 0, 1, 2


def _pack_result(index: int, res: FileResult) -> bytes:
    k = res.key or StatKey(0, 0, 0, 0, 0)
    return _RECORD.pack(index, res.status, min(res.errno, 255), k.dev, k.ino, k.size,
                        k.mtime_ns, k.ctime_ns, res.digest or b"")


def _unpack_result(data: bytes) -> tuple[int, FileResult]:
    index, status, err, dev, ino, size, mtime_ns, ctime_ns, digest = _RECORD.unpack(data)
    st = Status(status)
    key = StatKey(dev, ino, size, mtime_ns, ctime_ns) if dev or ino else None
    return index, FileResult(st, key, digest if st in (Status.OK, Status.CACHED) else None, err)


def _read_exact(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = os.read(fd, n - len(data))
        if not more:
            return b""
        data += more
    return data


def _write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as whole:
        view = whole
        while view:
            view = view[os.write(fd, view):]


def _worker_main(task_fd: int, result_fd: int, entries: Entries, cache: DigestCache | None,
                 lookup: bool, render: RenderFile, threads: int, started_ns: int,
                 trees: Sequence[tuple[bytes, bytes]] = (), walk: WalkFn | None = None) -> None:
    """A forked worker: run tasks until the parent closes the task pipe.

    ``cache`` is only read here; the fresh digests of each task go back to
    the parent with its result, as rows the parent writes.
    """
    hasher: blake3.blake3 | None = None
    keep = cache is not None
    look = cache if lookup else None
    while True:
        task = _read_exact(task_fd, _TASK.size)
        if not task:
            break
        kind, start, end = _TASK.unpack(task)
        if kind == _TASK_TREE and walk is not None:
            def mapped(path: bytes, key: StatKey, index: int = start) -> FileResult:
                nonlocal hasher
                if hasher is None:
                    hasher = blake3.blake3(max_threads=threads)

                def report(n: int) -> None:
                    _write_all(result_fd, _HEADER.pack(_MSG_PROGRESS, index, index, 0, 0, n,
                                                       0, 0, 0))

                return _hash_mapped(path, key, hasher, report)

            tree_path, tree_rel = trees[start]
            tree = _run_tree(walk, tree_path, tree_rel, look, render, keep=keep, mapped=mapped)
            payload = tree.pack()
            rows = pack_rows(tree.fresh, started_ns=started_ns) if keep else b""
            _write_all(result_fd, b"".join([
                _HEADER.pack(_MSG_TREE, start, end, 0, tree.files, tree.hashed_bytes,
                             tree.total_bytes, len(payload), len(rows)), payload, rows]))
            continue
        if kind == _TASK_CHUNK:
            chunk = _run_chunk(entries, start, end, look, render, defer_big=True, keep=keep)
            text = chunk.text
            rows = pack_rows(chunk.fresh, started_ns=started_ns) if keep else b""
            head = _HEADER.pack(_MSG_CHUNK, start, end, len(chunk.pending), chunk.files,
                                chunk.hashed_bytes, chunk.total_bytes, len(text), len(rows))
            _write_all(result_fd, b"".join(
                [head, text, *(_pack_result(i, r) for i, r in chunk.pending), rows]))
            continue
        if hasher is None:
            hasher = blake3.blake3(max_threads=threads)

        def report(n: int, index: int = start) -> None:
            _write_all(result_fd, _HEADER.pack(_MSG_PROGRESS, index, index, 0, 0, n, 0, 0, 0))

        path = entries.path(start)
        key, failed = lstat_file(path)
        res = failed or _hash_mapped(path, key or StatKey(0, 0, 0, 0, 0), hasher, report)
        rows = b""
        if keep and res.status == Status.OK and res.key is not None and res.digest is not None:
            rows = pack_rows([(res.key, res.digest)], started_ns=started_ns)
        _write_all(result_fd, _HEADER.pack(_MSG_CHUNK, start, end, 1, 0, 0, 0, 0, len(rows))
                   + _pack_result(start, res) + rows)
    os.close(result_fd)


class _Worker:
    __slots__ = ("buffer", "pid", "result_fd", "task", "task_fd")

    def __init__(self, pid: int, task_fd: int, result_fd: int) -> None:
        self.pid, self.task_fd, self.result_fd = pid, task_fd, result_fd
        self.task: tuple[int, int, int] | None = None
        self.buffer = bytearray()


def _fork_worker(others: list[_Worker], run: Callable[[int, int], None]) -> _Worker:
    task_r, task_w = os.pipe()
    result_r, result_w = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks. The worker
        # touches no lock another thread could hold: it only makes syscalls,
        # hashes, and opens its own SQLite connection (to read), then leaves by _exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child; its exit is all we see
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # A worker's death (SIGBUS on a truncated mapping) is handled by the
            # parent; a fault handler inherited from it would only print noise.
            faulthandler.disable()
            os.close(task_w)
            os.close(result_r)
            # Keep no other worker's pipe open, or its EOF would never come.
            for w in others:
                os.close(w.task_fd)
                os.close(w.result_fd)
            run(task_r, result_w)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(task_r)
    os.close(result_w)
    return _Worker(pid, task_w, result_r)


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def hash_entries(entries: Entries, *, cache: DigestCache | None, lookup: bool,
                 render: RenderFile, started_ns: int, jobs: int | None = None,
                 progress: ProgressFn | None = None, trees: Sequence[tuple[bytes, bytes]] = (),
                 walk: WalkFn | None = None) -> Hashed:
    """Hash every regular file among ``entries`` and render the listing body.

    ``cache`` is read when ``lookup`` and refreshed with every digest read
    now. Never raises for one file: failures come back in ``problems``.
    ``trees``: (directory, relative path) of subtrees that workers walk with
    ``walk``, hash and render whole; each stands in ``entries`` as a line
    ``_TREE_MARK`` where its lines go.
    """
    jobs = jobs or cpu_count()
    note: ProgressFn = progress or (lambda files, nbytes: None)
    n = len(entries.rel)
    can_fork = hasattr(os, "fork")
    texts: dict[int, bytes] = {}
    pending: dict[int, FileResult] = {}
    fresh: list[tuple[StatKey, bytes]] = []
    files = total = 0
    tasks: list[tuple[int, int, int]] = []
    done_trees: dict[int, _Tree] = {}

    def take_tree(index: int, tree: _Tree) -> None:
        nonlocal files, total
        done_trees[index] = tree
        files += tree.files
        total += tree.total_bytes
        note(tree.files, tree.hashed_bytes)

    def take(start: int, chunk: _Chunk) -> None:
        nonlocal files, total
        texts[start] = chunk.text
        files += chunk.files
        total += chunk.total_bytes
        for i, res in chunk.pending:
            pending[i] = res
            if res.status == Status.BIG:
                tasks.append((_TASK_BIG, i, i + 1))
        note(chunk.files, chunk.hashed_bytes)

    if (n < IN_PROCESS_MAX and not trees) or not can_fork:
        look = cache if lookup else None
        for start in range(0, n, CHUNK_ENTRIES):
            chunk = _run_chunk(entries, start, min(start + CHUNK_ENTRIES, n), look, render,
                               defer_big=can_fork, keep=cache is not None)
            fresh += chunk.fresh
            take(start, chunk)
    else:
        tasks = [(_TASK_CHUNK, s, min(s + CHUNK_ENTRIES, n)) for s in range(0, n, CHUNK_ENTRIES)]
    # Popped from the end: subtrees first, in path order.
    tasks += [(_TASK_TREE, j, j + 1) for j in reversed(range(len(trees) if can_fork else 0))]
    if cache is not None:
        cache.store(fresh, started_ns=started_ns)
        cache.close()
    if tasks:
        def run(task_fd: int, result_fd: int) -> None:
            _worker_main(task_fd, result_fd, entries, cache, lookup, render, jobs, started_ns,
                         trees, walk)

        # Workers send their fresh digests back as rows; only the parent writes
        # them, in few large transactions, while the workers hash the next tasks.
        rows: list[bytes] = []
        gathered = 0

        def keep_rows(data: bytes) -> None:
            nonlocal gathered
            rows.append(data)
            gathered += len(data)

        def flush(final: bool = False) -> None:
            nonlocal gathered
            if cache is not None and rows and (final or gathered >= _FLUSH_BYTES):
                cache.store_packed(b"".join(rows))
                rows.clear()
                gathered = 0

        def before_fork() -> None:
            if cache is not None:
                cache.close()  # no SQLite connection is carried across fork

        _run_pool(tasks, jobs, run, _Sink(take, take_tree, keep_rows, flush, before_fork),
                  pending, note)
        flush(final=True)
    # What a dead worker left unfinished, or a big file it could not map,
    # is hashed here with buffered reads: a truncation is a short read here.
    late: list[tuple[StatKey, bytes]] = []
    for start in range(0, n, CHUNK_ENTRIES):
        if start not in texts:
            chunk = _run_chunk(entries, start, min(start + CHUNK_ENTRIES, n), None, render,
                               defer_big=False, keep=cache is not None)
            late += chunk.fresh
            take(start, chunk)
    for j, (path, rel) in enumerate(trees):
        if j not in done_trees:  # its worker died (or there is no fork)
            tree = _run_tree(walk or _no_walk, path, rel, None, render, keep=cache is not None,
                             mapped=None)
            late += tree.fresh
            take_tree(j, tree)
    problems: list[tuple[bytes, FileResult]] = []

    def settle(path: bytes, rel: bytes, res: FileResult) -> str | None:
        """The line of a file left pending, once it is read again where it may be."""
        nonlocal files, total
        if res.status in (Status.BIG, Status.CHANGED):  # a worker died, or a file moved
            key, failed = lstat_file(path)
            res = failed or hash_buffered(path, key or StatKey(0, 0, 0, 0, 0))
            res = retry_changed(path, res)
            if res.status == Status.OK and res.key is not None and res.digest is not None:
                late.append((res.key, res.digest))
        if res.key is not None and res.digest is not None:
            files += 1
            total += res.key.size
            note(1, 0)
            return render(res.key.size, res.digest, rel)
        problems.append((rel, res))
        return None

    resolved: dict[int, str] = {}
    for i, res in sorted(pending.items()):
        line = settle(entries.path(i), entries.rel[i], res)
        if line is not None:
            resolved[i] = line
    if cache is not None:
        if late:
            cache.store(late, started_ns=started_ns)
        cache.close()
    body = _assemble(texts, sorted(pending), resolved, n)
    hashed = Hashed(body, files, total, problems)
    if trees:
        pieces = body.split(_TREE_MARK)
        parts = [pieces[0]]
        for j, piece in enumerate(pieces[1:]):
            tree = done_trees[j]
            text = tree.text
            if tree.pending:
                holes = text.split(_PLACEHOLDER.encode())
                fill = [(settle(path, rel, res) or "").encode("utf-8")
                        for path, rel, res in tree.pending] + [b""]
                text = b"".join(h + f for h, f in zip(holes, fill, strict=True))
            parts += [text, piece]
            hashed.walk_problems += tree.problems
            hashed.dir_ids += tree.dir_ids
        hashed.body = b"".join(parts)
        if cache is not None and late:
            cache.store(late, started_ns=started_ns)
            cache.close()
    return hashed


def _no_walk(path: bytes, rel: bytes) -> tuple[Entries, list[tuple[bytes, str]],
                                               list[tuple[bytes, int, int]]]:
    raise ValueError("subtrees to hash, but no walk to list them")


def _assemble(texts: dict[int, bytes], holes: list[int], resolved: dict[int, str],
              n: int) -> bytes:
    """Join chunk texts in order, filling each placeholder with its resolved line.

    A hole left unresolved is a problem, and a listing with problems is never used.
    """
    parts: list[bytes] = []
    for start in range(0, n, CHUNK_ENTRIES):
        text = texts[start]
        if b"\0" in text:
            mine = [i for i in holes if start <= i < start + CHUNK_ENTRIES]
            pieces = text.split(b"\0")
            fill = [resolved.get(i, "").encode("utf-8") for i in mine] + [b""]
            text = b"".join(p + f for p, f in zip(pieces, fill, strict=True))
        parts.append(text)
    return b"".join(parts)


class _Sink:
    """Where the pool hands what workers send, and what it calls between messages."""

    __slots__ = ("before_fork", "flush", "rows", "take", "take_tree")

    def __init__(self, take: Callable[[int, _Chunk], None],
                 take_tree: Callable[[int, _Tree], None], rows: Callable[[bytes], None],
                 flush: Callable[[bool], None], before_fork: Callable[[], None]) -> None:
        self.take, self.take_tree, self.rows = take, take_tree, rows
        self.flush, self.before_fork = flush, before_fork


def _run_pool(tasks: list[tuple[int, int, int]], jobs: int, run: Callable[[int, int], None],
              sink: _Sink, pending: dict[int, FileResult], note: ProgressFn) -> None:
    """Hand tasks to forked workers (up to ``jobs``) until every one has an answer."""
    workers: list[_Worker] = []
    sel = selectors.DefaultSelector()
    try:
        while tasks or any(w.task is not None for w in workers):
            for w in workers:
                if w.task is None and tasks:
                    _assign(w, tasks.pop())
            while tasks and len(workers) < jobs:
                sink.before_fork()
                w = _fork_worker(workers, run)
                workers.append(w)
                sel.register(w.result_fd, selectors.EVENT_READ, w)
                _assign(w, tasks.pop())
            # Every worker has its next task: the parent's own work goes here. With
            # no task left to hand out, rows are written as they come, so only the
            # rows of the last answer are written after the last worker is done.
            sink.flush(not tasks)
            for skey, _ in sel.select():
                w = skey.data
                assert isinstance(w, _Worker)
                data = os.read(w.result_fd, 1 << 22)
                if not data:
                    _bury(w, sel, workers)
                    continue
                w.buffer += data
                _drain(w, sink, pending, note)
    finally:
        for w in workers:
            with contextlib.suppress(OSError):
                os.close(w.task_fd)
        for w in workers:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(w.result_fd)
            with contextlib.suppress(OSError):
                os.close(w.result_fd)
            with contextlib.suppress(OSError):
                if w.task is not None:
                    os.kill(w.pid, signal.SIGKILL)
                # An idle worker sees EOF and exits.
                os.waitpid(w.pid, 0)
        sel.close()


def _assign(w: _Worker, task: tuple[int, int, int]) -> None:
    w.task = task
    _write_all(w.task_fd, _TASK.pack(*task))


def _drain(w: _Worker, sink: _Sink, pending: dict[int, FileResult], note: ProgressFn) -> None:
    buf = w.buffer
    while len(buf) >= _HEADER.size:
        (kind, start, _end, n_pending, files, hashed, total, text_len,
         rows_len) = _HEADER.unpack_from(buf)
        at = _HEADER.size + text_len
        at_rows = at + n_pending * _RECORD.size
        need = at_rows + rows_len
        if len(buf) < need:
            return
        if rows_len:
            sink.rows(bytes(buf[at_rows:need]))
        if kind == _MSG_PROGRESS:
            note(0, hashed)
        elif kind == _MSG_TREE:
            sink.take_tree(start, _Tree.unpack(bytes(buf[_HEADER.size:at]), files, hashed,
                                               total))
            w.task = None
        else:
            results = [_unpack_result(bytes(buf[at + k * _RECORD.size:at + (k + 1) * _RECORD.size]))
                       for k in range(n_pending)]
            if w.task is not None and w.task[0] == _TASK_BIG:
                for i, res in results:
                    pending[i] = res
            else:
                text = bytes(buf[_HEADER.size:at])
                sink.take(start, _Chunk(text, files, hashed, total, results, []))
            w.task = None
        del buf[:need]


def _bury(w: _Worker, sel: selectors.BaseSelector, workers: list[_Worker]) -> None:
    """A worker closed its pipe: it finished, was killed, or died of SIGBUS."""
    sel.unregister(w.result_fd)
    os.close(w.result_fd)
    with contextlib.suppress(OSError):
        os.close(w.task_fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(w.pid, 0)
    workers.remove(w)
    # Its unfinished chunk has no text and is redone by the parent; an
    # unfinished big file keeps its BIG result and is read again there.
