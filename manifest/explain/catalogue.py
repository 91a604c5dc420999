"""Ops that torch documents as nondeterministic with ``use_deterministic_algorithms`` off.

From the documentation of ``torch.use_deterministic_algorithms`` (torch
2.13): on CUDA these ops either pick a deterministic kernel when the switch
is on (``switched``) or raise (``raises``); with the switch off they may
give different bits from run to run (atomic adds in an order the scheduler
decides). On CPU torch lists none of them (and raises for none: measured
here, ``index_add_``, ``scatter_add_`` and ``put_(accumulate=True)`` all
run under the switch), so a CPU difference comes from elsewhere: thread
count, library, hardware, or an input.
"""

from __future__ import annotations

_SWITCHED_ON_CUDA = frozenset({
    "aten::index_add", "aten::index_add_", "aten::index_select_backward",
    "aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
    "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_put", "aten::index_put_",
    "aten::_index_put_impl_", "aten::put_", "aten::index_copy", "aten::index_copy_",
    "aten::gather_backward", "aten::embedding_dense_backward", "aten::_embedding_bag_backward",
    "aten::cumsum", "aten::cumsum_", "aten::bmm", "aten::mm", "aten::addmm",
    "aten::convolution", "aten::convolution_backward", "aten::_ctc_loss_backward",
    "aten::upsample_linear1d_backward", "aten::upsample_bilinear2d_backward",
    "aten::upsample_bicubic2d_backward", "aten::upsample_trilinear3d_backward",
    "aten::adaptive_avg_pool2d_backward", "aten::adaptive_avg_pool3d_backward",
    "aten::adaptive_max_pool2d_backward", "aten::max_pool3d_with_indices_backward",
    "aten::avg_pool3d_backward", "aten::fractional_max_pool2d_backward",
    "aten::fractional_max_pool3d_backward", "aten::reflection_pad1d_backward",
    "aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward",
    "aten::replication_pad1d_backward", "aten::replication_pad2d_backward",
    "aten::replication_pad3d_backward", "aten::nll_loss2d_forward",
    "aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward",
    "aten::histc", "aten::bincount", "aten::kthvalue", "aten::median",
    "aten::_embedding_bag", "aten::multilabel_margin_loss_forward",
})
"""aten names (overload stripped) documented for CUDA; mm/bmm/conv only through
cuBLAS workspace and cuDNN algorithm choice."""


def listed_nondeterministic(op: str, device: str) -> bool:
    """Whether torch documents ``op`` (``aten::name[.overload]``) as nondeterministic there."""
    if not device.startswith("cuda"):
        return False
    return op.split(".", 1)[0] in _SWITCHED_ON_CUDA
