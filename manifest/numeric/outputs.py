"""Outputs held to the bound: a declared weight file against another, by numbers.

The step trail covers optimizer steps, not the files a run declares: a bias moved by 0.5
after the last step verified ``equivalent`` while only the trail was judged. So every
declared output is compared with the other run's tensor by tensor
(:func:`output_distance`): the recorded file must be there with its recorded tensor
digests, and the relative L2 distance of all its floating tensors, |Δ| / |θ|, must lie
within the bound's last step (:func:`bind_outputs`; the tensor with the largest share
|Δ_t| / |θ| is named, integer tensors must be equal). A file that is absent, changed
since capture, or not a weight file leaves the outputs "not compared": never
``equivalent``. The recorded file is also held to the trail's own last point
(:func:`trail_agrees`).

One rule for every verb that judges a pair of runs by numbers: verify holds a re-run's
outputs to it (``manifest.verify.equivalence``), and diff two recorded runs' files
(``manifest.diff.engine``), so the two verbs cannot judge the same pair differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Artifact, NumericPoint

if TYPE_CHECKING:
    from manifest.numeric.calibration import Calibration
    from manifest.weights.raw import RawTensor


AGREES = "agrees with the numeric trail's last point"
"""How ``trail_agrees`` begins when the recorded file is the trail's last point."""


BUFFER_SUFFIXES = ("running_mean", "running_var")
"""BatchNorm's running statistics: saved beside the parameters, never optimised by a step."""


def final_bound(calibration: Calibration) -> float | None:
    """The parameters' bound at the envelope's last step, over every group (the largest)."""
    if not calibration.bounds or not calibration.bounds[-1].groups:
        return None
    return max(calibration.bounds[-1].groups)


