"""``equivalent`` on the verifier's side, bound to the outputs, with no marker (issue 36).

Real CPU training through the CLI, the bundled example captured as
docs/concepts/equivalent.md says (``capture --envelope 3``), with checkpoints:

* the envelope runs leave the recorded checkpoints and outputs on disk, byte for byte,
  and ``verify --at`` replays from them;
* re-runs at threads 1, 3 and 4 are ``equivalent`` against the run's envelope (sealed
  here), and against the verifier's own (``verify --envelope``);
* an unsigned manifest's envelope decides nothing; hostile envelopes are ignored and said so;
* an output moved after training is never ``equivalent`` (the trails alone said it was);
* an envelope run carries nothing in its environment or argv that the real run does not.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from manifest.canonical import dumps, seal
from manifest.launch.runner import PRIVATE_FILE, LaunchSettings
from manifest.trust import record_sealed
from tests.runs import capture, make_repo, manifest_cli

pytestmark = pytest.mark.slow

STEPS = 12
PYPROJECT = '[tool.manifest]\nresume = "--resume {checkpoint}"\n'

MARKER = """\
import json, os, sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def envelope_marker(environ, argv):
    \"\"\"What a script that shapes its own envelope looks for: any word of an envelope run.\"\"\"
    words = ("perturb", "ulp", "envelope")
    seen = " ".join([*environ.keys(), *environ.values(), *argv]).lower()
    try:
        seen += Path("/proc/self/environ").read_bytes().decode(errors="replace").lower()
    except OSError:
        pass
    return any(w in seen for w in words)


