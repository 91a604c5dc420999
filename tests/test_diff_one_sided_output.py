"""diff's `equivalent` covers every declared output of both runs: an output only B
declares was never compared, so the pair is not `equivalent` (exit 1, the numeric
verdict says which output). The control: the same pair without B's extra output is
`equivalent` (exit 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from manifest.canonical import load_manifest, seal, to_document  # noqa: E402
from manifest.diff.engine import diff_manifests  # noqa: E402
from manifest.models import Envelope, EnvelopeStep, Manifest, NumericPoint  # noqa: E402
from manifest.trust import record_sealed  # noqa: E402
from manifest.weights.tables import digest_artifact  # noqa: E402

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"
RUNS = ["1 ULP (seed 11)", "1 ULP (seed 12)", "1 ULP (seed 13)", "threads 2 → 1"]
ENVELOPE = Envelope(runs=RUNS, steps=[
    EnvelopeStep(step=t, loss=[1e-7 * 2**t * f for f in (1, 1.2, .9, 1.1)],
                 groups=[[6e-8 * 2**t * f for f in (1, 1.3, .8, 1.1)]]) for t in range(1, 6)])
TRAIL = [NumericPoint(step=t, loss=2.0 - t / 10, loss_eps=1.19e-7,
                      groups=[[3.0 + t] + [0.1 * i for i in range(16)]]) for t in range(1, 6)]


def _run(tmp: Path, name: str, *, cudnn: str | None, extra: bool) -> tuple[Manifest, Path]:
    repo = tmp / name
    (repo / ".git").mkdir(parents=True)
    (repo / "out").mkdir()
    nudge = 0.0 if cudnn is None else 1e-6  # rounding-sized, well inside the bound
    weights = {"fc.weight": torch.ones(4, 8) + nudge, "fc.bias": torch.zeros(4)}
    safetensors_torch.save_file(weights, str(repo / "out/model.safetensors"))
    artifacts = [digest_artifact(repo / "out/model.safetensors", "out/model.safetensors")]
    if extra:
        safetensors_torch.save_file({"x": torch.full((3,), 1e6)},
                                    str(repo / "out/extra.safetensors"))
        artifacts.append(digest_artifact(repo / "out/extra.safetensors",
                                         "out/extra.safetensors"))
    doc: dict[str, Any] = to_document(load_manifest(GOLDEN.read_bytes()))
    doc["outputs"]["artifacts"] = [a.model_dump(mode="json") for a in artifacts]
    process = dict(doc["outputs"]["processes"][0])
    process["numeric"] = [p.model_dump(mode="json") for p in TRAIL]
    doc["outputs"]["processes"] = [process]
    doc["outputs"]["envelope"] = ENVELOPE.model_dump(mode="json", exclude_none=True)
    doc["command"]["outputs"] = ["out/*.safetensors"]
    if cudnn is not None:
        doc["env"]["cudnn"] = cudnn  # another cuDNN build: rounding only
    sealed = seal({k: v for k, v in doc.items() if k not in ("run_id", "digest")})
    record_sealed(sealed.digest)
    return sealed, repo


@pytest.mark.parametrize(("extra", "outputs", "exit_code"),
                         [(True, "differ", 1), (False, "equivalent", 4)])
def test_an_output_only_b_declares_keeps_the_pair_from_equivalent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: bool, outputs: str,
        exit_code: int) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    a, repo_a = _run(tmp_path, "a", cudnn=None, extra=False)
    b, repo_b = _run(tmp_path, "b", cudnn="91000", extra=extra)
    found = diff_manifests(a, b, (repo_a, repo_b))
    assert str(found.outputs) == outputs and found.exit_code == exit_code
    assert found.numeric is not None
    compared = {o["path"]: o["problem"] for o in found.numeric.get("outputs", [])}
    assert compared["out/model.safetensors"] is None  # compared, and inside the bound
    if extra:
        assert "A declares no output" in (compared["out/extra.safetensors"] or "")
        assert found.numeric["verdict"] == "not-compared"
