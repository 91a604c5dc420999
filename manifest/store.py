"""Atomic file writes and the content-addressed blob store.

The store (default ``<repo>/.manifest/``) holds blobs named by their content:
``blobs/blake3-<hex>``. A blob is written once, atomically, and never
modified; the store ignores itself for git (``.gitignore`` containing ``*``)
so it never shows up as an untracked change of the tree it describes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import blake3

from manifest.errors import OutputError

STORE_DIRNAME = ".manifest"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def sweep_temp(path: Path, *, older_than_s: float = 3600.0) -> list[Path]:
    """Remove leftovers of interrupted :func:`atomic_write` calls for ``path``.

    A temporary file is ``.<name>.<pid>.<random>.tmp`` beside the target. A
    write killed with SIGKILL (or a power cut) leaves one behind; the next
    write of the same target (and gate, for its baseline) removes those
    whose process is gone, or that are older than an hour (a pid can be
    reused).
    """
    removed: list[Path] = []
    prefix = _temp_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix):].split(".", 1)[0]
        leftover = path.parent / name
        try:
            st = os.lstat(leftover)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        alive = False
        if pid_text.isdecimal():
            try:
                os.kill(int(pid_text), 0)
                alive = int(pid_text) != 0
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True  # another user's live process
        if alive and now - st.st_mtime < older_than_s:
            continue
        with contextlib.suppress(OSError):
            os.unlink(leftover)
            removed.append(leftover)
    return removed


def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new, never half.

    The bytes go to a temporary file in the same directory, are fsynced, and
    renamed over the target. The target must be a regular file or missing: a
    device, a FIFO, a directory or a symlink (``-o /dev/stdout``) is refused,
    never replaced.
    """
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist.")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.") from exc
    else:
        if not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else (
                "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
            raise OutputError(f"refusing to write {path}: it is {kind}.",
                              hint="Name a regular file, or leave out -o to write to stdout.")
    sweep_temp(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(path)}{os.getpid()}.", suffix=".tmp",
                                   dir=parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.") from exc


class BlobStore:
    """Content-addressed blobs under ``<root>/blobs``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    def ensure(self) -> None:
        """Create the store (and its self-ignoring .gitignore) if missing."""
        try:
            self.blobs.mkdir(parents=True, exist_ok=True)
            ignore = self.root / ".gitignore"
            if not ignore.exists():
                atomic_write(ignore, b"# written by manifest: the store is not source\n*\n")
        except OSError as exc:
            raise OutputError(f"cannot create the manifest store {self.root}: {exc}.") from exc

    def path_for(self, digest: str) -> Path:
        algo, _, hexpart = digest.partition(":")
        return self.blobs / f"{algo}-{hexpart}"

    def put(self, data: bytes) -> str:
        """Store bytes; return their ``blake3:<hex>`` name."""
        digest = "blake3:" + blake3.blake3(data).hexdigest()
        target = self.path_for(digest)
        if not target.exists():
            self.ensure()
            atomic_write(target, data, mode=0o444)
        return digest

    def writer(self) -> BlobWriter:
        """A blob written piece by piece (a listing too big to hold), named when complete."""
        self.ensure()
        return BlobWriter(self)

    def get(self, digest: str) -> bytes | None:
        """Return a blob's bytes, or None if absent or corrupted."""
        from manifest.bounded import InputKind, read_user_file_if_exists

        # Regular files only: a blob committed as a FIFO or a device is refused (exit 2).
        data = read_user_file_if_exists(self.path_for(digest), InputKind.BLOB)
        if data is None:
            return None
        if "blake3:" + blake3.blake3(data).hexdigest() != digest:
            return None
        return data


class BlobWriter:
    """A blob written as it is produced, to a temporary file in the store.

    :meth:`commit` names it by its content and renames it into place
    atomically, as :meth:`BlobStore.put` would have; :meth:`discard` removes
    it. Either must be called.
    """

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._hasher = blake3.blake3()
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=".blob.", suffix=".tmp", dir=store.blobs)
        except OSError as exc:
            raise OutputError(f"cannot write to the store {store.root}: "
                              f"{exc.strerror or exc}.") from exc
        self._fh = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        self._hasher.update(data)
        try:
            self._fh.write(data)
        except OSError as exc:
            self.discard()
            raise OutputError(f"cannot write to the store {self.store.root}: "
                              f"{exc.strerror or exc}.") from exc

    def commit(self) -> str:
        """Finish the blob; return its ``blake3:<hex>`` name."""
        digest = "blake3:" + self._hasher.hexdigest()
        target = self.store.path_for(digest)
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            if target.exists():
                os.unlink(self._tmp)
            else:
                os.chmod(self._tmp, 0o444)
                os.replace(self._tmp, target)
        except OSError as exc:
            self.discard()
            raise OutputError(f"cannot write {target}: {exc.strerror or exc}.") from exc
        return digest

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)


class OverlayStore(BlobStore):
    """The local store, read with a fallback to blobs that arrived in a checked pack.

    Writes still go to the local store; the pack's blobs are never copied there,
    so a pack leaves nothing behind in the user's repository.
    """

    def __init__(self, root: Path, extra: Mapping[str, bytes]) -> None:
        super().__init__(root)
        self.extra = dict(extra)

    def get(self, digest: str) -> bytes | None:
        data = super().get(digest)
        return self.extra.get(digest) if data is None else data
