"""What ``equivalent`` rests on in verify: whose envelope decides, and the outputs held to it.

Issue 36 measured three ways a tolerance verdict was bent (DESIGN, "What `equivalent` may
claim"), and this module closes the two that belong to verify:

* **Whose envelope.** An envelope stored in a manifest is its author's numbers: every
  distance ×1e6 made a planted learning rate ×1.01 ``equivalent``. So the envelope that
  decides is (``choose_envelope``):

  1. the verifier's own (``verify --envelope N``: N one-ULP runs with fresh seeds and one
     under another thread count, in the scratch clone, against verify's own re-run),
     narrowed pointwise by the run's carried one when that passes its checks; or
  2. the run's carried one alone, only when the manifest was sealed on this machine or is
     signed by an identity the trust policy trusts (``manifest.trust``: the same
     decision that lets its command run; ``--trust`` lets a command run but vouches for
     no number); otherwise
  3. none: the verdict stays ``differs``, with the reason saying to run
     ``verify --envelope N``.

  A carried envelope that fails its checks (NaN, inf, negative, mismatched groups, a
  first-step distance no rounding can produce: ``check_envelope``) is **ignored and said
  so**, not refused: the bits of the re-run still answer ``identical`` or ``differs``,
  and refusing (exit 2) would let a hostile field block the check that needs no
  envelope at all.

* **Bound to the outputs.** The numeric trail covers optimizer steps; nothing compared the
  outputs numerically, so a bias moved by 0.5 after the last step verified ``equivalent``.
  Now every declared output is compared with the re-run's tensor by tensor
  (``output_distance``, ``bind_outputs``): the recorded file must be there with its
  recorded tensor digests, and the relative L2 distance of all its floating tensors,
  |Δ| / |θ|, must lie within the bound's last step (the tensor with the largest share
  |Δ_t| / |θ| is named; integer tensors must be equal). A file that is absent, changed
  since capture, or not a weight file leaves the outputs "not compared": never
  ``equivalent``. Measured on the bundled example (12 steps, captured at 2 threads,
  re-run at 3): the output is 9.7e-8 from the re-run's, against a last-step bound of
  5.5e-7 (the verifier's 3 + 1 runs) or 2.3e-5 (the run's, sealed here); BatchNorm's
  running statistics, saved beside the parameters, stay inside it with them.
  The recorded files come from the user's tree, from a pack that carries them
  (``pack --with-outputs``) or from a folder the verifier names (``verify --outputs DIR``,
  each file checked against its recorded digest, or else its tensor table, before use:
  ``locate_recorded``). A run received without them cannot be ``equivalent``, and nothing
  was found to differ either: with every step inside the envelope, that is no verdict,
  with the reason (``DID_NOT_TRAVEL``), never ``differs``.
  The recorded file is also held to the trail's own last point (``trail_agrees``): its
  norm against the point's, where its tensors map onto the trained parameters, within
  float64 summation error (2 · n · eps for n elements summed in another order). The trail
  keeps no names, so the mapping is tried for every floating tensor and for those
  without BatchNorm's running statistics; when neither holds, the report says so.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Artifact, Envelope, NumericPoint

if TYPE_CHECKING:
    from manifest.numeric.calibration import Calibration
    from manifest.weights.raw import RawTensor

AGREES = "agrees with the numeric trail's last point"
"""How ``trail_agrees`` begins when the recorded file is the trail's last point."""

BUFFER_SUFFIXES = ("running_mean", "running_var")
"""BatchNorm's running statistics: saved beside the parameters, never optimised by a step."""


@dataclass
class Decision:
    """The envelope that decides, in whose name, and its bound."""

    envelope: Envelope | None
    calibration: Calibration | None = None
    """The bound (``manifest.numeric.calibration``); None when ``envelope`` is None."""
    whose: str | None = None
    """``the verifier's (N runs here)``, ``the run's (sealed on this machine)``,
    ``the run's, signed by <identity>`` (with ``, narrowed by the run's`` when both)."""
    refusal: str | None = None
    """Why no envelope may decide (then no ``equivalent``)."""
    notes: list[str] = field(default_factory=list)


