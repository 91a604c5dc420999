"""``manifest explain``: the step, op, module and line where two real CPU runs part (issue 13)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.runs import capture, free_port, make_repo, manifest_cli

pytestmark = pytest.mark.slow

# A training loop whose forward adds noise from os.urandom at step 3 only, on
# the line marked NOISE; with PLANT_ULP set, one weight moves by one ULP just
# before step 5 (through a bit view, outside autograd).
NOISY = """
import os, sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.step = 0

    def forward(self, x):
        if self.step == 3 and os.environ.get("NOISE"):
            x = x + torch.tensor(list(os.urandom(8)), dtype=torch.float32) / 255  # NOISE
        return self.lin(x)


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
data = torch.randn(16, 8)
for step in range(1, 8):
    net.step = step
    if step == 5 and os.environ.get("PLANT_ULP"):
        with torch.no_grad():
            net.lin.weight.view(torch.int32)[0, 0] += 1  # PLANT
    loss = net(data).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def explain(repo: Path, manifest: Path, *args: str,
            env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("explain", str(manifest), "--json", *args, cwd=repo, env=env)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr, stderr
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {}), stderr


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    repo = make_repo(tmp_path_factory.mktemp("explain") / "repo", {"noisy.py": NOISY},
                     example=False)
    path, _ = capture(repo, "--seed", "1", "--threads", "1", command=["python", "noisy.py"],
                      outputs="noisy.py")
    return repo, path


def test_faithful_runs_do_not_part(noisy: tuple[Path, Path]) -> None:
    repo, manifest = noisy
    code, report, stderr = explain(repo, manifest)
    assert code == 0, stderr
    assert report["verdict"] == "agree"
    assert report["findings"] == []
    assert "do not part" in report["reason"]


def test_urandom_noise_is_named_at_its_step_and_line(noisy: tuple[Path, Path]) -> None:
    repo, manifest = noisy
    code, report, stderr = explain(repo, manifest, env={"NOISE": "1"})
    assert code == 1, stderr
    assert report["first_step"] == 3
    assert report["cause"] == "outside-input"
    [finding] = report["findings"]
    assert finding["kind"] == "input-from-outside"
    assert finding["where"] == f"noisy.py:{line_of(NOISY, '# NOISE')}"
    assert finding["module"] == "" and finding["module_type"] == "Net"
    # Positive control: without the noise the same script does not part (test above).


def test_planted_ulp_before_step_5_is_found_at_step_5(noisy: tuple[Path, Path]) -> None:
    repo, manifest = noisy
    code, report, stderr = explain(repo, manifest, env={"PLANT_ULP": "1"})
    assert code == 1, stderr
    # Both fresh runs carry the plant, the record does not: an input, not nondeterminism.
    assert report["first_step"] == 5
    assert report["recorded_step"] == 5
    assert report["cause"] == "environment"
    assert "not nondeterminism" in report["reason"]
    assert report["findings"] == []  # no recorded op stream to name an op against


def test_recorded_op_stream_names_the_plant_the_record_lacks(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"noisy.py": NOISY}, example=False)
    manifest, _ = capture(repo, "--seed", "1", "--threads", "1", "--fingerprint-ops", "7",
                          command=["python", "noisy.py"], outputs="noisy.py")
    code, report, stderr = explain(repo, manifest, env={"PLANT_ULP": "1"})
    assert code == 1, stderr
    assert report["first_step"] == 5 and report["cause"] == "environment"
    [finding] = report["findings"]
    assert finding["compared"] == "recorded op stream vs run A"
    assert finding["kind"] in {"paths-differ", "missing"}
    assert finding["where"] == f"noisy.py:{line_of(NOISY, '# PLANT')}"


def test_example_threads_names_the_first_op_that_differs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    manifest, _ = capture(repo, "--seed", "0", "--threads", "2",
                          command=["python", "train.py", "--steps", "4"])
    code, report, stderr = explain(repo, manifest, "--threads", "1")
    assert code == 1, stderr
    assert report["first_step"] == 1
    assert report["cause"] == "threads" and report["threads"] == [2, 1]
    [finding] = report["findings"]
    assert finding["kind"] == "op-differs"
    assert finding["op"].startswith("aten::")
    assert finding["module"] in {"conv1", "bn1", "conv2", "fc", "dropout", ""}
    assert finding["module_type"]
    assert finding["where"].startswith("train.py:")
    assert finding["elements"] > 0 and finding["max_ulp"] > 0
    assert finding["listed_nondeterministic"] is False
    proc = manifest_cli("explain", str(manifest), "--threads", "1", "--step", "1", cwd=repo)
    text = proc.stdout.decode()
    assert proc.returncode == 1
    assert f"op       {finding['op']} on cpu" in text
    assert "first op whose inputs matched and whose outputs differ" in text


