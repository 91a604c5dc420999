"""Tensors of a ``torch.distributed.checkpoint`` (DCP) directory, without unpickling it.

DCP is what TorchTitan, torchtune and Lightning's FSDP strategy write: a
directory with a ``.metadata`` file (a pickle of
``torch.distributed.checkpoint.metadata.Metadata``) and one ``__<rank>_<n>.distcp``
file per writer. ``.metadata`` says, for each fully qualified name, the
tensor's dtype and global size and the chunks it was saved in (offsets and
sizes, one per shard); ``storage_data`` maps each chunk to a byte range
of a ``.distcp`` file, and that range is a whole ``torch.save`` archive of the
chunk. A non-tensor item (a step counter, an RNG state) is a ``torch.save``
archive of the object.

How it is read, and why each rule:

* ``.metadata`` goes through the same restricted unpickler as a torch archive's
  ``data.pkl`` (``manifest.weights.torch_archive``): the dataclasses it names
  become inert stubs, no code in it runs; its opcodes are checked before, and
  it must end where its pickle ends (an honest pickle followed by 6 GiB of
  zeros was read whole, 6.2 GB peak, and accepted).
* ``.metadata`` is bounded by its size before a byte of it is read or hashed
  (:func:`metadata_cap`): at most the ``.distcp`` files' size plus 1 MiB, and
  never over :data:`MAX_METADATA`. Each chunk it describes is a whole
  ``torch.save`` archive in a ``.distcp`` file (about 1 KB even when empty)
  while its entry in ``.metadata`` is a few hundred bytes, so an honest
  ``.metadata`` is always the smaller: measured with torch 2.13, 1,000 one-element
  tensors give 197 KB of ``.metadata`` for 1.58 MB of ``.distcp`` (0.13), 1,000
  empty ones 0.13, ten 4-element ones 0.14.
* A chunk's file is named by the metadata, so the name is held to a plain file
  name in the directory (no separator, not ``.``/``..``), and the file must be
  a regular file, not a link (``lstat``): a crafted ``../../etc/shadow`` or a
  link planted in the directory reads nothing outside it.
* Each byte range must lie inside its file; each chunk must lie inside the
  tensor, chunks must not overlap and must cover it exactly; the archive in a
  range must hold one tensor of the chunk's dtype and size. The overlap check
  (:func:`_disjoint`) cuts the chunks apart along straight cuts, as DTensor
  placements lay them out (a grid, nested per mesh dimension): time
  O(n·d²·log n) and memory O(n·d) for n chunks of d dimensions. Comparing every
  pair at once built ``(8192, 8192, 32)`` boolean arrays, 4.2 GB peak for a
  1.3 MB ``.metadata``; chunks no straight cut separates are compared pair by
  pair within :data:`MAX_PAIRWISE` comparisons, else refused.
* A tensor is identified as it would be in a ``torch.save`` of the full state
  dict (``manifest.weights.raw``): the chunks are assembled into C order. A
  single chunk covering the tensor is used in place; assembling several is
  charged to the directory's :class:`~manifest.weights.bounds.Budget`.
* A non-tensor item is identified by the bytes of its archive's ``data.pkl``
  (dtype ``pickle``): the archive around it carries a serialization id that is
  not part of the object.

``.metadata`` also carries a fresh ``save_id`` and the checkpoint's path, so
two saves of the same tensors never have the same directory digest: the
tensor table is the identity, as it is for ``torch.save`` files.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator, Sequence
from math import prod
from pathlib import Path
from typing import Any

from manifest.weights.bounds import Budget, MalformedWeightsError, WeightFileError, dims, short
from manifest.weights.mapped import MappedFile, member_files, plain_member, read_member
from manifest.weights.raw import ITEMSIZE, RawTensor

METADATA = ".metadata"
MAX_CHUNKS = 8192
"""Chunks of one tensor (one per shard: a 2,048-way FSDP run has 2,048)."""
MAX_METADATA = 1 << 30
"""Bytes of ``.metadata`` at most, whatever the ``.distcp`` files hold."""
METADATA_SLACK = 1 << 20
"""Bytes ``.metadata`` may exceed the ``.distcp`` files by (a checkpoint of few, tiny items)."""
MAX_PAIRWISE = 1 << 26
"""Coordinate comparisons allowed for chunks no straight cut separates (about 0.3 s)."""


def is_dcp_dir(path: Path) -> bool:
    """A directory (not a link) that holds a regular ``.metadata`` file."""
    try:
        return (stat.S_ISDIR(os.lstat(path).st_mode)
                and stat.S_ISREG(os.lstat(path / METADATA).st_mode))
    except OSError:
        return False


def _stub_fields(obj: Any, kind: str) -> dict[str, Any]:
    from manifest.weights.torch_archive import _Stub

    if not isinstance(obj, _Stub) or not obj._qualname.endswith("." + kind):
        raise MalformedWeightsError(f"DCP metadata: expected a {kind}, found {short(obj)}")
    state = obj._state
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        merged: dict[str, Any] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        state = merged
    if not isinstance(state, dict):
        raise MalformedWeightsError(f"DCP metadata: a {kind} without fields")
    return state


def _size(obj: Any, what: str) -> tuple[int, ...]:
    """A ``torch.Size`` (pickled as ``torch.Size((…))``) or a plain tuple."""
    from manifest.weights.torch_archive import _Stub

    if isinstance(obj, _Stub) and obj._qualname == "torch.Size" and len(obj._args) == 1:
        obj = obj._args[0]
    return dims(obj, what)


def _dtype(properties: Any, fqn: str) -> str:
    from manifest.weights.torch_archive import _Stub

    state = properties._state if isinstance(properties, _Stub) else None
    dtype = None
    if isinstance(state, tuple) and state:
        dtype = state[0]
    elif isinstance(state, dict):
        dtype = state.get("dtype")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise MalformedWeightsError(f"DCP metadata: tensor {short(fqn)} has no known dtype")
    return dtype


class _Files:
    """The ``.distcp`` files of one directory, each mapped once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._maps: dict[str, MappedFile] = {}

    def range(self, name: Any, offset: Any, length: Any, what: str) -> memoryview:
        path = plain_member(self.directory, name, f"{what}: file")
        if name not in self._maps:
            self._maps[name] = MappedFile(path)
        view = self._maps[name].view
        if (type(offset) is not int or type(length) is not int or offset < 0 or length < 0
                or offset + length > len(view)):
            raise MalformedWeightsError(f"{what}: bytes {short(offset)}+{short(length)} lie "
                                        f"outside {short(name)} ({len(view)} bytes)")
        return view[offset : offset + length]

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()


