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
  (``manifest.numeric.outputs``, the rule diff uses too): the recorded file must be there with its
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

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Artifact, Envelope, NumericPoint
from manifest.numeric.outputs import (
    AGREES,
    BUFFER_SUFFIXES,
    OutputDistance,
    bind_outputs,
    final_bound,
    output_distance,
    trail_agrees,
)

if TYPE_CHECKING:
    from manifest.numeric.calibration import Calibration

__all__ = ["AGREES", "BUFFER_SUFFIXES", "DID_NOT_TRAVEL", "Decision", "OutputDistance",
           "RecordedFile", "bind_outputs", "choose_envelope", "final_bound", "locate_recorded",
           "numeric_json", "output_distance", "trail_agrees"]


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
    """Whose envelope decides (see the module docstring): the verifier's own, else the
    run's where ``manifest.judge.envelope.may_decide`` (the rule diff applies too) says it
    may."""
    from manifest.judge.envelope import may_decide
    from manifest.numeric.calibration import calibrate, narrow

    if own is not None:
        bound = narrow(own, carried, loss_eps)
        mine = f"the verifier's ({own_runs} runs here)"
        if bound.source.endswith("narrowed by the manifest's"):
            mine += ", narrowed by the run's"
        return Decision(own, bound, mine, notes=list(bound.notes))
    vouched = may_decide(carried, basis=trust_basis, reason=trust_reason)
    notes = (["the run's own noise envelope was ignored: " + "; ".join(vouched.problems)]
             if vouched.problems else [])
    if vouched.envelope is not None:
        return Decision(vouched.envelope, calibrate(vouched.envelope, loss_eps), vouched.whose,
                        notes=notes)
    return Decision(None, refusal=f"{vouched.refusal}: whether the difference is rounding "
                    "was not judged (`manifest verify --envelope N` measures the envelope "
                    "here)", notes=notes)


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


