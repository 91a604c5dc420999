"""The op recorder on tensors that are not plain dense ones, and on its own faults.

In-process, no training subprocess: what ``explain``'s pinpoint runs do inside the
user's step, on sparse COO/CSR tensors, a sparse embedding gradient, nested,
quantized and meta tensors, and numbers passed to ops.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from manifest.launch.boot._manifest_ops import OpEvent, OpRecorder, numbers_text
from manifest.launch.boot._manifest_opstream import StepWindow
from manifest.ops.align import first_divergence
from manifest.ops.findings import compare_streams
from manifest.ops.stream import Op, parse_stream, streams_in

torch = pytest.importorskip("torch")


def record(body: Any) -> list[OpEvent]:
    events: list[OpEvent] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse and nested tensors warn that they are beta
        with OpRecorder(events.append) as recorder:
            body()
    assert recorder.error is None, recorder.error
    return events


def adjacency(value: float) -> Any:
    # Uncoalesced on purpose: index (0, 1) twice.
    idx = torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 1]])
    return torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 3.0, 4.0, value]), (4, 4),
                                   check_invariants=True)


def test_sparse_coo_is_fingerprinted_by_its_stored_indices_and_values() -> None:
    outs: dict[float, list[OpEvent]] = {}
    for value in (5.0, 6.0):
        adj = adjacency(value)
        outs[value] = record(lambda adj=adj: torch.sparse.mm(adj, torch.ones(4, 2)))
    [mm5] = [e for e in outs[5.0] if e.op == "aten::_sparse_addmm"]
    [mm6] = [e for e in outs[6.0] if e.op == "aten::_sparse_addmm"]
    sparse5 = [f for f in mm5.inputs if f.startswith("sparse_coo[4, 4]:")]
    sparse6 = [f for f in mm6.inputs if f.startswith("sparse_coo[4, 4]:")]
    assert sparse5 and sparse6
    # Positive control: one stored value differs, so do the fingerprints (and the product).
    assert sparse5 != sparse6 and mm5.outputs != mm6.outputs
    # The same tensor twice: the same text.
    adj = adjacency(5.0)
    again = record(lambda: torch.sparse.mm(adj, torch.ones(4, 2)))
    assert [f for e in again if e.op == "aten::_sparse_addmm" for f in e.inputs
            if f.startswith("sparse")] == sparse5


def test_every_layout_is_read_or_named_and_the_step_runs_on() -> None:
    def body() -> None:
        adj = adjacency(5.0)
        adj.to_sparse_csr().to_dense()
        torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8).dequantize()
        (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]) * 2).unbind()
        torch.ones(3, device="meta") + 1
        (torch.ones(2, dtype=torch.complex64) * 2).abs()
        torch.ones(()).expand(2, 3).sum()
        emb = torch.nn.Embedding(6, 3, sparse=True)
        emb(torch.tensor([1, 2, 1])).sum().backward()
        torch.optim.SGD(emb.parameters(), lr=0.1).step()

    events = record(body)
    texts = {f for e in events for f in e.inputs + e.outputs}
    assert any(f.startswith("sparse_csr[4, 4]:") for f in texts)
    assert any(f.startswith("quantized(0.1,0):") for f in texts)
    assert any(f.startswith("nested[2]:") for f in texts)
    assert "unreadable: meta" in texts
    assert not any(f in ("~", "unreadable: Tensor") for f in texts)  # complex, expanded: read
    # The sparse gradient of the embedding reaches the optimizer's add_, fingerprinted.
    [update] = [e for e in events if e.op == "aten::add_.Tensor" and e.inputs[1].startswith(
        "sparse_coo[6, 3]:")]
    assert update.module == ""
    assert any("sparse_coo" in m for e in events for m in e.meta)


def test_a_number_argument_is_an_input() -> None:
    x = torch.ones(3)
    a = record(lambda: x + 0.5)
    b = record(lambda: x + 0.25)
    assert a[0].inputs[0] == b[0].inputs[0]
    assert a[0].inputs[1].startswith("=") and a[0].inputs[1] != b[0].inputs[1]
    assert numbers_text((x,), {}) == ""

    def as_op(e: OpEvent) -> Op:
        return Op(row=e.seq, step=1, name=e.op, module="", module_type="", where="m.py:1",
                  inputs=e.inputs, outputs=e.outputs, meta=e.meta, device=e.device)

    div = first_divergence([as_op(a[0])], [as_op(b[0])])
    assert div is not None and div.kind == "input-from-outside" and div.position == 1
    # A stream recorded without the numbers' entry is compared on its tensors only.
    old = Op(row=0, step=1, name=a[0].op, module="", module_type="", where="m.py:1",
             inputs=a[0].inputs[:1], outputs=a[0].outputs, meta=a[0].meta, device="cpu")
    div = first_divergence([old], [as_op(b[0])])
    assert div is not None and div.kind == "op-differs"


def window_run(tmp_path: Path, body: Any, **config: Any) -> dict[str, Any]:
    window = StepWindow({"from": 1, "to": 1, "dir": str(tmp_path),
                         "values_budget": 2**20, **config}, rank=0)
    window.on_step_start(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        body()
    window.on_step_end(1)
    [path] = tmp_path.glob("ops-*.json")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_values_of_a_sparse_step_are_written_and_read_back(tmp_path: Path) -> None:
    def body() -> None:
        w = torch.nn.Parameter(torch.randn(4, 3))
        torch.sparse.mm(adjacency(5.0), w).square().mean().backward()

    doc = window_run(tmp_path, body)
    assert "error" not in doc and len(doc["ops"]) > 5
    [stream] = streams_in(tmp_path).values()
    assert stream.values is not None  # the dense values were kept, the sparse ones skipped
    row = next(op.row for op in stream.ops if op.name == "aten::_sparse_addmm")
    assert stream.tensor(f"o.{row}.0") is not None
    assert stream.ops[row].inputs[1].startswith("sparse_coo[4, 4]:")
    assert stream.tensor(f"i.{row}.1") is None  # compared by its fingerprint only
    assert compare_streams({0: stream}, {0: stream}, 1, "same") == []


def test_a_fault_in_the_recorder_is_kept_and_never_reaches_the_script(tmp_path: Path) -> None:
    calls = []

    def body() -> None:
        x = torch.ones(3) * 2
        calls.append(float((x + 1).sum()))  # the script's ops run on after the fault

    window = StepWindow({"from": 1, "to": 1, "dir": str(tmp_path)}, rank=0)

    def broken(ev: OpEvent) -> None:
        raise ValueError("recorder bug")

    window.on_step_start(1)
    window.recorder.on_op = broken
    body()
    window.on_step_end(1)
    assert calls == [9.0]
    [path] = tmp_path.glob("ops-*.json")
    stream = parse_stream(path.read_bytes())
    assert stream.error is not None and "ValueError: recorder bug" in stream.error
    assert "_manifest_ops.py:" in stream.error
    # Positive control: the same body with a working recorder leaves no error.
    other = tmp_path / "control"
    other.mkdir()
    assert "error" not in window_run(other, body)


def test_the_accelerator_path_fingerprints_a_sparse_tensor_with_its_layout() -> None:
    from manifest.launch.boot._manifest_ops import _Fingerprinter, fingerprint_text

    fp = _Fingerprinter(torch, device_sums=True)  # the CUDA code path, on CPU tensors
    slots = [fp(adjacency(5.0)), fp(adjacency(6.0)), fp(torch.ones(3))]
    fp.resolve()
    five, six, dense = (fingerprint_text(s) for s in slots)
    assert five.startswith("sparse_coo[4, 4]:s") and six.startswith("sparse_coo[4, 4]:s")
    assert five != six  # positive control: one stored value differs
    assert dense.startswith("s") and ":" not in dense  # a dense tensor's text is unchanged


def test_explains_drift_is_folded_as_verifys_and_verbose_lists_every_line() -> None:
    """A cu130 run explained on a cpu build: torch's CUDA libraries fold under its line and
    packages the run never imported into one (``--env run`` listed ~200 such lines)."""
    import io

    from manifest.cli.render_explain import render_explain
    from manifest.explain.pipeline import ExplainReport
    from manifest.verify.report import Drift

    report = ExplainReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"])
    report.drift = [
        Drift("env.torch", "bits", "torch 2.14.1+cu130 → 2.13.0+cpu"),
        *(Drift(f"env.packages[nvidia-{n}]", "bits", f"package nvidia-{n} 13 → not installed")
          for n in ("cublas", "cudnn-cu13", "nccl-cu13")),
        *(Drift(f"env.packages[p{i}]", "benign", f"package p{i} 1 → 2") for i in range(40)),
        Drift("determinism.threads", "bits", "threads 2 → 1")]
    folded, every = io.StringIO(), io.StringIO()
    render_explain(report, folded)
    render_explain(report, every, verbose=True)
    lines = [line for line in folded.getvalue().splitlines() if line.startswith("drift")]
    assert len(lines) == 3, lines
    assert "the CUDA libraries with it differ too (3 package(s)" in lines[0]
    assert "40 packages at another version" in lines[1] and "threads 2 → 1" in lines[2]
    # control: verbose keeps every line
    assert sum(line.startswith("drift") for line in every.getvalue().splitlines()) == 45
