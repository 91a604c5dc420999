"""The op window of one process: which steps to record, and the files they go to.

The launcher-side half of the op recorder (``_manifest_ops``). Loaded by the
launcher only when ``MANIFEST_OPS`` is set (``manifest explain``,
``capture --fingerprint-ops``); the launcher's optimizer-step hook tells the
window each step's start and end, the window turns the recorder on for steps
[lo, hi] only (fingerprinting every op makes a step ~4.5x slower), writes
the stream when the window closes, and asks the launcher to stop the process
after step ``stop`` (explain needs no step past the divergent one).

Stream file (JSON, one per process, ``<dir>/ops-<rank>-<pid>.json``)::

    {"format": "manifest-ops/v1", "rank", "pid", "steps": [lo, hi],
     "ops": [[step, op, module, module_type, where, [inputs], [outputs], [meta], device]],
     "error": "..."}   # only when the recorder itself failed (it then stopped recording)

A tensor of another layout (sparse, quantized, nested, a wrapper subclass) is
fingerprinted by the tensors that hold its value (``_manifest_ops``); one the
recorder cannot read (meta, fake) is ``unreadable: <what>``. Neither ever stops
the run: the recorder runs inside the user's training step.

With ``values`` set, the recorded dense outputs (and dense inputs no
recorded op produced) of the window's ops are also kept on the host, up to
a byte budget, and saved beside the stream (``values-<rank>-<pid>.safetensors``) so a
comparison can count differing elements and ULPs. That file is written with
the standard library: the child may not have the safetensors package.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot import _manifest_ops as ops
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        import _manifest_ops as ops
    except ImportError:  # pragma: no cover - only the launcher loads this module
        from manifest.launch.boot import _manifest_ops as ops

FORMAT = "manifest-ops/v1"


class StepWindow:
    """Records ops during steps [lo, hi] of this process; stops it after ``stop``.

    Steps are counted by the launcher's optimizer-step hook: step k is every
    op after the (k-1)-th ``optimizer.step()`` returned, up to and including
    the k-th.
    """

    def __init__(self, config: dict[str, Any], rank: int | None) -> None:
        self.lo = int(config.get("from", 1))
        self.hi = int(config.get("to", self.lo))
        self.stop = config.get("stop")
        self.dir = str(config["dir"])
        self.budget = int(config.get("values_budget", 0))
        self.rank = rank or 0
        self.rows: list[list[Any]] = []
        self.values: dict[int, tuple[list[Any], list[Any]]] = {}
        self.kept = 0
        self.produced: set[int] = set()
        self.recorder: Any = None
        self.current = 0
        self.done = False

    @property
    def paused(self) -> bool:
        return bool(self.recorder is not None and self.recorder.paused)

    @paused.setter
    def paused(self, value: bool) -> None:
        if self.recorder is not None:
            self.recorder.paused = value

    def _on_op(self, ev: ops.OpEvent) -> None:
        self.rows.append([ev.step, ev.op, ev.module, ev.module_type, ev.where,
                          list(ev.inputs), list(ev.outputs), list(ev.meta), ev.device])

    def _keep(self, index: int, ins: list[Any], outs: list[Any]) -> None:
        if self.kept >= self.budget:
            return
        copies_in = [self._copy(t) if id(t) not in self.produced else None for t in ins]
        copies_out = [self._copy(t) for t in outs]
        for t in outs:
            self.produced.add(id(t))
        self.values[len(self.rows)] = (copies_in, copies_out)

    def _copy(self, t: Any) -> Any:
        """A host copy of a dense tensor's values; None for any other (see ``dense_values``)."""
        try:
            if not dense_values(t) or not t.numel():
                return None
            c = t.detach().to("cpu", copy=True)
        except Exception:
            return None
        self.kept += c.numel() * c.element_size()
        return c

    def begin(self) -> None:
        recorder_class = ops.make_recorder_class()
        keep = self._keep if self.budget else None
        self.recorder = recorder_class(self._on_op, step=lambda: self.current, keep=keep)
        self.recorder.__enter__()

    def on_step_start(self, step: int) -> None:
        """Called with the number of the step about to run (1 at torch import)."""
        self.current = step
        if self.done:
            return
        if step == self.lo and self.recorder is None:
            self.begin()

    def on_step_end(self, step: int) -> bool:
        """After ``optimizer.step()`` number ``step``; True when the process should stop."""
        if self.recorder is not None and step >= self.hi and not self.done:
            self.finish()
        return self.stop is not None and step >= int(self.stop)

    def finish(self) -> None:
        """Write the stream (and the kept values); never raises into the script.

        A fault of the recorder itself (``Recorder.error``) or of writing the
        values goes into the stream as ``error``, so explain says the tool
        failed rather than the script or its confinement.
        """
        if self.done:
            return
        self.done = True
        errors: list[str] = []
        if self.recorder is not None:
            try:
                self.recorder.__exit__(None, None, None)
            except Exception as exc:
                errors.append(f"closing the recorder: {type(exc).__name__}: {exc}")
            if self.recorder.error:
                errors.insert(0, str(self.recorder.error))
        name = f"{self.rank}-{os.getpid()}"
        if self.values:
            try:
                self._write_values(os.path.join(self.dir, f"values-{name}.safetensors"))
            except Exception as exc:
                errors.append(f"writing values: {type(exc).__name__}: {exc}")
        for row in self.rows:
            row[5] = [ops.fingerprint_text(f) for f in row[5]]
            row[6] = [ops.fingerprint_text(f) for f in row[6]]
        doc: dict[str, Any] = {"format": FORMAT, "rank": self.rank, "pid": os.getpid(),
                               "steps": [self.lo, self.hi], "ops": self.rows}
        if errors:
            doc["error"] = "; ".join(errors)[:1000]
        path = os.path.join(self.dir, f"ops-{name}.json")
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                json.dump(doc, fh, separators=(",", ":"))
            os.replace(path + ".tmp", path)
        except OSError:  # explain then says no stream was recorded; the run goes on
            pass

    def _write_values(self, path: str) -> None:
        tensors: dict[str, Any] = {}
        for at, (ins, outs) in self.values.items():
            tensors.update({f"i.{at}.{k}": t for k, t in enumerate(ins) if t is not None})
            tensors.update({f"o.{at}.{k}": t for k, t in enumerate(outs) if t is not None})
        write_safetensors(path, tensors)


def dense_values(t: Any) -> bool:
    """Whether ``t``'s values can be kept as a plain array: a dense (strided) tensor that is
    not quantized, nested, meta or fake. Any other is compared by its fingerprint only."""
    try:
        return bool(str(t.layout) == "torch.strided" and not t.is_quantized
                    and not t.is_nested and t.device.type != "meta"
                    and type(t).__name__ not in ("FakeTensor", "FunctionalTensor"))
    except Exception:
        return False


_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                       "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
                       "uint8": "U8", "bool": "BOOL"}


def write_safetensors(path: str, tensors: dict[str, Any]) -> None:
    """The safetensors layout written with the standard library (the child may lack the package)."""
    import struct

    import torch

    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, t in tensors.items():
        code = _SAFETENSORS_DTYPES.get(str(t.dtype).removeprefix("torch."))
        if code is None or not dense_values(t):
            continue
        try:
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        except Exception:  # noqa: S112 - bytes it cannot read: compared by fingerprint only
            continue
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            fh.write(blob)
    os.replace(path + ".tmp", path)