def choose_envelope(carried: Envelope | None, own: Envelope | None, own_runs: int,
                    trust_basis: str | None, trust_reason: str | None,
                    loss_eps: float = 0.0) -> Decision:
    """Whose envelope decides (see the module docstring)."""
    from manifest.numeric.calibration import calibrate, check_envelope, narrow

    if own is not None:
        bound = narrow(own, carried, loss_eps)
        mine = f"the verifier's ({own_runs} runs here)"
        if bound.source.endswith("narrowed by the manifest's"):
            mine += ", narrowed by the run's"
        return Decision(own, bound, mine, notes=list(bound.notes))
    notes: list[str] = []
    usable = carried
    if carried is not None:
        problems = check_envelope(carried)
        if problems:
            notes.append("the run's own noise envelope was ignored: " + "; ".join(problems))
            usable = None
    if usable is not None and trust_basis in ("sealed", "signed"):
        whose = ("the run's (sealed on this machine)" if trust_basis == "sealed" else
                 f"the run's, {trust_reason or 'signed'}")
        return Decision(usable, calibrate(usable, loss_eps), whose, notes=notes)
    why = ("the run carries no usable noise envelope" if usable is None else
           "the run's own noise envelope is its author's numbers, and the manifest was "
           "neither sealed on this machine nor signed by an identity you trust")
    return Decision(None, refusal=f"{why}: whether the difference is rounding was not judged "
                    "(`manifest verify --envelope N` measures the envelope here)", notes=notes)


def final_bound(calibration: Calibration) -> float | None:
    """The parameters' bound at the envelope's last step, over every group (the largest)."""
    if not calibration.bounds or not calibration.bounds[-1].groups:
        return None
    return max(calibration.bounds[-1].groups)


# ----------------------------------------------------------------- outputs

DID_NOT_TRAVEL = ("the recorded outputs did not travel with the run: pass --outputs DIR or "
                  "pack with --with-outputs")
"""Why a run received without its outputs gets no verdict where it would be judged by them."""

RECEIVED = "received-outputs"
"""The scratch directory's folder where a pack's outputs are written to be mapped."""


@dataclass(frozen=True)
class RecordedFile:
    """Where one recorded output's bytes are on this machine, if anywhere.

    ``source``: ``tree`` (the user's tree, where the run wrote it: checked against the
    record by whoever reads it, and "changed since capture" if it no longer is), ``pack``
    (carried by the pack, content-checked), ``outputs`` (``--outputs DIR``, checked here),
    ``absent`` (not on this machine: it never travelled) or ``mismatch`` (``--outputs DIR``
    holds another file under its name)."""

    path: Path | None
    source: str
    problem: str | None = None
    note: str | None = None
    """What the user should know about a file that was used (a re-saved copy)."""

    @property
    def travelled(self) -> bool:
        """False: the recorded bytes are not on this machine (absent, or another file)."""
        return self.source not in ("absent", "mismatch")


def locate_recorded(artifacts: Sequence[Artifact], *, tree_cwd: Path,
                    outputs_dir: Path | None = None,
                    packed: Mapping[str, bytes] | None = None,
                    scratch: Path | None = None) -> dict[str, RecordedFile]:
    """Each recorded output's path → where its recorded bytes are: ``--outputs DIR`` first
    (the verifier said so), then the pack, then the run's own tree (``tree_cwd``, the
    command's cwd in the user's checkout). A pack's output is written into ``scratch``
    (removed with the scratch tree) because the weight readers map files."""
    out: dict[str, RecordedFile] = {}
    for artifact in artifacts:
        if outputs_dir is not None:
            out[artifact.path] = _supplied(artifact, outputs_dir)
            continue
        data = (packed or {}).get(artifact.digest)
        if data is not None and scratch is not None:
            folder = scratch / RECEIVED
            folder.mkdir(parents=True, exist_ok=True)
            suffix = Path(artifact.path).suffix
            target = folder / (artifact.digest.removeprefix("blake3:")
                               + (suffix if re.fullmatch(r"\.\w{1,16}", suffix) else ""))
            target.write_bytes(data)
            out[artifact.path] = RecordedFile(target, "pack")
            continue
        here = tree_cwd / artifact.path
        out[artifact.path] = (RecordedFile(here, "tree") if os.path.lexists(here) else
                              RecordedFile(None, "absent", "the recorded file is not on this "
                                           "machine (it did not travel with the run)"))
    return out


