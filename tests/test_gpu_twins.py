"""CPU twins of the branches only a CUDA device reaches (issue 27).

Each test runs the product's own code down the path a GPU takes:
* the op recorder's deferred device sums, switched on for CPU tensors by
  ``MANIFEST_OPS_DEVICE_SUMS=1`` (the same ``_device_sum``/``resolve`` code);
* the read of each CUDA generator's state at first use, under a fake CUDA
  *driver* (``tests/fakes/cuda_driver.py``): torch's own lazy init, queue and
  seeding run above it.
NVML's energy counter has its twin in ``test_compute_record.py`` (the fake
pynvml in ``conftest.py``).

On the parent of this change both failed as on the H100: explain's re-run died
in ``resolve()`` (``zip() argument 2 is shorter than argument 1``), and two
captures of one command got two run_ids (``randomness…at_start.cuda``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.runs import capture, make_repo, manifest_cli

DRIVER = Path(__file__).parent / "fakes" / "cuda_driver.py"
DEVICE_SUMS = {"MANIFEST_OPS_DEVICE_SUMS": "1"}


# ------------------------------------------------------- deferred device sums


def _record(device_sums: bool, *, resolve_inside: bool = False) -> tuple[list[Any], Any]:
    import torch

    from manifest.launch.boot import _manifest_ops as ops

    events: list[Any] = []
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    recorder = ops.make_recorder_class()(events.append)
    recorder.fp.device_sums = device_sums
    with recorder:
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if resolve_inside:  # as a caller may, between steps, with the mode still on
                recorder.fp.resolve()
    return events, ops


def test_device_sums_never_record_the_recorders_own_ops() -> None:
    plain, _ = _record(device_sums=False)
    deferred, ops = _record(device_sums=True)
    assert [e.op for e in deferred] == [e.op for e in plain]
    texts = [ops.fingerprint_text(f) for e in deferred for f in e.inputs + e.outputs]
    assert texts and all(t.startswith("s") and len(t) == 33 for t in texts
                         if t != "empty" and not t.startswith("="))  # "=": a number argument
    # The CPU path hashes bytes: the two fingerprints are different functions of a tensor.
    assert ops.fingerprint_text(plain[0].outputs[0]) != ops.fingerprint_text(deferred[0].outputs[0])


def test_resolving_inside_the_window_records_nothing_and_agrees() -> None:
    once, ops = _record(device_sums=True)
    stepwise, _ = _record(device_sums=True, resolve_inside=True)
    assert [e.op for e in stepwise] == [e.op for e in once]
    assert [[ops.fingerprint_text(f) for f in e.outputs] for e in stepwise] == \
           [[ops.fingerprint_text(f) for f in e.outputs] for e in once]


# ------------------------------------------- memory no op wrote (torch.empty)
# Found on the H100: with the deterministic switch off, explain named
# aten::empty.memory_format as the first op that computed differently. An empty-like
# op returns whatever its block held (CUDA's caching allocator hands back an earlier
# tensor's bytes), so its output is no value of the run. Here each run's leftovers are
# put into the fresh buffer from outside torch's ops (numpy), as the allocator would.


def _stream(events: list[Any]) -> list[Any]:
    """The recorder's events as explain reads them (fingerprints as text)."""
    from manifest.launch.boot._manifest_ops import fingerprint_text
    from manifest.ops.stream import Op

    return [Op(e.seq, e.step, e.op, e.module, e.module_type, e.where,
               tuple(map(fingerprint_text, e.inputs)), tuple(map(fingerprint_text, e.outputs)),
               e.meta, e.device) for e in events]


def _tensors(entries: tuple[str, ...]) -> tuple[str, ...]:
    from manifest.ops.align import NUMBERS

    return tuple(e for e in entries if not e.startswith(NUMBERS))


def _empty_then_written(leftover: float, device_sums: bool) -> list[Any]:
    import torch

    from manifest.launch.boot import _manifest_ops as ops

    events: list[Any] = []
    recorder = ops.make_recorder_class()(events.append)
    recorder.fp.device_sums = device_sums
    with recorder:
        buf = torch.empty(4096)
        buf.numpy()[:] = leftover  # this run's leftovers (a detach: a view, no value read)
        rows = buf.view(64, 64)  # a view reads no value
        rows.fill_(3.0)  # the first write
        torch.mul(buf, 2, out=torch.empty(4096))  # written through out=
        (buf * 2).sum()
    recorder.fp.resolve()
    return _stream(events)


