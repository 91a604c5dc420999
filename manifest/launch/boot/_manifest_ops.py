"""Op-level fingerprint stream: every aten op, the module and source line it ran in.

Loaded by the launcher only for an op window (``MANIFEST_OPS``: ``manifest
explain``, ``capture --fingerprint-ops``) or the lab's audit, so a normal
capture never imports it. It can also be used on its own, e.g. for an audit
of the ops a model hits::

    from manifest.launch.boot._manifest_ops import OpRecorder
    with OpRecorder(events.append, fingerprint=False):
        model(x).sum().backward()
    # each event: OpEvent(seq, step, op, module, module_type, where, inputs, outputs,
    #                     meta, device)

How: a ``TorchDispatchMode`` (``torch.utils._python_dispatch``, the public
extension point every op tracer uses; PyTorch's own ``DebugMode`` lives in a
private module in torch 2.13, so it is not used) sees every aten op after
autograd, forward, backward and optimizer alike. Global module forward
pre/post hooks keep the dotted path of the module running (backward ops
carry ``(backward)``), and a walk up the Python stack finds the first frame
outside torch and manifest: the user's ``file:line``.

Fingerprints: on CPU, blake3 of the raw bytes (zero-copy view, ~12 GB/s);
on an accelerator, two 64-bit integer sums over the bit view (plain and
position-weighted) computed on the device and fetched once per step, so
recording does not sync per op. ``MANIFEST_OPS_DEVICE_SUMS=1`` sends CPU
tensors down the accelerator's path: the same code, so CI exercises it.
Measured on an H100 (a GPT of 10.7M parameters, 650 ops per step):
fingerprinting every op makes a step ~4.5x slower, which is why only a window
of steps is ever recorded
(``_manifest_opstream``, which also writes the stream file).

One recorder, three users: the op window of ``manifest explain``
(``_manifest_opstream``), the lab's op audit (``_manifest_audit``, without
fingerprints) and ``benchmarks/trail_overhead.py``.

Longer than 500 lines because it is the recorder and everything it reads, for
one reader: the fingerprint of each tensor layout (dense, sparse, quantized,
nested, wrapper subclasses), the memory no op wrote, the module stack and the
source line are used by the recorder alone, inside the user's step, and each
module the launcher loads there is one more import on its path.
"""

from __future__ import annotations

import contextlib
import hashlib
import numbers
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

_TORCH_DIR = ""
_HERE = os.path.dirname(os.path.abspath(__file__))
_MANIFEST_DIR = os.path.dirname(os.path.dirname(_HERE))


class OpEvent(NamedTuple):
    seq: int
    step: int
    op: str
    module: str
    module_type: str
    where: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    meta: tuple[str, ...]
    device: str


# ------------------------------------------------------------ fingerprints

_INT_VIEW = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _leaves(obj: Any) -> Iterator[Any]:
    """Tensors inside args/kwargs (lists, tuples, dicts), in order."""
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)
    else:
        yield obj


def _describe(t: Any) -> str:
    """``dtype[shape]``, with the layout when it is not dense (``float32[4, 4] sparse_coo``)."""
    try:
        dtype = str(t.dtype).removeprefix("torch.")
    except Exception:
        return _what_kind(t)
    try:
        shape = str(list(t.shape))
    except Exception:  # a nested tensor has no single shape
        shape = "[?]"
    torch = sys.modules["torch"]
    if _plain_dense(torch, t):
        return f"{dtype}{shape}"
    kind = _what_kind(t)
    return f"{dtype}{shape}" if kind in ("Tensor", "Parameter") else f"{dtype}{shape} {kind}"


DEVICE_SUMS_VAR = "MANIFEST_OPS_DEVICE_SUMS"
"""Set to 1, CPU tensors are fingerprinted as an accelerator's are (deferred device
sums): the CPU twin of the CUDA path, which CI never reaches otherwise."""


