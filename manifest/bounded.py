"""The one bounded reader: every file the tool reads on a user's behalf goes through here.

The tool reads files someone else chose: a manifest or pack received by mail,
the ``FILE.sig`` committed beside it, a key named on the command line or in a
trust policy, a baseline and a pyproject.toml checked out from a pull request.
Read with a plain ``open()``:

* a FIFO blocks forever waiting for a writer (``verify run.json`` never returns);
* ``/dev/zero`` or ``/dev/urandom`` never ends: the read grows until
  ``MemoryError`` ("internal error") or the kernel's OOM killer;
* a committed symlink (``run.json.sig -> /dev/zero``) is the same device under
  an innocent name, and a directory raises ``IsADirectoryError`` mid-verb.

So :func:`read_user_file` is the only place that opens such a file, and it
refuses without blocking anything that is not a regular file: the path is
``stat``-ed first (a device is never opened: opening a tape or serial device
has effects of its own), then opened ``O_NONBLOCK | O_NOCTTY`` and
``fstat``-ed again (a FIFO swapped in between is still refused, and the
non-blocking open cannot wait for a writer). A symlink is followed, but only
to a regular file; a dangling one is refused, not taken for "absent". Each
:class:`InputKind` has a size cap, checked against ``st_size`` before a byte
is read and again while reading (cap + 1 bytes at most, for files whose size
lies, such as ``/proc`` and ``/sys``). Each refusal is one sentence with exit
status 2 (:class:`~manifest.errors.UsageError`, or
:class:`~manifest.errors.ConfigError` for configuration), reached in
milliseconds: nothing waits or retries.

The caps are far above any real file of the kind and far below what would
hurt: a manifest of 100,000 tensors is about 25 MiB (cap 64 MiB,
``MANIFEST_MAX_BYTES``); a Sigstore bundle is about 5 KiB (cap 1 MiB); a PEM
key under 4 KiB (cap 64 KiB); a trust policy or pyproject.toml a few KiB (cap
4 MiB).

A file at a path a manifest recorded (a checkpoint in the user's tree, mapped
by ``manifest.weights``) is opened by :func:`open_regular`: its links resolved
and held inside the tree, opened ``O_NOFOLLOW | O_NONBLOCK``, and its size
checked against the recorded one before a byte is read (a FIFO there left
``verify --at`` without an answer after 40 s; a 32 GiB sparse file where 2,205
bytes were recorded was hashed whole).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO

from manifest.errors import (
    ConfigError,
    DataError,
    MalformedArtifactError,
    ManifestError,
    NoVerdictError,
    UsageError,
)

MAX_BYTES_VARIABLE = "MANIFEST_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 * 2**20
"""The cap on manifests, packs and baselines (``MANIFEST_MAX_BYTES`` overrides it)."""


@dataclass(frozen=True)
class _Rule:
    what: str
    """How a refusal names the file: ``{path} is a FIFO, not a regular {what}``."""
    cap: int | None
    """Bytes; None: :func:`max_manifest_bytes`."""
    error: type[ManifestError]
    stdin: bool = False
    """Whether ``-`` means standard input."""


class InputKind(Enum):
    """What a file is for: picks its size cap and the words of a refusal."""

    MANIFEST = _Rule("manifest file", None, UsageError, stdin=True)
    """A manifest or a pack (``show``, ``verify``, ``diff``, ``pack`` …)."""
    BASELINE = _Rule("baseline manifest", None, UsageError)
    SIGNATURE = _Rule("signature", 1 << 20, UsageError)
    """``--signature FILE`` and the ``FILE.sig`` sidecar."""
    KEY = _Rule("private key", 64 << 10, UsageError)
    """``sign --key``."""
    POLICY = _Rule("trust policy", 4 << 20, ConfigError)
    """``trust.toml``, and a repository's pyproject.toml read for its trust table."""
    TRUSTED_KEY = _Rule("public key", 64 << 10, ConfigError)
    """A key file a trust policy names."""
    CONFIG = _Rule("pyproject.toml", 4 << 20, ConfigError)
    """The pyproject.toml whose ``[tool.manifest]`` gives defaults."""
    BLOB = _Rule("stored blob", 16 << 30, DataError)
    """A blob of the local store (patch, listing, op stream): a clone that commits
    ``.manifest/blobs/…`` as a FIFO or a device must not hang verify."""
    ARTIFACT = _Rule("output file", 1 << 50, DataError)
    """A recorded output hashed by ``attest`` (streamed: regular file only, no practical cap)."""
    SCRIPT = _Rule("Python script", 1 << 20, UsageError)
    """A script or config file a recorded command runs, parsed (never run) to learn how it
    resumes (``manifest.verify.conventions``: nanoGPT's train.py is ~15 KB)."""
    BUNDLE_INDEX = _Rule("bundle index", None, NoVerdictError)
    """A cluster bundle's ``bundle.json``, read on arrival (:func:`read_regular_at`)."""
    WEIGHTS = _Rule("checkpoint or output file", 1 << 50, MalformedArtifactError)
    """A checkpoint or output hashed by capture and verify (``manifest.weights``, mapped
    through :func:`open_regular`): a recorded checkpoint path in the user's tree that is a
    FIFO, a device or a 32 GiB sparse file must not hang ``verify --at``."""