def _chunk_tensor(blob: memoryview, dtype: str, sizes: tuple[int, ...],
                  what: str) -> memoryview | bytes:
    from manifest.weights.torch_archive import iter_torch_archive

    found = list(iter_torch_archive(blob, None))
    if len(found) != 1 or found[0].dtype != dtype or tuple(found[0].shape) != sizes:
        got = [(t.dtype, t.shape) for t in found]
        raise MalformedWeightsError(f"{what}: the archive holds {short(got)}, not one "
                                    f"{dtype} tensor of size {short(list(sizes))}")
    return found[0].data


def _pickle_bytes(blob: memoryview, what: str) -> memoryview | bytes:
    """The ``data.pkl`` of an item saved as an object (never unpickled)."""
    import zipfile

    from manifest.weights.torch_archive import _BufferFile

    try:
        with zipfile.ZipFile(_BufferFile(blob)) as zf:
            pkl = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
            if len(pkl) != 1 or pkl[0].file_size > len(blob):
                raise MalformedWeightsError(f"{what}: not one data.pkl in the item's archive")
            return zf.read(pkl[0])
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as exc:
        raise MalformedWeightsError(f"{what}: the item's archive cannot be read: {exc}") from exc


def _check_tiling(size: tuple[int, ...],
                  boxes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], fqn: str) -> None:
    """Chunks lie inside the tensor, do not overlap, and together cover it."""
    for offsets, sizes in boxes:
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o + s > n for o, s, n in zip(offsets, sizes, size, strict=True)):
            raise MalformedWeightsError(f"DCP tensor {short(fqn)}: a chunk at {short(offsets)} "
                                        f"of size {short(sizes)} lies outside {short(size)}")
    if sum(prod(s) for _, s in boxes) != prod(size):
        raise MalformedWeightsError(f"DCP tensor {short(fqn)}: its chunks hold "
                                    f"{sum(prod(s) for _, s in boxes):,} elements, not "
                                    f"{prod(size):,}")
    if len(boxes) > 1:
        import numpy as np

        lo = np.array([o for o, _ in boxes], dtype=np.int64).reshape(len(boxes), -1)
        hi = lo + np.array([s for _, s in boxes], dtype=np.int64).reshape(len(boxes), -1)
        full = (hi > lo).all(axis=1)  # an empty chunk holds nothing and overlaps nothing
        if not _disjoint(lo[full], hi[full], fqn):
            raise MalformedWeightsError(f"DCP tensor {short(fqn)}: two chunks overlap")