def _supplied(artifact: Artifact, folder: Path) -> RecordedFile:
    """``artifact`` in the folder ``--outputs DIR`` names: at its recorded path under it, else
    by its file name; used when its digest is the recorded one, or its tensors all are."""
    from manifest.errors import ManifestError
    from manifest.weights.tables import digest_artifact

    rel = Path(artifact.path)
    looked = [folder / rel] if not rel.is_absolute() and ".." not in rel.parts else []
    looked += [p for p in [folder / rel.name] if p not in looked]
    found = next((p for p in looked if os.path.lexists(p)), None)
    if found is None:
        where = " or ".join(str(p) for p in looked)
        return RecordedFile(None, "absent", f"--outputs: {where} does not exist")
    try:
        got = digest_artifact(found, artifact.path, malformed_ok=True, within=folder)
    except (ManifestError, OSError) as exc:
        return RecordedFile(None, "mismatch", f"--outputs: {found} cannot be used: "
                            f"{str(exc).rstrip('.')}")
    if got.digest == artifact.digest:
        return RecordedFile(found, "outputs")
    if got.tensors is not None and got.tensors == artifact.tensors:
        return RecordedFile(found, "outputs", note=(
            f"--outputs: {found} is not byte for byte the recorded {artifact.path}, but every "
            "tensor is (dtype, shape, digest): used"))
    differing = sorted(n for n in set(got.tensors or {}) | set(artifact.tensors or {})
                       if (got.tensors or {}).get(n) != (artifact.tensors or {}).get(n))
    which = f" (tensor {differing[0]} differs)" if differing and got.tensors else ""
    return RecordedFile(None, "mismatch", f"--outputs: {found} is not the recorded "
                        f"{artifact.path}: its digest is {got.digest[:19]}… where "
                        f"{artifact.digest[:19]}… was recorded{which}")


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


# ----------------------------------------------------------------- report


def numeric_json(judgement: Any, decision: Decision, recorded_trail: list[NumericPoint],
                 outputs: list[OutputDistance],
                 recorded_files: dict[str, Path], against: str | None = None) -> dict[str, Any]:
    """The report's ``numeric`` part: the trail's judgement (with its confidence and
    resolution), whose envelope decided, and each output held to the trail's last point.
    ``against``: what the re-run's trail was judged against when not the recorded trail
    (``judged against the run's tf32 twin``)."""
    doc: dict[str, Any] = judgement.to_json()
    doc["trail_verdict"] = judgement.verdict
    doc["envelope_from"] = decision.whose
    doc["notes"] = list(dict.fromkeys([*decision.notes, *doc.get("notes", [])]))
    last = recorded_trail[-1] if recorded_trail else None
    shown = []
    for out in outputs:
        entry = out.to_json()
        recorded_file = recorded_files.get(out.path)
        if last is not None and recorded_file is not None and recorded_file.exists():
            entry["trail"] = trail_agrees(last, recorded_file)
        shown.append(entry)
    doc["outputs"] = shown
    doc["judged_against"] = against or "the recorded run"
    sentence = judgement.sentence()
    if against is not None:
        sentence = sentence.replace("from the recorded run", "from the run's twin") + (
            f"; {against}")
    doc["sentence"] = f"{sentence}; envelope: {decision.whose}"
    return doc


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
