"""Structural diff of two manifests, each difference labelled by its impact.

The diff walks the pydantic models, not the JSON text. Lists whose elements
have a natural key are compared by that key (:data:`KEYED_LISTS`: datasets by
name, GPUs by index, processes by rank, artifacts by path, trail points by
step), dicts by key (packages, variables, tensors, lockfiles), and
:data:`SET_LISTS` as sets, so a reordered list is not a difference and one
changed package is one line. Other lists (``argv``, fingerprints) are one
value each.

Every difference gets an :class:`Impact` from :data:`RULES`, the one table
that says which fields can change the bits and why. A path is looked up
concretely first (``env.variables[OMP_NUM_THREADS]``), then with keys as
``[*]`` (``env.packages[*]``); a path in neither is labelled ``bits`` (fail
safe) and the test suite checks that every model field has a rule.

Refinements sit on top of the table, each documented where it applies (the
labels themselves live in ``manifest.diff.rules``: ``RULES`` and ``REFINED``):

* a package neither run imported is ``benign``, and a launcher seed that both
  runs' own seeding replaced before any draw is ``benign`` with the call
  sites named (``manifest.diff.overrides`` decides both);

* ``env.packages_digest`` is a summary of ``env.packages``: it is not listed
  when a package line already says what changed.
* An artifact whose file digest (or size) differs while every tensor in it
  is identical differs in container metadata only (``torch.save`` embeds the
  archive name): that line is ``benign``.

When both manifests have the same ``run_id`` and their outputs differ in a
way that is ``bits``, the inputs were the same and the results were not:
:attr:`ManifestDiff.nondeterminism` says so and names the differing tensors.

``--json`` shape (``format`` is bumped on any incompatible change)::

    {
      "format": "manifest-diff/v1",
      "a": {"file": "a.json", "run_id": "blake3:…", "digest": "blake3:…"},
      "b": {"file": "b.json", "run_id": "blake3:…", "digest": "blake3:…"},
      "same_run_id": false,
      "verdict": "bits" | "benign" | "identical",
      "counts": {"bits": 2, "benign": 1},          # over all differences
      "only": null | "bits" | "benign",            # the filter applied below
      "nondeterminism": null | {
        "message": "same inputs, different weights: the run is not deterministic here",
        "tensors": [{"artifact": "model.safetensors", "tensor": "fc.weight"}],
        "artifacts": ["model.safetensors"],        # artifacts whose bytes differ
        "first_divergent_step": null | 120         # from the step trail, if any
      },
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
turns :attr:`ManifestDiff.has_bits` into the exit status. It imports neither
torch, git, pynvml nor numpy: diff runs in CI jobs that have none of them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from manifest.diff.rules import FALLBACK_RULE, REFINED, RULES, SUMMARY_FIELDS, Impact, Rule
from manifest.errors import ManifestError, UnsupportedSchemaError
from manifest.models import SCHEMA_V1, Manifest

JSON_FORMAT = "manifest-diff/v1"

SECTIONS = (
    "schema", "code", "data", "env", "hardware", "randomness", "determinism",
    "command", "outputs", "observed",
)
"""Report order of the sections; ``run_id`` and ``digest`` are derived, not compared."""

DERIVED_FIELDS = frozenset({"run_id", "digest"})

KEYED_LISTS: Mapping[str, str] = {
    "code.submodules": "path",
    "data": "name",
    "hardware.gpus": "index",
    "randomness.processes": "rank",
    "determinism.processes": "rank",
    "outputs.artifacts": "path",
    "outputs.processes": "rank",
    "outputs.processes[*].trail": "step",
    "observed.compute.ranks": "rank",
    "observed.compute.gpus": "index",
    "randomness.processes[*].reseeds": "site",
    "randomness.processes[*].loaders": "site",
    "determinism.processes[*].switches": "switch",
}
"""List pattern -> the field that names an element. The key field itself is never a difference."""

SET_LISTS = frozenset({"hardware.cpu_isa"})
"""Lists whose order carries no meaning: compared as sets of strings."""


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


@dataclass(frozen=True, slots=True)
class ManifestDiff:
    """Every difference between two manifests, ``bits`` first."""

    a_run_id: str
    b_run_id: str
    a_digest: str
    b_digest: str
    differences: tuple[Difference, ...]
    nondeterminism: NonDeterminism | None

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
    def verdict(self) -> str:
        """``bits``, ``benign`` (only benign differences) or ``identical``."""
        if self.has_bits:
            return Impact.BITS.value
        return Impact.BENIGN.value if self.differences else "identical"

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
            "a": {"file": a_file, "run_id": self.a_run_id, "digest": self.a_digest},
            "b": {"file": b_file, "run_id": self.b_run_id, "digest": self.b_digest},
            "same_run_id": self.same_run_id,
            "verdict": self.verdict,
            "counts": {"bits": len(self.bits), "benign": len(self.benign)},
            "only": None if only is None else only.value,
            "nondeterminism": None if self.nondeterminism is None
            else self.nondeterminism.to_json(),
            "differences": [d.to_json() for d in self.selected(only)],
        }


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


def diff_manifests(a: Manifest, b: Manifest) -> ManifestDiff:
    """Compare two manifests field by field; see the module docstring."""
    walker = _Walker()
    for name in type(a).model_fields:
        loc_name = "schema" if name == "schema_" else name
        if loc_name in DERIVED_FIELDS:
            continue
        walker.walk(getattr(a, name), getattr(b, name), (loc_name,), loc_name, (), loc_name)
    found = _refine(walker.found, a, b)
    order = {s: i for i, s in enumerate(SECTIONS)}
    # Stable sort: bits first, then section order, then the walk's order.
    ranked = sorted(
        found, key=lambda d: (d.impact is not Impact.BITS, order.get(d.section, len(order)))
    )
    nondet = _nondeterminism(found) if a.run_id == b.run_id else None
    return ManifestDiff(
        a_run_id=a.run_id, b_run_id=b.run_id, a_digest=a.digest, b_digest=b.digest,
        differences=tuple(ranked), nondeterminism=nondet,
    )


def rule_for(path: str, pattern: str) -> tuple[str, Rule]:
    """The rule for a concrete path and its ``[*]`` pattern: (rule name, rule)."""
    rule = RULES.get(path)
    if rule is not None:
        return path, rule
    rule = RULES.get(pattern)
    if rule is not None:
        return pattern, rule
    return "(default)", FALLBACK_RULE


def _sort_key(key: Key) -> tuple[int, int, str]:
    return (0, key, "") if isinstance(key, int) else (1, 0, key)


class _Walker:
    def __init__(self) -> None:
        self.found: list[Difference] = []

    def walk(
        self, a: Any, b: Any, loc: tuple[Key, ...], path: str, keys: tuple[Key, ...],
        pattern: str, *, known_different: bool = False,
    ) -> None:
        # Callers that already compared a and b say so: model equality is the
        # costliest step when 10,000 tensors differ.
        if not known_different and _same(a, b):
            return
        if a is None or b is None:
            self.emit(a, b, ChangeKind.CHANGED, loc, path, keys, pattern)
        elif isinstance(a, BaseModel) and type(a) is type(b):
            key_field = _key_field(pattern)
            for name in type(a).model_fields:
                va, vb = getattr(a, name), getattr(b, name)
                if name == key_field or va == vb:
                    continue  # most fields are equal: skip them before building path strings
                self.walk(va, vb, (*loc, name), f"{path}.{name}", keys, f"{pattern}.{name}",
                          known_different=True)
        elif isinstance(a, dict) and isinstance(b, dict):
            self.walk_mapping(a, b, loc, path, keys, pattern)
        elif isinstance(a, list) and isinstance(b, list) and pattern in KEYED_LISTS:
            key_field = KEYED_LISTS[pattern]
            self.walk_mapping(_keyed(a, key_field), _keyed(b, key_field), loc, path, keys, pattern)
        elif isinstance(a, list) and isinstance(b, list) and pattern in SET_LISTS:
            self.walk_mapping(dict.fromkeys(map(str, a), "present"),
                              dict.fromkeys(map(str, b), "present"),
                              loc, path, keys, pattern)
        else:
            self.emit(a, b, ChangeKind.CHANGED, loc, path, keys, pattern)

    def walk_mapping(
        self, a: Mapping[Key, Any], b: Mapping[Key, Any], loc: tuple[Key, ...], path: str,
        keys: tuple[Key, ...], pattern: str,
    ) -> None:
        child_pattern = f"{pattern}[*]"
        for key in sorted(a.keys() | b.keys(), key=_sort_key):
            if key in a and key in b and _same(a[key], b[key]):
                continue
            child = ((*loc, key), f"{path}[{key}]", (*keys, key))
            if key not in b:
                self.emit(a[key], None, ChangeKind.REMOVED, *child, child_pattern)
            elif key not in a:
                self.emit(None, b[key], ChangeKind.ADDED, *child, child_pattern)
            else:
                self.walk(a[key], b[key], *child, child_pattern, known_different=True)

    def emit(
        self, a: Any, b: Any, change: ChangeKind, loc: tuple[Key, ...], path: str,
        keys: tuple[Key, ...], pattern: str,
    ) -> None:
        rule_name, rule = rule_for(path, pattern)
        self.found.append(Difference(
            location=loc, path=path, rule=rule_name, change=change, impact=rule.impact,
            reason=_reason(rule, change, a, b, keys, path), before=a, after=b,
        ))


def _same(a: Any, b: Any) -> bool:
    """Equality, with models compared by their field values.

    pydantic's ``__eq__`` also compares private and extra state, which
    manifest models (frozen, ``extra="forbid"``, no private attributes) never
    have; comparing ``__dict__`` gives the same answer several times faster.
    """
    if type(a) is type(b) and isinstance(a, BaseModel):
        return bool(a.__dict__ == b.__dict__)
    return bool(a == b)


def _key_field(pattern: str) -> str | None:
    """The key field of a keyed list element pattern (``data[*]`` -> ``name``)."""
    if pattern.endswith("[*]"):
        return KEYED_LISTS.get(pattern[:-3])
    return None


def _keyed(items: list[Any], key_field: str) -> dict[Key, Any]:
    """A keyed list as a dict; a repeated key gets ``#2``, ``#3`` … so nothing is lost."""
    out: dict[Key, Any] = {}
    for item in items:
        key: Key = getattr(item, key_field)
        if key in out:
            n = 2
            while f"{key}#{n}" in out:
                n += 1
            key = f"{key}#{n}"
        out[key] = item
    return out