def _disjoint(lo: Any, hi: Any, fqn: str) -> bool:
    """Whether no two of the boxes ``[lo, hi)`` (n × d arrays) overlap.

    Split the boxes along straight cuts: along one dimension, sorted by where they start,
    a box that starts at or after every earlier box's end begins a group no earlier box
    reaches; the groups are checked in turn. A grid of chunks (DTensor's layout, nested per
    mesh dimension) falls apart in at most d rounds. A group no cut splits is compared pair
    by pair, one box against the rest at a time (memory O(n·d)), within
    :data:`MAX_PAIRWISE` comparisons; past that, or past the work a nest of cuts may take,
    the tiling is refused as one that cannot be checked within bounds.
    """
    import numpy as np

    n, d = lo.shape
    work_left = 8 * n * d * d + (1 << 20)
    groups = [np.arange(n)]
    while groups:
        idx = groups.pop()
        if len(idx) < 2:
            continue
        for k in range(d):
            work_left -= len(idx)
            order = idx[np.argsort(lo[idx, k], kind="stable")]
            reach = np.maximum.accumulate(hi[order, k])
            cuts = np.flatnonzero(reach[:-1] <= lo[order[1:], k]) + 1
            if len(cuts):
                groups.extend(np.split(order, cuts))
                break
        else:
            m = len(idx)
            work_left -= m * m * d // 2
            if m * m * d > 2 * MAX_PAIRWISE or work_left < 0:
                raise MalformedWeightsError(
                    f"DCP tensor {short(fqn)}: {m:,} chunks that no straight cut separates, "
                    "too many to check for overlap")
            a, b = lo[idx], hi[idx]
            for i in range(m - 1):
                if ((a[i] < b[i + 1:]) & (a[i + 1:] < b[i])).all(axis=1).any():
                    return False
        if work_left < 0:
            raise MalformedWeightsError(f"DCP tensor {short(fqn)}: {n:,} chunks nested too "
                                        "deep to check for overlap within bounds")
    return True


def _assemble(size: tuple[int, ...], dtype: str,
              parts: list[tuple[tuple[int, ...], tuple[int, ...], memoryview | bytes]],
              budget: Budget, fqn: str) -> memoryview | bytes:
    if len(parts) == 1:
        return parts[0][2]
    import numpy as np

    item = ITEMSIZE[dtype]
    budget.charge(prod(size) * item, f"assembling DCP tensor {short(fqn)}")
    full = np.zeros(size, dtype=np.dtype(f"V{item}"))
    for offsets, sizes, data in parts:
        if prod(sizes) == 0:
            continue
        chunk = np.frombuffer(data, dtype=np.dtype(f"V{item}")).reshape(sizes)
        full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))] = chunk
    return full.tobytes()


def metadata_cap(directory: Path) -> int:
    """The most bytes ``.metadata`` may hold: the other member files' size plus
    :data:`METADATA_SLACK`, at most :data:`MAX_METADATA` (the module docstring says why)."""
    data = sum(os.lstat(p).st_size for p in member_files(directory) if p.name != METADATA)
    return min(MAX_METADATA, data + METADATA_SLACK)


def check_metadata_size(directory: Path) -> None:
    """Refuse a ``.metadata`` over :func:`metadata_cap` before anything is hashed or read."""
    meta = plain_member(directory, METADATA, "DCP metadata")
    size, cap = os.lstat(meta).st_size, metadata_cap(directory)
    if size > cap:
        raise MalformedWeightsError(f"DCP .metadata is {size:,} bytes, more than the "
                                    f"{cap:,} its .distcp files allow")