def test_verify_explain_names_the_step_verify_found(noisy: tuple[Path, Path]) -> None:
    repo, manifest = noisy
    proc = manifest_cli("verify", str(manifest), "--json", "--explain", cwd=repo,
                        env={"NOISE": "1"})
    assert proc.returncode == 1, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    # The automatic trail found the step without the script calling manifest.trail().
    assert doc["first_divergent_step"] == 3
    assert doc["explain"]["first_step"] == 3
    assert doc["explain"]["findings"][0]["kind"] == "input-from-outside"


# A model whose forward aggregates with index_add_ on CUDA: atomic adds in an
# order the scheduler picks, unless the deterministic switch is on.
INDEX_ADD = """
import torch
from torch import nn


class Scatter(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x, index):
        h = self.proj(x)
        out = torch.zeros(256, 64, device=x.device)
        return out.index_add_(0, index, h)  # INDEX_ADD


model = Scatter().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(200_000, 64, device="cuda")
index = torch.randint(0, 256, (200_000,), device="cuda")
for _ in range(3):
    loss = model(x, index).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
"""


@pytest.mark.gpu
def test_cuda_index_add_is_named_without_the_recipe_and_not_with_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"scatter.py": INDEX_ADD}, example=False)
    loose, _ = capture(repo, "--no-deterministic", command=["python", "scatter.py"],
                       outputs="scatter.py", name="loose.json")
    code, report, stderr = explain(repo, loose)
    assert code == 1, stderr
    assert report["cause"] == "nondeterminism"
    finding = report["findings"][0]
    assert finding["op"].startswith("aten::index_add")
    assert finding["module"] == "" and finding["module_type"] == "Scatter"
    assert finding["where"] == f"scatter.py:{line_of(INDEX_ADD, '# INDEX_ADD')}"
    assert finding["listed_nondeterministic"] is True
    strict, _ = capture(repo, command=["python", "scatter.py"], outputs="scatter.py",
                        name="strict.json")
    code, report, stderr = explain(repo, strict)
    assert code == 0, stderr
    assert report["verdict"] == "agree"


def test_recorded_op_stream_lets_verify_name_the_first_op(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    manifest, doc = capture(repo, "--seed", "0", "--threads", "2", "--fingerprint-ops", "1",
                            command=["python", "train.py", "--steps", "3"])
    [process] = doc["outputs"]["processes"]
    assert process["ops"]["steps"] == [1, 1] and process["ops"]["ops"] > 50
    faithful = manifest_cli("verify", str(manifest), "--json", cwd=repo)
    assert faithful.returncode == 0, faithful.stderr.decode()
    assert "first_divergent_op" not in json.loads(faithful.stdout)
    proc = manifest_cli("verify", str(manifest), "--json", "--threads", "1", cwd=repo)
    assert proc.returncode == 1, proc.stderr.decode()
    op = json.loads(proc.stdout)["first_divergent_op"]
    assert op["step"] == 1 and op["kind"] == "op-differs"
    assert op["op"].startswith("aten::") and op["where"].startswith("train.py:")
    assert op["compared"] == "recorded op stream vs re-run"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_ranks_get_their_own_streams(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    cmd = ["torchrun", "--nproc_per_node=2", f"--master_port={free_port()}", "train.py",
           "--steps", "3"]
    manifest, doc = capture(repo, "--seed", "0", "--threads", "1", "--fingerprint-ops", "1",
                            command=cmd)
    refs = [p["ops"] for p in doc["outputs"]["processes"]]
    assert len(refs) == 2 and all(r is not None for r in refs)
    assert refs[0]["digest"] != refs[1]["digest"]  # each rank trains on its own shard
    code, report, stderr = explain(repo, manifest)
    assert code == 0, stderr
    assert report["verdict"] == "agree"


# A Python that cannot import blake3 (a command whose `python` is not the one manifest is
# installed in): its launcher applies seeds and switches but fingerprints nothing. The
# blocker is a module named blake3 first on that process's path that refuses to import.
def test_a_python_without_blake3_is_named_by_capture_and_explain(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"noisy.py": NOISY,
                                         "nob3/blake3.py": "raise ImportError('no blake3')\n"},
                     example=False)
    blind = ["env", "PYTHONPATH=nob3", "python", "noisy.py"]
    proc = manifest_cli("capture", "--artifact", "noisy.py", "--", *blind, cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    (repo / "blind.json").write_bytes(proc.stdout)
    stderr = proc.stderr.decode()
    assert "rank(s) 0 could not import blake3" in stderr, stderr
    assert "verify can compare only the declared outputs" in stderr
    code, report, _ = explain(repo, repo / "blind.json")
    assert code == 3 and report["verdict"] == "no-verdict"
    assert report["reason"].startswith("the command ran 7 optimizer step(s) but fingerprinted "
                                       "none: its Python could not import blake3")
    # Control: the same script under a Python that has blake3 is noted by neither.
    proc = manifest_cli("capture", "--artifact", "noisy.py", "--", "python", "noisy.py",
                        cwd=repo)
    assert proc.returncode == 0 and "blake3" not in proc.stderr.decode()
    (repo / "seen.json").write_bytes(proc.stdout)
    code, report, _ = explain(repo, repo / "seen.json")
    assert code == 0 and report["steps_run"] == 7