# ------------------------------------------------------------------ reasons


_DIGEST = re.compile(r"^blake3:[0-9a-f]{64}$")
_HEX_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def show_value(value: Any, missing: str = "none") -> str:
    """A short human form of a field value, for reasons and tables."""
    if value is None:
        return missing
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if _DIGEST.match(value):
            return value[:19] + "…"
        if _HEX_COMMIT.match(value):
            return value[:12]
        return value if value else '""'
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        if not value:
            return "none"
        if all(isinstance(v, str) for v in value):
            return shlex.join(value)
        return ", ".join(show_value(v) for v in value) if len(value) <= 8 else f"{len(value)} items"
    if isinstance(value, dict):
        return f"{len(value)} entries"
    return _summarise_model(value)


def _summarise_model(value: Any) -> str:
    from manifest.models import Artifact, Dataset, Gpu, Submodule, Tensor

    if isinstance(value, Dataset):
        return f"{show_value(value.root)} ({value.files} files, {value.bytes} bytes)"
    if isinstance(value, Artifact):
        return f"{value.format} {show_value(value.digest)}"
    if isinstance(value, Gpu):
        return value.name
    if isinstance(value, Submodule):
        return show_value(value.commit)
    if isinstance(value, Tensor):
        return f"{value.dtype}{value.shape}"
    return "recorded"


