"""Op streams as written by ``manifest/launch/boot/_manifest_opstream.py`` (``manifest-ops/v1``).

One stream per process: a list of ops, each with the optimizer step it ran
in, the aten op name, the module path and type, the user's ``file:line``,
fingerprints of its tensor inputs and outputs, ``dtype[shape]`` of its
outputs and the device. Values of a window's tensors, when kept, sit beside
the stream in a safetensors file (``i.<row>.<k>`` inputs, ``o.<row>.<k>``
outputs) so differing elements and ULPs can be counted without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manifest.errors import UsageError

FORMAT = "manifest-ops/v1"


@dataclass(frozen=True)
class Op:
    row: int
    step: int
    name: str
    module: str
    module_type: str
    where: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    meta: tuple[str, ...]
    device: str

    @property
    def key(self) -> tuple[str, str]:
        """What alignment matches on: the op and where in the model it ran."""
        return self.name, self.module

    @property
    def short_name(self) -> str:
        return self.name.removesuffix(".default")


@dataclass
class OpStream:
    rank: int
    ops: list[Op]
    steps: tuple[int, int]
    values: Path | None = None
    error: str | None = None
    """The recorder's own fault, when one stopped it (the ops before it are kept)."""
    _tensors: dict[str, Any] | None = field(default=None, repr=False)

    def step(self, step: int, since: int | None = None) -> list[Op]:
        """The ops of ``step``, or of every step from ``since`` to ``step``."""
        lo = step if since is None else since
        return [op for op in self.ops if lo <= op.step <= step]

    def tensor(self, key: str) -> Any:
        """RawTensor ``key`` from the values file, or None."""
        if self._tensors is None:
            self._tensors = {}
            if self.values is not None and self.values.is_file():
                from manifest.weights.compare import _tensors
                from manifest.weights.raw import RawTensor

                loaded = _tensors(self.values)
                if loaded is not None:
                    # Copied out so the file is closed now, not by the garbage
                    # collector (an unclosed file is a ResourceWarning).
                    maps, views = loaded
                    self._tensors = {k: RawTensor(t.name, t.dtype, t.shape, bytes(t.data))
                                     for k, t in views.items()}
                    views.clear()
                    for mapped in maps:
                        mapped.close()
        return self._tensors.get(key)


def parse_stream(data: bytes, *, values: Path | None = None, what: str = "op stream") -> OpStream:
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        ops = [
            Op(row=i, step=int(r[0]), name=str(r[1]), module=str(r[2]), module_type=str(r[3]),
               where=str(r[4]), inputs=tuple(r[5]), outputs=tuple(r[6]), meta=tuple(r[7]),
               device=str(r[8]))
            for i, r in enumerate(doc["ops"])
        ]
        lo, hi = doc.get("steps") or (0, 0)
        error = doc.get("error")
        return OpStream(rank=int(doc.get("rank") or 0), ops=ops, steps=(int(lo), int(hi)),
                        values=values, error=str(error) if error else None)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise UsageError(f"{what} is not a manifest op stream ({exc}).") from exc


def streams_in(directory: Path) -> dict[int, OpStream]:
    """Every stream a run left in ``directory``, by rank (the rank's main process)."""
    found: dict[int, OpStream] = {}
    for path in sorted(directory.glob("ops-*.json")):
        values = path.with_name("values-" + path.name.removeprefix("ops-")).with_suffix(
            ".safetensors")
        stream = parse_stream(path.read_bytes(), values=values if values.is_file() else None)
        if stream.rank not in found or len(stream.ops) > len(found[stream.rank].ops):
            found[stream.rank] = stream
    return found