class _Fingerprinter:
    """Tensor → fingerprint text; device sums are resolved in one transfer.

    ``busy`` is set while :meth:`resolve` runs its own torch ops (``stack``,
    ``.cpu()``): the recorder must not record, nor fingerprint, its own
    bookkeeping. On an H100 it did, from inside ``__exit__`` while the mode was
    still active: each resolve added entries to ``pending`` as it read it.
    """

    def __init__(self, torch: Any, *, device_sums: bool | None = None) -> None:
        self.torch = torch
        self.pending: list[tuple[list[str], str, Any]] = []
        self._weights: dict[tuple[str, int], Any] = {}
        self.busy = False
        if device_sums is None:
            device_sums = os.environ.get(DEVICE_SUMS_VAR) == "1"
        self.device_sums = device_sums

    def __call__(self, t: Any) -> str:
        """``t``'s fingerprint; ``unreadable: <what>`` when its bytes cannot be read here.

        Never raises: the recorder runs inside the user's training step, and a
        tensor it cannot read (a meta or fake tensor, an unknown subclass) must
        not stop it. A dense tensor's text is the same as before any other
        layout was read, so streams recorded earlier still compare.
        """
        try:
            parts = _value_parts(self.torch, t)
        except Exception:  # a subclass whose accessors fail: named, never fatal
            parts = f"unreadable: {_what_kind(t)}"
        if isinstance(parts, str):
            return parts
        prefix, tensors = parts
        try:
            if all(p.numel() == 0 for p in tensors):
                return "empty" if not prefix else f"{prefix}:empty"
            if len(tensors) == 1 and not prefix:
                flat = tensors[0].detach().contiguous().reshape(-1)  # expanded: stride 0
            else:  # another layout: its parts' bytes in order, shapes in the prefix
                flat = self.torch.cat([_bytes_of(self.torch, p) for p in tensors])
            if flat.device.type == "cpu" and not self.device_sums:
                digest = _blake3_16(flat.view(self.torch.uint8).numpy())
                return f"{prefix}:{digest}" if prefix else digest
            return self._device_sum(flat, prefix)
        except Exception:
            return f"unreadable: {_what_kind(t)}"

    def _device_sum(self, flat: Any, prefix: str = "") -> str:
        torch = self.torch
        width = flat.element_size()
        ints = flat.view(getattr(torch, _INT_VIEW[width])) if width in _INT_VIEW else flat
        ints = ints.to(torch.int64)
        key = (str(flat.device), ints.numel())
        weights = self._weights.get(key)
        if weights is None:
            weights = torch.arange(1, ints.numel() + 1, device=flat.device, dtype=torch.int64)
            self._weights[key] = weights
        sums = torch.stack([ints.sum(), (ints * weights).sum()])
        slot: list[str] = ["?"]
        self.pending.append((slot, prefix, sums))
        return slot  # type: ignore[return-value]  # resolved to text by resolve()

    def resolve(self) -> None:
        """Fill every pending slot with its text, in one device-to-host transfer."""
        if not self.pending or self.busy:
            return
        # Take the list first: whatever runs below works on this snapshot only.
        pending, self.pending = self.pending, []
        self.busy = True
        try:
            values = self.torch.stack([s for _, _, s in pending]).cpu().tolist()
        finally:
            self.busy = False
        for (slot, prefix, _), (a, b) in zip(pending, values, strict=True):
            text = f"s{a & 0xFFFFFFFFFFFFFFFF:016x}{b & 0xFFFFFFFFFFFFFFFF:016x}"
            slot[0] = f"{prefix}:{text}" if prefix else text


_COMPRESSED = {"sparse_csr": ("crow_indices", "col_indices"),
               "sparse_bsr": ("crow_indices", "col_indices"),
               "sparse_csc": ("ccol_indices", "row_indices"),
               "sparse_bsc": ("ccol_indices", "row_indices")}


def _value_parts(torch: Any, t: Any) -> str | tuple[str, list[Any]]:
    """The dense tensors that hold ``t``'s value, with a prefix naming its layout.

    A dense tensor is itself, prefix ``""``. A sparse COO tensor is its stored
    indices and values as they are (never coalesced: coalescing is an op of its
    own, and a run that coalesces records that op); a compressed one (CSR, CSC,
    BSR, BSC) its index arrays and values; a quantized one its integer
    representation with scale and zero point; a nested one its components; a
    traceable wrapper subclass (DTensor, a jagged nested tensor) its inner
    tensors. A tensor with no bytes here (meta, fake) gives ``unreadable: <what>``.
    """
    if _plain_dense(torch, t):
        return "", [t]
    layout = str(t.layout).removeprefix("torch.")
    if t.device.type == "meta" or type(t).__name__ == "FakeTensor":
        return f"unreadable: {_what_kind(t)}"
    if layout == "sparse_coo":
        return f"{layout}{list(t.shape)}", [t._indices(), t._values()]
    if layout in _COMPRESSED:
        first, second = _COMPRESSED[layout]
        return (f"{layout}{list(t.shape)}",
                [getattr(t, first)(), getattr(t, second)(), t.values()])
    if t.is_quantized:
        if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            return f"quantized({t.q_scale()!r},{t.q_zero_point()})", [t.int_repr()]
        return "quantized", [t.int_repr(), t.q_per_channel_scales(),
                             t.q_per_channel_zero_points()]
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        tensors: list[Any] = []
        for name in names:
            inner = getattr(t, name)
            if inner is None:
                continue
            sub = _value_parts(torch, inner)
            if isinstance(sub, str):
                return f"unreadable: {_what_kind(t)}"
            tensors.extend(sub[1])
        return type(t).__name__, tensors
    if t.is_nested:
        parts = list(t.unbind())
        return f"nested[{len(parts)}]", parts
    if layout != "strided":
        return f"unreadable: {layout}"
    return "", [t]


