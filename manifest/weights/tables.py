"""Per-tensor digests of weight files, without ever unpickling them.

:func:`digest_artifact` is what capture and verify call: the file digest,
the format found from the first bytes, and for a weight file the table of
its tensors (dtype, shape, digest; see ``manifest.weights.raw`` for why a
tensor, not the file, is the identity). Formats, each with its own reader:

* **safetensors** (``manifest.weights.safetensors_file``): the header gives
  each tensor's dtype, shape and byte range.
* **torch.save zip archives** (``manifest.weights.torch_archive``):
  ``data.pkl`` is read by a restricted unpickler that builds inert stand-ins.
* **DCP directories** (``manifest.weights.dcp``): ``.metadata`` read like
  ``data.pkl``, each chunk an archive in a byte range of a ``.distcp`` file.
* **sharded safetensors** (``manifest.weights.sharded``): an
  ``*.safetensors.index.json`` whose ``weight_map`` names the shard of each tensor.
* anything else: the file digest only.

A checkpoint made of several files (a DCP directory, an index and its shards)
is one artifact: its digest is blake3 over the JSON list of its files' names
and digests (``_set_digest``), its table the tensors of all of them.

Outputs are read after the process that wrote them has exited, so mmap is
safe from concurrent truncation here (data hashing handles live trees).
Every file is opened through ``manifest.weights.mapped`` (regular files only,
never waiting on a FIFO); verify passes the recorded size, which a file (or a
checkpoint's files together) must have before anything is hashed.

Hostile files: the limits every reader is held to are in
``manifest.weights.bounds``. A file that claims a format and breaks them
raises :class:`~manifest.errors.MalformedArtifactError` at capture (a
difference at verify); a file that merely is not the format is recorded by
file digest only. What a reader did not foresee on a crafted file still ends
as a sentence (:func:`iter_tensors` turns it into
:class:`~manifest.weights.bounds.MalformedWeightsError`), never a traceback.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

from manifest.models import Artifact, Tensor
from manifest.weights.bounds import MalformedWeightsError, WeightFileError, short
from manifest.weights.dcp import (
    METADATA_SLACK,
    check_metadata_size,
    is_dcp_dir,
    iter_dcp,
)
from manifest.weights.mapped import MappedFile, member_files
from manifest.weights.raw import RawTensor, hash_bytes
from manifest.weights.safetensors_file import iter_safetensors
from manifest.weights.sharded import is_index, iter_sharded, shard_paths
from manifest.weights.torch_archive import iter_torch_archive


def detect_format(buf: memoryview) -> str:
    if bytes(buf[:4]) == b"PK\x03\x04":
        return "torch"
    if len(buf) >= 9:
        (n,) = struct.unpack("<Q", buf[:8])
        if 2 <= n <= len(buf) - 8 and bytes(buf[8:9]) == b"{":
            return "safetensors"
    return "file"


def iter_tensors(buf: memoryview, fmt: str, path: Path) -> Iterator[RawTensor]:
    """The tensors of a weight file; any failure is a :class:`WeightFileError`."""
    if fmt == "safetensors":
        inner = iter_safetensors(buf)
    elif fmt == "torch":
        inner = iter_torch_archive(buf, path)
    else:
        return iter(())
    return _guarded(inner)


def _guarded(inner: Iterator[RawTensor]) -> Iterator[RawTensor]:
    # A reader bug on a crafted file must still end as a sentence, never an internal
    # error: what the parsers above did not foresee counts as malformed.
    try:
        yield from inner
    except WeightFileError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, struct.error,
            OverflowError, RecursionError, MemoryError, zipfile.BadZipFile,
            NotImplementedError, EOFError) as exc:
        raise MalformedWeightsError(f"unexpected structure ({type(exc).__name__}: "
                                    f"{short(str(exc))})") from exc


def digest_artifact(path: Path, display: str, *, malformed_ok: bool = False,
                    size: int | None = None, within: Path | None = None) -> Artifact:
    """File digest plus, for weight files, the per-tensor table.

    A file that claims a weight format but is malformed or hostile raises
    :class:`~manifest.errors.MalformedArtifactError`; with ``malformed_ok``
    (verify's re-run, where such a file is simply a difference) it is
    recorded by file digest only. So does a path that is not a regular file
    (a FIFO, a device, also through a link), one linked out of ``within``, and,
    with ``size`` (the recorded ``bytes``), one of another size, before a byte is
    hashed: that is how verify reads a recorded checkpoint path.
    """
    from manifest.errors import MalformedArtifactError

    if is_dcp_dir(path) or is_index(path):
        return _digest_set(path, display, malformed_ok=malformed_ok, size=size, within=within)
    with MappedFile(path, size=size, within=within, shown=display) as mapped:
        buf = mapped.view
        file_digest = hash_bytes(buf)
        fmt = detect_format(buf)
        tensors: dict[str, Tensor] | None = None
        if fmt != "file":
            try:
                tensors = {}
                for raw in iter_tensors(buf, fmt, path):
                    tensors[raw.name] = Tensor(
                        dtype=raw.dtype, shape=raw.shape, digest=raw.digest()
                    )
                    if isinstance(raw.data, memoryview):
                        raw.data.release()
            except MalformedWeightsError as exc:
                if not malformed_ok:
                    raise MalformedArtifactError(
                        f"{display} looks like a {fmt} weight file but is malformed: {exc}.",
                        hint="Refusing to record a tensor table from it; check the file (it "
                        "may be crafted) or leave it out of --artifact.") from exc
                fmt, tensors = "file", None
            except WeightFileError:
                fmt, tensors = "file", None
        size = len(buf)
    return Artifact(path=display, digest=file_digest, bytes=size, format=fmt,  # type: ignore[arg-type]
                    tensors=tensors)


def _set_members(path: Path) -> list[Path]:
    """The files a multi-file checkpoint is made of (the index first, then its shards)."""
    if is_dcp_dir(path):
        return member_files(path)
    try:
        return [path, *shard_paths(path).values()]
    except WeightFileError:
        return [path]


def _set_digest(members: list[Path], display: str, size: int | None, within: Path | None,
                slack: int) -> tuple[str, int]:
    """The digest of a multi-file checkpoint; with ``size``, its files must hold that many
    bytes together, give or take ``slack`` (checked on their ``lstat`` before any is hashed,
    then on each one opened)."""
    import json

    from manifest.errors import MalformedArtifactError

    sizes = [os.stat(p).st_size if i == 0 else os.lstat(p).st_size  # the index may be a link
             for i, p in enumerate(members)]
    total = sum(sizes)
    if size is not None and abs(total - size) > slack:
        raise MalformedArtifactError(f"{display} holds {total:,} bytes in its files, not the "
                                     f"{size:,} recorded; refusing to read it.")
    listing = []
    for i, (p, each) in enumerate(zip(members, sizes, strict=True)):
        with MappedFile(p, size=each if size is not None else None,  # as it was lstat-ed
                        within=within if i == 0 else None,
                        shown=display if i == 0 else f"{display}: {p.name}") as mapped:
            listing.append([p.name, hash_bytes(mapped.view)])
    return hash_bytes(json.dumps(listing).encode()), total


def iter_set(path: Path) -> Iterator[RawTensor]:
    """The tensors of a DCP directory or a sharded-safetensors index."""
    return _guarded(iter_dcp(path) if is_dcp_dir(path) else iter_sharded(path))


def _digest_set(path: Path, display: str, *, malformed_ok: bool, size: int | None,
                within: Path | None) -> Artifact:
    from manifest.errors import MalformedArtifactError

    fmt = "dcp" if is_dcp_dir(path) else "safetensors-index"
    if fmt == "dcp" and not malformed_ok:  # (else it is a difference, hashed as files)
        try:
            check_metadata_size(path)  # before 6 GiB of it are hashed
        except MalformedWeightsError as exc:
            raise MalformedArtifactError(f"{display} looks like a dcp checkpoint but is "
                                         f"malformed: {exc}.") from exc
    # A DCP rewrite of the same state writes another save_id and path into .metadata: its
    # size may move by a few bytes, never by more than the slack .metadata is allowed.
    slack = METADATA_SLACK if fmt == "dcp" else 0
    digest, size = _set_digest(_set_members(path), display, size, within, slack)
    tensors: dict[str, Tensor] | None = {}
    try:
        for raw in iter_set(path):
            assert tensors is not None
            tensors[raw.name] = Tensor(dtype=raw.dtype, shape=raw.shape, digest=raw.digest())
    except MalformedWeightsError as exc:
        if not malformed_ok:
            raise MalformedArtifactError(
                f"{display} looks like a {fmt} checkpoint but is malformed: {exc}.",
                hint="Refusing to record a tensor table from it; check it (it may be crafted) "
                "or leave it out of --artifact.") from exc
        fmt, tensors = "file", None
    except WeightFileError:
        fmt, tensors = "file", None
    return Artifact(path=display, digest=digest, bytes=size, format=fmt,  # type: ignore[arg-type]
                    tensors=tensors)


class MappedFiles(list[MappedFile]):
    """The maps behind an artifact's tensors: iterate them, or close them all at once."""

    def close(self) -> None:
        for mapped in self:
            mapped.close()


def open_tensors(path: Path) -> tuple[MappedFiles, dict[str, RawTensor]] | None:
    """Every tensor of a weight artifact by name, with what to close after; None when the
    artifact has no tensor table (a plain file)."""
    if is_dcp_dir(path) or is_index(path):
        # The readers keep their maps open while a tensor view is referenced.
        return MappedFiles(), {t.name: t for t in iter_set(path)}
    mapped = MappedFile(path)
    fmt = detect_format(mapped.view)
    if fmt == "file":
        mapped.close()
        return None
    try:
        return MappedFiles([mapped]), {t.name: t for t in iter_tensors(mapped.view, fmt, path)}
    except BaseException:
        mapped.close()
        raise
