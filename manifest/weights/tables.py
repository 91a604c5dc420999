"""Per-tensor digests of weight files, without ever unpickling them.

Identity of weights = blake3 of each tensor's raw bytes (C-contiguous, the
file's byte order) with its dtype and shape beside it, never the file's
digest alone: ``torch.save`` embeds the archive name, so identical tensors
saved under another file name give another file digest. The same tensor
stored in safetensors and in a torch archive gets the same tensor digest.

Formats:

* **safetensors**: the 8-byte header length and JSON header give each
  tensor's dtype, shape and byte range (the format's specification).
* **torch.save zip archives** (state_dicts, nested checkpoints with optimizer
  state, whole pickled modules): the archive's ``data.pkl`` is *read* by a
  restricted unpickler whose ``find_class`` resolves only inert containers
  (``OrderedDict``, ``set`` …) and torch's tensor-rebuild functions to our
  own reference builders; every other class becomes an inert stub that only
  stores its arguments and state. No code from the file can run. Storages
  are persistent ids pointing at ``<archive>/data/<key>``, which are hashed
  straight from the file (stored zip entries are sliced out of an mmap).
  Names follow ``state_dict`` conventions: dict keys joined with ``.``, and
  for a pickled ``nn.Module`` its ``_parameters``/``_buffers``/``_modules``.
* anything else: the file digest only.

Outputs are read after the process that wrote them has exited, so mmap is
safe from concurrent truncation here (data hashing handles live trees).
"""

from __future__ import annotations

import io
import json
import mmap
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import blake3

from manifest.models import Artifact, Tensor

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complex64": 8, "complex128": 16, "complex32": 4,
}

STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UInt16Storage": "uint16",
    "UInt32Storage": "uint32", "UInt64Storage": "uint64",
    "Float8_e4m3fnStorage": "float8_e4m3fn", "Float8_e5m2Storage": "float8_e5m2",
}

_BIG = 1 << 22


class WeightFileError(Exception):
    """A weight file that cannot be parsed (recorded as a plain file)."""


@dataclass(frozen=True)
class RawTensor:
    """A tensor's identity and its raw bytes (a view into the file)."""

    name: str
    dtype: str
    shape: list[int]
    data: memoryview | bytes

    def digest(self) -> str:
        return hash_bytes(self.data)


def hash_bytes(data: memoryview | bytes) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO) if len(data) >= _BIG else blake3.blake3()
    h.update(data)
    return "blake3:" + h.hexdigest()


# -------------------------------------------------------------- safetensors


def iter_safetensors(buf: memoryview) -> Iterator[RawTensor]:
    if len(buf) < 8:
        raise WeightFileError("file too short for a safetensors header")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise WeightFileError("safetensors header length exceeds the file")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except ValueError as exc:
        raise WeightFileError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightFileError("safetensors header is not an object")
    base = 8 + n
    for name in sorted(k for k in header if k != "__metadata__"):
        entry = header[name]
        try:
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WeightFileError(f"safetensors entry {name!r} is malformed") from exc
        if not 0 <= begin <= end <= len(buf) - base:
            raise WeightFileError(f"safetensors entry {name!r} points outside the file")
        yield RawTensor(name, dtype, shape, buf[base + begin : base + end])


# ------------------------------------------------------------ torch archive


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
    return _TensorRef(storage, int(offset), tuple(size), tuple(stride))


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