def _plain_dense(torch: Any, t: Any) -> bool:
    """The common case, checked first (every op's every tensor passes here)."""
    return bool(type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout is torch.strided
                and not t.is_quantized and not t.is_nested and t.device.type != "meta")


def _what_kind(t: Any) -> str:
    """A tensor's layout or kind, in words, for ``unreadable: <what>``."""
    try:
        layout = str(t.layout).removeprefix("torch.")
        if type(t).__name__ == "FakeTensor":
            return "fake"
        if t.device.type == "meta":
            return "meta"
        if layout != "strided":
            return layout
        if getattr(t, "is_nested", False):
            return "nested"
        if t.is_quantized:
            return "quantized"
    except Exception:  # a subclass whose attributes fail: named by its type
        return type(t).__name__
    return type(t).__name__


def _bytes_of(torch: Any, t: Any) -> Any:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _blake3_16(buffer: Any) -> str:
    try:
        import blake3

        return str(blake3.blake3(buffer).hexdigest(length=8))
    except ImportError:
        import hashlib

        return hashlib.blake2b(buffer, digest_size=8).hexdigest()


UNINITIALIZED = "uninit"
"""The fingerprint of memory no op has written yet: ``torch.empty`` and its kin return
whatever the allocator's block held (on CUDA, the caching allocator's leftovers from an
earlier tensor), so its bytes are not a value of the run and are never read."""

_UNINIT_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted",
})


def _storage_key(t: Any) -> tuple[str, int] | None:
    try:
        ptr = int(t.untyped_storage().data_ptr())
        return (str(t.device), ptr) if ptr else None
    except Exception:  # a tensor without storage (a subclass, a functional wrapper)
        return None


def _written_args(func: Any, args: Any, kwargs: dict[str, Any]) -> Iterator[Any]:
    """Tensors an op writes into (``Tensor(a!)`` in its schema: in-place and ``out=``)."""
    try:
        arguments = func._schema.arguments
    except Exception:
        return
    for i, arg in enumerate(arguments):
        alias = arg.alias_info
        if alias is None or not alias.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        yield from _leaves(value)


NUMBERS = "="
"""The prefix of an op's last input fingerprint when it has number arguments."""


def numbers_text(args: Any, kwargs: dict[str, Any]) -> str:
    """The fingerprint of an op's number arguments (``x + 0.5``: ``0.5``), ``""`` if none.

    torch passes a Python or numpy scalar to an op as a number, not a tensor, so
    no tensor fingerprint sees it: a random number added to the loss would look
    like an op whose inputs matched and whose outputs differ. ``repr`` of a float
    is exact, so equal texts mean equal numbers. Recorded after the tensor inputs,
    as one entry: the tensors keep their positions.
    """
    found = [x for x in _leaves((args, kwargs)) if isinstance(x, numbers.Number)]
    if not found:
        return ""
    text = repr([x.item() if hasattr(x, "item") else x for x in found]).encode()
    return NUMBERS + hashlib.blake2b(text, digest_size=8).hexdigest()


def fingerprint_text(fp: Any) -> str:
    """An op's fingerprint as text (a device sum's slot once :meth:`resolve` has run)."""
    return fp[0] if isinstance(fp, list) else str(fp)


# ----------------------------------------------------------------- modules


class _ModuleStack:
    """Dotted path of the module whose forward is running (global hooks)."""

    def __init__(self, torch: Any) -> None:
        self.stack: list[tuple[Any, str]] = []
        self._child_names: dict[int, dict[int, str]] = {}
        mod = torch.nn.modules.module
        self.handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post),
        ]

    def _name_in(self, parent: Any, child: Any) -> str:
        names = self._child_names.get(id(parent))
        if names is None:
            names = {id(m): n for n, m in parent.named_modules() if n}
            self._child_names[id(parent)] = names
        return names.get(id(child), type(child).__name__)

    def _pre(self, module: Any, args: Any) -> None:
        if not self.stack:
            path = ""
        else:
            parent, parent_path = self.stack[-1]
            name = self._name_in(parent, module)
            path = f"{parent_path}.{name}" if parent_path else name
        self.stack.append((module, path))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        # A forward that raised skipped its post hook: unwind to this module.
        while self.stack:
            top, _ = self.stack.pop()
            if top is module:
                break

    def current(self) -> tuple[str, str]:
        if not self.stack:
            return "", ""
        module, path = self.stack[-1]
        return path or "", type(module).__name__

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.stack.clear()


