"""Per-tensor digests of weight files, and comparing them, without unpickling."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from manifest.weights.compare import compare_artifacts, numeric_delta
from manifest.weights.raw import RawTensor, hash_bytes
from manifest.weights.tables import digest_artifact


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_same_tensors_in_safetensors_torch_state_dict_and_whole_module(tmp_path: Path) -> None:
    m = _model()
    tensors = {k: v.contiguous() for k, v in m.state_dict().items()}
    save_file(tensors, str(tmp_path / "a.safetensors"))
    torch.save(m.state_dict(), tmp_path / "b.pt")
    torch.save(m, tmp_path / "c.pt")
    a = digest_artifact(tmp_path / "a.safetensors", "a")
    b = digest_artifact(tmp_path / "b.pt", "b")
    c = digest_artifact(tmp_path / "c.pt", "c")
    assert (a.format, b.format, c.format) == ("safetensors", "torch", "torch")
    assert a.tensors == b.tensors == c.tensors
    assert a.tensors is not None
    w = m.state_dict()["0.weight"]
    assert a.tensors["0.weight"].digest == hash_bytes(w.numpy().tobytes())
    assert a.tensors["1.num_batches_tracked"].dtype == "int64"


def test_file_name_changes_file_digest_not_tensor_digests(tmp_path: Path) -> None:
    m = _model()
    torch.save(m.state_dict(), tmp_path / "one.pt")
    torch.save(m.state_dict(), tmp_path / "two.pt")
    one = digest_artifact(tmp_path / "one.pt", "one.pt")
    two = digest_artifact(tmp_path / "two.pt", "two.pt")
    assert one.digest != two.digest
    assert one.tensors == two.tensors


def test_non_contiguous_and_shared_storage_views(tmp_path: Path) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    torch.save({"t": base.t(), "row": base[2], "all": base}, tmp_path / "v.pt")
    art = digest_artifact(tmp_path / "v.pt", "v")
    assert art.tensors is not None
    assert art.tensors["t"].digest == hash_bytes(base.t().contiguous().numpy().tobytes())
    assert art.tensors["row"].digest == hash_bytes(base[2].numpy().tobytes())
    assert art.tensors["t"].shape == [6, 4]


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("touch PWNED",))


def test_malicious_pickle_in_archive_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(evil, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = pickle.dumps({"w": _Evil()}, protocol=2)
            dst.writestr(info, data)
    art = digest_artifact(evil, "evil.pt")
    assert not (tmp_path / "PWNED").exists()
    assert art.format == "torch" and art.tensors == {}


def test_garbage_weight_file_falls_back_to_file_digest(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    art = digest_artifact(path, "x")
    assert art.format == "file" and art.tensors is None
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert digest_artifact(empty, "empty").bytes == 0


def _raw(name: str, t: torch.Tensor) -> RawTensor:
    dtype = str(t.dtype).removeprefix("torch.")
    data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return RawTensor(name, dtype, list(t.shape), data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_one_ulp_is_one_ulp_in_every_float_dtype(dtype: torch.dtype) -> None:
    a = torch.tensor([1.0, -2.5, 0.0, 3.0], dtype=dtype)
    b = a.clone()
    b[1] = torch.nextafter(a[1:2].float().to(dtype), torch.tensor([-10.0], dtype=dtype))[0]
    d = numeric_delta(_raw("x", a), _raw("x", b))
    assert (d.elements, d.total, d.max_ulp) == (1, 4, 1)
    assert d.max_abs is not None and d.max_abs > 0


def test_signed_zero_is_a_difference_of_zero_ulp_but_still_a_difference() -> None:
    a = torch.tensor([0.0])
    b = torch.tensor([-0.0])
    d = numeric_delta(_raw("z", a), _raw("z", b))
    assert d.elements == 1 and d.max_ulp == 0 and d.max_abs == 0.0


def test_compare_artifacts_names_dtype_shape_missing_and_extra(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(2)}, str(tmp_path / "1.st"))
    save_file({"a": torch.ones(2, dtype=torch.float64), "b": torch.ones(4), "d": torch.ones(1)},
              str(tmp_path / "2.st"))
    old = digest_artifact(tmp_path / "1.st", "m")
    new = digest_artifact(tmp_path / "2.st", "m")
    delta = compare_artifacts(old, new, recorded_file=tmp_path / "1.st", new_file=tmp_path / "2.st")
    assert not delta.identical
    assert {(t.name, t.change) for t in delta.tensors} == {
        ("a", "dtype"), ("b", "shape"), ("c", "missing"), ("d", "extra")}
