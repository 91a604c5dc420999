"""Hashing the files of a dataset listing as fast as the machine allows.

:func:`hash_entries` takes the sorted entries of a listing (found by the walk
in ``manifest.data.walk``), hashes the regular files among them, and returns
the body of the listing with every file line filled in, or the files it
could not hash and why.

Why it is built this way (figures from a 2-core machine, page cache warm):

* **Many small files: a fork pool, not threads.** Per small file the work is
  a handful of syscalls and a few microseconds of hashing, each step holding
  the GIL; a thread pool was 3-6x *slower* than one thread. Forked workers
  (one per CPU, ``manifest.data.workers``) each take chunks of
  :data:`CHUNK_ENTRIES` entries by index into the lists they inherited
  through ``fork``, or whole subtrees that they walk themselves. A worker
  renders the listing lines of its task and sends them back as one piece of
  text, so the parent does no per-file work at all; it only concatenates
  pieces in order.
* **A worker that dies is replaced by the parent's own reads**: its
  unfinished files are re-hashed by the parent with buffered reads, which
  see a truncation as a short read, never a SIGBUS (``manifest.data.reading``
  says why only workers map files).
* **The cache is consulted before any file is opened** (in the worker, with
  its own SQLite connection), so a warm re-hash reads no file contents.
  Workers only read it: the fresh digests of a task go back to the parent
  with its result, as packed rows, and the parent alone writes them, in
  transactions of :data:`FLUSH_ROWS` rows while the workers hash on, so no
  two processes take turns on SQLite's write lock.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from collections.abc import Callable, Sequence

from manifest.data.cache import ROW_SIZE, DigestCache, Key, StatKey, TreeRecord
from manifest.data.reading import (
    PLACEHOLDER,
    Chunk,
    FileResult,
    RenderFile,
    Status,
    hash_buffered,
    lstat_file,
    retry_changed,
    run_chunk,
)
from manifest.data.walk import Entries, WalkFn
from manifest.data.workers import (
    HEADER,
    MSG_PROGRESS,
    MSG_TREE,
    RECORD,
    TASK,
    TASK_BIG,
    TASK_CHUNK,
    TASK_TREE,
    SubTree,
    Worker,
    fork_worker,
    run_tree,
    unpack_result,
    worker_main,
    write_all,
)

CHUNK_ENTRIES = 512
"""Entries per task: enough to amortise a pipe round trip, few enough to balance."""
IN_PROCESS_MAX = 1024
"""Below this many entries (and with no big file) forking costs more than it saves."""
FLUSH_ROWS = 8192
"""Cache rows the parent gathers from workers before it writes them in one transaction."""
_FLUSH_BYTES = FLUSH_ROWS * ROW_SIZE

ProgressFn = Callable[[int, int], None]
"""Called with (files finished, bytes hashed) increments."""
_Settle = Callable[[bytes, bytes, FileResult], "str | None"]
"""(path, relative path, result) -> the line of a file left pending, or None (a problem)."""
_TREE_MARK = b"\x01"
"""The line of a subtree in the parent's entries (``manifest.data.walk.TREE``)."""


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


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def hash_entries(entries: Entries, *, cache: DigestCache | None, lookup: bool,
                 render: RenderFile, started_ns: int, jobs: int | None = None,
                 progress: ProgressFn | None = None, trees: Sequence[tuple[bytes, bytes]] = (),
                 walk: WalkFn | None = None, emit: Callable[[bytes], None] | None = None
                 ) -> Hashed:
    """Hash every regular file among ``entries`` and render the listing body.

    ``cache`` is read when ``lookup`` and refreshed with every digest read
    now. Never raises for one file: failures come back in ``problems``.
    ``trees``: (directory, relative path) of subtrees that workers walk with
    ``walk``, hash and render whole; each stands in ``entries`` as a line
    ``_TREE_MARK`` where its lines go. ``emit``: called with the body in
    order, piece by piece, as it becomes final (then ``Hashed.body`` is
    empty); without it the body is returned whole.
    """
    jobs = jobs or cpu_count()
    note: ProgressFn = progress or (lambda files, nbytes: None)
    n = len(entries.rel)
    can_fork = hasattr(os, "fork")
    texts: dict[int, bytes] = {}
    pending: dict[int, FileResult] = {}
    fresh: list[tuple[Key, bytes]] = []
    files = total = 0
    tasks: list[tuple[int, int, int]] = []
    done_trees: dict[int, SubTree] = {}
    late: list[tuple[Key, bytes]] = []
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

    body = _InOrder(entries, texts, pending, done_trees, settle, emit)

    records: list[TreeRecord] = []

    def take_tree(index: int, tree: SubTree) -> None:
        nonlocal files, total
        done_trees[index] = tree
        if tree.record is not None:
            records.append(tree.record)
        files += tree.files
        total += tree.total_bytes
        note(tree.files, tree.hashed_bytes)

    def take(start: int, chunk: Chunk) -> None:
        nonlocal files, total
        texts[start] = chunk.text
        files += chunk.files
        total += chunk.total_bytes
        if chunk.pending:
            body.holes[start] = [i for i, _ in chunk.pending]
        for i, res in chunk.pending:
            pending[i] = res
            if res.status == Status.BIG:
                tasks.append((TASK_BIG, i, i + 1))
        note(chunk.files, chunk.hashed_bytes)

    if (n < IN_PROCESS_MAX and not trees) or not can_fork:
        look = cache if lookup else None
        for start in range(0, n, CHUNK_ENTRIES):
            chunk = run_chunk(entries, start, min(start + CHUNK_ENTRIES, n), look, render,
                              defer_big=can_fork, keep=cache is not None)
            fresh += chunk.fresh
            take(start, chunk)
    # Popped from the end, so handed out in path order: chunks (the parent's
    # entries, the top levels only when there are subtrees), then subtrees.
    # Pieces come back in about the order they go out, and the body is
    # passed on as soon as it is in order, not held whole.
    tasks[:0] = [(TASK_TREE, j, j + 1) for j in reversed(range(len(trees) if can_fork else 0))]
    if not ((n < IN_PROCESS_MAX and not trees) or not can_fork):
        tasks += [(TASK_CHUNK, s, min(s + CHUNK_ENTRIES, n))
                  for s in reversed(range(0, n, CHUNK_ENTRIES))]
    if cache is not None:
        cache.store(fresh, started_ns=started_ns)
        cache.close()
    if tasks:
        def run(task_fd: int, result_fd: int) -> None:
            worker_main(task_fd, result_fd, entries, cache, lookup, render, jobs, started_ns,
                        trees, walk)

        # Workers send their fresh digests back as rows; only the parent writes
        # them, in few large transactions, while the workers hash the next tasks.
        rows: list[bytes] = []
        gathered = 0

        def keep_rows(data: bytes) -> None:
            nonlocal gathered
            rows.append(data)
            gathered += len(data)

        def between(final: bool = False) -> None:
            nonlocal gathered
            body.advance(final=False)
            if cache is not None and records:
                cache.store_trees(records)
                records.clear()
            if cache is not None and rows and (final or gathered >= _FLUSH_BYTES):
                cache.store_packed(b"".join(rows))
                rows.clear()
                gathered = 0

        def before_fork() -> None:
            if cache is not None:
                cache.close()  # no SQLite connection is carried across fork

        _run_pool(tasks, jobs, run, _Sink(take, take_tree, keep_rows, between, before_fork),
                  pending, note)
        between(final=True)
    # What a dead worker left unfinished, or a big file it could not map,
    # is hashed here with buffered reads: a truncation is a short read here.
    for start in range(0, n, CHUNK_ENTRIES):
        if start not in texts and start >= body.next_chunk:
            chunk = run_chunk(entries, start, min(start + CHUNK_ENTRIES, n), None, render,
                              defer_big=False, keep=cache is not None)
            late += chunk.fresh
            take(start, chunk)
    for j, (path, rel) in enumerate(trees):
        if j not in done_trees and j >= body.next_tree:  # its worker died (or no fork)
            tree = run_tree(walk or _no_walk, path, rel, None, render, keep=cache is not None,
                            mapped=None)
            late += tree.fresh
            take_tree(j, tree)
    body.advance(final=True)
    if cache is not None:
        if late:
            cache.store(late, started_ns=started_ns)
        cache.close()
    hashed = Hashed(body.collected(), files, total, problems)
    hashed.walk_problems, hashed.dir_ids = body.walk_problems, body.dir_ids
    return hashed