@dataclass
class OutputDistance:
    """One declared output of the recorded run against the re-run's, by numbers."""

    path: str
    distance: float | None = None
    """|Δ| / |θ| over every floating tensor (relative L2)."""
    worst: str | None = None
    worst_share: float | None = None
    """The tensor with the largest |Δ_t| / |θ|, and that share."""
    problem: str | None = None
    """Why it was not compared, or how it fails (then never ``equivalent``)."""
    travelled: bool = True
    """False: the recorded file is not on this machine (``RecordedFile.travelled``)."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def output_distance(artifact: Artifact, recorded_file: Path | None, new_file: Path, *,
                    absent: str | None = None) -> OutputDistance:
    """``artifact`` as recorded (its file still holding the recorded tensors) against the
    re-run's file: relative L2 over the floating tensors, integer tensors equal. With no
    recorded file here (None, or a path where nothing is), ``absent`` says why."""
    from manifest.errors import MalformedArtifactError
    from manifest.weights.bounds import WeightFileError
    from manifest.weights.raw import hash_bytes
    from manifest.weights.tables import open_tensors

    out = OutputDistance(artifact.path)
    if artifact.tensors is None:
        out.problem = "not a weight file: its numbers cannot be compared"
        return out
    if recorded_file is None or not recorded_file.exists():
        out.travelled = False
        out.problem = (f"{absent or 'the recorded file is not on this machine'}: the outputs "
                       "were not compared")
        return out
    try:
        old = open_tensors(recorded_file)
        new = open_tensors(new_file)
    except (OSError, ValueError, WeightFileError, MalformedArtifactError) as exc:
        out.problem = f"unreadable ({exc}): the outputs were not compared"
        return out
    try:
        if old is None or new is None:
            out.problem = "no tensor table: the outputs were not compared"
            return out
        return _distance(out, artifact, old[1], new[1], hash_bytes)
    finally:
        for opened in (old, new):
            if opened is not None:
                opened[1].clear()
                opened[0].close()


def _distance(out: OutputDistance, artifact: Artifact, old: dict[str, RawTensor],
              new: dict[str, RawTensor], hash_bytes: Any) -> OutputDistance:
    from manifest.numeric.twin import tensor_distance

    assert artifact.tensors is not None
    if set(old) != set(artifact.tensors) or any(
            hash_bytes(old[n].data) != artifact.tensors[n].digest for n in old):
        out.problem = ("the recorded file changed since capture (its tensors are not the "
                       "recorded ones): the outputs were not compared")
        return out
    got = tensor_distance(old, new)
    if isinstance(got, str):
        out.problem = got
        return out
    out.distance, out.worst, out.worst_share = got.distance, got.worst, got.worst_share
    return out


def trail_agrees(last: NumericPoint, recorded_file: Path) -> str:
    """Whether the recorded output's parameters are the trail's last point: the norm of the
    floating tensors (all of them, or without BatchNorm's running statistics) against the
    point's, within float64 summation error (n × eps: the sums differ only in order)."""
    from manifest.errors import MalformedArtifactError
    from manifest.numeric.twin import floats
    from manifest.weights.bounds import WeightFileError
    from manifest.weights.tables import open_tensors

    target = math.sqrt(sum(g[0] ** 2 for g in last.groups if g))
    try:
        opened = open_tensors(recorded_file)
    except (OSError, ValueError, WeightFileError, MalformedArtifactError):
        return "could not be read to hold it to the numeric trail's last point"
    if opened is None:
        return "not a weight file: not held to the numeric trail's last point"
    try:
        sums: dict[str, tuple[float, int]] = {}
        for name, tensor in opened[1].items():
            values = floats(tensor)
            if values is not None:
                sums[name] = (float((values * values).sum()), int(values.size))
    finally:
        opened[1].clear()
        opened[0].close()
    eps = 2.0 ** -52
    candidates = {"every floating tensor": list(sums),
                  "its parameters (BatchNorm's running statistics left out)":
                      [n for n in sums if not n.endswith(BUFFER_SUFFIXES)]}
    for what, names in candidates.items():
        norm = math.sqrt(sum(sums[n][0] for n in names))
        count = sum(sums[n][1] for n in names)
        if target and abs(norm - target) <= 2 * count * eps * target:
            return (f"{AGREES} (step {last.step}): the norm "
                    f"of {what} is the trained parameters' norm")
    return (f"could not be mapped onto the numeric trail's last point (step {last.step}): no "
            "set of its tensors has the trained parameters' norm (another set of tensors was "
            "saved, or the file is not what the last step produced)")


def bind_outputs(doc: dict[str, Any], outputs: list[OutputDistance],
                 calibration: Calibration, *, compared: bool,
                 twin_offsets: dict[str, float] | None = None) -> str | None:
    """Hold every declared output to the bound's last step; the problem that keeps the
    verdict from ``equivalent`` (None: every output inside). Fills ``doc``'s output part.

    ``twin_offsets`` (judged against the run's emulated twin, ``numeric.twin``): each
    output's bound is widened by the twin's exact distance o from the recorded file, to
    b · (1 + o) + o (the triangle inequality); an output without one, or whose recorded
    file is not the trail's last point (``trail_agrees``: o is held to the trail by
    ``numeric.twin.check_twin``, so the file must be the trail's), is not compared."""
    from manifest.numeric.twin import output_bound

    bound = final_bound(calibration)
    doc["outputs_bound"] = bound
    if twin_offsets is not None:
        doc["outputs_twin_offsets"] = dict(twin_offsets)
    problem = None
    missing = False
    worst_of: tuple[float, float, float] = (-1.0, 0.0, bound or 0.0)  # ratio, distance, edge
    if not compared:
        problem = "the outputs were not compared numerically with the re-run's"
    elif bound is None:
        problem = "the envelope has no parameter bound to hold the outputs to"
    else:
        # Measured outputs first: one outside the bound is a difference found, whatever
        # another output that could not be compared says.
        for out in sorted(outputs, key=lambda o: o.problem is not None):
            if out.problem is not None:
                problem = f"{out.path}: {out.problem}"
                break
            edge = bound
            if twin_offsets is not None:
                offset = twin_offsets.get(out.path)
                if offset is None:
                    missing = True
                    problem = (f"{out.path}: the twin's distance from it was not measured at "
                               "capture, so it cannot be held to the twin's bound: the outputs "
                               "were not compared")
                    break
                held = next((e.get("trail") for e in doc.get("outputs", [])
                             if e.get("path") == out.path), None)
                if not str(held or "").startswith(AGREES):
                    missing = True
                    problem = (f"{out.path}: the twin widens its bound, and the recorded file "
                               "is not held to the numeric trail's last point "
                               f"({held or 'not checked'}): the outputs were not compared")
                    break
                edge = output_bound(bound, offset)
            assert out.distance is not None
            if out.distance > edge:
                times = math.inf if edge == 0 else out.distance / edge
                problem = (f"the output {out.path} is {out.distance:.3g} from the re-run's "
                           f"(relative L2, most in {out.worst}), {times:.3g}× the bound's "
                           f"{edge:.3g} at the last step: it is not what this training "
                           "produces up to rounding")
                break
            ratio = out.distance / edge if edge else 0.0
            if ratio > worst_of[0]:
                worst_of = (ratio, out.distance, edge)
    doc["outputs_verdict"] = ("inside" if problem is None else "not-compared"
                              if not compared or missing or any(o.problem for o in outputs)
                              else "outside")
    if problem is None and outputs:
        widened = " (widened by the twin's distance from the recorded file)" if (
            twin_offsets is not None) else ""
        doc["sentence"] += (f"; every declared output inside the bound at the last step"
                            f"{widened} ({worst_of[1]:.2g} of {worst_of[2]:.2g})")
    return problem
