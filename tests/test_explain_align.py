"""Op-stream alignment and the launcher's step fingerprint, without training runs."""

from __future__ import annotations

import json

import pytest

from manifest.launch.boot import _manifest_trail
from manifest.ops.align import first_divergence
from manifest.ops.stream import Op, parse_stream


def op(row: int, name: str, ins: tuple[str, ...], outs: tuple[str, ...],
       module: str = "fc") -> Op:
    return Op(row=row, step=1, name=name, module=module, module_type="Linear",
              where=f"train.py:{10 + row}", inputs=ins, outputs=outs, meta=("float32[2]",),
              device="cpu")


A = [op(0, "aten::t", ("w",), ("wt",)), op(1, "aten::addmm", ("b", "x", "wt"), ("y",)),
     op(2, "aten::relu", ("y",), ("r",))]


def test_identical_streams_do_not_part() -> None:
    assert first_divergence(A, list(A)) is None


def test_first_op_with_equal_inputs_and_different_outputs_is_named() -> None:
    b = [A[0], op(1, "aten::addmm", ("b", "x", "wt"), ("y'",)), op(2, "aten::relu", ("y'",),
                                                                    ("r'",))]
    div = first_divergence(A, b)
    assert div is not None and div.kind == "op-differs"
    assert div.a is not None and div.a.name == "aten::addmm" and div.position == 0


def test_an_input_no_op_produced_came_from_outside() -> None:
    b = [A[0], op(1, "aten::addmm", ("b", "x-noise", "wt"), ("y'",)), A[2]]
    div = first_divergence(A, b)
    assert div is not None and div.kind == "input-from-outside" and div.position == 1


def test_extra_ops_in_one_stream_are_aligned_around() -> None:
    extra = op(9, "aten::clone", ("x",), ("x2",), module="dropout")
    b = [A[0], extra, A[1], A[2]]
    div = first_divergence(A, b)
    assert div is not None and div.kind == "missing" and div.only_in == "b"
    assert div.b is not None and div.b.name == "aten::clone"
    # An extra op whose output feeds the next op is a path difference, not an outside value.
    c = [A[0], extra, op(1, "aten::addmm", ("b", "x2", "wt"), ("y'",)), A[2]]
    div = first_divergence(A, c)
    assert div is not None and div.kind == "paths-differ"


def test_stream_document_round_trips() -> None:
    doc = {"format": "manifest-ops/v1", "rank": 1, "pid": 7, "steps": [3, 3],
           "ops": [[3, "aten::mm", "fc", "Linear", "m.py:4", ["a", "b"], ["c"], ["float32[2]"],
                    "cpu"]]}
    stream = parse_stream(json.dumps(doc).encode())
    assert stream.rank == 1 and stream.steps == (3, 3)
    assert stream.step(3)[0].key == ("aten::mm", "fc")


def test_trail_keeps_every_step_to_1000_then_thins() -> None:
    kept = [s for s in range(1, 100_001) if _manifest_trail.keep_point(s, "sampled")]
    assert kept[:1000] == list(range(1, 1001))
    assert 1010 in kept and 1011 not in kept and 10_100 in kept and 10_110 not in kept
    assert len(kept) < 3000
    assert all(_manifest_trail.keep_point(s, "all") for s in (1001, 12345))


def test_step_fingerprint_sees_one_ulp() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _manifest_trail.optimizer_fingerprint(opt)
    assert _manifest_trail.optimizer_fingerprint(opt) == before
    with torch.no_grad():
        model.weight.view(torch.int32)[2, 3] += 1
    assert _manifest_trail.optimizer_fingerprint(opt) != before
    # A parameter replaced by a new tensor (p.data = ...) is seen too, not a stale view.
    with torch.no_grad():
        model.bias.data = model.bias.data.clone() + 1
    assert _manifest_trail.optimizer_fingerprint(opt) != before


def test_an_in_place_write_through_a_view_is_blamed_on_the_extra_op() -> None:
    # Run b wrote one element through an integer view: the weight's bytes changed
    # but no op returned the weight, so the next reader's input looks "from outside".
    plant = op(9, "aten::add_.Tensor", ("elem",), ("elem+1",), module="")
    b = [plant, op(0, "aten::t", ("w+ulp",), ("wt'",)), A[1], A[2]]
    div = first_divergence(A, b)
    assert div is not None and div.kind == "missing" and div.b == plant
    # Positive control: without the extra op the same difference is an outside value.
    c = [op(0, "aten::t", ("w+ulp",), ("wt'",)), A[1], A[2]]
    control = first_divergence(A, c)
    assert control is not None and control.kind == "input-from-outside"
