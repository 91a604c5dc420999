"""Why a verdict is what it is, as a stable code beside the sentence for people.

Every reason a verb gives is a :class:`ReasonCode` and a sentence. The sentence is for
people and may be reworded; the code is for scripts (CI jobs, the GitHub Action) and is
never renamed once shipped: ``--format json`` of verify, diff, gate, lab, explain and
``verify --segments`` carries it as ``reason_code`` next to ``reason``. The concepts page
lists every code with :data:`MEANINGS`, generated at each docs build (``docs/gen_ref.py``).
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    """The code of every reason a verdict is given with."""

    NOTHING_COMPARED = "nothing-compared"
    OUTPUTS_DIFFER = "outputs-differ"
    TRAIL_PARTS = "trail-parts"
    OUTPUTS_MISSING = "outputs-missing"
    RERUN_FAILED = "rerun-failed"
    RECORDED_RUN_FAILED = "recorded-run-failed"
    NO_COMMAND = "no-command"
    STRICT_DRIFT = "strict-drift"
    IN_PLACE_CODE = "in-place-code"
    ENVIRONMENT_NOT_BUILT = "environment-not-built"
    DATA_CHANGED = "data-changed"
    TOPOLOGY_CHANGED = "topology-changed"
    INSIDE_ENVELOPE = "inside-envelope"
    TRAIL_OUTSIDE_ENVELOPE = "trail-outside-envelope"
    OUTPUTS_OUTSIDE_ENVELOPE = "outputs-outside-envelope"
    OUTPUTS_NOT_COMPARED = "outputs-not-compared"
    OUTPUTS_DID_NOT_TRAVEL = "outputs-did-not-travel"
    ENVELOPE_NOT_COMPARED = "envelope-not-compared"
    REPLAY_FAILED = "replay-failed"
    REPLAY_NOT_STARTED = "replay-not-started"
    NO_TEMPLATE = "no-template"
    PARTS_AT_RESUME = "parts-at-resume"
    RUNS_AGREE = "runs-agree"
    RUNS_PARTED = "runs-parted"
    EXPLAIN_FAILED = "explain-failed"


MEANINGS: dict[ReasonCode, str] = {
    ReasonCode.NOTHING_COMPARED: "no output tensor and no step-trail point to compare; the "
                                 "sentence gives the fix (--artifact PATH)",
    ReasonCode.OUTPUTS_DIFFER: "a declared output's bytes differ (the tensors are named)",
    ReasonCode.TRAIL_PARTS: "the outputs match but the step trails part",
    ReasonCode.OUTPUTS_MISSING: "the re-run did not write a declared output",
    ReasonCode.RERUN_FAILED: "the re-run's command failed (its error, and the files it read "
                             "that git does not carry)",
    ReasonCode.RECORDED_RUN_FAILED: "the recorded run itself failed: there is nothing to "
                                    "reproduce",
    ReasonCode.NO_COMMAND: "the manifest records no command to re-run",
    ReasonCode.STRICT_DRIFT: "the environment (or data) drifted in bits under --strict",
    ReasonCode.IN_PLACE_CODE: "--in-place: the tree is not the recorded code",
    ReasonCode.ENVIRONMENT_NOT_BUILT: "--env run: the run's own environment could not be "
                                      "rebuilt and proven",
    ReasonCode.DATA_CHANGED: "recorded data (local or remote) changed since capture; the "
                             "data is named",
    ReasonCode.TOPOLOGY_CHANGED: "the outputs differ on another world size (the size of the "
                                 "difference is given)",
    ReasonCode.INSIDE_ENVELOPE: "not the same bits, but every step and every output lies "
                                "inside a noise envelope that may decide",
    ReasonCode.TRAIL_OUTSIDE_ENVELOPE: "a step of the numeric trail lies outside the noise "
                                       "envelope (the step, how far, which group)",
    ReasonCode.OUTPUTS_OUTSIDE_ENVELOPE: "the step trails lie inside the envelope, but a "
                                         "declared output lies outside its last step",
    ReasonCode.OUTPUTS_NOT_COMPARED: "the step trails lie inside the envelope, but a "
                                     "declared output could not be compared numerically",
    ReasonCode.OUTPUTS_DID_NOT_TRAVEL: "the step trails lie inside the envelope, and the "
                                       "recorded outputs are not on this machine "
                                       "(--outputs DIR, pack --with-outputs)",
    ReasonCode.ENVELOPE_NOT_COMPARED: "not the same bits, and no envelope may decide whether "
                                      "the difference is rounding (other devices, none "
                                      "vouched for, a refused twin)",
    ReasonCode.REPLAY_FAILED: "a stretch's replay failed",
    ReasonCode.REPLAY_NOT_STARTED: "a stretch's replay could not be set up (its checkpoint "
                                   "could not be placed, too many outputs at its end, the "
                                   "executor refused the job)",
    ReasonCode.NO_TEMPLATE: "a stretch starts from a checkpoint the script cannot resume",
    ReasonCode.PARTS_AT_RESUME: "a stretch parts at its first step: the resume, not the "
                                "training, differs",
    ReasonCode.RUNS_AGREE: "explain: the fresh runs and the recorded trail do not part",
    ReasonCode.RUNS_PARTED: "explain: the runs part (the step, op and cause are named)",
    ReasonCode.EXPLAIN_FAILED: "explain: no step to explain (a run failed, no trail, no op "
                               "stream)",
}
"""Each code → what it means, for the concepts page (``docs/gen_ref.py``)."""
