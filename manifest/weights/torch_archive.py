"""Tensors of a ``torch.save`` zip archive, without ever unpickling it.

Covers state_dicts, nested checkpoints with optimizer state and whole pickled
modules. The archive's ``data.pkl`` is *read* by a restricted unpickler whose
``find_class`` resolves only inert containers (``OrderedDict``, ``set`` …)
and torch's tensor-rebuild functions to our own reference builders; every
other class becomes an inert stub that only stores its arguments and state.
No code from the file can run. Storages are persistent ids pointing at
``<archive>/data/<key>``, which are hashed straight from the file (stored zip
entries are sliced out of an mmap). Names follow ``state_dict`` conventions:
dict keys joined with ``.``, and for a pickled ``nn.Module`` its
``_parameters``/``_buffers``/``_modules``.

Hostile archives: every view (offset, size, stride) is bound-checked against
its storage *before* memory is touched (``numpy.as_strided`` over an
unchecked stride read far outside the map and segfaulted capture); a view
gathered into C order, a compressed entry and ``data.pkl`` are charged to the
file's :class:`~manifest.weights.bounds.Budget`; ``data.pkl``'s opcodes are
checked against its length before the unpickler allocates what they claim.
numpy is imported only for a non-contiguous view.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from manifest.weights.bounds import (
    MAX_DEPTH,
    MAX_DIM,
    Budget,
    MalformedWeightsError,
    WeightFileError,
    dims,
    short,
)
from manifest.weights.raw import ITEMSIZE, RawTensor

STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UInt16Storage": "uint16",
    "UInt32Storage": "uint32", "UInt64Storage": "uint64",
    "Float8_e4m3fnStorage": "float8_e4m3fn", "Float8_e5m2Storage": "float8_e5m2",
}


@dataclass(frozen=True)
class _StorageRef:
    key: str
    dtype: str


@dataclass(frozen=True)
class _TensorRef:
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Stub:
    """Inert stand-in for any class the archive names: stores, never runs."""

    _qualname = "?"

    _args: tuple[Any, ...]
    _state: Any
    _items: list[Any]
    _mapping: dict[Any, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        # pickle's NEWOBJ calls only __new__; REDUCE calls the class (both).
        obj = super().__new__(cls)
        obj._args = args
        obj._state = None
        obj._items = []
        obj._mapping = {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self._state = state

    def append(self, item: Any) -> None:
        self._items.append(item)

    def extend(self, items: Any) -> None:
        self._items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._mapping[key] = value


def _stub_class(module: str, name: str) -> type[_Stub]:
    return type(name, (_Stub,), {"_qualname": f"{module}.{name}"})


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any, *rest: Any) -> Any:
    if not isinstance(storage, _StorageRef):
        return _Stub(storage)
    if type(offset) is not int or not 0 <= offset <= MAX_DIM:
        raise MalformedWeightsError(f"tensor storage offset {short(offset)} is not an integer "
                                    "from 0 to 2**53-1")
    size_t = dims(size, "tensor size")
    stride_t = dims(stride, "tensor stride")
    if len(size_t) != len(stride_t):
        raise MalformedWeightsError(f"tensor size {short(size_t)} and stride "
                                    f"{short(stride_t)} differ in length")
    return _TensorRef(storage, offset, size_t, stride_t)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    return func(*args)


def _dtype_marker(name: str) -> str:
    return name


def _storage_class(name: str) -> Any:
    return ("storage-class", STORAGE_DTYPES.get(name))


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and name.endswith("Storage"):
            return _storage_class(name)
        if module == "torch" and name in ITEMSIZE:
            return _dtype_marker(name)
        return _stub_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise pickle.UnpicklingError("unsupported persistent id")
        storage_type, key = pid[1], pid[2]
        dtype = None
        if isinstance(storage_type, tuple) and storage_type[:1] == ("storage-class",):
            dtype = storage_type[1]
        elif isinstance(storage_type, str):
            dtype = storage_type
        if dtype is None:
            raise pickle.UnpicklingError(f"unknown storage type {storage_type!r}")
        return _StorageRef(str(key), dtype)


def _walk(obj: Any, prefix: str, seen: set[int],
          depth: int = 0) -> Iterator[tuple[str, _TensorRef]]:
    if isinstance(obj, _TensorRef):
        yield prefix, obj
        return
    if isinstance(obj, (dict, list, tuple, _Stub)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if depth > MAX_DEPTH:
            raise MalformedWeightsError(f"data.pkl nests containers more than {MAX_DEPTH} deep")

    def join(key: Any) -> str:
        try:
            text = str(key)
        except ValueError:  # an int key of more than 4300 digits
            text = "<int>"
        return f"{prefix}.{text}" if prefix else text

    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk(value, join(key), seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(value, join(i), seen, depth + 1)
    elif isinstance(obj, _Stub):
        state = obj._state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            state = state[0]
        if isinstance(state, dict) and "_parameters" in state and "_modules" in state:
            # An nn.Module: name tensors as its state_dict would.
            for group in ("_parameters", "_buffers"):
                members = state.get(group) or {}
                if isinstance(members, dict):
                    for key, value in members.items():
                        yield from _walk(value, join(key), seen, depth + 1)
            modules = state.get("_modules") or {}
            if isinstance(modules, dict):
                for key, value in modules.items():
                    yield from _walk(value, join(key), seen, depth + 1)
            return
        if state is not None:
            yield from _walk(state, prefix, seen, depth + 1)
        for i, value in enumerate(obj._args):
            yield from _walk(value, join(f"<arg{i}>") if obj._args[1:] else prefix, seen, depth + 1)
        for i, value in enumerate(obj._items):
            yield from _walk(value, join(i), seen, depth + 1)
        for key, value in obj._mapping.items():
            yield from _walk(value, join(key), seen, depth + 1)


def _stored_entry(buf: memoryview, info: zipfile.ZipInfo) -> memoryview:
    """The bytes of an uncompressed zip entry, sliced from the mapped file."""
    off = info.header_offset
    if not 0 <= off <= len(buf) - 30 or bytes(buf[off : off + 4]) != b"PK\x03\x04":
        raise MalformedWeightsError(f"bad local header for {short(info.filename)}")
    name_len, extra_len = struct.unpack("<HH", buf[off + 26 : off + 30])
    start = off + 30 + name_len + extra_len
    if start + info.file_size > len(buf):
        raise MalformedWeightsError(f"zip entry {short(info.filename)} runs past the end of "
                                    "the file")
    return buf[start : start + info.file_size]


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for dim in reversed(size):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def _tensor_bytes(ref: _TensorRef, storage: memoryview, budget: Budget) -> memoryview | bytes:
    """A view's bytes in C order; every index is checked against the storage first."""
    item = ITEMSIZE.get(ref.storage.dtype)
    if item is None:
        raise WeightFileError(f"unknown dtype {ref.storage.dtype}")
    numel = prod(ref.size)
    if numel == 0:
        return b""
    available = len(storage) // item
    last = ref.offset + sum((n - 1) * st for n, st in zip(ref.size, ref.stride, strict=True))
    if last >= available:
        raise MalformedWeightsError(
            f"a view (offset {ref.offset}, size {short(ref.size)}, stride {short(ref.stride)}) "
            f"reaches element {short(last)} of a storage of {available}")
    if ref.stride == _contiguous_strides(ref.size) or len(ref.size) == 0:
        begin = ref.offset * item
        return storage[begin : begin + numel * item]
    # A non-contiguous view: gather it into C order (bounded above; charged here).
    budget.charge(numel * item, f"the view of size {short(ref.size)}")
    import numpy as np

    raw = np.frombuffer(storage, dtype=np.dtype(f"V{item}"))
    view = np.lib.stride_tricks.as_strided(
        raw[ref.offset :], shape=ref.size, strides=tuple(s * item for s in ref.stride)
    )
    return np.ascontiguousarray(view).tobytes()


