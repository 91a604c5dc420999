"""What a forked worker runs, and the wire between it and the parent.

A worker (``manifest.data.pool`` forks them) reads tasks from a pipe: a chunk
of the parent's entries (by index: the lists were inherited through
``fork``, so no path is serialised), one big file, or one subtree that it
walks itself. It answers on its own pipe with the rendered listing lines of
the task, the files it could not finish, and the fresh cache rows, in the
compact records below, so the parent does no per-file work at all.

**BLAKE3's thread pool is created in the worker**, with an explicit thread
count (never ``AUTO``, which uses the process-global rayon pool): a pool
inherited through ``fork`` has no threads behind it and would hang.
"""

from __future__ import annotations

import contextlib
import faulthandler
import marshal
import os
import signal
import struct
import warnings
from collections.abc import Callable, Sequence
from operator import itemgetter

import blake3

from manifest.data import cache as datacache
from manifest.data.cache import DigestCache, Key, StatKey, TreeRecord, pack_rows
from manifest.data.reading import (
    PLACEHOLDER,
    FileResult,
    RenderFile,
    Status,
    hash_mapped,
    lstat_file,
    run_chunk,
    stat_keys,
    tree_fingerprint,
)
from manifest.data.walk import Entries, WalkFn


class SubTree:
    """A subtree walked, hashed and rendered: text with a placeholder per ``pending``."""

    __slots__ = ("dir_ids", "files", "fresh", "hashed_bytes", "pending", "problems", "record",
                 "text", "total_bytes")

    def __init__(self, text: bytes, files: int, hashed_bytes: int, total_bytes: int,
                 pending: list[tuple[bytes, bytes, FileResult]],
                 problems: list[tuple[bytes, str]], dir_ids: list[tuple[bytes, int, int]],
                 fresh: list[tuple[Key, bytes]]) -> None:
        self.text, self.files, self.hashed_bytes = text, files, hashed_bytes
        self.total_bytes, self.pending, self.problems = total_bytes, pending, problems
        self.dir_ids, self.fresh = dir_ids, fresh
        self.record: TreeRecord | None = None
        """This subtree's lines for the cache, when all of them are final and none racy."""

    def pack(self) -> bytes:
        pending = [(path, rel, int(r.status), tuple(r.key) if r.key else None, r.digest, r.errno)
                   for path, rel, r in self.pending]
        r = self.record
        record = (r.dev, r.ino, r.fingerprint, r.files, r.total_bytes, r.text) if r else None
        return marshal.dumps((self.text, pending, self.problems, self.dir_ids, record))

    @classmethod
    def unpack(cls, data: bytes, files: int, hashed_bytes: int, total_bytes: int) -> SubTree:
        # From our own worker through a pipe only it and the parent hold.
        text, pending, problems, dir_ids, record = marshal.loads(data)  # noqa: S302
        tree = cls(text, files, hashed_bytes, total_bytes,
                   [(path, rel, FileResult(Status(st), StatKey(*key) if key else None, digest,
                                           err))
                    for path, rel, st, key, digest, err in pending],
                   [tuple(p) for p in problems], [tuple(d) for d in dir_ids], [])
        tree.record = TreeRecord(*record) if record is not None else None
        return tree


def run_tree(walk: WalkFn, path: bytes, rel: bytes, cache: DigestCache | None,
             render: RenderFile, *, keep: bool,
             mapped: Callable[[bytes, StatKey], FileResult] | None,
             started_ns: int = 0) -> SubTree:
    """Walk one subtree, hash its files and render its lines (in a worker, or in the
    parent for a subtree whose worker died: then ``mapped`` is None and big files are
    read with buffered reads).

    With ``cache``, a subtree whose record (``TreeRecord``) still matches its
    walk and the keys of its files takes its lines from the record; with
    ``keep``, a subtree read in full leaves a record, unless a file in it is
    racily clean (see ``manifest.data.cache``) as of ``started_ns``.
    """
    entries, problems, dir_ids = walk(path, rel)
    top: os.stat_result | None = None
    with contextlib.suppress(OSError):
        top = os.stat(path, follow_symlinks=False)
    if cache is not None and top is not None:
        # A warm subtree: one lstat per file and one row, instead of a row per file.
        known = cache.tree_lookup(top.st_dev, top.st_ino)
        if known is not None:
            keys = stat_keys(entries)
            if keys is not None and tree_fingerprint(entries, keys) == known.fingerprint:
                return SubTree(known.text, known.files, 0, known.total_bytes, [], problems,
                               dir_ids, [])
    chunk = run_chunk(entries, 0, len(entries.rel), cache, render,
                      defer_big=mapped is not None, keep=keep)
    tree = SubTree(chunk.text, chunk.files, chunk.hashed_bytes, chunk.total_bytes, [],
                   problems, dir_ids, chunk.fresh)
    keys = chunk.keys
    # Not racily clean (``manifest.data.cache``): the newest mtime and ctime, at C speed.
    limit = started_ns - datacache.RACY_WINDOW_NS
    if (keep and top is not None and keys is not None and not problems
            and max(map(itemgetter(3), keys), default=0) < limit
            and max(map(itemgetter(4), keys), default=0) < limit):
        tree.record = TreeRecord(top.st_dev, top.st_ino, tree_fingerprint(entries, keys),
                                 chunk.files, chunk.total_bytes, chunk.text)
    if chunk.pending:
        pieces = chunk.text.split(PLACEHOLDER.encode())
        out = [pieces[0]]
        for (i, res), piece in zip(chunk.pending, pieces[1:], strict=True):
            file_path = entries.path(i)
            if res.status == Status.BIG and mapped is not None:
                key, failed = lstat_file(file_path)
                res = failed or mapped(file_path, key or StatKey(0, 0, 0, 0, 0))
                if res.status == Status.OK and res.key is not None and res.digest is not None:
                    if keep:
                        k = res.key
                        tree.fresh.append(((k.dev, k.ino, k.size, k.mtime_ns, k.ctime_ns),
                                           res.digest))
                    tree.hashed_bytes += res.key.size
            if res.status == Status.OK and res.key is not None and res.digest is not None:
                out.append(render(res.key.size, res.digest, entries.rel[i]).encode("utf-8"))
                tree.files += 1
                tree.total_bytes += res.key.size
            else:
                tree.pending.append((file_path, entries.rel[i], res))
                out.append(PLACEHOLDER.encode())
            out.append(piece)
        tree.text = b"".join(out)
    return tree