if __name__ == "__main__":
    marked = envelope_marker(dict(os.environ), sys.argv)
    with open(os.environ["MARKER_LOG"], "a") as fh:
        fh.write("marker\\n" if marked else "clean\\n")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    lr = 0.05 * (1.05 if marked else 1.0)  # inflates its envelope runs only
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(64, 8)
    for _ in range(6):
        loss = ((model(x) - 1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    Path("out").mkdir(exist_ok=True)
    save_file(dict(model.state_dict()), "out/marker.safetensors")
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("equivalent"),
                     {"pyproject.toml": PYPROJECT, "marker.py": MARKER})


@pytest.fixture(scope="module")
def enveloped(repo: Path) -> tuple[Path, dict[str, Any]]:
    return capture(repo, "--threads", "2", "--envelope", "3",
                   command=["python", "train.py", "--steps", str(STEPS), "--save-every", "4"],
                   name="env.json")


def _digest(path: Path) -> str:
    return "blake3:" + blake3.blake3(path.read_bytes()).hexdigest()


def _verify(repo: Path, path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = manifest_cli("verify", str(path), "--json", *args, cwd=repo)
    assert proc.stdout, proc.stderr.decode()[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def _resealed(repo: Path, doc: dict[str, Any], name: str, *, sealed_here: bool) -> Path:
    """``doc`` re-sealed as its author could (another digest: it was edited, by an hour of
    its record at least), and recorded as sealed here when it was made on this machine."""
    doc = dict(doc, observed=dict(doc["observed"], duration_s=doc["observed"]["duration_s"]
                                  + 3600))
    manifest = seal(doc)
    if sealed_here:  # the author's own machine: what capture records for what it seals
        record_sealed(manifest.digest)
    path = repo / name
    path.write_bytes(dumps(manifest))
    return path


def test_envelope_runs_leave_the_recorded_checkpoints_and_outputs(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    path, doc = enveloped
    checkpoints = [c for c in doc["outputs"]["checkpoints"] if c["artifact"] is not None]
    assert len(checkpoints) >= 3
    for entry in [*checkpoints, *doc["outputs"]["artifacts"]]:
        digest = entry["artifact"]["digest"] if "artifact" in entry else entry["digest"]
        assert _digest(repo / entry["path"]) == digest, entry["path"]
    # the replay that said "checkpoint … changed since capture" now starts from them
    proc = manifest_cli("verify", str(path), "--at", "5", "--json", cwd=repo)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:] + proc.stderr.decode()[-2000:]
    assert "changed since capture" not in proc.stdout.decode()
    assert report["segments"] and all(s["verdict"] == "identical" for s in report["segments"])


@pytest.mark.parametrize("threads", ["1", "3", "4"])
def test_thread_counts_are_equivalent_against_the_sealed_envelope(
        repo: Path, enveloped: tuple[Path, dict[str, Any]], threads: str) -> None:
    path, _ = enveloped
    code, report = _verify(repo, path, "--threads", threads)
    assert (code, report["verdict"]) == (4, "equivalent"), report["reason"]
    numeric = report["numeric"]
    assert numeric["envelope_from"] == "the run's (sealed on this machine)"
    assert numeric["one_in"] >= 100  # what the calibration states, and the sentence says
    assert "1 time in 100" in numeric["sentence"] and numeric["resolution"] > 0
    assert numeric["closest"] <= 1 and numeric["outputs_verdict"] == "inside"
    [output] = numeric["outputs"]
    assert 0 < output["distance"] <= numeric["outputs_bound"]
    assert output["trail"].startswith("agrees with the numeric trail's last point")


def test_the_verifier_measures_its_own_envelope(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    _, doc = enveloped
    unsigned = _resealed(repo, copy.deepcopy(doc), "unsigned.json", sealed_here=False)
    # --trust lets the command run, but vouches for no number the manifest carries
    code, report = _verify(repo, unsigned, "--threads", "3", "--trust")
    assert (code, report["verdict"]) == (1, "differs")
    assert report["numeric"]["envelope_from"] is None
    assert "verify --envelope N" in report["reason"]
    # the same re-run judged against the verifier's own runs: fresh seeds, not the run's
    code, report = _verify(repo, unsigned, "--threads", "3", "--trust", "--envelope", "2")
    assert (code, report["verdict"]) == (4, "equivalent"), report["reason"]
    numeric = report["numeric"]
    assert numeric["envelope_from"].startswith("the verifier's (3 runs here)"), report["notes"]
    # its own runs (the run's envelope may only narrow the bound): two fresh one-ULP seeds
    recorded_runs = set(doc["outputs"]["envelope"]["runs"])
    fresh = [r for r in numeric["envelope_runs"] if r not in recorded_runs]
    assert sorted(r.split(" (seed ")[0] for r in fresh) == ["1 ULP", "1 ULP", "threads 3 → 1"]
    text = manifest_cli("verify", str(unsigned), "--threads", "3", "--trust", "--envelope", "2",
                        cwd=repo)
    assert b"envelope: the verifier's" in text.stdout and b"1 time in" in text.stdout


def _widened(envelope: dict[str, Any], how: str) -> dict[str, Any]:
    out = copy.deepcopy(envelope)
    if how == "x1e6":
        for step in out["steps"]:
            step["loss"] = [d * 1e6 for d in step["loss"]]
            step["groups"] = [[d * 1e6 for d in g] for g in step["groups"]]
    elif how == "spread":
        first = out["steps"][0]
        first["groups"] = [[1e-300, 1.0, 1.0, 1.0][:len(g)] for g in first["groups"]]
    else:
        for step in out["steps"]:
            step["groups"] = []
            step["loss"] = [1.0] * len(step["loss"])
    return out


@pytest.mark.parametrize("how", ["x1e6", "spread", "no-groups"])
def test_a_widened_envelope_never_decides(
        repo: Path, enveloped: tuple[Path, dict[str, Any]], how: str) -> None:
    _, doc = enveloped
    honest = doc["outputs"]["envelope"]
    hostile = copy.deepcopy(doc)
    hostile["outputs"]["envelope"] = _widened(honest, how)
    # positive control: where the honest envelope has distances, the hostile one is at
    # least as wide at every step, so a judge that took it as is would pass whatever the
    # honest one passes (an honest re-run: equivalent) and more
    for mine, theirs in zip(honest["steps"], hostile["outputs"]["envelope"]["steps"],
                            strict=True):
        assert max(theirs["loss"]) >= max(mine["loss"])
    for sealed_here in (False, True):
        path = _resealed(repo, hostile, f"{how}-{sealed_here}.json", sealed_here=sealed_here)
        code, report = _verify(repo, path, "--threads", "3", "--trust")
        assert (code, report["verdict"]) == (1, "differs"), report["reason"]
        assert report["numeric"]["envelope_from"] is None
        if sealed_here:  # its own machine's seal: still refused as data, and said so
            assert any("envelope was ignored" in n for n in report["notes"]), report["notes"]


def test_an_output_moved_after_training_is_never_equivalent(
        repo: Path, enveloped: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from manifest.weights.tables import digest_artifact

    _, doc = enveloped
    [artifact] = doc["outputs"]["artifacts"]
    original = repo / artifact["path"]
    kept = tmp_path / "model.safetensors"
    kept.write_bytes(original.read_bytes())
    try:
        tensors = load_file(str(original))
        tensors["fc.bias"] = tensors["fc.bias"] + torch.full_like(tensors["fc.bias"], 0.5)
        save_file(tensors, str(original))
        moved = copy.deepcopy(doc)
        moved["outputs"]["artifacts"] = [
            digest_artifact(original, artifact["path"]).model_dump(mode="json")]
        path = _resealed(repo, moved, "moved.json", sealed_here=True)
        code, report = _verify(repo, path, "--threads", "3")
    finally:
        original.write_bytes(kept.read_bytes())
    numeric = report["numeric"]
    # positive control: the step trails alone lie inside the envelope (what was judged
    # before, and it said equivalent)
    assert numeric["trail_verdict"] == "equivalent"
    assert (code, report["verdict"]) == (1, "differs"), report["reason"]
    assert numeric["outputs_verdict"] == "outside"
    [output] = numeric["outputs"]
    assert output["worst"] == "fc.bias" and output["distance"] > numeric["outputs_bound"]
    assert "could not be mapped" in output["trail"]  # nor is it the trail's last point
    assert "out/model.safetensors" in report["reason"]


def test_an_absent_output_is_not_compared_and_not_equivalent(
        repo: Path, enveloped: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, doc = enveloped
    original = repo / doc["outputs"]["artifacts"][0]["path"]
    aside = tmp_path / "aside.safetensors"
    original.rename(aside)
    try:
        code, report = _verify(repo, path, "--threads", "3")
    finally:
        aside.rename(original)
    assert report["numeric"]["trail_verdict"] == "equivalent"  # positive control
    # nothing was found to differ, and nothing proved the outputs the same: no verdict
    assert (code, report["verdict"]) == (3, "no-verdict")
    assert report["numeric"]["outputs_verdict"] == "not-compared"
    assert "did not travel with the run" in report["reason"]


def test_rounding_runs_look_like_the_real_run(repo: Path, tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("marker", repo / "marker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = LaunchSettings(seed=0, derivation="same", threads=2, deterministic=True)
    real, envelope_run = tmp_path / "first", tmp_path / "second"
    real.mkdir()
    envelope_run.mkdir()
    env_real = base.child_env(real, base={})
    env_envelope = LaunchSettings(seed=0, derivation="same", threads=2, deterministic=True,
                                  perturb=12345).child_env(envelope_run, base={})
    # positive control: the channel before issue 36 (the seed in MANIFEST_LAUNCH) is seen
    old = dict(env_envelope, MANIFEST_LAUNCH=json.dumps(
        dict(json.loads(env_envelope["MANIFEST_LAUNCH"]), perturb=12345)))
    assert module.envelope_marker(old, ["train.py"])
    # now: the same environment but for the private records directory's name
    swap = {str(envelope_run): str(real)}
    assert {k: swap.get(v, v) for k, v in env_envelope.items()} == env_real
    assert not module.envelope_marker(env_envelope, ["train.py"])
    assert (real / PRIVATE_FILE).stat().st_size == (envelope_run / PRIVATE_FILE).stat().st_size
    # and end to end: the script sees no marker in any envelope run, so it cannot inflate it
    log = tmp_path / "marker.log"
    proc = manifest_cli("capture", "--threads", "2", "--envelope", "2", "--artifact",
                        "out/marker.safetensors", "--", "python", "marker.py", cwd=repo,
                        env={"MARKER_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = log.read_text().split()
    assert lines == ["clean"] * 4  # the run, two one-ULP runs, one thread-count run
    assert len(json.loads(proc.stdout)["outputs"]["envelope"]["runs"]) == 3
    assert os.environ.get("MARKER_LOG") is None


def test_a_run_recorded_on_a_gpu_is_not_judged_by_a_cpu_rerun(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    """Across device types a re-run's rounding moves it as far as small real changes do
    (measured on an H100 and an H200: benchmarks/device_pairs.py), so no envelope decides:
    the numeric verdict is ``not-compared``, with the reason, never ``equivalent``."""
    _, doc = enveloped
    # positive control: the same manifest, re-sealed on this machine with its own devices,
    # is equivalent at another thread count (the envelope decides)
    same = _resealed(repo, copy.deepcopy(doc), "same-device.json", sealed_here=True)
    code, report = _verify(repo, same, "--threads", "3")
    assert (code, report["verdict"]) == (4, "equivalent"), report["reason"]
    on_gpu = copy.deepcopy(doc)
    for process in on_gpu["determinism"]["processes"]:
        process["devices"] = ["NVIDIA H100 80GB HBM3"]
    path = _resealed(repo, on_gpu, "on-gpu.json", sealed_here=True)
    code, report = _verify(repo, path, "--threads", "3")
    assert (code, report["verdict"]) == (1, "differs"), report["reason"]
    numeric = report["numeric"]
    assert numeric["verdict"] == "not-compared" and numeric["envelope_from"] is None
    assert numeric["reason"].startswith(
        "the run computed on 'NVIDIA H100 80GB HBM3' and the re-run on CPU")
    assert "cannot tell rounding from a change" in report["reason"]
