"""The result of a diff: its differences, the verdict, and the ``--json`` document.

Kept apart from the walk (``manifest.diff.walk``) because the terminal and
Markdown renderers in ``manifest.cli`` read a result without diffing anything.
A :class:`ManifestDiff` is plain frozen dataclasses over the models; its
``to_json`` is the one place the documented shape below is produced.

``--json`` shape (``format`` is bumped on any incompatible change)::

    {
      "format": "manifest-diff/v1",
      "a": {"file": "a.json", "run_id": "blake3:…", "digest": "blake3:…",
            "signature": null | {                  # null: no signature came with it
              "source": "a.mfpack (embedded)",     # or a.json.sig, or --signature
              "signer": "key sha256:…" | "alice@example.com (issuer)",
              "method": "key" | "sigstore",
              "trusted": true,                     # listed by your trust policy
              "verified": true                     # false: a key no policy lists
            }},                                    # (one that covers another manifest
                                                   # is refused: exit 2)
      "b": {"file": "b.json", "run_id": "blake3:…", "digest": "blake3:…",
            "signature": …},
      "same_run_id": false,
      "verdict": "bits" | "benign" | "identical",
      "counts": {"bits": 2, "benign": 1},          # over all differences
      "only": null | "bits" | "benign",            # the filter applied below
      "nondeterminism": null | {
        "message": "same inputs, different weights: not deterministic, or an input the
                    record misses",
        "tensors": [{"artifact": "model.safetensors", "tensor": "fc.weight"}],
        "artifacts": ["model.safetensors"],        # artifacts whose bytes differ
        "first_divergent_step": null | 120         # from the step trail, if any
      },
      "outputs": "identical" | "equivalent" | "differ",  # only where it decided the exit
      "numeric": {…},                              # only where judged: the numeric trails
                                                   # against a noise envelope
      "reason_code": "outputs-differ" | "inside-envelope" | …,  # only where weighed and
                                                   # not identical: the stable code
                                                   # (manifest.judge.reasons)
      "differences": [                             # bits first, then by section
        {
          "section": "env",
          "path": "env.cudnn",                     # keys shown in [brackets]
          "location": ["env", "cudnn"],            # the same path, unambiguous
          "rule": "env.cudnn",                     # the RULES entry that applied
          "change": "changed" | "added" | "removed",   # added: only in b
          "impact": "bits" | "benign",
          "reason": "cuDNN 9.1.0 → 9.3.0: convolution kernels may change",
          "before": <JSON value in a, null if absent>,
          "after": <JSON value in b, null if absent>
        }
      ]
    }

This module never prints or exits; ``manifest.cli`` renders the result and
turns :attr:`ManifestDiff.has_bits` into the exit status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from manifest.diff.rules import Impact
from manifest.judge.tables import DiffOutcome, OutputsOutcome

if TYPE_CHECKING:
    from manifest.travel.sign import InputSignature

JSON_FORMAT = "manifest-diff/v1"


class ChangeKind(StrEnum):
    CHANGED = "changed"
    ADDED = "added"
    """Present only in the second manifest."""
    REMOVED = "removed"
    """Present only in the first manifest."""


Key = str | int
JsonValue = Any


@dataclass(frozen=True, slots=True)
class Difference:
    """One field that differs between manifest ``a`` and manifest ``b``."""

    location: tuple[Key, ...]
    path: str
    rule: str
    change: ChangeKind
    impact: Impact
    reason: str
    before: Any = field(repr=False)
    """The value in ``a`` (a model, a scalar, a list or dict, or None)."""
    after: Any = field(repr=False)

    @property
    def section(self) -> str:
        return str(self.location[0])

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "section": self.section,
            "path": self.path,
            "location": list(self.location),
            "rule": self.rule,
            "change": self.change.value,
            "impact": self.impact.value,
            "reason": self.reason,
            "before": _jsonable(self.before),
            "after": _jsonable(self.after),
        }


@dataclass(frozen=True, slots=True)
class NonDeterminism:
    """Same ``run_id``, different outputs: the inputs were the same, the bits were not."""

    message: str
    tensors: tuple[tuple[str, str], ...]
    """(artifact path, tensor name) of every tensor that differs or exists in one run only."""
    artifacts: tuple[str, ...]
    """Artifacts whose bytes differ (with or without a tensor table)."""
    first_divergent_step: int | None

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "message": self.message,
            "tensors": [{"artifact": a, "tensor": t} for a, t in self.tensors],
            "artifacts": list(self.artifacts),
            "first_divergent_step": self.first_divergent_step,
        }


WEIGHED_BY_OUTPUTS = ("randomness.", "outputs.processes[*].at_exit")
"""Rules whose ``bits`` lines identical outputs settle: seeds and generator states (at start
and at exit) act only through the run's draws, and identical weights show the draws did not
reach them (makemore reseeds torch itself: --seed 0 and 1 give the same weights). A code,
data or library change stays ``bits`` (exit 1) even then: it may well matter on other
inputs."""


def settled_by_outputs(d: Difference) -> bool:
    """Whether identical outputs settle this difference (:data:`WEIGHED_BY_OUTPUTS`)."""
    return d.rule.startswith(WEIGHED_BY_OUTPUTS)


@dataclass(frozen=True, slots=True)
class ManifestDiff:
    """Every difference between two manifests, ``bits`` first."""

    a_run_id: str
    b_run_id: str
    a_digest: str
    b_digest: str
    differences: tuple[Difference, ...]
    nondeterminism: NonDeterminism | None
    a_signature: InputSignature | None = None
    """The signature found with the first input (its pack's, FILE.sig, --signature)."""
    b_signature: InputSignature | None = None
    outputs: OutputsOutcome | None = None
    """What the runs produced, weighed (``engine.weigh_outputs``): ``identical``,
    ``equivalent``, ``differ``, or None when a side has no output or trail to compare."""
    numeric: dict[str, Any] | None = None
    """``equivalent`` or a rounding-only ``differ``: the numeric trails judged against the
    noise envelope (``manifest.numeric.envelope.Judgement.to_json``); or, where the runs
    computed on other devices, ``{"verdict": "not-compared", "reason", "sentence"}``
    (``manifest.numeric.precision.device_change``)."""

    @property
    def same_run_id(self) -> bool:
        return self.a_run_id == self.b_run_id

    @property
    def bits(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.impact is Impact.BITS)

    @property
    def benign(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.impact is Impact.BENIGN)

    @property
    def has_bits(self) -> bool:
        return any(d.impact is Impact.BITS for d in self.differences)

    @property
    def verdict(self) -> DiffOutcome:
        """``bits``, ``benign`` (only benign differences) or ``identical``
        (``manifest.judge.rules.diff_verdict``)."""
        from manifest.judge.rules import diff_verdict

        return diff_verdict(bits=self.has_bits, differences=bool(self.differences))

    @property
    def reason_code(self) -> str | None:
        """The stable code of the outputs' weighing (``manifest.judge.rules.diff_reason``)."""
        from manifest.judge.rules import diff_reason

        code = diff_reason(self.outputs, self.numeric)
        return None if code is None else str(code)

    @property
    def settled_by_outputs(self) -> bool:
        """``bits`` lines only of seeds and generators, and identical outputs anyway."""
        return (self.outputs == OutputsOutcome.IDENTICAL and self.has_bits
                and all(settled_by_outputs(d) for d in self.bits))

    @property
    def exit_code(self) -> int:
        """0 when nothing can change the bits, or only seeds and generators differ and the
        outputs are identical anyway; 4 when the outputs are equivalent (the same run up to
        rounding); 1 otherwise."""
        from manifest.errors import EXIT_EQUIVALENT, EXIT_FAILED, EXIT_OK

        if self.settled_by_outputs:
            return EXIT_OK
        if self.outputs == OutputsOutcome.EQUIVALENT:
            return EXIT_EQUIVALENT
        return EXIT_FAILED if self.has_bits else EXIT_OK

    def selected(self, only: Impact | None = None) -> tuple[Difference, ...]:
        if only is None:
            return self.differences
        return tuple(d for d in self.differences if d.impact is only)

    def to_json(
        self, *, a_file: str | None = None, b_file: str | None = None, only: Impact | None = None
    ) -> dict[str, JsonValue]:
        """The documented ``--json`` document (see the module docstring)."""
        return {
            "format": JSON_FORMAT,
            "a": {"file": a_file, "run_id": self.a_run_id, "digest": self.a_digest,
                  "signature": None if self.a_signature is None
                  else dict(self.a_signature.to_json())},
            "b": {"file": b_file, "run_id": self.b_run_id, "digest": self.b_digest,
                  "signature": None if self.b_signature is None
                  else dict(self.b_signature.to_json())},
            "same_run_id": self.same_run_id,
            "verdict": str(self.verdict),
            "counts": {"bits": len(self.bits), "benign": len(self.benign)},
            "only": None if only is None else only.value,
            "nondeterminism": None if self.nondeterminism is None
            else self.nondeterminism.to_json(),
            # Only where weighing the outputs changed the answer (the exit status).
            **({"outputs": None if self.outputs is None else str(self.outputs)}
               if self.settled_by_outputs or self.outputs == OutputsOutcome.EQUIVALENT
               or self.numeric is not None else {}),
            **({"numeric": self.numeric} if self.numeric is not None else {}),
            # Only where the outputs were weighed and did not come out identical.
            **({"reason_code": self.reason_code} if self.reason_code is not None else {}),
            "differences": [d.to_json() for d in self.selected(only)],
        }


def _jsonable(value: Any) -> JsonValue:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
