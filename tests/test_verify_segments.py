"""``verify --segments`` / ``--at``: replay stretches of a run from its own checkpoints.

The run is the bundled example with ``--save-every`` and its ``--resume`` flag,
captured for real; one copy of it nudges a weight by one ULP before the
optimizer step ``NUDGE_AT`` (a silent fault: the environment variable is not
part of the recorded identity, so the re-run does not nudge). A replay from the
checkpoint before the fault recomputes that step honestly and parts from the
recorded trail exactly there; a replay of another stretch, which starts from
checkpoints the faulty run wrote, agrees.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from manifest.verify.segments import seeded_choice
from tests.cluster_runs import segments_run, segments_verify
from tests.runs import make_repo, manifest_cli


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return segments_run(tmp_path_factory.mktemp("seg"), steps=60, every=15, nudge_at=23,
                        out="out")


def _segments(repo: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, doc, _ = segments_verify(repo, *args)
    return code, doc


@pytest.mark.slow
def test_replay_over_the_planted_fault_differs_at_its_step(faulty_run: Path) -> None:
    code, doc = _segments(faulty_run, "--at", "23")
    assert code == 1
    segs = doc["segments"]
    assert isinstance(segs, list) and len(segs) == 1
    seg = segs[0]
    assert (seg["start"], seg["end"], seg["checkpoint"]) == (15, 30, "out/ckpt/step-15.pt")
    assert seg["verdict"] == "differs" and seg["first_divergent_step"] == 23
    assert seg["end_checkpoints"] == {"out/ckpt/step-30.pt": False}


@pytest.mark.slow
def test_replays_elsewhere_agree_with_the_faulty_run(faulty_run: Path) -> None:
    code, doc = _segments(faulty_run, "--at", "10,50")
    assert code == 0, doc
    got = [(s["start"], s["end"], s["verdict"], s["steps_compared"])
           for s in doc["segments"]]
    assert got == [(0, 15, "identical", 15), (45, 60, "identical", 15)]
    last = doc["segments"][1]
    assert last["end_checkpoints"] == {"out/ckpt/step-60.pt": True,
                                       "out/model.safetensors": True}
    assert doc["steps_checked"] == 30 and doc["total_steps"] == 60
    assert doc["share_checked"] == 0.5 and doc["p_catch_single_bad_step"] == 0.5


@pytest.mark.slow
def test_seeded_segments_text_report(faulty_run: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUDGE_AT"}
    out = manifest_cli("verify", "--trust", "run.json", "--segments", "1", cwd=faulty_run,
                       env=env)
    text = out.stdout.decode()
    run_id = json.loads((faulty_run / "run.json").read_text())["run_id"]
    [pick] = seeded_choice(run_id, 4, 1)
    start = 15 * pick
    assert f"steps {start + 1}–{start + 15}" in text, text
    assert "steps checked: 15 of 60 (25.0%)" in text
    assert "chance of catching a single bad step: 25.0%" in text
    assert out.returncode == (1 if pick == 1 else 0), text


@pytest.mark.slow
def test_missing_checkpoint_is_named(faulty_run: Path) -> None:
    ck = faulty_run / "out" / "ckpt" / "step-30.pt"
    kept = ck.read_bytes()
    ck.unlink()
    try:
        code, doc = _segments(faulty_run, "--at", "35")
    finally:
        ck.write_bytes(kept)
    assert code == 3
    segs = doc["segments"]
    assert isinstance(segs, list) and len(segs) == 1
    seg = segs[0]
    assert seg["verdict"] == "no-verdict"
    assert "checkpoint out/ckpt/step-30.pt (step 30) is missing" in seg["reason"]
    assert doc["steps_checked"] == 0


def test_resume_template_needs_its_placeholder(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    from manifest.errors import UsageError
    from manifest.verify.conventions import resume_template

    assert resume_template(repo, None) is None  # a known convention, or named as not resumed
    with pytest.raises(UsageError):
        resume_template(repo, "--resume")  # no {checkpoint}
    assert resume_template(repo, "--resume {checkpoint} --x") == ["--resume", "{checkpoint}",
                                                                    "--x"]


def test_seeded_choice_is_the_same_for_everyone_and_depends_on_the_run() -> None:
    a = "blake3:" + "ab" * 32
    b = "blake3:" + "cd" * 32
    assert seeded_choice(a, 10, 3) == seeded_choice(a, 10, 3)
    assert len(set(seeded_choice(a, 10, 3))) == 3
    assert seeded_choice(a, 10, 3) != seeded_choice(b, 10, 3)
    assert seeded_choice(a, 2, 5) == [0, 1]


DCP_TRAIN = """# Two gloo ranks average their gradients and save a DCP checkpoint every 4 steps.
import argparse
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

warnings.filterwarnings("ignore")
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--resume")
a = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data, target = torch.randn(64, 8), torch.randn(64, 2)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
step = 0
if a.resume:
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "rng": torch.get_rng_state(), "step": 0}
    load(state, checkpoint_id=a.resume)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.set_rng_state(state["rng"])
    step = state["step"]
while step < a.steps:
    idx = torch.randint(0, 64, (16,))[rank::world]
    loss = ((model(data[idx]) - target[idx]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    for q in model.parameters():
        dist.all_reduce(q.grad)
        q.grad /= world
    opt.step()
    step += 1
    if step % 4 == 0:
        msd, osd = get_state_dict(model, opt)
        save({"model": msd, "optim": osd, "rng": torch.get_rng_state(), "step": step},
             checkpoint_id=f"out/dcp-{step}")
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_two_gloo_ranks_resume_from_dcp_bit_identically(tmp_path: Path) -> None:
    """torchrun, 2 ranks, DCP every 4 steps through get_state_dict/set_state_dict: the
    resume's get_state_dict takes a zero-lr optimizer step to create the state, which is
    not counted (without that, the audit named the weights and every step was off by one)."""
    from tests.runs import free_port

    repo = make_repo(tmp_path / "repo", {
        "dcp_train.py": DCP_TRAIN,
        "pyproject.toml": '[tool.manifest]\nresume = "--resume {checkpoint}"\n'},
        example=False)
    cmd = ["torchrun", "--nproc_per_node=2", f"--master_port={free_port()}", "dcp_train.py"]
    cap = manifest_cli("capture", "--seed", "0", "--artifact", "out/dcp-12", "--", *cmd,
                       cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    doc = json.loads(cap.stdout)
    assert [(c["step"], c["artifact"]["format"]) for c in doc["outputs"]["checkpoints"]] == [
        (4, "dcp"), (8, "dcp"), (12, "dcp")]
    code, seg = _segments(repo, "--at", "6")
    assert code == 0, seg
    assert seg["segments"][0]["end_checkpoints"] == {"out/dcp-8": True}
    audit = manifest_cli("lab", "-q", "--resume-at", "4", "--format", "json", "--", *cmd,
                         cwd=repo)
    assert audit.returncode == 0, audit.stdout.decode() + audit.stderr.decode()
    assert json.loads(audit.stdout)["steps_compared"] == 8


@pytest.mark.slow
def test_strict_refuses_on_drift_before_replaying(faulty_run: Path) -> None:
    code, doc = _segments(faulty_run, "--at", "10", "--threads", "1", "--strict")
    assert code == 3, doc
    assert doc["segments"] == [] and doc["verdict"] == "no-verdict"
    assert any("threads 2 → 1" in d or "threads" in d for d in doc["drift"]), doc