def _walk(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, _TensorRef]]:
    if isinstance(obj, _TensorRef):
        yield prefix, obj
        return
    if isinstance(obj, (dict, list, tuple, _Stub)):
        if id(obj) in seen:
            return
        seen.add(id(obj))

    def join(key: Any) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk(value, join(key), seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(value, join(i), seen)
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
                        yield from _walk(value, join(key), seen)
            modules = state.get("_modules") or {}
            if isinstance(modules, dict):
                for key, value in modules.items():
                    yield from _walk(value, join(key), seen)
            return
        if state is not None:
            yield from _walk(state, prefix, seen)
        for i, value in enumerate(obj._args):
            yield from _walk(value, join(f"<arg{i}>") if obj._args[1:] else prefix, seen)
        for i, value in enumerate(obj._items):
            yield from _walk(value, join(i), seen)
        for key, value in obj._mapping.items():
            yield from _walk(value, join(key), seen)


def _stored_entry(buf: memoryview, info: zipfile.ZipInfo) -> memoryview:
    """The bytes of an uncompressed zip entry, sliced from the mapped file."""
    off = info.header_offset
    if bytes(buf[off : off + 4]) != b"PK\x03\x04":
        raise WeightFileError(f"bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", buf[off + 26 : off + 30])
    start = off + 30 + name_len + extra_len
    return buf[start : start + info.file_size]


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for dim in reversed(size):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def _tensor_bytes(ref: _TensorRef, storage: memoryview) -> memoryview | bytes:
    item = ITEMSIZE.get(ref.storage.dtype)
    if item is None:
        raise WeightFileError(f"unknown dtype {ref.storage.dtype}")
    numel = prod(ref.size)
    if numel == 0:
        return b""
    if ref.stride == _contiguous_strides(ref.size) or len(ref.size) == 0:
        begin = ref.offset * item
        return storage[begin : begin + numel * item]
    # A non-contiguous view: gather it into C order.
    import numpy as np

    raw = np.frombuffer(storage, dtype=np.dtype(f"V{item}"))
    view = np.lib.stride_tricks.as_strided(
        raw[ref.offset :], shape=ref.size, strides=tuple(s * item for s in ref.stride)
    )
    return np.ascontiguousarray(view).tobytes()


def iter_torch_archive(buf: memoryview, path: Path) -> Iterator[RawTensor]:
    try:
        zf = zipfile.ZipFile(path)  # reads the central directory only
    except (zipfile.BadZipFile, OSError) as exc:
        raise WeightFileError(f"not a zip archive: {exc}") from exc
    with zf:
        yield from _archive_tensors(zf, buf)


def _archive_tensors(zf: zipfile.ZipFile, buf: memoryview) -> Iterator[RawTensor]:
    pkl = [i for i in zf.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
    if len(pkl) != 1:
        raise WeightFileError("archive has no single data.pkl (not a torch.save file)")
    prefix = pkl[0].filename[: -len("data.pkl")]
    byteorder = prefix + "byteorder"
    if byteorder in zf.namelist() and zf.read(byteorder).strip() not in (b"little", b""):
        raise WeightFileError("big-endian torch archives are not supported")
    try:
        root = _RestrictedUnpickler(io.BytesIO(zf.read(pkl[0]))).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as exc:
        raise WeightFileError(f"data.pkl could not be read safely: {exc}") from exc
    infos = {i.filename: i for i in zf.infolist()}
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
                raise WeightFileError(f"storage {key} missing from the archive")
            if info.compress_type == zipfile.ZIP_STORED:
                storages[key] = _stored_entry(buf, info)
            else:
                storages[key] = memoryview(zf.read(info))
        yield RawTensor(name, ref.storage.dtype, list(ref.size), _tensor_bytes(ref, storages[key]))


# ----------------------------------------------------------------- dispatch


def detect_format(buf: memoryview) -> str:
    if bytes(buf[:4]) == b"PK\x03\x04":
        return "torch"
    if len(buf) >= 9:
        (n,) = struct.unpack("<Q", buf[:8])
        if 2 <= n <= len(buf) - 8 and bytes(buf[8:9]) == b"{":
            return "safetensors"
    return "file"


def iter_tensors(buf: memoryview, fmt: str, path: Path) -> Iterator[RawTensor]:
    if fmt == "safetensors":
        return iter_safetensors(buf)
    if fmt == "torch":
        return iter_torch_archive(buf, path)
    return iter(())


class MappedFile:
    """A read-only view of a whole file (mmap; empty files give b"")."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("rb")
        size = path.stat().st_size
        self._map: mmap.mmap | None = (
            mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        )
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


def digest_artifact(path: Path, display: str) -> Artifact:
    """File digest plus, for weight files, the per-tensor table."""
    with MappedFile(path) as mapped:
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
            except WeightFileError:
                fmt, tensors = "file", None
        size = len(buf)
    return Artifact(path=display, digest=file_digest, bytes=size, format=fmt,  # type: ignore[arg-type]
                    tensors=tensors)