def _one_pickle(data: bytes) -> None:
    """Walk ``.metadata``'s opcodes (as ``_check_pickle`` does for ``data.pkl``) and refuse
    bytes after its STOP: the unpickler would stop there and never look at them."""
    import pickletools

    end = -1
    try:
        for op, _arg, pos in pickletools.genops(data):
            if op.name == "STOP" and pos is not None:
                end = pos
    except (ValueError, EOFError, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise WeightFileError(f"DCP .metadata is not a well-formed pickle: {exc}") from exc
    if end != len(data) - 1:
        raise MalformedWeightsError(f"DCP .metadata holds {len(data) - 1 - end:,} bytes "
                                    "after the end of its pickle")


def iter_dcp(directory: Path) -> Iterator[RawTensor]:
    """The tensors (and pickled items) of a DCP directory, by fully qualified name."""
    from manifest.weights.torch_archive import _RestrictedUnpickler

    meta_path = plain_member(directory, METADATA, "DCP metadata")
    files = member_files(directory)
    budget = Budget(sum(p.stat().st_size for p in files))
    data = read_member(meta_path, metadata_cap(directory), "DCP .metadata")
    budget.charge(len(data), "DCP .metadata")
    _one_pickle(data)
    try:
        root = _RestrictedUnpickler(io.BytesIO(data)).load()
    except (RecursionError, MemoryError) as exc:
        raise MalformedWeightsError(f"DCP .metadata is built to exhaust the reader "
                                    f"({type(exc).__name__})") from exc
    except Exception as exc:  # any failure of a crafted pickle is "not DCP"
        raise WeightFileError(f"DCP .metadata could not be read safely: {exc}") from exc
    fields = _stub_fields(root, "Metadata")
    state_dict = fields.get("state_dict_metadata")
    storage = fields.get("storage_data")
    if not isinstance(state_dict, dict) or not isinstance(storage, dict):
        raise MalformedWeightsError("DCP metadata has no state_dict_metadata/storage_data")
    where: dict[tuple[str, tuple[int, ...] | None], Any] = {}
    for key, info in storage.items():
        index = _stub_fields(key, "MetadataIndex")
        fqn = index.get("fqn")
        offset = index.get("offset")
        if not isinstance(fqn, str):
            raise MalformedWeightsError("DCP metadata: a storage entry without a name")
        where[(fqn, None if offset is None else _size(offset, "a chunk offset"))] = info
    files_open = _Files(directory)
    try:
        for fqn in sorted(k for k in state_dict if isinstance(k, str)):
            yield _item(fqn, state_dict[fqn], where, files_open, budget)
    finally:
        files_open.close()


def _storage_range(files: _Files, info: Any, what: str) -> memoryview:
    fields = _stub_fields(info, "_StorageInfo")
    if fields.get("transform_descriptors"):
        how = short(fields["transform_descriptors"])
        raise WeightFileError(f"{what} is stored transformed ({how}): only plain DCP "
                              "checkpoints are read")
    return files.range(fields.get("relative_path"), fields.get("offset"), fields.get("length"),
                       what)


def _item(fqn: str, meta: Any, where: dict[tuple[str, tuple[int, ...] | None], Any],
          files: _Files, budget: Budget) -> RawTensor:
    from manifest.weights.torch_archive import _Stub

    what = f"DCP item {short(fqn)}"
    if isinstance(meta, _Stub) and meta._qualname.endswith(".BytesStorageMetadata"):
        info = where.get((fqn, None))
        if info is None:
            raise MalformedWeightsError(f"{what} has no storage entry")
        data = _pickle_bytes(_storage_range(files, info, what), what)
        return RawTensor(fqn, "pickle", [len(data)], data)
    fields = _stub_fields(meta, "TensorStorageMetadata")
    dtype = _dtype(fields.get("properties"), fqn)
    size = _size(fields.get("size"), f"{what} size")
    chunks = fields.get("chunks")
    if not isinstance(chunks, list) or not chunks or len(chunks) > MAX_CHUNKS:
        raise MalformedWeightsError(f"{what}: between 1 and {MAX_CHUNKS} chunks expected")
    boxes = []
    for chunk in chunks:
        c = _stub_fields(chunk, "ChunkStorageMetadata")
        boxes.append((_size(c.get("offsets"), f"{what} chunk offsets"),
                      _size(c.get("sizes"), f"{what} chunk sizes")))
    _check_tiling(size, boxes, fqn)
    parts = []
    for offsets, sizes in boxes:
        info = where.get((fqn, offsets))
        if info is None:
            raise MalformedWeightsError(f"{what}: the chunk at {short(offsets)} has no "
                                        "storage entry")
        blob = _storage_range(files, info, f"{what} chunk {short(offsets)}")
        parts.append((offsets, sizes, _chunk_tensor(blob, dtype, sizes,
                                                    f"{what} chunk {short(offsets)}")))
    return RawTensor(fqn, dtype, list(size), _assemble(size, dtype, parts, budget, fqn))