class _BufferFile(io.RawIOBase):
    """A read-only file over a memoryview, for an archive embedded in a larger file (a
    DCP ``.distcp`` holds one ``torch.save`` archive per item): no copy of the bytes."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._buf)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        chunk = self._buf[self._pos : self._pos + len(b)]
        n = len(chunk)
        b[:n] = chunk
        self._pos += n
        return n


def iter_torch_archive(buf: memoryview, path: Path | None) -> Iterator[RawTensor]:
    """The tensors of the archive in ``buf`` (the whole file at ``path``, or, with
    ``path`` None, an archive that is all of ``buf``)."""
    try:
        # reads the central directory only
        zf = zipfile.ZipFile(path if path is not None else _BufferFile(buf))
    except (zipfile.BadZipFile, OSError) as exc:
        raise WeightFileError(f"not a zip archive: {exc}") from exc
    with zf:
        try:
            yield from _archive_tensors(zf, buf)
        except (RecursionError, OverflowError, MemoryError) as exc:
            raise MalformedWeightsError(f"data.pkl is built to exhaust the reader "
                                        f"({type(exc).__name__})") from exc


def _archive_tensors(zf: zipfile.ZipFile, buf: memoryview) -> Iterator[RawTensor]:
    pkl = [i for i in zf.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
    if len(pkl) != 1:
        raise WeightFileError("archive has no single data.pkl (not a torch.save file)")
    prefix = pkl[0].filename[: -len("data.pkl")]
    budget = Budget(len(buf))
    infos = {i.filename: i for i in zf.infolist()}

    def read_entry(info: zipfile.ZipInfo) -> memoryview:
        if info.compress_type == zipfile.ZIP_STORED:
            return _stored_entry(buf, info)
        budget.charge(info.file_size, f"compressed entry {short(info.filename)}")
        try:
            return memoryview(zf.read(info))
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as exc:
            raise MalformedWeightsError(f"zip entry {short(info.filename)} cannot be "
                                        f"read: {exc}") from exc

    byteorder = infos.get(prefix + "byteorder")
    if byteorder is not None and (byteorder.file_size > 16 or bytes(
            read_entry(byteorder)).strip() not in (b"little", b"")):
        raise WeightFileError("big-endian torch archives are not supported")
    data = bytes(read_entry(pkl[0]))
    _check_pickle(data)
    try:
        root = _RestrictedUnpickler(io.BytesIO(data)).load()
    except MalformedWeightsError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as exc:
        raise WeightFileError(f"data.pkl could not be read safely: {exc}") from exc
    storages: dict[str, memoryview] = {}
    names_seen: set[str] = set()
    for name, ref in _walk(root, "", set()):
        if name in names_seen:
            continue
        names_seen.add(name)
        key = ref.storage.key
        if key not in storages:
            info = infos.get(f"{prefix}data/{key}")
            if info is None:
                raise MalformedWeightsError(f"storage {short(key)} missing from the archive")
            storages[key] = read_entry(info)
        yield RawTensor(name, ref.storage.dtype, list(ref.size),
                        _tensor_bytes(ref, storages[key], budget))


def _check_pickle(data: bytes) -> None:
    """Walk ``data.pkl``'s opcodes before unpickling: a counted string or bytes opcode
    that claims more than the pickle holds would make the C unpickler allocate that
    much up front (8 bytes can claim 2**63)."""
    import pickletools

    try:
        for _op, _arg, _pos in pickletools.genops(data):
            pass
    except (ValueError, EOFError, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise WeightFileError(f"data.pkl is not a well-formed pickle: {exc}") from exc