@pytest.mark.parametrize("device_sums", [False, True], ids=["bytes", "device sums"])
def test_memory_no_op_wrote_is_not_a_value_of_the_run(device_sums: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.launch.boot import _manifest_ops as ops
    from manifest.ops.align import first_divergence

    one, two = _empty_then_written(1.0, device_sums), _empty_then_written(2.0, device_sums)
    by_name = {o.name: o for o in one}
    assert [o.name for o in one][:4] == ["aten::empty.memory_format", "aten::detach",
                                         "aten::view", "aten::fill_.Scalar"]
    assert one[0].outputs == (ops.UNINITIALIZED,)
    view, fill = by_name["aten::view"], by_name["aten::fill_.Scalar"]
    # the tensors' entries (a last "=" entry is the op's number arguments: view's shape,
    # fill's 3.0, the same in both runs)
    assert _tensors(view.inputs) == view.outputs == (ops.UNINITIALIZED,)
    assert _tensors(fill.inputs) == (ops.UNINITIALIZED,) and fill.outputs[0] != ops.UNINITIALIZED
    mul_out = by_name["aten::mul.out"]
    assert _tensors(mul_out.inputs)[-1] == ops.UNINITIALIZED != mul_out.outputs[0]
    assert first_divergence(one, two) is None
    assert one == two  # same fingerprints op for op: nothing of the leftovers is recorded
    # Control: a recorder that takes empty's bytes for a value parts the two runs at the
    # buffer before its first write (at the empty op itself when the allocator's block
    # held other bytes in the second run, as on the H100; else where the leftovers show).
    monkeypatch.setattr(ops, "_UNINIT_OPS", frozenset())
    found = first_divergence(_empty_then_written(1.0, device_sums),
                             _empty_then_written(2.0, device_sums))
    assert found is not None and found.a is not None
    assert found.a.name in ("aten::empty.memory_format", "aten::view", "aten::fill_.Scalar")


def _empty_then_read(value: float) -> list[Any]:
    import torch

    from manifest.launch.boot import _manifest_ops as ops

    events: list[Any] = []
    with ops.make_recorder_class()(events.append):
        buf = torch.empty(16)
        buf.numpy()[:] = value  # data written from outside torch's ops
        (buf * 2).sum()
    return _stream(events)


def test_data_written_into_an_empty_buffer_from_outside_is_still_named() -> None:
    from manifest.ops.align import first_divergence

    a, b = _empty_then_read(1.0), _empty_then_read(2.0)
    found = first_divergence(a, b)
    assert found is not None and found.kind == "input-from-outside"
    assert found.a is not None and found.a.name == "aten::mul.Tensor"


@pytest.mark.slow
def test_explain_names_the_first_op_down_the_device_sum_path(tmp_path: Path) -> None:
    """The H100 failure: runs part, explain's op window must resolve its device sums."""
    repo = make_repo(tmp_path / "repo", {})
    manifest, _ = capture(repo, "--seed", "0", "--threads", "2",
                          command=["python", "train.py", "--steps", "3"])
    proc = manifest_cli("explain", str(manifest), "--json", "--threads", "1", cwd=repo,
                        env=DEVICE_SUMS)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "zip()" not in stderr, stderr
    assert proc.returncode == 1, stderr
    report = json.loads(proc.stdout)
    assert report["first_step"] == 1
    [finding] = report["findings"]
    assert finding["kind"] == "op-differs"
    assert finding["op"].startswith("aten::")
    assert finding["where"].startswith("train.py:")
    # Positive control of the switch: the same explain with it on agrees with itself.
    same = manifest_cli("explain", str(manifest), "--json", cwd=repo, env=DEVICE_SUMS)
    assert same.returncode == 0, same.stderr.decode()
    assert json.loads(same.stdout)["verdict"] == "agree"


# ------------------------------------------- CUDA RNG state at first use (lazy seeding)

# Reseeds before any draw, as makemore does (torch.manual_seed(3407)), then touches
# "CUDA" (torch.cuda.init(), as .cuda() would) and draws from the device's generator.
CUDA_SCRIPT = """
import os, sys
import torch
import cuda_driver

cuda_driver.install()
if not os.environ.get("NO_RESEED"):
    torch.manual_seed(3407)
torch.cuda.init()
noise = torch.randn(4, generator=torch.cuda.default_generators[0])
w = torch.nn.Parameter(torch.randn(4) + noise)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
os.makedirs("out", exist_ok=True)
torch.save({"w": w.detach()}, "out/w.pt")
"""


@pytest.fixture(scope="module")
def cuda_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("twin") / "repo",
                     {"cuda_train.py": CUDA_SCRIPT, "cuda_driver.py": DRIVER.read_text()},
                     example=False)
    return repo


def _cuda_capture(repo: Path, name: str, *extra: str) -> dict[str, Any]:
    _, doc = capture(repo, "--seed", "0", "--threads", "1", *extra,
                     command=["python", "cuda_train.py"], outputs="out/w.pt", name=name)
    return doc