def max_manifest_bytes() -> int:
    """The size cap on manifest, pack and baseline files (``MANIFEST_MAX_BYTES``, 64 MiB)."""
    raw = os.environ.get(MAX_BYTES_VARIABLE, "")
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise UsageError(f"{MAX_BYTES_VARIABLE} must be a positive number of bytes, "
                         f"not {raw!r}.")
    return value


def cap_of(kind: InputKind) -> int:
    """The size cap of a kind, in bytes."""
    return kind.value.cap if kind.value.cap is not None else max_manifest_bytes()


def _cap_words(kind: InputKind, cap: int) -> str:
    return f"{cap}-byte limit for a {kind.value.what}" + (
        f" ({MAX_BYTES_VARIABLE})" if kind.value.cap is None else "")


def _file_type(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _refuse_type(name: str, mode: int, kind: InputKind, linked: bool) -> ManifestError:
    rule = kind.value
    if stat.S_ISDIR(mode):
        return rule.error(f"{name} is a directory, not a {rule.what}.")
    via = " (through a symlink)" if linked else ""
    return rule.error(f"{name} is {_file_type(mode)}{via}, not a regular {rule.what}; "
                      "refusing to read it.")


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def read_user_file(path: str | Path, kind: InputKind) -> bytes:
    """The bytes of a file the user named (or a tool-found file read for them).

    Refuses, with one sentence and exit 2, anything missing, not a regular
    file (FIFO, device, socket, directory, also behind a symlink), or over
    the kind's cap; see the module docstring.
    """
    data = _read(path, kind, missing_ok=False)
    assert data is not None
    return data


def read_user_file_if_exists(path: str | Path, kind: InputKind) -> bytes | None:
    """As :func:`read_user_file`, but None when nothing is at ``path``.

    A dangling symlink is not "nothing": it is refused, so a committed
    ``run.json.sig -> /missing`` cannot pass for an unsigned manifest.
    """
    return _read(path, kind, missing_ok=True)


def read_user_text(path: str | Path, kind: InputKind, *, missing_ok: bool = False) -> str | None:
    """The UTF-8 text of such a file (configuration, policies); None if absent and allowed."""
    data = _read(path, kind, missing_ok=missing_ok)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise kind.value.error(f"{os.fsdecode(path)} is not UTF-8 text "
                               f"(byte {exc.start}), not a {kind.value.what}.") from exc


def open_user_file(path: str | Path, kind: InputKind) -> BinaryIO:
    """A regular file opened for streaming (an output artifact being hashed): the same
    refusals as :func:`read_user_file`; the caller reads it in chunks, up to its cap."""
    opened = _open(path, kind, missing_ok=False)
    assert opened is not None
    return os.fdopen(opened[0], "rb", closefd=True)


def _open(path: str | Path, kind: InputKind, *,
          missing_ok: bool) -> tuple[int, os.stat_result] | None:
    """An fd open on a regular file within the kind's cap, and its fstat; None if absent."""
    rule = kind.value
    cap = cap_of(kind)
    name = os.fsdecode(path)
    if not name:
        raise rule.error(f"the {rule.what} name is empty.")
    try:
        linked = os.path.islink(name)
        # Looked at before it is opened: a device is refused without an open() of it.
        st = os.stat(name)
    except FileNotFoundError as exc:
        if linked:
            raise rule.error(f"{name} is a symlink to nothing, not a {rule.what}.") from exc
        if missing_ok:
            return None
        raise rule.error(f"{rule.what} {name} does not exist.") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise rule.error(f"cannot read the {rule.what} {name!r}: {_reason(exc)}.") from exc
    if not stat.S_ISREG(st.st_mode):
        raise _refuse_type(name, st.st_mode, kind, linked)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise rule.error(f"cannot read the {rule.what} {name!r}: {_reason(exc)}.") from exc
    try:
        st = os.fstat(fd)  # what was opened, whatever the name points at now
        if not stat.S_ISREG(st.st_mode):
            raise _refuse_type(name, st.st_mode, kind, linked)
        if st.st_size > cap:
            raise rule.error(f"{name} is {st.st_size} bytes, over the {_cap_words(kind, cap)}; "
                             "refusing to read it.")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read(path: str | Path, kind: InputKind, *, missing_ok: bool) -> bytes | None:
    rule = kind.value
    cap = cap_of(kind)
    name = os.fsdecode(path)
    if name == "-" and rule.stdin:
        data = sys.stdin.buffer.read(cap + 1)
        if len(data) > cap:
            raise rule.error(f"the {rule.what} on stdin is larger than {cap} bytes"
                             + (f" ({MAX_BYTES_VARIABLE})" if rule.cap is None else "")
                             + "; refusing to read it.")
        return data
    opened = _open(path, kind, missing_ok=missing_ok)
    if opened is None:
        return None
    try:
        with os.fdopen(opened[0], "rb", closefd=True) as fh:
            data = fh.read(cap + 1)
    except OSError as exc:
        raise rule.error(f"cannot read the {rule.what} {name}: {_reason(exc)}.") from exc
    if len(data) > cap:  # it grew while we read, or its size lied
        raise rule.error(f"{name} is over the {_cap_words(kind, cap)}; refusing to read it.")
    return data


def _open_looked_at(name: str, before: os.stat_result, label: str, rule: _Rule,
                    dir_fd: int | None) -> tuple[int, os.stat_result]:
    """An fd on ``name`` opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never waits for a
    writer, a link swapped in since the ``lstat`` is refused) and ``fstat``-ed: it must be
    the regular file that was looked at (``before``: same device and inode)."""
    flags = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: a link swapped in after the lstat
        raise rule.error(f"{label} changed while it was checked ({_reason(exc)}); "
                         "refusing to read it.") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev,
                                                                       before.st_ino):
            raise rule.error(f"{label} changed while it was checked; refusing to read it.")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular_at(dir_fd: int, name: str, kind: InputKind, *, shown: str | None = None,
                    missing_ok: bool = False) -> tuple[int, os.stat_result] | None:
    """An fd open on the regular file ``name`` of the directory ``dir_fd``, never through a
    link: for a tree that arrived from elsewhere (a cluster bundle), where a link or a name
    swapped between check and use must not lead outside it.

    ``name`` is one component. It is ``lstat``-ed (a device is never opened), opened
    ``O_NOFOLLOW | O_NONBLOCK`` relative to ``dir_fd`` and ``fstat``-ed: the descriptor must
    be the regular file that was looked at (same device and inode). A symlink, FIFO, device,
    socket or directory is refused with one sentence (the kind's error); None when absent
    and ``missing_ok``. The caller reads from the descriptor, up to the kind's cap.
    """
    rule = kind.value
    label = shown or name
    if not name or "/" in name or name in (".", ".."):
        raise rule.error(f"{label} is not a name inside its folder; refusing to read it.")
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise rule.error(f"{label} is missing.") from None
    except OSError as exc:
        raise rule.error(f"cannot read {label}: {_reason(exc)}.") from exc
    if stat.S_ISLNK(before.st_mode):
        raise rule.error(f"{label} is a symbolic link, not a regular {rule.what}; "
                         "refusing to follow it.")
    if not stat.S_ISREG(before.st_mode):
        raise _refuse_type(label, before.st_mode, kind, False)
    fd, st = _open_looked_at(name, before, label, rule, dir_fd)
    try:
        cap = cap_of(kind)
        if st.st_size > cap:
            raise rule.error(f"{label} is {st.st_size} bytes, over the "
                             f"{_cap_words(kind, cap)}; refusing to read it.")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular_at(dir_fd: int, name: str, kind: InputKind, *,
                    shown: str | None = None) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd`` (:func:`open_regular_at`), at
    most the kind's cap (a file that grows while read is refused, not truncated)."""
    opened = open_regular_at(dir_fd, name, kind, shown=shown)
    assert opened is not None
    cap = cap_of(kind)
    with os.fdopen(opened[0], "rb", closefd=True) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise kind.value.error(f"{shown or name} is over the {_cap_words(kind, cap)}; "
                               "refusing to read it.")
    return data


