"""The parts of verify's ``equivalent`` that need no training (issue 36): whose envelope
decides, the outputs held to the bound, and the envelope runs' clean-up of the tree."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from manifest.models import Envelope, EnvelopeStep, NumericPoint
from manifest.numeric.measure import files_kept
from manifest.verify.equivalence import (
    choose_envelope,
    final_bound,
    output_distance,
    trail_agrees,
)
from manifest.weights.tables import digest_artifact


def _envelope(scale: float = 1.0) -> Envelope:
    """Three one-ULP runs and a thread-count run, growing 2× a step from float32's level."""
    runs = ["1 ULP (seed 11)", "1 ULP (seed 12)", "1 ULP (seed 13)", "threads 2 → 1"]
    steps = [EnvelopeStep(step=t, loss=[scale * 1e-7 * 2 ** t * f for f in (1, 1.2, 0.9, 1.1)],
                          groups=[[scale * 6e-8 * 2 ** t * f for f in (1, 1.3, 0.8, 1.1)]])
             for t in range(1, 6)]
    return Envelope(runs=runs, steps=steps)


def test_whose_envelope_decides() -> None:
    carried = _envelope()
    # an unsigned manifest's numbers decide nothing, even under --trust
    unsigned = choose_envelope(carried, None, 0, "user", "--trust")
    assert unsigned.calibration is None and unsigned.whose is None
    assert unsigned.refusal is not None and "verify --envelope N" in unsigned.refusal
    sealed = choose_envelope(carried, None, 0, "sealed", "sealed here")
    assert sealed.whose == "the run's (sealed on this machine)" and sealed.calibration
    signed = choose_envelope(carried, None, 0, "signed", "signed by ci@example.com")
    assert signed.whose == "the run's, signed by ci@example.com"
    own = choose_envelope(None, _envelope(), 4, "user", "--trust")
    assert own.whose == "the verifier's (4 runs here)"


def test_a_carried_envelope_only_narrows_the_verifiers() -> None:
    own = choose_envelope(None, _envelope(), 4, "user", "--trust")
    wider = choose_envelope(_envelope(2.0), _envelope(), 4, "sealed", "sealed here")
    narrower = choose_envelope(_envelope(0.5), _envelope(), 4, "sealed", "sealed here")
    assert own.calibration is not None and wider.calibration is not None
    assert narrower.calibration is not None
    # positive control: taken alone, the wider carried envelope gives a wider bound
    alone = choose_envelope(_envelope(2.0), None, 0, "sealed", "sealed here")
    assert alone.calibration is not None
    assert final_bound(alone.calibration) > final_bound(own.calibration)  # type: ignore[operator]
    assert final_bound(wider.calibration) == final_bound(own.calibration)
    assert final_bound(narrower.calibration) < final_bound(own.calibration)  # type: ignore[operator]
    assert narrower.whose == "the verifier's (4 runs here), narrowed by the run's"


@pytest.mark.parametrize("how", ["x1e6", "spread", "no-groups", "nan"])
def test_a_hostile_carried_envelope_is_ignored_and_said_so(how: str) -> None:
    doc = _envelope(1e6 if how == "x1e6" else 1.0).model_dump(mode="python")
    if how == "spread":
        doc["steps"][0]["groups"] = [[1e-300, 1.0, 1.0, 1.0]]
    elif how == "no-groups":
        for step in doc["steps"]:
            step["groups"] = []
            step["loss"] = [1.0] * 4
    elif how == "nan":
        doc["steps"][0]["groups"] = [[math.nan, 1e-7, 1e-7, 1e-7]]
    hostile = Envelope.model_construct(
        runs=doc["runs"], steps=[EnvelopeStep.model_construct(**s) for s in doc["steps"]])
    # positive control: the honest envelope of the same shape decides when sealed here
    assert choose_envelope(_envelope(), None, 0, "sealed", "sealed here").calibration
    for basis in ("sealed", "signed"):
        decision = choose_envelope(hostile, None, 0, basis, "signed by x")
        assert decision.calibration is None, how
        assert any("ignored" in n for n in decision.notes), decision.notes


