"""The limits a weight file is held to, and the errors for breaking them.

A weight file is input a user can be handed, so nothing in it is trusted
before it is checked against the file itself. The rules every reader shares
live here, once: shapes, strides and offsets are plain ints from 0 to 2**53-1
(:func:`dims`); every byte allocated beyond the memory map (a non-contiguous
view gathered into C order, a compressed zip entry, ``data.pkl``) is charged
to a :class:`Budget` of :data:`BUDGET_FACTOR` × the file size plus 1 MiB (a
1 MB archive cost 2.1 GB of RSS, a stride-0 view asked for 149 GiB); and
containers in ``data.pkl`` nest at most :data:`MAX_DEPTH` deep. The checks
that need a format's own structure (a safetensors byte range, an archive
view against its storage, a zip local header) sit in that format's reader,
next to the access they guard, and raise the errors below.

A file that claims a format and breaks one of these rules raises
:class:`MalformedWeightsError`; a file that merely is not the format (garbage
JSON header, no ``data.pkl``, a truncated zip) raises
:class:`WeightFileError` and is recorded by file digest only.
"""

from __future__ import annotations

from typing import Any

from manifest.errors import MalformedWeightsError as MalformedWeightsError
from manifest.errors import WeightFileError as WeightFileError

BUDGET_FACTOR = 4
"""Bytes allocated beyond the memory map, as a multiple of the file size (plus 1 MiB)."""
MAX_DIM = 2**53 - 1
MAX_DEPTH = 200
"""Containers nested deeper than this in ``data.pkl`` are refused (a state dict is 2-10)."""




class Budget:
    """Bytes we may still allocate for one file beyond its memory map."""

    def __init__(self, file_size: int) -> None:
        self.left = BUDGET_FACTOR * file_size + (1 << 20)

    def charge(self, n: int, what: str) -> None:
        if n > self.left:
            raise MalformedWeightsError(
                f"{what} would need {n:,} bytes, more than {BUDGET_FACTOR}x the file size")
        self.left -= n


def dims(values: Any, what: str) -> tuple[int, ...]:
    """A shape or stride: a sequence of plain non-negative ints no larger than 2**53-1."""
    if not isinstance(values, (tuple, list)):
        raise MalformedWeightsError(f"{what} is not a sequence of integers")
    out = tuple(values)
    if not all(type(v) is int and 0 <= v <= MAX_DIM for v in out):
        raise MalformedWeightsError(f"{what} {short(out)} holds a value that is not an "
                                    "integer from 0 to 2**53-1")
    return out


def short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "<huge>"
    return text if len(text) <= 60 else text[:57] + "..."

