"""How the weight readers open files: a read-only map of a regular file, and a checkpoint
directory's members.

A module of its own so the import graph of ``manifest.weights`` runs one way:
``tables`` dispatches to the readers (``dcp``, ``sharded``, ``safetensors_file``,
``torch_archive``), and every one of them imports the map and the member checks
from here (with :class:`MappedFile` in ``tables``, ``dcp`` and ``sharded`` would import
it back: an import circle tables ↔ dcp ↔ sharded).

Every file goes through :func:`manifest.bounded.open_regular`: a checkpoint path
is written in a manifest, so what lies there is whatever the user's tree holds: a
FIFO would block ``verify --at`` forever, a 32 GiB sparse file at a path that
recorded 2,205 bytes would be hashed whole (no answer after 40 s), and a
``*.safetensors.index.json`` linked to ``/dev/zero`` passes a 64 MiB size check
(``st_size`` 0) and is read until memory runs out. Here only a regular file is
opened, never waiting for a writer, and with the recorded size given it must be
exactly that size before a byte is read.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import Any

from manifest.bounded import InputKind, open_regular
from manifest.errors import ManifestError
from manifest.weights.bounds import MalformedWeightsError, short


class MappedFile:
    """A read-only view of a whole regular file (mmap; empty files give b"").

    ``size``: the recorded size, which the file must have (checked before mapping);
    ``within``: a directory a link at ``path`` must not lead out of. A file that is not
    regular, or not that size, raises :class:`~manifest.errors.MalformedArtifactError`
    (one sentence, naming ``shown`` or the path).
    """

    def __init__(self, path: Path, *, size: int | None = None, within: Path | None = None,
                 shown: str | None = None) -> None:
        fd, st = open_regular(path, InputKind.WEIGHTS, size=size, within=within, shown=shown)
        self._fh = os.fdopen(fd, "rb", closefd=True)
        self._map: mmap.mmap | None = None
        try:
            if st.st_size:
                self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            self._fh.close()
            raise
        self.view = memoryview(self._map) if self._map is not None else memoryview(b"")

    def close(self) -> None:
        try:
            self.view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass  # a tensor view is still referenced; the map closes when it is collected
        self._fh.close()

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_member(path: Path, cap: int, what: str) -> bytes:
    """The bytes of a small file a checkpoint is described by (DCP ``.metadata``, a sharded
    index): a regular file of at most ``cap`` bytes, checked before a byte is read, and
    read no further than ``cap`` + 1 bytes whatever its size claims; else
    :class:`~manifest.weights.bounds.MalformedWeightsError` naming ``what``."""
    try:
        fd, _ = open_regular(path, InputKind.WEIGHTS, cap=cap, shown=what)
    except ManifestError as exc:
        raise MalformedWeightsError(str(exc).rstrip(".")) from exc
    with os.fdopen(fd, "rb", closefd=True) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:  # it grew while read
        raise MalformedWeightsError(f"{what} is over its {cap:,}-byte limit")
    return data


def plain_member(directory: Path, name: Any, what: str) -> Path:
    """``directory/name`` for a name a file in the directory gave: a plain file name of
    a regular file, never a path out of the directory or a link."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\x00" in name or len(name) > 255):
        raise MalformedWeightsError(f"{what} {short(name)} is not a plain file name in "
                                    "the checkpoint's directory")
    path = directory / name
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise MalformedWeightsError(f"{what} {short(name)} is missing") from exc
    if not stat.S_ISREG(mode):
        raise MalformedWeightsError(f"{what} {short(name)} is not a regular file (a link or "
                                    "a device is never followed)")
    return path


def member_files(directory: Path) -> list[Path]:
    """The regular files directly in a checkpoint directory, by name (links left out)."""
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            out.append(directory / entry.name)
    return out