def open_regular(path: str | Path, kind: InputKind, *, size: int | None = None,
                 cap: int | None = None, within: str | Path | None = None,
                 shown: str | None = None) -> tuple[int, os.stat_result]:
    """An fd open (blocking reads) on the regular file at ``path``, and its fstat: for a file at
    a path a manifest recorded (a checkpoint in the user's tree), read in time and memory
    proportional to what was recorded, never waiting on anything.

    * The path is resolved (:func:`os.path.realpath`, strict); with ``within``, the result
      must lie inside that directory: a link inside the tree (Lightning's ``last.ckpt``) is
      followed, one out of it is refused, as is a dangling one.
    * The resolved file is ``lstat``-ed (a device is never opened), opened ``O_NOFOLLOW |
      O_NONBLOCK | O_NOCTTY`` (a FIFO cannot wait for a writer; a link swapped in since is
      refused) and ``fstat``-ed: a regular file, the very one looked at.
    * ``size``: it must be exactly that many bytes (the recorded size), checked before a byte
      is read, so a 32 GiB sparse file where 2,205 bytes were recorded is refused in
      microseconds, not hashed for minutes; without it, ``cap`` (or the kind's cap) bounds it.

    Each refusal is one sentence, the kind's error, naming ``shown`` (or the path).
    """
    rule = kind.value
    name = os.fsdecode(path)
    label = shown or name
    if not name:
        raise rule.error(f"the {rule.what} name is empty.")
    try:
        real = os.path.realpath(name, strict=True)
        linked = real != os.path.abspath(name)
    except FileNotFoundError as exc:
        what = "a symlink to nothing" if os.path.islink(name) else "missing"
        raise rule.error(f"{label} is {what}, not a {rule.what}.") from exc
    except (OSError, ValueError) as exc:  # a link loop, a NUL in the name
        raise rule.error(f"cannot read {label}: {_reason(exc)}.") from exc
    if within is not None:
        root = os.path.realpath(within)
        if os.path.commonpath([root, real]) != root:
            raise rule.error(f"{label} is a link out of {os.fsdecode(within)} (to {real}); "
                             "refusing to follow it.")
    try:
        before = os.lstat(real)
    except OSError as exc:
        raise rule.error(f"cannot read {label}: {_reason(exc)}.") from exc
    if not stat.S_ISREG(before.st_mode):
        raise _refuse_type(label, before.st_mode, kind, linked)
    fd, st = _open_looked_at(real, before, label, rule, None)
    try:
        if size is not None and st.st_size != size:
            raise rule.error(f"{label} is {st.st_size:,} bytes, not the {size:,} recorded; "
                             "refusing to read it.")
        limit = cap if cap is not None else cap_of(kind)
        if st.st_size > limit:
            raise rule.error(f"{label} is {st.st_size:,} bytes, over the {limit:,}-byte limit "
                             f"for a {rule.what}; refusing to read it.")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