def _reason(
    rule: Rule, change: ChangeKind, a: Any, b: Any, keys: tuple[Key, ...], path: str
) -> str:
    label = rule.label.format(key=keys[-1] if keys else "", keys=keys, path=path)
    if not rule.show_values:
        what = {ChangeKind.CHANGED: "changed", ChangeKind.ADDED: "only in b",
                ChangeKind.REMOVED: "only in a"}[change]
        if change is ChangeKind.CHANGED and (a is None or b is None):
            what = "recorded only in b" if a is None else "recorded only in a"
        text = f"{label} {what}"
    elif change is not ChangeKind.CHANGED and rule.missing is None:
        text = (f"{label} added ({show_value(b)})" if change is ChangeKind.ADDED
                else f"{label} removed (was {show_value(a)})")
    else:
        missing = rule.missing or "none"
        text = f"{label} {show_value(a, missing)} → {show_value(b, missing)}"
    return f"{text}: {rule.why}" if rule.why else text


# -------------------------------------------------------------- refinements


_ARTIFACT_FILE_FIELDS = ("outputs.artifacts[*].digest", "outputs.artifacts[*].bytes")


def _refine(found: list[Difference], a: Manifest, b: Manifest) -> list[Difference]:
    """Apply the documented refinements to the table's labels."""
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
        return _relabel(d, rule, _reason(rule, d.change, d.before, d.after, (d.location[-1],),
                                         d.path))
    if d.rule == "randomness.seed":
        sites, rule = overrides.seed_overridden(a, b), REFINED["seed-overridden"]
    elif d.rule == "randomness.processes[*].seed" or d.rule in _RANK_RNG:
        pa, pb = _process(a, d.location[2]), _process(b, d.location[2])
        if pa is None or pb is None:
            return None
        if d.rule in _RANK_RNG:
            site = overrides.overridden_generators(pa, pb).get(_RANK_RNG[d.rule])
            sites = [site] if site is not None else None
        else:
            sites = overrides.rank_seed_overridden(pa, pb)
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
    a_arts = _keyed(a.outputs.artifacts, "path")
    b_arts = _keyed(b.outputs.artifacts, "path")
    return {
        k for k, art in a_arts.items()
        if k in b_arts and art.tensors is not None and art.tensors == b_arts[k].tensors
        and art.format == b_arts[k].format
    }


def _nondeterminism(found: list[Difference]) -> NonDeterminism | None:
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
        message=f"same inputs, different {weights}: the run is not deterministic here",
        tensors=tuple(tensors),
        artifacts=tuple(artifacts),
        first_divergent_step=min(steps) if steps else None,
    )


# ------------------------------------------------------------------ helpers


def _jsonable(value: Any) -> JsonValue:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
