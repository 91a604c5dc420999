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

from manifest.canonical import seal
from manifest.errors import UsageError
from manifest.models import Checkpoint, Envelope, EnvelopeStep, Manifest, NumericPoint
from manifest.numeric.envelope import bounds
from manifest.verify.stretches import (
    WELL_ABOVE,
    Choice,
    Stretch,
    chances,
    choose,
    drawn,
    resume_name,
    stretches_of,
    weigh,
)
from tests.cluster_runs import segments_run, segments_verify
from tests.runs import EXAMPLE, make_repo, manifest_cli

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


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
    assert doc["share_checked"] == 0.5
    # Chosen by the user: no chance of catching anything is claimed for it.
    assert doc["chosen_by"] == "--at" and doc["seed"] is None
    assert doc["p_catch_single_bad_step"] is None and doc["p_catch_tampered_stretch"] is None


@pytest.mark.slow
def test_drawn_segments_print_their_nonce_and_a_seed_repeats_them(faulty_run: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUDGE_AT"}
    out = manifest_cli("verify", "--trust", "run.json", "--segments", "1", cwd=faulty_run,
                       env=env)
    text = out.stdout.decode()
    nonce = int(text.split("--seed ")[1].split()[0])
    assert f"drawn from a fresh nonce, {nonce}: --seed {nonce} repeats this choice" in text
    [pick] = drawn(nonce, 4, 1)
    start = 15 * pick
    assert f"steps {start + 1}–{start + 15}" in text, text
    assert "steps checked: 15 of 60 (25.0%)" in text
    assert "chance of catching a single bad step: 25.0% (assuming one bad step anywhere" in text
    assert "chance of catching a tampered stretch: 25.0%" in text
    assert out.returncode == (1 if pick == 1 else 0), text
    # The printed nonce repeats the choice, as JSON too.
    code, doc = _segments(faulty_run, "--segments", "1", "--seed", str(nonce))
    assert [s["start"] for s in doc["segments"]] == [start]
    assert (doc["chosen_by"], doc["seed"]) == ("--seed", nonce)
    # Repeated from a seed the user gave: whoever gave it chose, so no chance is claimed.
    assert doc["p_catch_tampered_stretch"] is None and doc["p_catch_single_bad_step"] is None
    assert code == out.returncode


@pytest.mark.slow
def test_a_planted_fault_past_the_first_step_is_not_called_a_resume_bug(
        faulty_run: Path) -> None:
    """Positive control of the resume-point tests below: the fault at step 23 of the stretch
    from step 15 differs without the resume-point hint."""
    code, doc = _segments(faulty_run, "--at", "23")
    [seg] = doc["segments"]
    assert code == 1 and seg["first_divergent_step"] == 23
    assert "resume point" not in (seg["reason"] or "")


@pytest.mark.slow
def test_a_script_that_forgets_its_momentum_parts_at_the_resume_point(tmp_path: Path) -> None:
    """The bundled example without ``opt.load_state_dict``: every resumed stretch parts at its
    first step. The report says so and names the resume audit (issue 39 item 6)."""
    text = EXAMPLE.read_text()
    forgot = '        opt.load_state_dict(state["optimizer"])\n'
    assert text.count(forgot) == 1
    repo = make_repo(tmp_path / "repo", {
        "train.py": text.replace(forgot, ""),
        "pyproject.toml": '[tool.manifest]\nresume = "--resume {checkpoint}"\n'},
        example=False)
    cap = manifest_cli("capture", "--seed", "0", "--artifact", "out/*.safetensors", "--",
                       "python", "train.py", "--steps", "8", "--save-every", "4", "--out",
                       "out", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    code, doc = _segments(repo, "--at", "6")
    [seg] = doc["segments"]
    assert code == 1 and seg["verdict"] == "differs" and seg["first_divergent_step"] == 5
    assert_hedged(seg["reason"], 4)
    assert "manifest lab --resume-at 4 -- python train.py --steps 8" in seg["reason"]


@pytest.mark.slow
def test_a_fault_planted_at_a_stretch_s_first_step_is_not_called_a_resume_bug(
        tmp_path: Path) -> None:
    """The review's case: a fault at step 5 at capture (the example nudged there), a
    checkpoint at step 4 that is faithful, verified without the fault. The stretch parts at
    its first step exactly as the forgetful script's above, so the report may only hint: it
    still says differs, and the resume is a condition, not the cause."""
    repo = segments_run(tmp_path, steps=8, every=4, nudge_at=5, out="out")
    code, doc = _segments(repo, "--at", "6")
    [seg] = doc["segments"]
    assert code == 1 and seg["verdict"] == "differs" and seg["first_divergent_step"] == 5
    assert_hedged(seg["reason"], 4)


def assert_hedged(reason: str, step: int) -> None:
    """The resume-point hint is conditional: it names where the runs part, says the checkpoint
    forgot state only *if* the whole run re-runs identically, and names the audit. The
    sentence this turn replaced asserted the cause ("parts at the resume point: … already
    differs, which is what a checkpoint that forgot some state gives") and fails here."""
    head = (f"the runs part at the resume point (step {step}): if the whole run re-runs "
            "identically, the checkpoint forgot some state")
    assert reason.startswith(head), reason
    assert reason.index("if the whole run re-runs identically") < reason.index("forgot")
    assert f"manifest lab --resume-at {step} -- " in reason and reason.endswith("names it")


def test_the_resume_point_hint_is_a_condition_not_a_cause() -> None:
    from manifest.verify.stretches import parts_at_resume

    assert_hedged(parts_at_resume(long_run(), 4), 4)
    asserted = ("parts at the resume point: the first step after resuming from step 4 already "
                "differs, which is what a checkpoint that forgot some state (optimizer, RNG, "
                "sampler, scheduler) gives; manifest lab --resume-at 4 -- python x names the "
                "forgotten state")
    with pytest.raises(AssertionError):  # positive control: the old wording is refused
        assert_hedged(asserted, 4)


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


# ---------------------------------------------------- choosing, chances, weighing (fast)


def long_run(every: int = 10, total: int = 600, argv_word: str | None = None,
             numeric: list[NumericPoint] | None = None,
             envelope: Envelope | None = None, kept: int | None = None) -> Manifest:
    """The golden manifest as a run of ``total`` steps with a checkpoint every ``every``,
    each kept (with a digest), or only the last ``kept`` of them (the others saved again to
    the same file later, as a script that writes ``ckpt/latest.pt`` leaves them)."""
    doc: dict[str, Any] = json.loads(GOLDEN.read_bytes())
    if argv_word is not None:
        doc["command"]["argv"].append(argv_word)
    proc = doc["outputs"]["processes"][0]
    proc["trail"] = [{"step": s, "digest": "blake3:" + f"{s:064x}"}
                     for s in range(1, total + 1)]
    if numeric is not None:
        proc["numeric"] = [p.model_dump(mode="json") for p in numeric]
    steps = list(range(every, total, every))
    lost = set(steps[:len(steps) - kept]) if kept is not None else set()
    doc["outputs"]["checkpoints"] = [
        {"step": s, "path": f"out/ckpt/step-{s}.pt", "lost": "saved again later",
         "artifact": None} if s in lost else
        {"step": s, "path": f"out/ckpt/step-{s}.pt", "lost": None,
         "artifact": {"path": f"out/ckpt/step-{s}.pt", "digest": "blake3:" + f"{s:064x}",
                      "bytes": 100, "format": "torch", "tensors": None}}
        for s in steps]
    if envelope is not None:
        doc["outputs"]["envelope"] = envelope.model_dump(mode="json")
    return seal(doc)


def run_id_choice(run: Manifest, count: int, n: int) -> list[int]:
    """The draw before this turn: seeded from the run_id, which the author controls."""
    return drawn(int(run.run_id.split(":", 1)[1][:16], 16), count, n)


def test_two_draws_differ_and_a_seed_repeats_one() -> None:
    run = long_run()
    a, b = choose(run, segments=5, at=None), choose(run, segments=5, at=None)
    assert a.of == 60 and a.chosen_by == b.chosen_by == "nonce"
    assert a.seed is not None and b.seed is not None and a.seed != b.seed
    # 1 chance in C(60, 5) = 5.5 million that two fresh draws pick the same five
    assert a.stretches != b.stretches
    again = choose(run, segments=5, at=None, seed=a.seed)
    assert again.stretches == a.stretches and again.chosen_by == "--seed"
    assert len({s.start for s in a.stretches}) == 5


def test_nothing_the_author_controls_moves_the_draw() -> None:
    """An ignored argv word re-seals the run under another run_id. The old draw (seeded from
    the run_id) moves with it, which is how an author could steer the check off a bad
    stretch; the verifier's draw from the same seed does not move."""
    runs = [long_run(argv_word=None if i == 0 else f"--ignored={i}") for i in range(6)]
    assert len({r.run_id for r in runs}) == 6
    old = {tuple(run_id_choice(r, 60, 3)) for r in runs}
    assert len(old) > 1  # positive control: the author could pick among these draws
    new = {tuple(s.start for s in choose(r, segments=3, at=None, seed=12345).stretches)
           for r in runs}
    assert len(new) == 1


def test_chances_are_claimed_for_random_draws_only() -> None:
    run = long_run(every=10, total=30)
    # Stretches of 10, 10 and 10 steps; --at names one: chosen by the user, no chance.
    at = choose(run, segments=None, at=[15])
    assert at.chosen_by == "--at" and at.seed is None
    assert chances(at, at.stretches, 30) is None
    # Unequal stretches: a draw that took the long one replays 90% of the steps, and still
    # catches a tampered stretch only 1 time in 3 (each stretch is as likely to be drawn).
    uneven = [Stretch(0, 10, None), Stretch(10, 20, None), Stretch(20, 200, None)]
    odds = chances(Choice([uneven[2]], 3, "nonce", 7), [uneven[2]], 200)
    assert odds is not None
    assert odds.single_bad_step == pytest.approx(0.9)
    assert odds.tampered_stretch == pytest.approx(1 / 3)
    # Checked by simulation: a uniformly placed bad step, a uniformly tampered stretch.
    import random

    rng = random.Random(0)
    trials = 20_000
    bad_step = sum(rng.randrange(200) >= 20 for _ in range(trials)) / trials
    tampered = sum(rng.randrange(3) in drawn(rng.randrange(2**53), 3, 1)
                   for _ in range(trials)) / trials
    assert abs(bad_step - 0.9) < 0.01 and abs(tampered - 1 / 3) < 0.015


def test_a_run_with_no_checkpoint_has_no_stretches_to_draw() -> None:
    none = long_run(every=1000, total=40)
    assert len(stretches_of(none)) == 1
    with pytest.raises(UsageError, match="recorded no checkpoint before its last step"):
        choose(none, segments=3, at=None)
    assert len(choose(long_run(every=20, total=40), segments=3, at=None).stretches) == 2


def test_a_hugging_face_stretch_is_named_after_its_checkpoint_directory() -> None:
    def ck(path: str) -> Checkpoint:
        return Checkpoint(step=4, path=path, artifact=None, lost="x")

    assert resume_name(ck("out/checkpoint-4/optimizer.pt")) == "out/checkpoint-4"
    assert resume_name(ck("out/ckpt/step-4.pt")) == "out/ckpt/step-4.pt"
    assert resume_name(ck("checkpoint-4.pt")) == "checkpoint-4.pt"


def _point(step: int, moved: float) -> NumericPoint:
    """A parameter group of norm 1 whose 4 projections have moved by ``moved`` since step 0."""
    return NumericPoint(step=step, loss=1.0, loss_eps=None, groups=[[1.0, *[moved] * 4]])


def _envelope(distance: float, last: int = 30) -> Envelope:
    """Rounding that starts at a hundredth of ``distance`` and reaches it by step 10."""
    return Envelope(runs=["threads 2 → 1", "threads 2 → 3"], steps=[
        EnvelopeStep(step=s, loss=[0.0, 0.0],
                     groups=[[distance * 10 ** (min(s, 10) / 5 - 2),
                              distance * 10 ** (min(s, 10) / 5 - 2) / 2]])
        for s in range(1, last + 1)])


def test_a_stretch_that_moves_less_than_rounding_is_weak_evidence() -> None:
    # Steps 10 → 20 move the parameters by 1e-3 (relative); steps 20 → 30 by 2e-6.
    numeric = [_point(s, 1e-3 * min(s, 20) / 20 + (2e-6 * (s - 20) / 10 if s > 20 else 0.0))
               for s in range(1, 31)]
    envelope = _envelope(1e-6)
    run = long_run(every=10, total=30, numeric=numeric, envelope=envelope)
    bound = bounds(envelope)[-1].groups[0]
    strong = weigh(run, Stretch(10, 20, None))
    weak = weigh(run, Stretch(20, 30, None))
    assert strong is not None and weak is not None
    assert not strong.weak and strong.ratio == pytest.approx(5e-4 / bounds(envelope)[19]
                                                              .groups[0])
    assert weak.weak and weak.ratio == pytest.approx(2e-6 / bound)
    assert weak.ratio is not None and weak.ratio < WELL_ABOVE
    assert weak.reason.startswith("weak evidence: over steps 20–30")
    # Positive control: the same stretch against rounding 1000x quieter is strong evidence,
    # so the label follows the envelope's bound, not a constant on the change.
    quiet = long_run(every=10, total=30, numeric=numeric, envelope=_envelope(1e-9))
    found = weigh(quiet, Stretch(20, 30, None))
    assert found is not None and not found.weak
    # No envelope, or one that is not rounding (its first step beyond what one ULP can do):
    # nothing to weigh with, said by the report (None), never guessed.
    assert weigh(long_run(every=10, total=30, numeric=numeric), Stretch(20, 30, None)) is None
    loud = Envelope(runs=envelope.runs, steps=[
        EnvelopeStep(step=s.step, loss=s.loss, groups=[[1e-3, 1e-3]]) for s in envelope.steps])
    assert weigh(long_run(every=10, total=30, numeric=numeric, envelope=loud),
                 Stretch(20, 30, None)) is None


def test_a_stretch_whose_trail_did_not_move_is_weak_evidence() -> None:
    run = long_run(every=10, total=30)
    doc: dict[str, Any] = json.loads(run.model_dump_json(by_alias=True))
    trail = doc["outputs"]["processes"][0]["trail"]
    for point in trail:
        if 20 <= point["step"] <= 30:
            point["digest"] = "blake3:" + "ee" * 32
    frozen = seal(doc)
    found = weigh(frozen, Stretch(20, 30, None))
    assert found is not None and found.weak and found.ratio == 0.0
    assert weigh(run, Stretch(20, 30, None)) is None  # positive control: it moved


def test_contradicting_or_empty_spot_check_options_are_refused_before_anything_runs(
        tmp_path: Path) -> None:
    """Exit 2, one sentence, no traceback, before the manifest is read (it does not exist);
    positive control: a well-formed --at gets as far as reading it."""
    for args, says in (((("--at", "")), "argument --at: expected optimizer steps"),
                       (("--at", ",,,"), "argument --at: expected optimizer steps"),
                       (("--segments", "2", "--at", "3"), "not allowed with argument"),
                       (("--at", "3", "--segments", "2"), "not allowed with argument")):
        out = manifest_cli("verify", "missing.json", *args, cwd=tmp_path)
        err = out.stderr.decode()
        assert out.returncode == 2 and says in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    control = manifest_cli("verify", "missing.json", "--at", "3", cwd=tmp_path)
    assert control.returncode == 2 and "does not exist" in control.stderr.decode()
    (tmp_path / "run.json").write_bytes(seal(json.loads(GOLDEN.read_bytes())).model_dump_json(
        by_alias=True).encode())
    seed = manifest_cli("verify", "run.json", "--seed", "4", cwd=tmp_path)
    assert seed.returncode == 2, seed.stderr.decode()
    assert "--seed repeats the draw of --segments N" in seed.stderr.decode()


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


# ------------------------------------------- what can be replayed, and who chose (fast)


def _report(run: Manifest, choice: Choice, verdict: str = "identical") -> Any:
    """The report verify_segments builds for ``choice``, each chosen stretch given ``verdict``
    (the replays themselves are the slow tests above)."""
    from manifest.verify.segments import SegmentResult, SegmentsReport
    from manifest.verify.stretches import not_kept, total_steps

    report = SegmentsReport(file="run.json", run_id=run.run_id,
                            total_steps=total_steps(run), stretches=choice.of,
                            chosen_by=choice.chosen_by, seed=choice.seed,
                            unreplayable=choice.unreplayable)
    lost = not_kept(choice)
    if lost is not None:
        report.notes.append(lost)
    report.segments = [SegmentResult(s.start, s.end, s.checkpoint.path if s.checkpoint else None,
                                     verdict=verdict, steps_compared=1)
                       for s in choice.stretches]
    return report


def test_a_stretch_whose_checkpoint_was_not_kept_counts_for_no_chance() -> None:
    """The review's train3.py: every checkpoint saved to one file, so of the stretches from
    step 0, 2, 4 and 6 of 8 only the first can be replayed. The draw is made among what can
    be replayed, the tampered-stretch chance is a share of that, and the report says how
    many stretches can never be (the chance used to read 25% over all four)."""
    from manifest.cli.verbs_segments import segments_text

    latest = long_run(every=2, total=8, kept=0)
    choice = choose(latest, segments=3, at=None)
    assert choice.of == 4 and choice.replayable == 1
    assert [(s.start, s.end) for s in choice.stretches] == [(0, 2)]
    assert [s.start for s in choice.unreplayable] == [2, 4, 6]
    report = _report(latest, choice)
    doc = report.to_json()
    assert doc["p_catch_tampered_stretch"] == 1.0 and doc["replayable_stretches"] == 1
    assert doc["p_catch_single_bad_step"] == 0.25  # 2 of 8 steps: 6 are never checked
    assert [u["start"] for u in doc["unreplayable_stretches"]] == [2, 4, 6]
    text = segments_text(report)
    assert ("3 of 4 stretches start from a checkpoint that was not kept: a tampered stretch "
            "there is never caught") in text
    assert "tampered stretch: 100.0% of the 1 stretch that can be replayed" in text
    assert "the 6 steps of stretches that cannot be replayed are never checked" in text
    # --at names one anyway: it is replayed as asked (a no-verdict naming the checkpoint).
    named = choose(latest, segments=None, at=[5])
    assert [s.start for s in named.stretches] == [4] and not named.stretches[0].replayable
    # Positive control: the same run with every checkpoint kept draws among all four.
    kept = choose(long_run(every=2, total=8), segments=3, at=None)
    assert kept.replayable == kept.of == 4 and not kept.unreplayable
    whole = _report(long_run(every=2, total=8), kept)
    assert whole.to_json()["p_catch_tampered_stretch"] == 0.75 and not whole.notes
    assert "cannot be replayed" not in segments_text(whole)


def test_the_chances_over_what_can_be_replayed_match_a_simulation() -> None:
    """10 stretches of 10 steps, the first 5 checkpoints lost: a draw of 3 catches a tampered
    replayable stretch 3 times in 5, a uniformly placed bad step 30 times in 100, and a
    tampered stretch from a lost checkpoint never. Checked against simulated adversaries."""
    import random

    run = long_run(every=10, total=100, kept=4)
    choice = choose(run, segments=3, at=None)
    assert (choice.of, choice.replayable) == (10, 5)
    odds = chances(choice, choice.stretches, 100)
    assert odds is not None and odds.unchecked_steps == 50
    assert odds.tampered_stretch == pytest.approx(3 / 5)
    assert odds.single_bad_step == pytest.approx(0.3)
    rng = random.Random(0)
    trials = 4000
    replayable = [s for s in stretches_of(run) if s.replayable]
    lost = [s for s in stretches_of(run) if not s.replayable]
    hits = {"replayable": 0, "lost": 0, "step": 0}
    for _ in range(trials):
        drawn_now = choose(run, segments=3, at=None, seed=rng.randrange(2**53)).stretches
        hits["replayable"] += rng.choice(replayable) in drawn_now
        hits["lost"] += rng.choice(lost) in drawn_now
        bad = rng.randrange(1, 101)
        hits["step"] += any(s.start < bad <= s.end for s in drawn_now)
    # 4000 trials: a binomial's standard deviation at p = 0.6 is 0.0077; 4 of them.
    assert abs(hits["replayable"] / trials - odds.tampered_stretch) < 0.031
    assert abs(hits["step"] / trials - odds.single_bad_step) < 0.03
    assert hits["lost"] == 0


def test_a_choice_repeated_from_a_given_seed_claims_no_chance() -> None:
    """``--seed S``: whoever gave S (the run's author, perhaps) chose the stretches. The same
    stretches as the fresh draw that printed S, and no chance: the report says the choice was
    repeated, and the JSON's chances are null. Positive control: the fresh draw claims both."""
    from manifest.cli.verbs_segments import segments_text

    run = long_run(every=10, total=40)
    fresh = choose(run, segments=2, at=None)
    assert fresh.seed is not None
    repeated = choose(run, segments=2, at=None, seed=fresh.seed)
    assert repeated.stretches == fresh.stretches and repeated.chosen_by == "--seed"
    assert chances(repeated, repeated.stretches, 40) is None
    doc = _report(run, repeated).to_json()
    assert doc["p_catch_single_bad_step"] is None and doc["p_catch_tampered_stretch"] is None
    text = segments_text(_report(run, repeated))
    assert (f"repeated from --seed {fresh.seed}: whoever gave the seed chose the stretches, "
            "so no chance of catching anything applies") in text
    assert "\n  chance of catching" not in text  # no line claims one
    claimed = _report(run, fresh).to_json()
    assert claimed["p_catch_single_bad_step"] == 0.5
    assert claimed["p_catch_tampered_stretch"] == 0.5
    assert "chance of catching a tampered stretch: 50.0% (" in segments_text(_report(run, fresh))
