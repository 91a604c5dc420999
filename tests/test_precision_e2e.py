"""``capture --envelope N --precision tf32|bf16`` end to end (issue 37): the envelope runs
emulate the precision in the child (the boot installs ``_manifest_precision`` before the
script's code), and the stored envelope says which precision it covers and how it was
obtained. The positive control is the same capture at fp32: its one-ULP runs start
thousands of times closer to the run than the emulated ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from manifest.errors import EXIT_EQUIVALENT
from manifest.models import Envelope
from manifest.numeric.precision import choose
from tests.runs import capture, make_repo, manifest_cli

pytestmark = pytest.mark.slow

SCRIPT = """\
from pathlib import Path
import torch
from safetensors.torch import save_file
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(256, 32)
y = x.sum(1, keepdim=True)
for step in range(8):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
Path("out").mkdir(exist_ok=True)
save_file(dict(model.state_dict()), "out/model.safetensors")
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One repository captured twice: a float32 envelope and a TF32 (emulated) one."""
    repo = make_repo(tmp_path_factory.mktemp("precision") / "repo", {"fit.py": SCRIPT},
                     example=False)
    command = ["python", "fit.py"]
    fp32_path, fp32 = capture(repo, "--threads", "1", "--envelope", "2", command=command,
                              name="fp32.json")
    tf32_path, tf32 = capture(repo, "--threads", "1", "--envelope", "4", "--precision",
                              "tf32", command=command, name="tf32.json")
    return {"repo": repo, "fp32": fp32, "tf32": tf32, "fp32_path": fp32_path,
            "tf32_path": tf32_path}


def _verify(captured: dict[str, Any], which: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = manifest_cli("verify", "--json", "-q", *args, str(captured[f"{which}_path"]),
                        cwd=captured["repo"])
    assert "Traceback" not in proc.stderr.decode()
    return proc.returncode, json.loads(proc.stdout)


def _first_step(envelope: Envelope) -> float:
    return min(d for g in envelope.steps[0].groups for d in g)


def test_capture_measures_the_envelope_at_the_emulated_precision(
        captured: dict[str, Any]) -> None:
    fine = Envelope.model_validate(captured["fp32"]["outputs"]["envelope"])
    coarse = Envelope.model_validate(captured["tf32"]["outputs"]["envelope"])
    assert fine.precision is None and coarse.precision == "tf32" and coarse.how == "emulated"
    # the runs did emulate TF32 in the child: they start far beyond what one ULP does
    assert _first_step(coarse) > 100 * max(d for g in fine.steps[0].groups for d in g)
    assert captured["tf32"]["run_id"] == captured["fp32"]["run_id"]  # outside identity
    assert choose([fine, coarse], "fp32", "tf32").envelope == coarse
    assert choose([fine], "fp32", "tf32").envelope is None


def test_a_tf32_emulated_rerun_is_equivalent_against_the_tf32_envelope(
        captured: dict[str, Any]) -> None:
    code, report = _verify(captured, "tf32", "--emulate", "tf32")
    assert report["verdict"] == "equivalent", report.get("reason")
    assert code == EXIT_EQUIVALENT
    said = report["numeric"]["precision"]
    assert said["covers"] == "tf32" and said["how"] == "emulated"
    assert "smallest change" in said["resolution"]


def test_no_envelope_covers_a_coarser_rerun(captured: dict[str, Any]) -> None:
    """Neither a false ``differs`` of the numbers nor a false ``equivalent``: not judged."""
    for which, emulate, have in (("fp32", "tf32", "fp32"), ("tf32", "bf16", "tf32")):
        code, report = _verify(captured, which, "--emulate", emulate)
        assert report["verdict"] != "equivalent" and code != EXIT_EQUIVALENT
        numeric = report["numeric"]
        assert numeric["verdict"] == "not-compared"
        assert f"no envelope covers {emulate}" in numeric["reason"]
        assert f"envelopes are at {have}" in numeric["reason"]


def test_emulate_with_a_verifier_envelope_is_one_sentence_and_exit_2(
        captured: dict[str, Any]) -> None:
    proc = manifest_cli("verify", "--emulate", "tf32", "--envelope", "3",
                        str(captured["tf32_path"]), cwd=captured["repo"])
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "--emulate" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_precision_is_one_sentence_and_exit_2(captured: dict[str, Any]) -> None:
    proc = manifest_cli("capture", "--envelope", "2", "--precision", "fp8", "--",
                        "python", "fit.py", cwd=captured["repo"])
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "fp8" in err and "Traceback" not in err