# ------------------------------------------------------------ source lines

_outside: dict[str, bool] = {}


def _is_user_file(filename: str) -> bool:
    known = _outside.get(filename)
    if known is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        known = not (
            filename.startswith("<")
            or (_TORCH_DIR and path.startswith(_TORCH_DIR))
            or path.startswith(_MANIFEST_DIR)
            or path.startswith(_HERE)
        )
        _outside[filename] = known
    return known


def user_line(depth: int = 2) -> str:
    """``file:line`` of the first frame outside torch and manifest ('' if none)."""
    try:
        frame: Any = sys._getframe(depth)
    except ValueError:
        return ""
    while frame is not None:
        code = frame.f_code
        if _is_user_file(code.co_filename):
            return f"{_short(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _short(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


# ---------------------------------------------------------------- recorder


def _fault_line(exc: BaseException) -> str:
    """`` (at file.py:LINE)``: the innermost frame of manifest's own code the fault passed."""
    tb = exc.__traceback__
    found = ""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if os.path.abspath(filename).startswith(_MANIFEST_DIR):
            found = f" (at {os.path.basename(filename)}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward pass on this thread.

    torch has no public query for it; without the private one, backward ops
    are recorded with no module path rather than failing.
    """
    query = getattr(getattr(sys.modules.get("torch"), "_C", None), "_current_graph_task_id", None)
    if query is None:
        return False
    try:
        return bool(query() != -1)
    except Exception:
        return False


def _backward_labeller(torch: Any, modules: _ModuleStack, holder: dict[str, Any]) -> Any:
    """A ``TorchFunctionMode`` that tags each forward op's autograd node with its module.

    Both are public API (``torch.overrides.TorchFunctionMode``,
    ``Node.register_prehook``): when the node runs in backward, its prehook
    says which module's backward the following aten ops belong to.
    """
    from torch.overrides import TorchFunctionMode

    class Labeller(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            # A label is a courtesy: an output it cannot tag stays bare.
            with contextlib.suppress(Exception):
                _label(out)
            return out

    def _label(out: Any) -> None:
        path, kind = modules.current()
        if not (path or kind):
            return
        for t in _leaves(out):
            node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if node is None or node.metadata.get("manifest_module") is not None:
                continue
            node.metadata["manifest_module"] = (path, kind)
            node.register_prehook(_set_backward(holder, path, kind))

    return Labeller()


def _set_backward(holder: dict[str, Any], path: str, kind: str) -> Callable[[Any], None]:
    def prehook(grad_outputs: Any) -> None:
        holder["module"] = (path, kind)

    return prehook


def _dispatch_mode_base() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def make_recorder_class() -> Any:
    """The recorder class, built lazily so importing this file never imports torch."""
    global _TORCH_DIR
    import torch

    _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    base = _dispatch_mode_base()

    class Recorder(base):  # type: ignore[misc, valid-type]
        def __init__(self, on_op: Callable[[OpEvent], None], *, fingerprint: bool = True,
                     step: Callable[[], int] | None = None,
                     keep: Callable[[int, list[Any], list[Any]], None] | None = None) -> None:
            super().__init__()
            self.on_op = on_op
            self.fingerprint = fingerprint
            self.step = step or (lambda: 0)
            self.keep = keep
            self.index = 0
            self.pid = os.getpid()
            self.fp = _Fingerprinter(torch)
            self.modules: _ModuleStack | None = None
            self.paused = False
            self.backward: dict[str, Any] = {}
            self.labeller: Any = None
            self.error: str | None = None
            """The recorder's own fault, when one stopped it (``None`` while it records)."""
            # Storages an empty-like op made and no op has written since (see UNINITIALIZED).
            self.uninit: set[tuple[str, int] | None] = set()

        def _unwritten(self, func: Any, args: Any, kwargs: dict[str, Any]) -> set[Any]:
            """Storages among this op's inputs whose bytes it neither reads nor depends on.

            Those of a view op (it reads no value) and those the op writes (in-place,
            ``out=``), while no op has written them since an empty-like op made them.
            Any other op that reads such a storage reads the allocator's leftovers, and
            is fingerprinted by them: a value from outside the run's ops.
            """
            if not self.uninit:
                return set()
            if getattr(func, "is_view", False):
                return self.uninit
            return {_storage_key(t) for t in _written_args(func, args, kwargs)
                    if isinstance(t, torch.Tensor)} & self.uninit

        def _after(self, func: Any, written: set[Any], ins: list[Any], outs: list[Any]) -> None:
            """Which storages hold bytes no op wrote, once this op ran.

            An empty-like op's outputs join; the storages an op wrote leave, and so
            does a fresh output's (its storage is none of its inputs': the allocator
            reuses addresses); a view of an unwritten storage stays unwritten.
            """
            if func.name().split(".")[0] in _UNINIT_OPS:
                self.uninit.update(k for k in map(_storage_key, outs) if k is not None)
                return
            if not self.uninit:
                return
            if not getattr(func, "is_view", False):
                self.uninit -= written
            inputs = {_storage_key(t) for t in ins}
            self.uninit -= {k for k in map(_storage_key, outs) if k not in inputs}

        def __enter__(self) -> Any:
            self.modules = _ModuleStack(torch)
            try:
                self.labeller = _backward_labeller(torch, self.modules, self.backward)
                self.labeller.__enter__()
            except Exception:  # no TorchFunctionMode here: backward ops stay unlabelled
                self.labeller = None
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            if self.labeller is not None:
                self.labeller.__exit__(None, None, None)
            if self.modules is not None:
                self.modules.remove()
            # Leave the mode first: resolving runs torch ops of its own.
            result = super().__exit__(*exc)
            self.fp.resolve()
            return result

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            # A forked DataLoader worker inherits the mode; the launcher pauses it
            # while it fingerprints the step trail. A recorder that failed stops.
            if (self.paused or self.fp.busy or self.error is not None
                    or os.getpid() != self.pid):
                return func(*args, **kwargs)
            # The op itself runs outside every guard: its errors are the script's.
            # The recorder's own bookkeeping never reaches the script: a fault in
            # it ends the recording and is kept as ``error`` for the stream file.
            try:
                before = self._before(func, args, kwargs)
            except Exception as exc:
                self._fail(exc)
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            try:
                self._record(func, before, out)
            except Exception as exc:
                self._fail(exc)
            return out

        def _before(self, func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
            ins = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            in_fps: tuple[Any, ...] = ()
            unwritten: set[Any] = set()
            if self.fingerprint:
                unwritten = self._unwritten(func, args, kwargs)
                in_fps = tuple(UNINITIALIZED if unwritten and _storage_key(t) in unwritten
                               else self.fp(t) for t in ins)
                numbers = numbers_text(args, kwargs)
                if numbers:
                    in_fps += (numbers,)
            return ins, in_fps, unwritten

        def _record(self, func: Any, before: tuple[Any, ...], out: Any) -> None:
            ins, in_fps, unwritten = before
            outs = [t for t in _leaves(out) if isinstance(t, torch.Tensor)]
            out_fps: tuple[Any, ...] = ()
            if self.fingerprint:
                self._after(func, unwritten, ins, outs)
                out_fps = tuple(UNINITIALIZED if self.uninit and _storage_key(t) in self.uninit
                                else self.fp(t) for t in outs)
            path, kind = self.modules.current() if self.modules is not None else ("", "")
            if not path and _in_backward():
                path, kind = self.backward.get("module") or ("", "")
                path, kind = (path or "(backward)"), (f"{kind}, backward" if kind else "")
            device = next((str(t.device) for t in outs + ins), "cpu")
            index = self.index
            self.index += 1
            if self.keep is not None:
                self.keep(index, ins, outs)
            self.on_op(OpEvent(index, self.step(), func.name(), path, kind, user_line(3),
                               in_fps, out_fps, tuple(_describe(t) for t in outs), device))

        def _fail(self, exc: BaseException) -> None:
            """The recorder's own fault: kept, with the recorder's line it was raised at."""
            self.error = f"{type(exc).__name__}: {exc}"[:500] + _fault_line(exc)

    return Recorder


def OpRecorder(on_op: Callable[[OpEvent], None], *, fingerprint: bool = True,
               step: Callable[[], int] | None = None) -> Any:
    """A context manager that calls ``on_op(OpEvent)`` for every aten op run inside it.

    With ``fingerprint=False`` only names, modules and lines are recorded (an
    audit: no tensor is read). Fingerprints from an accelerator are filled in
    when the recorder exits or :func:`resolve` is called on it (``rec.fp.resolve()``).
    """
    return make_recorder_class()(on_op, fingerprint=fingerprint, step=step)
