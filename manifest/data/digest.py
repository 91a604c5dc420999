"""The digest of one path: walk, hash, check, and the root of the listing.

:func:`digest_path` is the one entry point every verb uses (through
``manifest.data.datasets``): it opens the top (a file, a directory, or a
link to one), walks it (``manifest.data.walk``), hashes its files
(``manifest.data.pool``), and returns the root with the listing it was
computed from, or refuses with one sentence naming what could not be read
(the rules are in ``manifest.data.listing``). A root is never recorded for a
tree that was not read completely and stably.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import blake3

from manifest.data.cache import DigestCache
from manifest.data.listing import (
    KIND_WORD,
    LISTING_HEADER,
    SPECIAL_KIND,
    TREE_CONTEXT,
    file_line,
    path_text,
)
from manifest.data.pool import cpu_count, hash_entries
from manifest.data.reading import ATTEMPTS, FileResult, Status
from manifest.data.walk import Entries, Problems, seen_twice, walk, walk_tree
from manifest.errors import DataError

if TYPE_CHECKING:
    from manifest.store import BlobStore, BlobWriter

PROGRESS_AFTER_S = 1.0


class DatasetDigest(NamedTuple):
    """The digest of one path: root, counts, and the listing it was computed from.

    (A NamedTuple, immutable: ``dataclasses`` would add ~8 ms of imports to
    every ``manifest hash``.)
    """

    root: str
    files: int
    total_bytes: int
    listing: bytes
    """The listing, unless it went to the store (``blob``) or was not asked for (``keep``)."""
    is_dir: bool
    blob: str | None = None
    """The listing's name in the store, when :func:`digest_path` wrote it there."""


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


def _result_reason(res: FileResult) -> str:
    if res.status == Status.GONE:
        return "was removed while the dataset was being hashed"
    if res.status == Status.CHANGED:
        return f"kept changing while it was being hashed ({ATTEMPTS} attempts)"
    if res.status == Status.SIZE_MISMATCH:
        return ("is not a plain file: reading it gives another length than its size says "
                "(a /proc or /sys pseudo-file)")
    if res.errno in (errno.EPERM, errno.EACCES):
        return "permission denied"
    return os.strerror(res.errno).lower()


def _refuse(label: str, problems: Problems) -> DataError:
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


class _ListingOut:
    """Where the listing goes as the pool hands it on in order: into the root's
    hasher, and into a store blob, memory, or neither.

    Streamed, a directory of a million files costs the parent no 100 MB
    listing (and no copies of it), so peak memory stays flat in the file count.
    """

    def __init__(self, writer: BlobWriter | None, keep: bool) -> None:
        self.root = blake3.blake3(derive_key_context=TREE_CONTEXT)
        self.writer = writer
        self.parts: list[bytes] | None = [] if keep else None
        self.add(LISTING_HEADER.encode() + b"\n")

    def add(self, piece: bytes) -> None:
        self.root.update(piece)
        if self.writer is not None:
            self.writer.write(piece)
        if self.parts is not None:
            self.parts.append(piece)

    def listing(self) -> bytes:
        return b"".join(self.parts) if self.parts is not None else b""


def digest_path(path: Path, *, cache: DigestCache | None, no_cache: bool = False,
                quiet: bool = True, label: str | None = None,
                skip: Sequence[Path] = (), store: BlobStore | None = None,
                keep: bool = True) -> DatasetDigest:
    """Digest a file or a directory tree (see the module docstring for what is hashed).

    ``cache`` is consulted unless ``no_cache``, and refreshed either way;
    ``skip`` names directories left out of a tree (the store). The listing
    is written to a blob in ``store`` as it is made (``DatasetDigest.blob``),
    or held in memory if ``keep`` (``DatasetDigest.listing``), or dropped.
    Raises :class:`DataError` for anything that prevents a complete, stable read.
    """
    label = label if label is not None else path_text(os.fsencode(path))
    started_ns = time.time_ns()
    top, top_st = _open_top(path, label)
    is_dir = stat.S_ISDIR(top_st.st_mode)
    # A single file's listing is one line, and its root is read from it.
    out = _ListingOut(store.writer() if store is not None else None, keep or not is_dir)
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
            problems: Problems = []
        elif is_dir:
            for folder in skip:
                with contextlib.suppress(OSError):
                    st = os.stat(folder)
                    skip_ids.add((st.st_dev, st.st_ino))
            jobs = cpu_count()
            entries, trees, problems, seen = walk(top, top_st, skip_ids, progress, jobs)
            if not trees:  # with subtrees, the count is known only once they are walked
                progress.total = entries.lines.count(None)
        else:
            kind = KIND_WORD[SPECIAL_KIND.get(stat.S_IFMT(top_st.st_mode), "p")]
            raise DataError(f"dataset {label} is a {kind}, not a file or directory; "
                            "it is never opened.")
        hashed = hash_entries(entries, cache=cache, lookup=not no_cache, render=file_line,
                              started_ns=started_ns, progress=progress, trees=trees,
                              walk=lambda path, rel: walk_tree(path, rel, seen, skip_ids),
                              emit=out.add)
        problems += hashed.walk_problems
        problems += seen_twice(hashed.dir_ids)
        problems += [(rel, _result_reason(res)) for rel, res in hashed.problems]
        if problems:
            raise _refuse(label, problems)
        blob = out.writer.commit() if out.writer is not None else None
        out.writer = None
    finally:
        progress.close()
        if out.writer is not None:
            out.writer.discard()
    listing = out.listing()
    if not is_dir:
        hexd = listing.split(b"\t")[2].decode()
        return DatasetDigest("blake3:" + hexd, 1, hashed.total_bytes, listing, is_dir=False,
                             blob=blob)
    return DatasetDigest("blake3:" + out.root.hexdigest(), hashed.files, hashed.total_bytes,
                         listing, is_dir=True, blob=blob)
