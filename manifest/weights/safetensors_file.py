"""Tensors of a safetensors file, read from its header without trusting it.

The format's specification: an 8-byte little-endian header length, a JSON
header giving each tensor's dtype, shape and byte range, then the data. Each
range is checked to lie inside the file and to hold exactly shape × item size
bytes before a view of it is made; the tensor is then a slice of the memory
map (no copy). A header that is not JSON, or a length past the end, means the
file is not safetensors (:class:`~manifest.weights.bounds.WeightFileError`);
an entry that breaks the rules is
:class:`~manifest.weights.bounds.MalformedWeightsError`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from math import prod

from manifest.weights.bounds import MalformedWeightsError, WeightFileError, dims, short
from manifest.weights.raw import ITEMSIZE, RawTensor

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}


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
            shape = list(dims(entry["shape"], f"safetensors shape of {name!r}"))
            begin, end = dims(entry["data_offsets"], f"safetensors offsets of {name!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedWeightsError(f"safetensors entry {short(name)} is malformed") from exc
        if not 0 <= begin <= end <= len(buf) - base:
            raise MalformedWeightsError(
                f"safetensors entry {short(name)} points outside the file "
                f"(bytes {begin}..{end} of {len(buf) - base})")
        item = ITEMSIZE.get(dtype)
        if item is not None and prod(shape) * item != end - begin:
            raise MalformedWeightsError(
                f"safetensors entry {short(name)} has shape {short(shape)} of {dtype} "
                f"but {end - begin} bytes")
        yield RawTensor(name, dtype, shape, buf[base + begin : base + end])
