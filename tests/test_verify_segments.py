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
from pathlib import Path
from typing import Any

import pytest

from manifest.verify.segments import seeded_choice
from tests.runs import EXAMPLE, make_repo, manifest_cli

NUDGE = """        if os.environ.get("NUDGE_AT") == str(step + 1):
            with torch.no_grad():  # a silent fault: one weight moved by one ULP
                model.fc.bias[0] = torch.nextafter(model.fc.bias[0], torch.tensor(1e9))
        opt.step()
"""


def _nudged_example() -> str:
    text = EXAMPLE.read_text()
    assert text.count("        opt.step()\n") == 1
    return text.replace("        opt.step()\n", NUDGE)


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("seg") / "repo", {
        "train.py": _nudged_example(),
        "pyproject.toml": '[tool.manifest]\nresume = "--resume {checkpoint}"\n'})
    cap = manifest_cli("capture", "--seed", "0", "--artifact", "out/*.safetensors", "--",
                       "python", "train.py", "--steps", "60", "--save-every", "15",
                       cwd=repo, env={"NUDGE_AT": "23"})
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    return repo


def _segments(repo: Path, *args: str) -> tuple[int, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "NUDGE_AT"}
    out = manifest_cli("verify", "--trust", "run.json", "--format", "json", *args, cwd=repo,
                       env=env)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    return out.returncode, json.loads(out.stdout)


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
    code, doc = _segments(faulty_run, "--at", "10", "50")
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


def test_segments_need_a_resume_template(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {})
    from manifest.errors import UsageError
    from manifest.verify.segments import resume_template

    with pytest.raises(UsageError) as err:
        resume_template(repo, None)
    assert "[tool.manifest] resume" in err.value.diagnostics()
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