def _model_file(path: Path, bias_shift: float = 0.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    tensors = {"linear.weight": torch.randn(64, 32, generator=gen),
               "linear.bias": torch.randn(64, generator=gen) + bias_shift,
               "bn.running_mean": torch.randn(64, generator=gen),
               "bn.num_batches_tracked": torch.tensor(12)}
    save_file(tensors, str(path))
    return tensors


def test_outputs_are_held_to_the_bound_by_relative_l2(tmp_path: Path) -> None:
    recorded, same, moved = tmp_path / "a.safetensors", tmp_path / "b.safetensors", \
        tmp_path / "c.safetensors"
    _model_file(recorded)
    _model_file(same)
    _model_file(moved, bias_shift=0.5)
    artifact = digest_artifact(recorded, "out/model.safetensors")
    honest = output_distance(artifact, recorded, same)
    assert honest.problem is None and honest.distance == 0
    shifted = output_distance(artifact, recorded, moved)
    assert shifted.problem is None and shifted.worst == "linear.bias"
    assert shifted.distance is not None and shifted.distance > 0.05
    # the recorded file must be there and still hold the recorded tensors
    absent = output_distance(artifact, tmp_path / "gone.safetensors", same)
    assert absent.problem is not None and "not compared" in absent.problem
    changed = output_distance(artifact, moved, same)
    assert changed.problem is not None and "changed since capture" in changed.problem


def _point(tensors: dict[str, torch.Tensor], names: list[str], step: int) -> NumericPoint:
    norm = math.sqrt(sum(float((tensors[n].double() ** 2).sum()) for n in names))
    return NumericPoint(step=step, loss=1.0, groups=[[norm, 0.1, 0.2, 0.3, 0.4]])


def test_the_recorded_output_is_held_to_the_trails_last_point(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = _model_file(path)
    trained = _point(tensors, ["linear.weight", "linear.bias"], 30)
    assert trail_agrees(trained, path).startswith("agrees")
    moved = tmp_path / "moved.safetensors"
    _model_file(moved, bias_shift=0.5)
    assert trail_agrees(trained, moved).startswith("could not be mapped")


def test_envelope_runs_leave_the_tree_as_the_run_left_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "out" / "ckpt").mkdir(parents=True)
    model, ckpt, notes = tree / "out/model.bin", tree / "out/ckpt/step-4.pt", tree / "notes.txt"
    for path, text in ((model, "run"), (ckpt, "run ckpt"), (notes, "user")):
        path.write_text(text)

    def envelope_run() -> dict[str, str]:
        for path in (model, ckpt, notes):
            path.write_text("envelope")
        (tree / "out" / "logs").mkdir(exist_ok=True)
        (tree / "out" / "logs" / "events.1").write_text("envelope")
        return {str(p): "w" for p in (model, ckpt, notes, tree / "out/logs/events.1")}

    # positive control: keeping the declared outputs alone (before issue 36) leaves the
    # envelope run's checkpoint, and its log, in the tree
    with files_kept(tree, ["out/*.bin"]):
        envelope_run()
    assert ckpt.read_text() == "envelope" and (tree / "out/logs/events.1").exists()
    shutil.rmtree(tree / "out" / "logs")
    ckpt.write_text("run ckpt")
    notes.write_text("user")
    kept = files_kept(tree, ["out/*.bin"], keep=[ckpt], tree=tree)
    with kept:
        kept.written(envelope_run())
    assert (model.read_text(), ckpt.read_text()) == ("run", "run ckpt")
    assert not (tree / "out" / "logs").exists()  # created by the envelope runs alone
    # a file the run never wrote cannot be put back: it is named
    assert notes.read_text() == "envelope"
    assert any("notes.txt" in n for n in kept.notes)
