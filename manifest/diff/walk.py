"""The structural walk: every field that differs between two manifests, labelled.

The diff walks the pydantic models, not the JSON text. Lists whose elements
have a natural key are compared by that key (:data:`KEYED_LISTS`: datasets by
name, GPUs by index, processes by rank, artifacts by path, trail points by
step), dicts by key (packages, variables, tensors, lockfiles), and
:data:`SET_LISTS` as sets, so a reordered list is not a difference and one
changed package is one line. Other lists (``argv``, fingerprints) are one
value each.

Every difference gets an :class:`~manifest.diff.rules.Impact` from
:data:`~manifest.diff.rules.RULES`, the one table that says which fields can
change the bits and why. A path is looked up concretely first
(``env.variables[OMP_NUM_THREADS]``), then with keys as ``[*]``
(``env.packages[*]``); a path in neither is labelled ``bits`` (fail safe) and
the test suite checks that every model field has a rule.

The walk knows nothing about what the runs did; labels that depend on both
manifests as a whole are applied afterwards (``manifest.diff.refine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from manifest.diff.reasons import reason_for
from manifest.diff.result import ChangeKind, Difference, Key
from manifest.diff.rules import FALLBACK_RULE, RULES, Rule

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
    "determinism.outside_recipe": "command",
    "hardware.nodes": "node",
    "hardware.nodes[*].gpus": "index",
    "command.topology.ranks": "rank",
    "outputs.segments": "restart",
}
"""List pattern -> the field that names an element. The key field itself is never a difference."""

OPAQUE_LISTS = frozenset({"outputs.processes[*].numeric", "outputs.envelope.steps",
                          "outputs.envelope.twin", "outputs.checkpoints"})
"""Lists of measurements compared as one value: one line when they differ, never one line
per step (the numeric trail, the envelope and its emulated twin's trail: ``manifest.numeric``
reads them; the
checkpoints saved during training: ``verify --segments`` reads them, and the step trail
already names the first step where two runs part)."""

SET_LISTS = frozenset({"hardware.cpu_isa", "hardware.nodes[*].cpu_isa"})
"""Lists whose order carries no meaning: compared as sets of strings."""


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


class Walker:
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
            self.walk_mapping(keyed(a, key_field), keyed(b, key_field), loc, path, keys, pattern)
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
            reason=reason_for(rule, change, a, b, keys, path), before=a, after=b,
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


def keyed(items: list[Any], key_field: str) -> dict[Key, Any]:
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
