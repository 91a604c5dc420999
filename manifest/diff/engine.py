"""Structural diff of two manifests, each difference labelled by its impact.

:func:`diff_manifests` runs four steps, each in its own module so that none
is more than a screen or two (the single module was 600 lines):

1. walk the two models field by field and label each difference from the
   rule table (``manifest.diff.walk``, wording in ``manifest.diff.reasons``,
   the table in ``manifest.diff.rules``);
2. refine the labels that depend on both runs as a whole: packages neither
   run imported, seeds the script replaced, container-only artifact changes
   (``manifest.diff.refine``, deciding with ``manifest.diff.overrides``);
3. rank: ``bits`` first, then by section in :data:`SECTIONS` order, then the
   walk's order;
4. with the same ``run_id`` on both sides, say first whether the outputs
   differ in bits: the run is not deterministic there;
5. weigh the evidence (``weigh_outputs``): a ``bits`` line says what *could* change
   the weights; when the two runs' outputs are nevertheless identical, each seed and
   generator line says so, and when those are the only ``bits`` lines the exit status
   follows the outputs (``manifest.diff.result.WEIGHED_BY_OUTPUTS``). Outputs that differ
   while every input difference is rounding only (hardware, driver, library build, threads) are
   ``equivalent`` when both runs were sealed here, their numeric trails stay inside the noise
   envelope, and both runs' output files, found on disk with their recorded tensors, lie
   within the bound's last step (``weigh_outputs``).

The result and its documented ``--json`` shape are ``manifest.diff.result``.
:func:`load_for_diff` reads one side, naming its file in every error.

No module of this package prints or exits; ``manifest.cli`` renders the
result and turns :attr:`~manifest.diff.result.ManifestDiff.exit_code` into the
exit status. None imports torch, git, pynvml nor numpy: diff runs in CI jobs
that have none of them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from manifest.diff.refine import find_nondeterminism, refine_labels
from manifest.diff.result import Difference, ManifestDiff, settled_by_outputs
from manifest.diff.rules import Impact
from manifest.diff.walk import Walker
from manifest.errors import ManifestError, UnsupportedSchemaError
from manifest.judge.rules import diff_outputs, outputs_not_held, worst_numeric
from manifest.judge.tables import OutputsOutcome
from manifest.models import SCHEMA_V1, Envelope, Manifest

SECTIONS = (
    "schema", "code", "data", "env", "hardware", "randomness", "determinism",
    "command", "outputs", "observed",
)
"""Report order of the sections; ``run_id`` and ``digest`` are derived, not compared."""

DERIVED_FIELDS = frozenset({"run_id", "digest"})


# ------------------------------------------------------------------ loading


def schema_major(schema: str) -> str:
    """``manifest/v1`` and ``manifest/v1.2`` -> ``v1``."""
    return schema.rpartition("/")[2].split(".")[0]


def load_for_diff(data: bytes, *, name: str) -> Manifest:
    """Load one side of a diff; every error names the file it came from.

    A manifest of another schema major version is refused with a sentence
    saying why: its fields cannot be compared one by one with ours.
    """
    from manifest.canonical import load_manifest, parse_json

    try:
        return load_manifest(data)
    except UnsupportedSchemaError as exc:
        doc = parse_json(data)
        found = doc.get("schema") if isinstance(doc, dict) else None
        if not isinstance(found, str):
            raise UnsupportedSchemaError(
                f"{name}: has no schema field, so it is not a manifest this tool wrote.",
                hint=exc.hint,
            ) from exc
        raise UnsupportedSchemaError(
            f"{name}: schema {found!r} is major version {schema_major(found)}, and this "
            f"manifest reads {SCHEMA_V1!r} (major {schema_major(SCHEMA_V1)}); manifests of "
            "different major versions cannot be compared field by field.",
            hint="Upgrade manifest to diff them, or diff two manifests of the same version.",
        ) from exc
    except ManifestError as exc:
        raise type(exc)(f"{name}: {exc.message}", hint=exc.hint) from exc


# ------------------------------------------------------------------- diffing


def outputs_root(manifest_file: str) -> Path | None:
    """Where a manifest's recorded output paths are looked for by diff: the repository
    that holds the manifest file (``manifest.nodes.patches.repository_of``); None for stdin
    or a file outside any repository (its outputs are then not compared)."""
    from manifest.nodes.patches import repository_of

    return repository_of(manifest_file)


def diff_manifests(a: Manifest, b: Manifest,
                   roots: tuple[Path | None, Path | None] = (None, None)) -> ManifestDiff:
    """Compare two manifests field by field; see the module docstring. ``roots``: the
    repositories each side's outputs are read from when diff weighs them numerically
    (``outputs_root``); without one that side's outputs are not compared, and the two runs
    are never ``equivalent``."""
    walker = Walker()
    for name in type(a).model_fields:
        loc_name = "schema" if name == "schema_" else name
        if loc_name in DERIVED_FIELDS:
            continue
        walker.walk(getattr(a, name), getattr(b, name), (loc_name,), loc_name, (), loc_name)
    found = refine_labels(walker.found, a, b)
    order = {s: i for i, s in enumerate(SECTIONS)}
    # Stable sort: bits first, then section order, then the walk's order.
    ranked = sorted(
        found, key=lambda d: (d.impact is not Impact.BITS, order.get(d.section, len(order)))
    )
    nondet = find_nondeterminism(found) if a.run_id == b.run_id else None
    outputs, numeric = weigh_outputs(a, b, ranked, roots)
    if outputs == OutputsOutcome.IDENTICAL:
        ranked = [_outputs_identical(d) for d in ranked]
    return ManifestDiff(
        a_run_id=a.run_id, b_run_id=b.run_id, a_digest=a.digest, b_digest=b.digest,
        differences=tuple(ranked), nondeterminism=nondet, outputs=outputs, numeric=numeric,
    )


# ------------------------------------------------------- weighing the outputs

_OUTPUT_EVIDENCE = ("outputs.artifacts", "outputs.processes[*].trail", "outputs.status",
                    "outputs.exit_code")
"""Rules of what the runs produced: weights, step-trail states, how they ended."""


def _has_evidence(m: Manifest) -> bool:
    out = m.outputs
    return out is not None and out.status == "ok" and bool(
        out.artifacts or any(p.trail for p in out.processes))


def weigh_outputs(a: Manifest, b: Manifest, found: list[Difference],
                  roots: tuple[Path | None, Path | None] = (None, None),
                  ) -> tuple[OutputsOutcome | None, dict[str, Any] | None]:
    """Step 5, the evidence: did the two runs produce the same thing? ``identical`` (no
    output, trail state or ending differs), ``equivalent``, ``differ``; None when a side
    has nothing to compare.

    ``equivalent`` is the judgement verify makes of a re-run, with both runs' own numbers
    held to what this machine can vouch for: every input that differs in bits is rounding
    only; the envelope is one sealed here (``_vouched_envelope``); both numeric trails were
    sealed here (a trail sits outside identity: anyone who can re-seal a manifest can put
    another run's trail in it); the trails lie inside the envelope (``numeric.envelope
    .judge``); and every declared output of both runs is on disk at its recorded path
    (``roots``) with its recorded tensors, and the two lie within the bound's last step
    (``numeric.outputs.output_distance`` and ``bind_outputs``, verify's own rule).
    Where any of that cannot be checked, the numeric verdict is ``not-compared`` with the
    reason, and the outputs ``differ`` (exit 1, ``manifest.judge.DIFF_OUTCOMES``)."""
    if not (_has_evidence(a) and _has_evidence(b)):
        return None, None
    produced = [d for d in found if d.impact is Impact.BITS and d.rule.startswith(
        _OUTPUT_EVIDENCE)]
    numeric = _numeric(a, b, found, roots) if produced else None
    return diff_outputs(produced=bool(produced), numeric=numeric), numeric


def _numeric(a: Manifest, b: Manifest, found: list[Difference],
             roots: tuple[Path | None, Path | None]) -> dict[str, Any] | None:
    """The numeric judgement of two runs whose outputs differ in bits (None: no envelope
    judges them; ``weigh_outputs`` says which)."""
    from manifest.numeric.envelope import judge, rounding_only

    inputs = [d for d in found if d.impact is Impact.BITS and d.section != "outputs"]
    assert a.outputs is not None and b.outputs is not None
    from manifest.numeric.precision import device_change

    moved = device_change(a, b)  # other devices: no envelope decides (verify says the same)
    rest = [d.path for d in inputs if d.rule not in _DEVICE_RULES]
    if moved is not None and (not rest or rounding_only(rest)):
        return _not_compared(moved)
    envelope = _vouched_envelope(a) or _vouched_envelope(b)
    if not rounding_only([d.path for d in inputs]) or envelope is None:
        return None
    from manifest.trust import was_sealed_here

    unvouched = [side for side, m in (("A", a), ("B", b)) if not was_sealed_here(m.digest)]
    if unvouched:
        return _not_compared(
            f"{' and '.join(unvouched)} was not sealed on this machine, and a numeric trail "
            "is its author's numbers (outside identity): whether the difference is rounding "
            "was not judged (`manifest verify --envelope N` re-runs it here)")
    again = {p.rank: p.numeric or [] for p in b.outputs.processes}
    verdicts = [judge(p.numeric or [], again.get(p.rank, []), envelope)
                for p in a.outputs.processes if p.numeric]
    if not verdicts:
        return None
    worst = worst_numeric(verdicts)
    if worst is not None:
        return worst.to_json()
    return _hold_outputs(a, b, roots, envelope, verdicts[0].to_json())


def _not_compared(reason: str) -> dict[str, Any]:
    return {"verdict": "not-compared", "reason": reason, "sentence": reason}


def _hold_outputs(a: Manifest, b: Manifest, roots: tuple[Path | None, Path | None],
                  envelope: Envelope, doc: dict[str, Any]) -> dict[str, Any]:
    """The trails lie inside the envelope: the outputs decide, compared numerically as
    verify compares a re-run's (``bind_outputs``), each side's file checked against its
    own recorded tensors first (``output_distance``); an output only one side declares is
    one not compared. Anything not compared: ``differ``."""
    from manifest.numeric.calibration import verdict_calibration
    from manifest.numeric.outputs import OutputDistance, bind_outputs

    assert a.outputs is not None and b.outputs is not None
    trail = next((p.numeric for p in sorted(a.outputs.processes, key=lambda p: p.rank)
                  if p.numeric), None) or []
    calibration = verdict_calibration(envelope, trail)
    theirs = {art.path: art for art in b.outputs.artifacts}
    outputs: list[OutputDistance] = []
    for art in a.outputs.artifacts:
        other = theirs.get(art.path)
        if other is None:
            outputs.append(OutputDistance(art.path, problem="B declares no output at this "
                                          "path: the outputs were not compared"))
            continue
        outputs.append(_output_pair(art, other, a, b, roots))
    mine = {art.path for art in a.outputs.artifacts}
    outputs.extend(OutputDistance(art.path, problem="A declares no output at this path: the "
                                  "outputs were not compared")
                   for art in b.outputs.artifacts if art.path not in mine)
    if not outputs:
        outputs.append(OutputDistance("(none)", problem="A declares no output: the outputs "
                                      "were not compared"))
    doc["trail_verdict"] = doc["verdict"]
    problem = bind_outputs(doc, outputs, calibration, compared=True)
    doc["outputs"] = [o.to_json() for o in outputs]
    if problem is not None:
        outputs_not_held(doc, problem)
    return doc


def _output_pair(art: Any, other: Any, a: Manifest, b: Manifest,
                 roots: tuple[Path | None, Path | None]) -> Any:
    """One declared output of A against B's at the same recorded path: both files on disk
    with their own recorded tensors, the distance the larger of the two directions."""
    from manifest.numeric.outputs import OutputDistance, output_distance

    files = []
    for side, m, root in (("A", a, roots[0]), ("B", b, roots[1])):
        if root is None:
            return OutputDistance(art.path, problem=f"{side}'s repository is not known (a "
                                  "manifest read from stdin or from outside a repository): "
                                  "the outputs were not compared")
        assert m.command is not None
        files.append(root / m.command.cwd / art.path)
    if files[0] == files[1]:
        return OutputDistance(art.path, problem=(
            "both runs recorded it at the same place, which holds at most one of them (a "
            "later run writes over the earlier's): the outputs were not compared"))
    try:
        there = output_distance(art, files[0], files[1])
        back = output_distance(other, files[1], files[0])
    except ImportError as exc:  # diff runs where numpy may be missing (CI jobs)
        return OutputDistance(art.path, problem=f"{exc.name or 'numpy'} is not installed "
                              "here: the outputs were not compared")
    for side, got in (("A", there), ("B", back)):
        if got.problem is not None:
            return OutputDistance(art.path, problem=f"{side}'s file: {got.problem}")
    assert there.distance is not None and back.distance is not None
    return there if there.distance >= back.distance else back


_DEVICE_RULES = frozenset(f"determinism.processes[*].{field}"
                          for field in ("devices", "cuda_runtime", "cudnn", "nccl"))
"""What a change of devices differs in by itself (the devices each process could use, the
CUDA libraries it loaded)."""


def _vouched_envelope(m: Manifest) -> Envelope | None:
    """A manifest's noise envelope, when diff may judge with it: the rule verify applies
    (``manifest.judge.envelope.may_decide``), with the vouching diff can check without a
    trust policy: sealed by this tool on this machine (the user's own capture). A received
    manifest's envelope never turns a difference into ``equivalent`` here; verify
    --envelope N measures one on the verifier's side."""
    from manifest.judge.envelope import may_decide, vouched_by_seal

    envelope = m.outputs.envelope if m.outputs is not None else None
    return may_decide(envelope, basis=vouched_by_seal(m)).envelope


def _outputs_identical(d: Difference) -> Difference:
    if d.impact is not Impact.BITS or not settled_by_outputs(d):
        return d
    return replace(d, reason=f"{d.reason} (could change the bits; here the outputs are "
                   "identical)")

