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

Hostile files. A weight file is input a user can be handed, so nothing in it
is trusted before it is checked against the file itself: every safetensors
byte range and every archive view (offset, size, stride) is bound-checked
against its storage *before* memory is touched (``numpy.as_strided`` over an
unchecked stride read far outside the map and segfaulted capture); every
byte we allocate beyond the map (a non-contiguous view gathered into C
order, a compressed zip entry, ``data.pkl``) is charged to a budget of
:data:`BUDGET_FACTOR` × the file size plus 1 MiB (a 1 MB archive cost 2.1 GB
of RSS, a stride-0 view asked for 149 GiB); ``data.pkl``'s opcodes are
checked against its length before the unpickler allocates what they claim.
A file that claims a format and breaks one of these rules raises
:class:`MalformedWeightsError`; a file that merely is not the format
(garbage JSON header, no ``data.pkl``, a truncated zip) is recorded by file
digest only.
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
BUDGET_FACTOR = 4
"""Bytes allocated beyond the memory map, as a multiple of the file size (plus 1 MiB)."""
MAX_DIM = 2**53 - 1
MAX_DEPTH = 200
"""Containers nested deeper than this in ``data.pkl`` are refused (a state dict is 2-10)."""


class WeightFileError(Exception):
    """A weight file that cannot be parsed (recorded as a plain file)."""


class MalformedWeightsError(WeightFileError):
    """A file that claims a weight format but whose offsets, sizes or structure are
    impossible or hostile: refused at capture, a difference at verify."""


class _Budget:
    """Bytes we may still allocate for one file beyond its memory map."""

    def __init__(self, file_size: int) -> None:
        self.left = BUDGET_FACTOR * file_size + (1 << 20)

    def charge(self, n: int, what: str) -> None:
        if n > self.left:
            raise MalformedWeightsError(
                f"{what} would need {n:,} bytes, more than {BUDGET_FACTOR}x the file size")
        self.left -= n


def _dims(values: Any, what: str) -> tuple[int, ...]:
    """A shape or stride: a sequence of plain non-negative ints no larger than 2**53-1."""
    if not isinstance(values, (tuple, list)):
        raise MalformedWeightsError(f"{what} is not a sequence of integers")
    out = tuple(values)
    if not all(type(v) is int and 0 <= v <= MAX_DIM for v in out):
        raise MalformedWeightsError(f"{what} {_short(out)} holds a value that is not an "
                                    "integer from 0 to 2**53-1")
    return out


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "<huge>"
    return text if len(text) <= 60 else text[:57] + "..."


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
    except (ValueError, RecursionError) as exc:
        raise WeightFileError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightFileError("safetensors header is not an object")
    base = 8 + n
    for name in sorted(k for k in header if k != "__metadata__"):
        entry = header[name]
        try:
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
            shape = list(_dims(entry["shape"], f"safetensors shape of {name!r}"))
            begin, end = _dims(entry["data_offsets"], f"safetensors offsets of {name!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedWeightsError(f"safetensors entry {_short(name)} is malformed") from exc
        if not 0 <= begin <= end <= len(buf) - base:
            raise MalformedWeightsError(
                f"safetensors entry {_short(name)} points outside the file "
                f"(bytes {begin}..{end} of {len(buf) - base})")
        item = ITEMSIZE.get(dtype)
        if item is not None and prod(shape) * item != end - begin:
            raise MalformedWeightsError(
                f"safetensors entry {_short(name)} has shape {_short(shape)} of {dtype} "
                f"but {end - begin} bytes")
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
    if type(offset) is not int or not 0 <= offset <= MAX_DIM:
        raise MalformedWeightsError(f"tensor storage offset {_short(offset)} is not an integer "
                                    "from 0 to 2**53-1")
    size_t = _dims(size, "tensor size")
    stride_t = _dims(stride, "tensor stride")
    if len(size_t) != len(stride_t):
        raise MalformedWeightsError(f"tensor size {_short(size_t)} and stride "
                                    f"{_short(stride_t)} differ in length")
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
        raise MalformedWeightsError(f"bad local header for {_short(info.filename)}")
    name_len, extra_len = struct.unpack("<HH", buf[off + 26 : off + 30])
    start = off + 30 + name_len + extra_len
    if start + info.file_size > len(buf):
        raise MalformedWeightsError(f"zip entry {_short(info.filename)} runs past the end of "
                                    "the file")
    return buf[start : start + info.file_size]


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for dim in reversed(size):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def _tensor_bytes(ref: _TensorRef, storage: memoryview, budget: _Budget) -> memoryview | bytes:
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
            f"a view (offset {ref.offset}, size {_short(ref.size)}, stride {_short(ref.stride)}) "
            f"reaches element {_short(last)} of a storage of {available}")
    if ref.stride == _contiguous_strides(ref.size) or len(ref.size) == 0:
        begin = ref.offset * item
        return storage[begin : begin + numel * item]
    # A non-contiguous view: gather it into C order (bounded above; charged here).
    budget.charge(numel * item, f"the view of size {_short(ref.size)}")
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
    budget = _Budget(len(buf))
    infos = {i.filename: i for i in zf.infolist()}

    def read_entry(info: zipfile.ZipInfo) -> memoryview:
        if info.compress_type == zipfile.ZIP_STORED:
            return _stored_entry(buf, info)
        budget.charge(info.file_size, f"compressed entry {_short(info.filename)}")
        try:
            return memoryview(zf.read(info))
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as exc:
            raise MalformedWeightsError(f"zip entry {_short(info.filename)} cannot be "
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
                raise MalformedWeightsError(f"storage {_short(key)} missing from the archive")
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
                                    f"{_short(str(exc))})") from exc


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


def digest_artifact(path: Path, display: str, *, malformed_ok: bool = False) -> Artifact:
    """File digest plus, for weight files, the per-tensor table.

    A file that claims a weight format but is malformed or hostile raises
    :class:`~manifest.errors.MalformedArtifactError`; with ``malformed_ok``
    (verify's re-run, where such a file is simply a difference) it is
    recorded by file digest only.
    """
    from manifest.errors import MalformedArtifactError

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
