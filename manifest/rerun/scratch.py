"""Scratch directories for verify's re-runs: removed on exit, on SIGTERM/SIGINT,
and swept by the next verify when a run was killed harder than that.

A re-run's scratch clone holds a whole checkout plus its outputs (the bundled
example: ~2 MB; a real project: the repository's size). Before this module a
``kill`` of verify left one behind in the temp dir every time.

* Each scratch directory is ``$TMPDIR/manifest-verify-<random>`` and holds a
  ``.lock`` file that the owning verify keeps ``flock``-ed for its lifetime.
  The kernel drops the lock when the process dies, however it dies (kill -9
  included), so "lock can be taken" means "owner is gone".
* SIGTERM (and SIGHUP) are turned into an exception while a scratch
  directory is held, so ``finally`` runs, the child is killed by
  ``subprocess.run``'s own clean-up, and the tree is removed; SIGINT already
  raises ``KeyboardInterrupt``.
* Entering a new scratch directory first sweeps every
  ``manifest-verify-*`` whose lock can be taken (older than a minute, so a
  directory whose owner is still between ``mkdtemp`` and ``flock`` is left
  alone). One kept on purpose (``--keep``) holds a ``.kept`` marker and is
  never swept, or the next re-run a minute later would remove it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from manifest.errors import raise_terminated as _raise

PREFIX = "manifest-verify-"
LOCK = ".lock"
KEPT = ".kept"
GRACE_S = 60.0


def sweep(tmpdir: Path | None = None, *, grace_s: float = GRACE_S) -> list[Path]:
    """Remove scratch directories whose verify is gone; return what was removed."""
    base = Path(tmpdir or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < grace_s:
            continue
        path = Path(entry.path)
        if os.path.lexists(path / KEPT):
            continue  # kept on purpose (--keep): the user removes it
        try:
            fd = os.open(path / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # killed before it took the lock (the grace period has passed)
        except OSError:
            continue
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its verify is still running
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            if fd >= 0:
                os.close(fd)
    return removed


@contextlib.contextmanager
def scratch_dir(*, keep: bool = False) -> Iterator[Path]:
    """A fresh scratch directory, locked while in use, removed at the end (unless ``keep``)."""
    sweep()
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    previous: dict[signal.Signals, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, _raise)
    try:
        yield path
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if keep:
            (path / KEPT).touch()
        else:
            shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