def _no_walk(path: bytes, rel: bytes) -> tuple[Entries, list[tuple[bytes, str]],
                                               list[tuple[bytes, int, int]]]:
    raise ValueError("subtrees to hash, but no walk to list them")


class _InOrder:
    """The listing body, handed on in entry order as soon as each piece is final.

    Tasks finish out of order; a piece (a chunk's text, a subtree's text) is
    passed to ``emit`` once every piece before it has been, and then dropped,
    so the parent holds only the pieces that arrived early, never the whole
    listing (~100 bytes a file: 100 MB for a million files). A piece with a
    hole waits for it: a big file's own task (filled as soon as its digest
    is back), or a file a worker could not read (filled by :attr:`settle`,
    which reads it again, once the pool is done).
    """

    def __init__(self, entries: Entries, texts: dict[int, bytes], pending: dict[int, FileResult],
                 trees: dict[int, SubTree], settle: _Settle,
                 emit: Callable[[bytes], None] | None) -> None:
        self.entries, self.texts, self.pending, self.trees = entries, texts, pending, trees
        self.holes: dict[int, list[int]] = {}
        """Chunk start -> the entries of that chunk left as placeholders, in order."""
        self.parts: list[bytes] = []
        self.emit = emit if emit is not None else self.parts.append
        self.next_chunk = 0
        self.next_tree = 0
        self.rest: list[bytes] = []
        """What is left of the current chunk's text after a subtree's mark."""
        self.settle = settle
        self.walk_problems: list[tuple[bytes, str]] = []
        self.dir_ids: list[tuple[bytes, int, int]] = []

    def collected(self) -> bytes:
        return b"".join(self.parts)

    def _fill(self, text: bytes, holes: list[tuple[bytes, bytes, FileResult]],
              final: bool) -> bytes | None:
        """``text`` with its placeholders filled, or None while a hole is not final.

        Early (not ``final``), only digests already known fill a hole: a big
        file whose own task is back. A hole whose file is filled with nothing
        is a problem :attr:`settle` recorded; the listing is then never used.
        """
        if not final and not all(res.status in (Status.OK, Status.CACHED)
                                 and res.key is not None and res.digest is not None
                                 for _, _, res in holes):
            return None
        lines = [(self.settle(path, rel, res) or "").encode("utf-8") for path, rel, res in holes]
        pieces = text.split(PLACEHOLDER.encode())
        return b"".join(p + f for p, f in zip(pieces, [*lines, b""], strict=True))

    def advance(self, *, final: bool) -> None:
        """Emit every piece that is final now (with ``final``: all of them)."""
        n = len(self.entries.rel)
        while True:
            while self.rest:
                tree = self.trees.get(self.next_tree)
                if tree is None:
                    return
                text: bytes | None = tree.text
                if tree.pending:
                    if not final:
                        return
                    text = self._fill(tree.text, tree.pending, final)
                assert text is not None
                self.emit(text)
                self.walk_problems += tree.problems
                self.dir_ids += tree.dir_ids
                del self.trees[self.next_tree]
                self.next_tree += 1
                self.emit(self.rest.pop(0))
            start = self.next_chunk
            if start >= n or start not in self.texts:
                return
            text = self.texts[start]
            holes = self.holes.get(start)
            if holes:
                path, rel = self.entries.path, self.entries.rel
                text = self._fill(text, [(path(i), rel[i], self.pending[i]) for i in holes],
                                  final)
                if text is None:
                    return
                for i in holes:
                    del self.pending[i]
            del self.texts[start]
            self.next_chunk = start + CHUNK_ENTRIES
            first, *self.rest = text.split(_TREE_MARK)
            self.emit(first)


