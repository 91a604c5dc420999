"""Which of the ops a run hit are nondeterministic somewhere: the lab's op catalogue.

Source of truth, in order:

1. The installed torch's own list: the docstring of
   ``torch.use_deterministic_algorithms`` names, in two bullet lists, the
   ops that act deterministically under the switch (``switched``: the
   default is nondeterministic) and those that raise under it (``raises``:
   no deterministic implementation). Torch 2.13 lists 23 and 25. The
   documented names are Python-level (``torch.Tensor.index_add_``,
   ``torch.nn.AdaptiveAvgPool2d``), so ``_ATEN`` maps each to the aten ops
   an op audit sees (``AdaptiveAvgPool2d`` "when attempting to
   differentiate" → ``aten::_adaptive_avg_pool2d_backward``). A documented
   name the map does not know is reported as unmapped, so a newer torch's
   additions show up instead of vanishing.
2. Where the docstring cannot be read (torch not importable here, or its
   text no longer has the two lists), the maintained fallback
   ``_FALLBACK``, written from torch 2.13's docstring.

Plus, from the table in both cases: ``mm``/``addmm``/``bmm`` are
nondeterministic on CUDA unless ``CUBLAS_WORKSPACE_CONFIG`` is set (the
recipe sets it; the switch raises without it), so they are listed as
``switched`` with that note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_DOC_SWITCHED = "act\n    deterministically"
_BULLET = re.compile(r"\* :(?:class|func):`([^`]+)`([^*]*)")

# documented name -> aten ops (overload stripped) in which it shows up in an audit
_ATEN: dict[str, tuple[str, ...]] = {
    "torch.nn.Conv1d": ("convolution", "convolution_backward"),
    "torch.nn.Conv2d": ("convolution", "convolution_backward"),
    "torch.nn.Conv3d": ("convolution", "convolution_backward"),
    "torch.nn.ConvTranspose1d": ("convolution", "convolution_backward"),
    "torch.nn.ConvTranspose2d": ("convolution", "convolution_backward"),
    "torch.nn.ConvTranspose3d": ("convolution", "convolution_backward"),
    "torch.nn.ReplicationPad1d": ("replication_pad1d_backward",),
    "torch.nn.ReplicationPad2d": ("replication_pad2d_backward",),
    "torch.nn.ReplicationPad3d": ("replication_pad3d_backward",),
    "torch.bmm": ("bmm",),
    "torch.Tensor.__getitem__": ("_index_put_impl_",),
    "torch.Tensor.index_put": ("index_put", "index_put_", "_index_put_impl_"),
    "torch.Tensor.put_": ("put_", "put"),
    "torch.Tensor.scatter_add_": ("scatter_add_", "scatter_add"),
    "torch.gather": (),  # its backward is a scatter_add, caught there
    "torch.index_add": ("index_add", "index_add_"),
    "torch.index_select": (),  # its backward is an index_add, caught there
    "torch.repeat_interleave": ("repeat_interleave",),
    "torch.Tensor.index_copy": ("index_copy", "index_copy_"),
    "torch.Tensor.scatter": ("scatter", "scatter_"),
    "torch.Tensor.scatter_reduce": ("scatter_reduce", "scatter_reduce_"),
    "torch.nn.MaxPool3d": ("max_pool3d_with_indices_backward",),
    "torch.nn.AvgPool3d": ("avg_pool3d_backward",),
    "torch.nn.AdaptiveAvgPool2d": ("_adaptive_avg_pool2d_backward",),
    "torch.nn.AdaptiveAvgPool3d": ("_adaptive_avg_pool3d_backward",),
    "torch.nn.AdaptiveMaxPool2d": ("adaptive_max_pool2d_backward",),
    "torch.nn.FractionalMaxPool2d": ("fractional_max_pool2d_backward",),
    "torch.nn.FractionalMaxPool3d": ("fractional_max_pool3d_backward",),
    "torch.nn.MaxUnpool1d": ("max_unpool2d",),
    "torch.nn.MaxUnpool2d": ("max_unpool2d",),
    "torch.nn.MaxUnpool3d": ("max_unpool3d",),
    "torch.nn.functional.interpolate": (
        "upsample_linear1d_backward", "upsample_bilinear2d_backward",
        "upsample_bicubic2d_backward", "upsample_trilinear3d_backward"),
    "torch.nn.ReflectionPad1d": ("reflection_pad1d_backward",),
    "torch.nn.ReflectionPad2d": ("reflection_pad2d_backward",),
    "torch.nn.ReflectionPad3d": ("reflection_pad3d_backward",),
    "torch.nn.NLLLoss": ("nll_loss2d_forward",),
    "torch.nn.CTCLoss": ("_ctc_loss_backward",),
    "torch.nn.EmbeddingBag": ("_embedding_bag_backward", "_embedding_bag_dense_backward"),
    "torch.histc": ("histc",),
    "torch.bincount": ("bincount",),
    "torch.median": ("median",),
    "torch.nn.functional.grid_sample": ("grid_sampler_2d_backward", "grid_sampler_3d_backward"),
    "torch.cumsum": ("cumsum", "cumsum_"),
    "torch.Tensor.resize_": (),  # quantized tensors only
}

# torch 2.13's two lists, for when the docstring cannot be read: (name, when, kind)
_FALLBACK: tuple[tuple[str, str, str], ...] = (
    *((f"torch.nn.{m}", "when called on CUDA tensor", "switched")
      for m in ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                "ConvTranspose3d")),
    *((f"torch.nn.ReplicationPad{d}d", "when attempting to differentiate a CUDA tensor",
       "switched") for d in (1, 2, 3)),
    ("torch.bmm", "when called on sparse-dense CUDA tensors", "switched"),
    ("torch.Tensor.__getitem__", "when attempting to differentiate a CPU tensor and the index "
     "is a list of tensors", "switched"),
    ("torch.Tensor.index_put", "with accumulate=True when called on a CPU tensor", "switched"),
    ("torch.Tensor.put_", "with accumulate=True when called on a CPU tensor", "switched"),
    ("torch.Tensor.scatter_add_", "when called on a CUDA tensor", "switched"),
    ("torch.index_add", "when called on CUDA tensor", "switched"),
    ("torch.repeat_interleave", "when attempting to differentiate a CUDA tensor", "switched"),
    ("torch.Tensor.index_copy", "when called on a CPU or CUDA tensor", "switched"),
    ("torch.Tensor.scatter", "when src type is Tensor and called on CUDA tensor", "switched"),
    ("torch.Tensor.scatter_reduce", "when reduce='sum' or reduce='mean' and called on CUDA "
     "tensor", "switched"),
    ("torch.nn.MaxPool3d", "when attempting to differentiate a CUDA tensor", "switched"),
    *((f"torch.nn.{m}", "when attempting to differentiate a CUDA tensor", "raises")
      for m in ("AvgPool3d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool2d",
                "FractionalMaxPool2d", "FractionalMaxPool3d", "ReflectionPad1d",
                "ReflectionPad2d", "ReflectionPad3d", "CTCLoss")),
    *((f"torch.nn.MaxUnpool{d}d", "", "raises") for d in (1, 2, 3)),
    ("torch.nn.functional.interpolate", "when attempting to differentiate a CUDA tensor "
     "(linear, bilinear, bicubic, trilinear)", "raises"),
    ("torch.nn.NLLLoss", "when called on a CUDA tensor", "raises"),
    ("torch.nn.EmbeddingBag", "when attempting to differentiate a CUDA tensor when mode='max'",
     "raises"),
    ("torch.histc", "when called on a CUDA tensor", "raises"),
    ("torch.bincount", "when called on a CUDA tensor and weights tensor is given", "raises"),
    ("torch.median", "with indices output when called on a CUDA tensor", "raises"),
    ("torch.nn.functional.grid_sample", "when attempting to differentiate a CUDA tensor",
     "raises"),
    ("torch.cumsum", "when called on a CUDA tensor when dtype is floating point or complex",
     "raises"),
)

_CUBLAS = ("mm", "addmm", "bmm", "baddbmm", "addbmm")
_CUBLAS_WHEN = ("on CUDA unless CUBLAS_WORKSPACE_CONFIG is :4096:8 or :16:8 (the recipe sets "
                "it; the switch raises without it)")


@dataclass(frozen=True)
class Rule:
    """Why an aten op is listed: the documented name, its condition, what the switch does."""

    kind: str
    """``raises`` (no deterministic implementation) or ``switched`` (nondeterministic default)."""
    documented: str
    when: str


@dataclass(frozen=True)
class OpTable:
    rules: dict[str, list[Rule]]
    """aten base name (``index_add_``) → the documented entries that cover it."""
    source: str
    """``torch docstring (torch X.Y)`` or ``maintained table (…)``."""
    unmapped: list[str]
    """Documented names the aten map does not know (a newer torch's additions)."""


def _clean(text: str) -> str:
    return " ".join(text.replace("``", "").replace("`", "").replace("-", " ").split())


def parse_docstring(doc: str) -> list[tuple[str, str, str]] | None:
    """(documented name, condition, kind) from the docstring, or None if it lost its shape."""
    marker = "throw a\n    :class:`RuntimeError` when ``mode=True``"
    head, sep, tail = doc.partition(marker)
    if not sep or _DOC_SWITCHED not in head:
        return None
    switched_text = head.split(_DOC_SWITCHED, 1)[1].split("The following", 1)[0]
    raises_text = tail.split("In addition", 1)[0]
    found = [(m.group(1), _clean(m.group(2)), "switched")
             for m in _BULLET.finditer(switched_text)]
    found += [(m.group(1), _clean(m.group(2)), "raises") for m in _BULLET.finditer(raises_text)]
    kinds = {k for _, _, k in found}
    return found if kinds == {"switched", "raises"} else None


def load_table(torch_module: Any | None = None) -> OpTable:
    """The table from the installed torch's docstring where readable, else the fallback."""
    entries = None
    version = None
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError:
            torch_module = None
    if torch_module is not None:
        version = str(getattr(torch_module, "__version__", "?"))
        doc = getattr(getattr(torch_module, "use_deterministic_algorithms", None), "__doc__", "")
        entries = parse_docstring(doc or "")
    if entries is not None:
        source = f"torch docstring (torch.use_deterministic_algorithms, torch {version})"
    else:
        entries = list(_FALLBACK)
        why = "torch not importable" if torch_module is None else "its docstring lost its lists"
        source = f"maintained table (torch 2.13 docs; {why})"
    rules: dict[str, list[Rule]] = {}
    unmapped: list[str] = []
    for name, when, kind in entries:
        ops = _ATEN.get(name)
        if ops is None:
            unmapped.append(name)
            continue
        for op in ops:
            rule = Rule(kind, name, when)
            if rule not in rules.setdefault(op, []):
                rules[op].append(rule)
    for op in _CUBLAS:
        rules.setdefault(op, []).append(Rule("switched", "cuBLAS matmul", _CUBLAS_WHEN))
    return OpTable(rules, source, sorted(set(unmapped)))


def base_name(op: str) -> str:
    """``aten::index_add_.default`` → ``index_add_``."""
    return op.removeprefix("aten::").split(".", 1)[0]