@pytest.mark.slow
@pytest.mark.parametrize("reseed", [True, False], ids=["script-reseeds", "launcher-seed"])
def test_two_captures_on_a_cuda_device_get_one_run_id(cuda_repo: Path, reseed: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if not reseed:
        monkeypatch.setenv("NO_RESEED", "1")
    a = _cuda_capture(cuda_repo, "a.json")
    b = _cuda_capture(cuda_repo, "b.json")
    [pa] = a["randomness"]["processes"]
    [pb] = b["randomness"]["processes"]
    # The device's state was read (the fake driver's path ran), after the queued seed.
    assert pa["at_start"]["cuda"] and len(pa["at_start"]["cuda"]) == 1
    assert pa["at_start"]["cuda"] == pb["at_start"]["cuda"]
    assert a["run_id"] == b["run_id"]
    diff = manifest_cli("diff", str(cuda_repo / "a.json"), str(cuda_repo / "b.json"), "--json",
                        cwd=cuda_repo)
    assert diff.returncode == 0, diff.stdout.decode()


@pytest.mark.slow
def test_the_cuda_state_at_start_follows_the_seed(cuda_repo: Path) -> None:
    """Positive control: the read is a function of the seed, so another seed moves it."""
    a = _cuda_capture(cuda_repo, "s0.json")
    proc = manifest_cli("capture", "--artifact", "out/w.pt", "--seed", "0", "--threads", "1",
                        "--", "python", "cuda_train.py", cwd=cuda_repo, env={"NO_RESEED": "1"})
    assert proc.returncode == 0, proc.stderr.decode()
    launcher_seed = json.loads(proc.stdout)
    [pa] = a["randomness"]["processes"]
    [pl] = launcher_seed["randomness"]["processes"]
    assert pa["at_start"]["cuda"] != pl["at_start"]["cuda"]  # 3407 vs the launcher's 0


@pytest.mark.slow
def test_verify_and_lab_agree_on_a_cuda_device(cuda_repo: Path) -> None:
    """lab's recipe runs are bit-identical, so they must agree on identity too."""
    path = cuda_repo / "v.json"
    _cuda_capture(cuda_repo, "v.json")
    proc = manifest_cli("verify", str(path), "--json", "--no-sandbox", cwd=cuda_repo)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["verdict"] == "identical"
    lab = manifest_cli("lab", "--runs", "2", "--threads", "1", "--json", "--output",
                       "out/w.pt", "--", "python", "cuda_train.py", cwd=cuda_repo)
    assert lab.returncode == 0, lab.stderr.decode()
    doc = json.loads(lab.stdout)
    assert doc["recipe"]["bit_identical"] is True
    assert doc["identity"]["recipe_runs_agree"] is True


# ------------------------------------------------- ULP distances in a report

def test_a_float64_parting_beyond_2_53_ulps_is_written_as_canonical_json() -> None:
    """On an H100, explain's index_add finding failed to print: 'value cannot be written as
    canonical JSON: 40880503745675260 exceeds safe integer domain'. float64 ULP distances
    reach 2^64; a report states at most 2^53-1 ("at least" that)."""
    import struct

    import rfc8785

    from manifest.canonical import canonical_bytes
    from manifest.weights.compare import MAX_REPORTED_ULP, numeric_delta
    from manifest.weights.raw import RawTensor

    a = RawTensor("t", "float64", [2], struct.pack("<2d", 1.0, -1e300))
    b = RawTensor("t", "float64", [2], struct.pack("<2d", 1.0, 1e300))
    delta = numeric_delta(a, b)
    assert delta.elements == 1 and delta.max_ulp == MAX_REPORTED_ULP
    assert canonical_bytes({"max_ulp": delta.max_ulp})
    # Positive control: the raw distance is past what canonical JSON can hold.
    with pytest.raises(Exception, match="safe integer"):
        rfc8785.dumps({"max_ulp": MAX_REPORTED_ULP + 1})
    # float32 distances are exact (never near the cap).
    c = RawTensor("t", "float32", [1], struct.pack("<f", -1.0))
    d = RawTensor("t", "float32", [1], struct.pack("<f", 1.0))
    assert numeric_delta(c, d).max_ulp == 2 * 0x3F800000



def test_a_diverging_loss_past_2_53_survives_a_round_trip(tmp_path: Path) -> None:
    """On an H100 a run without the recipe diverged (loss 4.088e16 at step 2). RFC 8785
    writes that double as the literal 40880508040642560; read back as an int, the manifest
    could not be canonicalised again, so explain refused its own capture (exit 2)."""
    import rfc8785

    from manifest.canonical import dumps, load_manifest, parse_json, seal, to_document

    golden = Path(__file__).parent / "golden" / "manifest_v1.json"
    doc = to_document(load_manifest(golden.read_bytes()))
    doc["observed"]["duration_s"] = 40880508040642560.0  # any float field: a loss, a time
    sealed = seal({k: v for k, v in doc.items() if k not in ("run_id", "digest")})
    data = dumps(sealed)
    assert b"40880508040642560" in data and b"e+16" not in data
    again = load_manifest(data)
    assert dumps(again) == data and again.digest == sealed.digest
    # Positive control: a plain parse makes it an int that canonical JSON refuses.
    plain = json.loads(data)
    with pytest.raises(rfc8785.CanonicalizationError):
        rfc8785.dumps(plain)
    # Safe integers stay ints.
    assert parse_json(b'{"a": 9007199254740991, "b": 1}') == {"a": 2**53 - 1, "b": 1}