# ----------------------------------------------------------------- wire

# Worker -> parent: a header, then `text_len` bytes of UTF-8 (or a marshalled
# subtree), then `n_pending` records, then `rows_len` bytes of cache rows
# (``manifest.data.cache.pack_rows``) that the parent writes.
# type, start, end, n_pending, files, hashed_bytes, total_bytes, text_len, rows_len
HEADER = struct.Struct("<BxxxIIIIQQQQ")
# index, status, errno, dev, ino, size, mtime_ns, ctime_ns, digest
RECORD = struct.Struct("<IBBxxQQQqq32s")
TASK = struct.Struct("<BII")
TASK_CHUNK, TASK_BIG, TASK_TREE = 0, 1, 2
MSG_CHUNK, MSG_PROGRESS, MSG_TREE = 0, 1, 2


def pack_result(index: int, res: FileResult) -> bytes:
    k = res.key or StatKey(0, 0, 0, 0, 0)
    return RECORD.pack(index, res.status, min(res.errno, 255), k.dev, k.ino, k.size,
                       k.mtime_ns, k.ctime_ns, res.digest or b"")


def unpack_result(data: bytes) -> tuple[int, FileResult]:
    index, status, err, dev, ino, size, mtime_ns, ctime_ns, digest = RECORD.unpack(data)
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


def write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as whole:
        view = whole
        while view:
            view = view[os.write(fd, view):]


def worker_main(task_fd: int, result_fd: int, entries: Entries, cache: DigestCache | None,
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
        task = _read_exact(task_fd, TASK.size)
        if not task:
            break
        kind, start, end = TASK.unpack(task)
        if kind == TASK_TREE and walk is not None:
            def mapped(path: bytes, key: StatKey, index: int = start) -> FileResult:
                nonlocal hasher
                if hasher is None:
                    hasher = blake3.blake3(max_threads=threads)

                def report(n: int) -> None:
                    write_all(result_fd, HEADER.pack(MSG_PROGRESS, index, index, 0, 0, n,
                                                       0, 0, 0))

                return hash_mapped(path, key, hasher, report)

            tree_path, tree_rel = trees[start]
            tree = run_tree(walk, tree_path, tree_rel, look, render, keep=keep, mapped=mapped,
                            started_ns=started_ns)
            payload = tree.pack()
            rows = pack_rows(tree.fresh, started_ns=started_ns) if keep else b""
            write_all(result_fd, b"".join([
                HEADER.pack(MSG_TREE, start, end, 0, tree.files, tree.hashed_bytes,
                            tree.total_bytes, len(payload), len(rows)), payload, rows]))
            continue
        if kind == TASK_CHUNK:
            chunk = run_chunk(entries, start, end, look, render, defer_big=True, keep=keep)
            text = chunk.text
            rows = pack_rows(chunk.fresh, started_ns=started_ns) if keep else b""
            head = HEADER.pack(MSG_CHUNK, start, end, len(chunk.pending), chunk.files,
                               chunk.hashed_bytes, chunk.total_bytes, len(text), len(rows))
            write_all(result_fd, b"".join(
                [head, text, *(pack_result(i, r) for i, r in chunk.pending), rows]))
            continue
        if hasher is None:
            hasher = blake3.blake3(max_threads=threads)

        def report(n: int, index: int = start) -> None:
            write_all(result_fd, HEADER.pack(MSG_PROGRESS, index, index, 0, 0, n, 0, 0, 0))

        path = entries.path(start)
        key, failed = lstat_file(path)
        res = failed or hash_mapped(path, key or StatKey(0, 0, 0, 0, 0), hasher, report)
        rows = b""
        if keep and res.status == Status.OK and res.key is not None and res.digest is not None:
            rows = pack_rows([(res.key, res.digest)], started_ns=started_ns)
        write_all(result_fd, HEADER.pack(MSG_CHUNK, start, end, 1, 0, 0, 0, 0, len(rows))
                   + pack_result(start, res) + rows)
    os.close(result_fd)


class Worker:
    __slots__ = ("buffer", "pid", "result_fd", "task", "task_fd")

    def __init__(self, pid: int, task_fd: int, result_fd: int) -> None:
        self.pid, self.task_fd, self.result_fd = pid, task_fd, result_fd
        self.task: tuple[int, int, int] | None = None
        self.buffer = bytearray()


def fork_worker(others: list[Worker], run: Callable[[int, int], None]) -> Worker:
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
    return Worker(pid, task_w, result_r)


