"""The three-way verdict end to end (issue 28): capture --envelope, verify, diff, show.

Real CPU training through the CLI: the bundled example captured with its noise envelope,
then re-run under a thread count the envelope never saw (``equivalent``, exit 4); a
script that updates its weights by hand (no torch.optim: backward() calls are its
steps); a script that reseeds itself, so two captures with different ``--seed`` produce
identical weights (diff's bits lines say so, exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import blake3
import pytest

from tests.runs import capture, git, make_repo, manifest_cli

pytestmark = pytest.mark.slow

HAND = """\
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1))
x = torch.randn(1024, 64)
y = x.sum(1, keepdim=True)
for step in range(12):  # word_language_model's way: no optimizer, p.data.add_
    loss = ((model(x) - y) ** 2).mean()
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.01)
Path("out").mkdir(exist_ok=True)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "out/hand.safetensors")
"""

ACCUMULATE = """\
from pathlib import Path

import torch
from safetensors.torch import save_file

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
for i in range(12):  # two micro-batches per optimizer step: 12 backward(), 6 steps
    ((model(x[i % 4 * 16:(i % 4 + 1) * 16]) - 1) ** 2).mean().backward()
    if i % 2 == 1:
        opt.step()
        opt.zero_grad()
Path("out").mkdir(exist_ok=True)
save_file(dict(model.state_dict()), "out/accumulate.safetensors")
"""

RESEED = """\
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

torch.manual_seed(0)  # makemore's way: the script seeds torch itself
jitter = random.random()  # a draw the launcher's seed decides, which the weights never see
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
for _ in range(5):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
Path("out").mkdir(exist_ok=True)
save_file(dict(model.state_dict()), "out/reseed.safetensors")
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("numeric"), {"hand.py": HAND, "reseed.py": RESEED,
                                                               "accumulate.py": ACCUMULATE})


@pytest.fixture(scope="module")
def enveloped(repo: Path) -> tuple[Path, dict[str, Any]]:
    return capture(repo, "--threads", "2", "--envelope", "2",
                   command=["python", "train.py", "--steps", "12"], name="env.json")


