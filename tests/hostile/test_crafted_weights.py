"""Crafted weight files: refused with a sentence, never a crash, never a big allocation.

Each file starts as a real ``torch.save`` archive (or safetensors file) whose
bytes are then patched: ``data.pkl`` is replaced by a pickle that names the
same storage with a hostile offset, size or stride, a storage is deflated into
a zip bomb, and so on. Each case carries a positive control showing the file
is dangerous to a reader that trusts it (an unchecked strided gather
segfaults; plain ``torch.load(weights_only=False)`` runs a planted reduce; the
stride-0 view really claims terabytes) and then that ours refuses it.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from manifest.errors import MalformedArtifactError
from manifest.weights.compare import compare_artifacts
from manifest.weights.tables import digest_artifact
from tests.runs import make_repo, manifest_cli


class _Storage:
    """Stands for the archive's storage 0 in a crafted pickle."""


class _View:
    def __init__(self, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.args = (offset, size, stride)

    def __reduce__(self) -> tuple[Any, ...]:
        return (torch._utils._rebuild_tensor_v2,
                (_Storage(), *self.args, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, "0", "cpu", 16)
        return None


def _pickle(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _archive(tmp: Path, name: str, data_pkl: bytes | None = None, *,
             deflate_storage: bytes | None = None) -> Path:
    """A real torch.save archive of 16 floats, with data.pkl or storage 0 replaced."""
    real = tmp / "real.pt"
    torch.save({"w": torch.arange(16, dtype=torch.float32)}, real)
    out = tmp / name
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl") and data_pkl is not None:
                data = data_pkl
            if info.filename.endswith("/data/0") and deflate_storage is not None:
                info.compress_type = zipfile.ZIP_DEFLATED
                data = deflate_storage
            dst.writestr(info, data)
    return out


def _refused(path: Path) -> str:
    with pytest.raises(MalformedArtifactError) as err:
        digest_artifact(path, path.name)
    text = err.value.diagnostics()
    assert path.name in text and "\n" not in text
    return text


def test_real_archive_is_read(tmp_path: Path) -> None:
    art = digest_artifact(_archive(tmp_path, "ok.pt", _pickle({"w": _View(0, (4, 4), (4, 1))})),
                          "ok.pt")
    assert art.tensors is not None and art.tensors["w"].shape == [4, 4]
    t = digest_artifact(_archive(tmp_path, "t.pt", _pickle({"w": _View(0, (4, 4), (1, 4))})), "t")
    assert t.tensors is not None and t.tensors["w"].digest != art.tensors["w"].digest


def test_huge_stride_is_refused_where_an_unchecked_gather_segfaults(tmp_path: Path) -> None:
    path = _archive(tmp_path, "stride.pt", _pickle({"w": _View(0, (4, 4), (10**12, 1))}))
    # Positive control: what the reader did before the bound check (as_strided over the
    # storage with the file's stride) kills the process.
    control = subprocess.run([sys.executable, "-c", (
        "import numpy as np; raw = np.zeros(16, dtype='V4'); "
        "v = np.lib.stride_tricks.as_strided(raw, shape=(4, 4), strides=(4 * 10**12, 4)); "
        "np.ascontiguousarray(v).tobytes()")], capture_output=True, check=False)
    assert control.returncode < 0  # SIGSEGV / SIGBUS
    assert "reaches element" in _refused(path)


def test_offset_and_size_past_the_storage_are_refused(tmp_path: Path) -> None:
    assert "reaches element" in _refused(
        _archive(tmp_path, "offset.pt", _pickle({"w": _View(10**6, (4,), (1,))})))
    assert "reaches element" in _refused(
        _archive(tmp_path, "size.pt", _pickle({"w": _View(0, (17,), (1,))})))
    assert "2**53-1" in _refused(
        _archive(tmp_path, "neg.pt", _pickle({"w": _View(0, (4,), (-1,))})))
    assert "2**53-1" in _refused(
        _archive(tmp_path, "dims.pt", _pickle({"w": _View(0, (0, 2**60), (1, 1))})))


def test_stride_zero_view_claims_terabytes_and_allocates_nothing(tmp_path: Path) -> None:
    path = _archive(tmp_path, "zero.pt", _pickle({"w": _View(0, (2**20, 2**20), (0, 0))}))
    # Positive control: torch reads it back as a 4 TiB view.
    t = torch.load(path, weights_only=True)["w"]
    assert t.numel() * t.element_size() == 4 * 2**40
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from manifest.weights.tables import digest_artifact\n"
        "from manifest.errors import MalformedArtifactError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    digest_artifact(Path({str(path)!r}), 'zero.pt')\n"
        "except MalformedArtifactError as exc:\n"
        "    print(exc.message)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    message, grown_kib = proc.stdout.strip().splitlines()
    assert "more than 4x the file size" in message
    assert int(grown_kib) < 64 * 1024  # < 64 MiB, not 149 GiB (or 4 TiB)


def test_zip_bomb_storage_is_refused(tmp_path: Path) -> None:
    bomb = b"\0" * (64 << 20)
    path = _archive(tmp_path, "bomb.pt", deflate_storage=bomb)
    assert path.stat().st_size < 1 << 20  # positive control: 64 MiB in well under 1 MiB
    with zipfile.ZipFile(path) as zf:
        assert zf.read(next(n for n in zf.namelist() if n.endswith("data/0"))) == bomb
    assert "more than 4x the file size" in _refused(path)


def test_deep_pickle_is_refused(tmp_path: Path) -> None:
    depth = 50_000
    # ``[[[…{}…]]]`` written opcode by opcode (pickle.dumps itself would recurse).
    data = b"\x80\x02" + b"]" * depth + b"}" + b"a" * depth + b"."
    built = pickle.loads(data)  # the C unpickler builds it without recursing

    # Positive control: a naive recursive walk of what the file builds overflows.
    def walk(x: Any) -> int:
        return 1 + walk(x[0]) if isinstance(x, list) and x else 0

    with pytest.raises(RecursionError):
        walk(built)
    assert "deep" in _refused(_archive(tmp_path, "deep.pt", data))


def test_counted_bytes_that_claim_more_than_the_pickle_holds(tmp_path: Path) -> None:
    claim = b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"xx."  # BINBYTES8 of 2**62 bytes
    with pytest.raises((MemoryError, OverflowError, pickle.UnpicklingError)):
        pickle.loads(claim)  # positive control: the C unpickler takes the claim at its word
    art = digest_artifact(_archive(tmp_path, "claim.pt", claim), "claim.pt")
    assert art.format == "file" and art.tensors is None  # not a readable pickle: file digest


def test_truncated_archive_is_a_plain_file(tmp_path: Path) -> None:
    whole = _archive(tmp_path, "whole.pt").read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(RuntimeError):
        torch.load(cut, weights_only=True)  # positive control: torch cannot read it either
    art = digest_artifact(cut, "cut.pt")
    assert art.format == "file" and art.tensors is None


def test_planted_reduce_runs_under_torch_load_never_under_ours(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.makedirs, (str(marker),))

    path = _archive(tmp_path, "evil.pt", pickle.dumps({"w": Evil()}, protocol=2))
    digest_artifact(path, "evil.pt")
    assert not marker.exists()
    torch.load(path, weights_only=False)  # positive control: plain torch.load runs it
    assert marker.is_dir()


def _safetensors(path: Path, header: dict[str, Any], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(("entry", "reason"), [
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 10**9]}, "outside the file"),
    ({"dtype": "F32", "shape": [10**15], "data_offsets": [0, 16]}, "but 16 bytes"),
    ({"dtype": "F32", "shape": [2**60, 0], "data_offsets": [0, 0]}, "2**53-1"),
    ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "2**53-1"),
    ({"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}, "not a sequence"),
])
def test_lying_safetensors_headers_are_refused(tmp_path: Path, entry: dict[str, Any],
                                               reason: str) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = _safetensors(tmp_path / "x.safetensors", {"w": entry}, b"\0" * 16)
    with pytest.raises((SafetensorError, ValueError, TypeError)):
        load_file(str(path))  # positive control: the reference reader rejects it too
    assert reason in _refused(path)


def test_corrupt_artifacts_in_verify_are_differences_not_errors(tmp_path: Path) -> None:
    good = _archive(tmp_path, "good.pt", _pickle({"w": _View(0, (8,), (2,))}))
    bad = _archive(tmp_path, "bad.pt", _pickle({"w": _View(0, (4, 4), (10**12, 1))}))
    recorded = digest_artifact(good, "m.pt")
    rerun = digest_artifact(bad, "m.pt", malformed_ok=True)  # verify's re-run
    assert rerun.format == "file" and rerun.tensors is None
    assert not compare_artifacts(recorded, rerun, recorded_file=good, new_file=bad).identical
    # The recorded original, now corrupt on disk: differences are named by digest.
    other = digest_artifact(_archive(tmp_path, "o.pt", _pickle({"w": _View(1, (8,), (2,))})), "m")
    delta = compare_artifacts(recorded, other, recorded_file=bad, new_file=good)
    assert not delta.identical and delta.detail is not None


@pytest.mark.slow
def test_capture_and_verify_end_to_end(tmp_path: Path) -> None:
    bad = _archive(tmp_path, "bad.pt", _pickle({"w": _View(0, (4, 4), (10**12, 1))}))
    good = _archive(tmp_path, "good.pt", _pickle({"w": _View(0, (16,), (1,))}))
    job = ("import os, shutil\nos.makedirs('out', exist_ok=True)\n"
           "shutil.copy('bad.bin' if os.environ.get('CRAFT') else 'good.bin', 'out/m.pt')\n")
    repo = make_repo(tmp_path / "repo", {"job.py": job}, example=False)
    (repo / "bad.bin").write_bytes(bad.read_bytes())
    (repo / "good.bin").write_bytes(good.read_bytes())
    from tests.runs import git

    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "weights")
    refused = manifest_cli("capture", "--artifact", "out/*.pt", "--", "python", "job.py",
                           cwd=repo, env={"CRAFT": "1"})
    assert refused.returncode == 2
    assert refused.stderr.decode().startswith("manifest: out/m.pt looks like a torch weight")
    assert b"Traceback" not in refused.stderr and b"internal error" not in refused.stderr
    ok = manifest_cli("capture", "--artifact", "out/*.pt", "--", "python", "job.py", cwd=repo)
    assert ok.returncode == 0, ok.stderr.decode()
    (repo / "run.json").write_bytes(ok.stdout)
    again = manifest_cli("verify", "--trust", "run.json", cwd=repo)
    assert again.returncode == 0, again.stderr.decode()
    differs = manifest_cli("verify", "--trust", "run.json", cwd=repo, env={"CRAFT": "1"})
    assert differs.returncode == 1, differs.stderr.decode()
    assert b"differs" in differs.stdout and b"internal error" not in differs.stderr
