"""A tensor as this project identifies it: dtype, shape and blake3 of its raw bytes.

Identity of weights = blake3 of each tensor's raw bytes (C-contiguous, the
file's byte order) with its dtype and shape beside it, never the file's
digest alone: ``torch.save`` embeds the archive name, so identical tensors
saved under another file name give another file digest. The same tensor
stored in safetensors and in a torch archive gets the same tensor digest,
because every reader yields the same :class:`RawTensor`. Buffers of 4 MiB
and more are hashed with blake3's threads (``AUTO``), smaller ones on one
thread; the digest is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import blake3

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complex64": 8, "complex128": 16, "complex32": 4,
}

_BIG = 1 << 22


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