COPY_CHUNK = 1 << 20
"""Bytes read at a time by :func:`copy_regular_at` (its memory, whatever the file's size)."""


def copy_regular_at(dir_fd: int, name: str, target: Path | None, kind: InputKind, *,
                    size: int | None = None, cap: int | None = None,
                    shown: str | None = None) -> tuple[int, str]:
    """Copy the regular file ``name`` of the directory ``dir_fd`` to ``target`` (None: read
    it only), digesting it on the way; its size and blake3 (``blake3:…``).

    Opened as :func:`open_regular_at` opens (no link, no FIFO or device, the very file that
    was looked at, checked after the open); ``size``: exactly that many bytes (the size a
    manifest recorded), checked before a byte is read and again while reading, so a file
    that grows or whose size lies is refused, not copied past it; without it, ``cap`` (or
    the kind's cap) bounds it. ``target`` is created ``O_EXCL | O_NOFOLLOW`` (the caller
    clears the place first) and removed again when the copy is refused. Each refusal is
    one sentence, the kind's error, naming ``shown`` (or the name).
    """
    import blake3

    rule = kind.value
    label = shown or name
    opened = open_regular_at(dir_fd, name, kind, shown=label)
    assert opened is not None
    fd, st = opened
    limit = size if size is not None else (cap if cap is not None else cap_of(kind))
    out = -1
    try:
        if size is not None and st.st_size != size:
            raise rule.error(f"{label} is {st.st_size:,} bytes, not the {size:,} recorded; "
                             "refusing to copy it.")
        if st.st_size > limit:
            raise rule.error(f"{label} is {st.st_size:,} bytes, over the {limit:,}-byte limit "
                             f"for a {rule.what}; refusing to copy it.")
        if target is not None:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | getattr(os, "O_CLOEXEC", 0), 0o644)
        hasher = blake3.blake3()
        total = 0
        while True:
            chunk = os.read(fd, min(COPY_CHUNK, limit + 1 - total))
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise rule.error(f"{label} grew past {limit:,} bytes while it was copied; "
                                 "refusing to copy it.")
            hasher.update(chunk)
            if out >= 0:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
        if size is not None and total != size:
            raise rule.error(f"{label} gave {total:,} bytes, not the {size:,} recorded; "
                             "refusing to copy it.")
    except BaseException:
        if out >= 0 and target is not None:
            os.close(out)
            out = -1
            with contextlib.suppress(OSError):
                os.unlink(target)
        raise
    finally:
        os.close(fd)
        if out >= 0:
            os.close(out)
    return total, "blake3:" + hasher.hexdigest()