def test_capture_envelope_is_stored_outside_identity_and_shown(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    path, doc = enveloped
    envelope = doc["outputs"]["envelope"]
    # fresh one-ULP seeds each capture (issue 36: 1…N let a script know its perturbations)
    assert [r.split(" (seed ")[0] for r in envelope["runs"]] == ["1 ULP", "1 ULP",
                                                                  "threads 2 → 1"]
    assert len(set(envelope["runs"])) == 3
    assert [s["step"] for s in envelope["steps"]] == list(range(1, 13))
    numeric = doc["outputs"]["processes"][0]["numeric"]
    assert len(numeric) == 12 and numeric[0]["loss"] > 0 and len(numeric[0]["groups"]) == 1
    # the envelope runs wrote over out/: the file on disk is the base run's again
    [artifact] = doc["outputs"]["artifacts"]
    on_disk = blake3.blake3((repo / artifact["path"]).read_bytes()).hexdigest()
    assert artifact["digest"] == f"blake3:{on_disk}"
    _, again = capture(repo, "--threads", "2", command=["python", "train.py", "--steps", "12"],
                       name="plain.json")
    assert again["run_id"] == doc["run_id"]  # the envelope is outside identity
    assert again["outputs"]["artifacts"] == doc["outputs"]["artifacts"]
    shown = manifest_cli("show", str(path), cwd=repo)
    assert shown.returncode == 0
    assert b"noise envelope" in shown.stdout and b"envelope step 12" in shown.stdout


def test_verify_on_another_thread_count_is_equivalent_with_its_own_status(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    path, _ = enveloped
    proc = manifest_cli("verify", str(path), "--threads", "3", "--json", cwd=repo)
    report = json.loads(proc.stdout)
    assert proc.returncode == 4, proc.stderr.decode()
    assert report["verdict"] == "equivalent"
    assert report["numeric"]["verdict"] == "equivalent"
    assert report["numeric"]["steps_compared"] == 12
    assert any(d["path"] == "determinism.num_threads" for d in report["drift"])
    # the same machine, the same threads: bits, as always
    same = manifest_cli("verify", str(path), "--json", cwd=repo)
    assert same.returncode == 0 and json.loads(same.stdout)["verdict"] == "identical"


def test_explain_says_a_parting_on_another_thread_count_is_rounding(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    path, _ = enveloped
    proc = manifest_cli("explain", str(path), "--threads", "3", "--json", cwd=repo)
    report = json.loads(proc.stdout)
    assert report["verdict"] == "parted", proc.stderr.decode()
    assert report["numeric"]["verdict"] == "equivalent"
    text = manifest_cli("explain", str(path), "--threads", "3", cwd=repo)
    assert b"against the noise envelope: rounding only" in text.stdout


def test_diff_weighs_outputs_equivalent_across_thread_counts(
        repo: Path, enveloped: tuple[Path, dict[str, Any]]) -> None:
    path, _ = enveloped
    # the other run in a clone: diff compares both runs' outputs, each where its manifest is
    clone = repo.parent / "threads1"
    git(repo.parent, "clone", "-q", str(repo), str(clone))
    other, _ = capture(clone, "--threads", "1", command=["python", "train.py", "--steps", "12"],
                       name="threads1.json")
    proc = manifest_cli("diff", str(path), str(other), "--json", cwd=repo)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["outputs"]) == (4, "equivalent"), proc.stderr.decode()
    assert result["numeric"]["verdict"] == "equivalent"
    # The same two manifests received by someone else (not sealed on their machine: another
    # data directory holds their seal record): the envelope is the author's numbers, so it
    # never makes them equivalent there.
    elsewhere = {"XDG_DATA_HOME": str(repo.parent / "another-machine")}
    proc = manifest_cli("diff", str(path), str(other), "--json", cwd=repo, env=elsewhere)
    assert proc.returncode == 1 and "numeric" not in json.loads(proc.stdout), proc.stderr
    # another seed is never rounding: differ, exit 1, even with an envelope at hand
    seeded, _ = capture(repo, "--threads", "2", "--seed", "7",
                        command=["python", "train.py", "--steps", "12"], name="seed7.json")
    proc = manifest_cli("diff", str(path), str(seeded), "--json", cwd=repo)
    assert proc.returncode == 1 and "numeric" not in json.loads(proc.stdout)


def test_hand_updated_weights_count_backward_calls_as_steps(repo: Path) -> None:
    # One thread: on the 2-vCPU CI machine, torch.tanh over a 1024x512 tensor at 2 threads
    # gave another first half (thread 0's chunk, up to 5e-5 apart) in about 1 process of 5,
    # same seed, same input; pinned to one CPU, or at 1 thread, 30 of 30 agree. Not this
    # test's subject: it counts backward() calls as steps.
    path, doc = capture(repo, "--envelope", "2", "--threads", "1", command=["python", "hand.py"],
                        outputs="out/hand.safetensors", name="hand.json")
    process = doc["outputs"]["processes"][0]
    assert [p["step"] for p in process["trail"]] == list(range(1, 13))
    numeric = process["numeric"]
    assert [p["step"] for p in numeric] == list(range(1, 13))
    losses = [p["loss"] for p in numeric]
    assert losses[-1] < losses[0]  # the loss of each step, from its backward()
    assert len(doc["outputs"]["envelope"]["steps"]) == 12
    proc = manifest_cli("verify", str(path), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stdout.decode()[-2000:]
    # explain finds the step too (it answered "the command ran no optimizer step" before)
    proc = manifest_cli("explain", str(path), "--threads", "2", "--json", cwd=repo)
    report = json.loads(proc.stdout)
    # Whether this script parts at 1 and 2 threads is the machine's: MKL's split of tanh
    # gave another first half in about 1 process of 5 on one box, identical bits in every
    # run on another. The subject is that explain finds the 12 backward() updates as steps,
    # either way, instead of "the command ran no optimizer step".
    assert report["verdict"] in ("parted", "agree"), proc.stderr.decode()
    assert report["steps_run"] == 12, report
    if report["verdict"] == "parted":
        assert 1 <= report["first_step"] <= 12
        assert report["findings"] and report["findings"][0]["op"].startswith("aten::")


def test_gradient_accumulation_counts_optimizer_steps_not_backward_calls(repo: Path) -> None:
    _, doc = capture(repo, command=["python", "accumulate.py"],
                     outputs="out/accumulate.safetensors", name="accumulate.json")
    process = doc["outputs"]["processes"][0]
    assert [p["step"] for p in process["trail"]] == list(range(1, 7))
    assert [p["step"] for p in process["numeric"]] == list(range(1, 7))


def test_diff_bits_lines_say_when_the_outputs_are_identical(repo: Path) -> None:
    a, _ = capture(repo, "--seed", "0", command=["python", "reseed.py"],
                   outputs="out/reseed.safetensors", name="r0.json")
    b, _ = capture(repo, "--seed", "1", command=["python", "reseed.py"],
                   outputs="out/reseed.safetensors", name="r1.json")
    proc = manifest_cli("diff", str(a), str(b), "--json", cwd=repo)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout.decode()[-3000:]
    assert result["outputs"] == "identical"
    bits = [d for d in result["differences"] if d["impact"] == "bits"]
    assert bits, "the seeds still differ, and a seed can change the bits"
    assert all("here the outputs are identical" in d["reason"] for d in bits
               if d["section"] != "outputs")
    text = manifest_cli("diff", str(a), str(b), cwd=repo)
    assert b"Here the outputs are identical." in text.stdout