class _Sink:
    """Where the pool hands what workers send, and what it calls between messages."""

    __slots__ = ("before_fork", "flush", "rows", "take", "take_tree")

    def __init__(self, take: Callable[[int, Chunk], None],
                 take_tree: Callable[[int, SubTree], None], rows: Callable[[bytes], None],
                 flush: Callable[[bool], None], before_fork: Callable[[], None]) -> None:
        self.take, self.take_tree, self.rows = take, take_tree, rows
        self.flush, self.before_fork = flush, before_fork


def _run_pool(tasks: list[tuple[int, int, int]], jobs: int, run: Callable[[int, int], None],
              sink: _Sink, pending: dict[int, FileResult], note: ProgressFn) -> None:
    """Hand tasks to forked workers (up to ``jobs``) until every one has an answer."""
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()
    try:
        while tasks or any(w.task is not None for w in workers):
            for w in workers:
                if w.task is None and tasks:
                    _assign(w, tasks.pop())
            while tasks and len(workers) < jobs:
                sink.before_fork()
                w = fork_worker(workers, run)
                workers.append(w)
                sel.register(w.result_fd, selectors.EVENT_READ, w)
                _assign(w, tasks.pop())
            # Every worker has its next task: the parent's own work goes here. With
            # no task left to hand out, rows are written as they come, so only the
            # rows of the last answer are written after the last worker is done.
            sink.flush(not tasks)
            for skey, _ in sel.select():
                w = skey.data
                assert isinstance(w, Worker)
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


def _assign(w: Worker, task: tuple[int, int, int]) -> None:
    w.task = task
    write_all(w.task_fd, TASK.pack(*task))


def _drain(w: Worker, sink: _Sink, pending: dict[int, FileResult], note: ProgressFn) -> None:
    buf = w.buffer
    while len(buf) >= HEADER.size:
        (kind, start, _end, n_pending, files, hashed, total, text_len,
         rows_len) = HEADER.unpack_from(buf)
        at = HEADER.size + text_len
        at_rows = at + n_pending * RECORD.size
        need = at_rows + rows_len
        if len(buf) < need:
            return
        if rows_len:
            sink.rows(bytes(buf[at_rows:need]))
        if kind == MSG_PROGRESS:
            note(0, hashed)
        elif kind == MSG_TREE:
            sink.take_tree(start, SubTree.unpack(bytes(buf[HEADER.size:at]), files, hashed,
                                               total))
            w.task = None
        else:
            results = [unpack_result(bytes(buf[at + k * RECORD.size:at + (k + 1) * RECORD.size]))
                       for k in range(n_pending)]
            if w.task is not None and w.task[0] == TASK_BIG:
                for i, res in results:
                    pending[i] = res
            else:
                text = bytes(buf[HEADER.size:at])
                sink.take(start, Chunk(text, files, hashed, total, results, []))
            w.task = None
        del buf[:need]


def _bury(w: Worker, sel: selectors.BaseSelector, workers: list[Worker]) -> None:
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
