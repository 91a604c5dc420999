"""Refinements on top of the rule table, and the non-determinism finding.

The table (``manifest.diff.rules``) labels one field at a time; these labels
need both manifests as a whole (the labels themselves live in the table
module: ``RULES`` and ``REFINED``):

* a package neither run imported is ``benign``, and a launcher seed that both
  runs' own seeding replaced before any draw is ``benign`` with the call
  sites named (``manifest.diff.overrides`` decides both);
* a generator that no process of either run drew from (its state at exit is
  its state at start everywhere, and nothing could hide a draw) makes its
  state lines ``benign``, and a seed every one of whose generators was
  reseeded before its first draw or never drawn from is ``benign``, each
  reason saying which (``overrides.never_drawn``);

* ``env.packages_digest`` is a summary of ``env.packages``: it is not listed
  when a package line already says what changed.
* An artifact whose file digest (or size) differs while every tensor in it
  is identical differs in container metadata only (``torch.save`` embeds the
  archive name): that line is ``benign``.

When both manifests have the same ``run_id`` and their outputs differ in a
way that is ``bits``, the inputs were the same and the results were not:
:attr:`~manifest.diff.result.ManifestDiff.nondeterminism` says so and names the differing tensors.
"""

from __future__ import annotations

from typing import Any

from manifest.diff.reasons import reason_for
from manifest.diff.result import Difference, Key, NonDeterminism
from manifest.diff.rules import REFINED, SUMMARY_FIELDS, Impact, Rule
from manifest.diff.walk import keyed
from manifest.models import Manifest

_ARTIFACT_FILE_FIELDS = ("outputs.artifacts[*].digest", "outputs.artifacts[*].bytes")


def refine_labels(found: list[Difference], a: Manifest, b: Manifest) -> list[Difference]:
    """Apply the documented refinements to the table's labels."""
    from manifest.diff.envreads import relabel_unrecorded

    found = relabel_unrecorded(found, a, b)  # reads only one run recorded: said once, benign
    out: list[Difference] = []
    same_tensors = _artifacts_with_same_tensors(a, b)
    for d in found:
        refined = _refine_by_run(d, a, b)
        if refined is not None:
            out.append(refined)
            continue
        prefix = SUMMARY_FIELDS.get(d.rule)
        if prefix is not None and any(o.path.startswith(prefix) for o in found):
            continue
        if d.rule in _ARTIFACT_FILE_FIELDS and d.location[2] in same_tensors:
            d = Difference(
                location=d.location, path=d.path, rule=d.rule, change=d.change,
                impact=Impact.BENIGN,
                reason=d.reason.partition(":")[0] + ": every tensor is identical, the file "
                "differs in container metadata only (torch.save embeds the archive name)",
                before=d.before, after=d.after,
            )
        out.append(d)
    return out


_RANK_RNG = {f"randomness.processes[*].at_start.{g}": g
             for g in ("python", "numpy", "torch_cpu", "cuda")}
_EXIT_RNG = {f"outputs.processes[*].at_exit.{g}": g
             for g in ("python", "numpy", "torch_cpu", "cuda")}


def _refine_by_run(d: Difference, a: Manifest, b: Manifest) -> Difference | None:
    """The labels of :data:`REFINED`: what the runs themselves made irrelevant."""
    from manifest.diff import overrides

    if d.impact is not Impact.BITS:
        return None
    sites: list[str] | None = None
    rule = None
    if d.rule == "env.packages[*]":
        if overrides.counts_for_bits(str(d.location[-1]), a, b):
            return None
        rule = REFINED["package-not-imported"]
        return _relabel(d, rule, reason_for(rule, d.change, d.before, d.after,
                                            (d.location[-1],), d.path))
    if d.rule == "env.distributions[*].files":  # "same version, other files": as its package
        if overrides.counts_for_bits(str(d.location[2]), a, b):
            return None
        rule = REFINED["package-not-imported"]
        return _relabel(d, rule, f"{d.reason}: {rule.why}")
    generator = _RANK_RNG.get(d.rule) or _EXIT_RNG.get(d.rule)
    if generator is not None and generator in overrides.never_drawn(a, b):
        rule = REFINED["rng-never-drawn"]
        return _relabel(d, rule, f"{d.reason.partition(':')[0]}: {rule.why}")
    if d.rule == "randomness.seed":
        sites, rule = overrides.seed_overridden(a, b), REFINED["seed-overridden"]
    elif d.rule == "randomness.processes[*].seed" or d.rule in _RANK_RNG:
        pa, pb = _process(a, d.location[2]), _process(b, d.location[2])
        if pa is None or pb is None:
            return None
        if d.rule in _RANK_RNG:
            site = overrides.overridden_generators(pa, pb).get(_RANK_RNG[d.rule])
            sites = [site] if site is not None else None
            rule = REFINED["rng-overridden"]
        else:
            sites = overrides.rank_seed_overridden(pa, pb, overrides.never_drawn(a, b))
            rule = REFINED["rank-seed-overridden"]
    if sites is None or rule is None:
        return None
    where = "; ".join(sites[:3]) + (" …" if len(sites) > 3 else "")
    return _relabel(d, rule, f"{d.reason.partition(':')[0]}: {rule.why} ({where})")


def _process(m: Manifest, rank: Any) -> Any:
    for p in m.randomness.processes:
        if p.rank == rank:
            return p
    return None


def _relabel(d: Difference, rule: Rule, reason: str) -> Difference:
    return Difference(location=d.location, path=d.path, rule=d.rule, change=d.change,
                      impact=rule.impact, reason=reason, before=d.before, after=d.after)


def _artifacts_with_same_tensors(a: Manifest, b: Manifest) -> set[Key]:
    if a.outputs is None or b.outputs is None:
        return set()
    a_arts = keyed(a.outputs.artifacts, "path")
    b_arts = keyed(b.outputs.artifacts, "path")
    return {
        k for k, art in a_arts.items()
        if k in b_arts and art.tensors is not None and art.tensors == b_arts[k].tensors
        and art.format == b_arts[k].format
    }


def find_nondeterminism(found: list[Difference]) -> NonDeterminism | None:
    """Same run_id: say so first if the outputs differ in bits."""
    outputs = [d for d in found if d.section == "outputs" and d.impact is Impact.BITS]
    if not outputs:
        return None
    tensors: list[tuple[str, str]] = []
    artifacts: list[str] = []
    steps: list[int] = []
    for d in outputs:
        loc = d.location
        if len(loc) >= 5 and loc[1] == "artifacts" and loc[3] == "tensors":
            pair = (str(loc[2]), str(loc[4]))
            if pair not in tensors:
                tensors.append(pair)
        if len(loc) >= 3 and loc[1] == "artifacts" and str(loc[2]) not in artifacts:
            artifacts.append(str(loc[2]))
        if d.rule == "outputs.processes[*].trail[*].digest" and isinstance(loc[4], int):
            steps.append(loc[4])
    weights = "weights" if artifacts else "outputs"
    return NonDeterminism(
        # The record can miss an input (a non-Python child reading the environment, a read
        # around os.environ: the launcher hook's limits), so the sentence names both causes.
        message=(f"same inputs, different {weights}: not deterministic, or an input "
                 "the record misses"),
        tensors=tuple(tensors),
        artifacts=tuple(artifacts),
        first_divergent_step=min(steps) if steps else None,
    )
