"""Compare two artifacts tensor by tensor, as raw bytes first and numbers second.

The verdict comes from bytes alone: two tensors are identical when their
dtype, shape and blake3 of raw bytes agree, so a single flipped bit is a
difference and NaN payloads or -0.0/+0.0 are never "close enough". Numbers
(element count, max |Δ|, max ULP distance) are only computed to describe a
difference that the bytes already proved.

ULP distance: floats are mapped to integers that order like the floats
(sign-magnitude to two's complement), so adjacent representable values are
1 apart and +0.0/-0.0 are 0 apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifest.errors import MalformedArtifactError
from manifest.models import Artifact
from manifest.weights.bounds import WeightFileError
from manifest.weights.raw import RawTensor
from manifest.weights.tables import MappedFiles, open_tensors

MAX_REPORTED_ULP = 2**53 - 1
"""The largest ULP distance a report states; a larger one (float64 only) is reported as this."""

_INT_VIEWS = {"float64": ("<i8", 63), "float32": ("<i4", 31), "float16": ("<i2", 15),
              "bfloat16": ("<i2", 15)}
_NUMPY_DTYPES = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8",
                 "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1", "uint16": "<u2",
                 "uint32": "<u4", "uint64": "<u8", "bool": "?", "complex64": "<c8",
                 "complex128": "<c16"}


@dataclass(frozen=True)
class TensorDelta:
    """How one tensor differs between the recorded run and the re-run."""

    name: str
    change: str
    """``values``, ``dtype``, ``shape``, ``missing`` (only recorded) or ``extra`` (only new)."""
    elements: int | None = None
    total: int | None = None
    max_abs: float | None = None
    max_ulp: int | None = None
    detail: str | None = None


@dataclass(frozen=True)
class ArtifactDelta:
    path: str
    identical: bool
    tensors: list[TensorDelta]
    detail: str | None = None


def _as_float64(data: bytes | memoryview, dtype: str) -> Any:
    import numpy as np

    if dtype == "bfloat16":
        raw = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).astype(np.float64)
    np_dtype = _NUMPY_DTYPES.get(dtype)
    if np_dtype is None:
        return None
    arr = np.frombuffer(data, dtype=np_dtype)
    if arr.dtype.kind == "c":
        return None
    return arr.astype(np.float64)


def numeric_delta(a: RawTensor, b: RawTensor) -> TensorDelta:
    """Element count, max |Δ| and max ULP of two same-dtype, same-shape tensors."""
    import numpy as np

    total = len(a.data) // max(1, _itemsize(a.dtype))
    view = _INT_VIEWS.get(a.dtype)
    if view is not None:
        ia = np.frombuffer(a.data, dtype=view[0])
        ib = np.frombuffer(b.data, dtype=view[0])
        differ = ia != ib
        elements = int(np.count_nonzero(differ))
        if elements == 0:
            return TensorDelta(a.name, "values", 0, total, 0.0, 0)
        mask = (1 << view[1]) - 1
        ka = np.where(ia[differ] < 0, -(ia[differ] & mask).astype(object),
                      (ia[differ] & mask).astype(object))
        kb = np.where(ib[differ] < 0, -(ib[differ] & mask).astype(object),
                      (ib[differ] & mask).astype(object))
        max_ulp = int(max(abs(x - y) for x, y in zip(ka.tolist(), kb.tolist(), strict=True)))
        # float64 distances reach 2^64; reports are canonical JSON, whose integers stop at
        # 2^53-1 (an explain on an H100 failed writing one). Beyond it, "at least" that.
        max_ulp = min(max_ulp, MAX_REPORTED_ULP)
        fa = _as_float64(a.data, a.dtype)[differ]
        fb = _as_float64(b.data, b.dtype)[differ]
        with np.errstate(invalid="ignore", over="ignore"):
            deltas = np.abs(fa - fb)
        finite = deltas[np.isfinite(deltas)]
        max_abs = float(finite.max()) if finite.size else float("inf")
        return TensorDelta(a.name, "values", elements, total, max_abs, max_ulp)
    fa = _as_float64(a.data, a.dtype)
    fb = _as_float64(b.data, b.dtype)
    if fa is None or fb is None or fa.shape != fb.shape:
        ba = np.frombuffer(a.data, dtype="u1")
        bb = np.frombuffer(b.data, dtype="u1")
        n = int(np.count_nonzero(ba != bb)) if ba.shape == bb.shape else None
        return TensorDelta(a.name, "values", n, total, None, None, detail="bytes differ")
    differ = fa != fb
    elements = int(np.count_nonzero(differ))
    max_abs = float(np.abs(fa[differ] - fb[differ]).max()) if elements else 0.0
    return TensorDelta(a.name, "values", elements, total, max_abs, None)


def _itemsize(dtype: str) -> int:
    from manifest.weights.raw import ITEMSIZE

    return ITEMSIZE.get(dtype, 1)


def _tensors(path: Path) -> tuple[MappedFiles, dict[str, RawTensor]] | None:
    return open_tensors(path)


def compare_artifacts(
    recorded: Artifact, new: Artifact, *, recorded_file: Path | None, new_file: Path
) -> ArtifactDelta:
    """Compare a recorded artifact with a re-run's, tensor by tensor where possible.

    ``recorded_file`` is the original output, used for numbers only if its
    digest still matches the record; otherwise (absent, or changed since capture: the
    detail tells them apart) differences are named by digest alone.
    """
    if recorded.tensors is None or new.tensors is None:
        same = recorded.digest == new.digest
        return ArtifactDelta(recorded.path, same, [],
                             None if same else "file bytes differ (no tensor table)")
    deltas: list[TensorDelta] = []
    changed: list[str] = []
    for name in sorted(set(recorded.tensors) | set(new.tensors)):
        a, b = recorded.tensors.get(name), new.tensors.get(name)
        if b is None:
            deltas.append(TensorDelta(name, "missing"))
        elif a is None:
            deltas.append(TensorDelta(name, "extra"))
        elif a.dtype != b.dtype:
            deltas.append(TensorDelta(name, "dtype", detail=f"{a.dtype} → {b.dtype}"))
        elif a.shape != b.shape:
            deltas.append(TensorDelta(name, "shape", detail=f"{a.shape} → {b.shape}"))
        elif a.digest != b.digest:
            changed.append(name)
    detail = None
    if changed:
        numbers = _numbers(changed, recorded, recorded_file, new_file)
        if numbers is None:
            detail = ("the recorded file is not on this machine: differences named by digest "
                      "only" if recorded_file is None or not recorded_file.exists() else
                      "original output changed since capture: differences named by digest only")
            deltas.extend(TensorDelta(n, "values", detail="digest differs") for n in changed)
        else:
            deltas.extend(numbers)
    deltas.sort(key=lambda d: d.name)
    return ArtifactDelta(recorded.path, not deltas, deltas, detail)


def _numbers(
    names: list[str], recorded: Artifact, recorded_file: Path | None, new_file: Path
) -> list[TensorDelta] | None:
    if recorded_file is None or not recorded_file.exists():
        return None
    try:
        from manifest.weights.raw import hash_bytes

        old = _tensors(recorded_file)
        if old is None:
            return None
        try:
            new = _tensors(new_file)
        except BaseException:
            _close(old[0])
            raise
        if new is None:
            _close(old[0])
            return None
    except (OSError, ValueError, WeightFileError, MalformedArtifactError):
        # unreadable now (or the re-run's file stayed on a cluster): name differences by digest
        return None
    try:
        assert recorded.tensors is not None
        out = []
        for name in names:
            a, b = old[1].get(name), new[1].get(name)
            if a is None or b is None or hash_bytes(a.data) != recorded.tensors[name].digest:
                return None
            out.append(numeric_delta(a, b))
        return out
    except ImportError:
        return [TensorDelta(n, "values", detail="digest differs (numpy not installed)")
                for n in names]
    finally:
        old[1].clear()
        new[1].clear()
        _close(old[0])
        _close(new[0])


def _close(maps: MappedFiles) -> None:
    maps.close()
