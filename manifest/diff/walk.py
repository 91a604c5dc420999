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

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from manifest.diff.reasons import reason_for, show_value
from manifest.diff.result import ChangeKind, Difference, Key
from manifest.diff.rules import FALLBACK_RULE, REFINED, RULES, Impact, Rule

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
    "observed.recording": "rank",
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
                          "outputs.envelope.twin", "outputs.checkpoints",
                          "observed.lockfile_disagrees"})
"""Lists of measurements compared as one value: one line when they differ, never one line
per step (the numeric trail, the envelope and its emulated twin's trail: ``manifest.numeric``
reads them; the
checkpoints saved during training: ``verify --segments`` reads them, and the step trail
already names the first step where two runs part; the lockfile disagreements, a note on
the installed versions that ``env`` compares one by one)."""

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
                if pattern == "env" and name == "environment_digest" and any(
                        getattr(a, f) != getattr(b, f) for f in ("distributions", "packages")):
                    continue  # a summary: the lines that differ behind it are listed
                self.walk(va, vb, (*loc, name), f"{path}.{name}", keys, f"{pattern}.{name}",
                          known_different=True)
        elif isinstance(a, dict) and isinstance(b, dict) and pattern == "env.packages":
            self.walk_packages(a, b, loc, path, keys, pattern)
        elif isinstance(a, dict) and isinstance(b, dict) and pattern == "env.distributions":
            self.walk_distributions(a, b, loc, path, keys, pattern)
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

    def walk_packages(
        self, a: Mapping[Key, Any], b: Mapping[Key, Any], loc: tuple[Key, ...], path: str,
        keys: tuple[Key, ...], pattern: str,
    ) -> None:
        """``env.packages``, with each CUDA-suffix rename (:func:`cuda_renames`) on one line."""
        renames = cuda_renames(a, b)
        if not renames:
            self.walk_mapping(a, b, loc, path, keys, pattern)
            return
        gone = set(renames) | set(renames.values())
        self.walk_mapping({k: v for k, v in a.items() if k not in gone},
                          {k: v for k, v in b.items() if k not in gone},
                          loc, path, keys, pattern)
        for old, new in sorted(renames.items()):
            rule_name, rule = rule_for(f"{path}[{new}]", f"{pattern}[*]")
            before, after = f"{old}=={a[old]}", f"{new}=={b[new]}"
            reason = (f"package {old} {a[old]} → {new} {b[new]}: renamed with CUDA "
                      f"{_cuda_major(old) or '?'} → {_cuda_major(new) or '?'} (the same library "
                      f"under its new wheel name)")
            if a[old] != b[new]:
                reason += f"; {rule.why}"
            self.found.append(Difference(
                location=(*loc, new), path=f"{path}[{old} → {new}]", rule=rule_name,
                change=ChangeKind.CHANGED, impact=rule.impact, reason=reason,
                before=before, after=after))

    def walk_distributions(
        self, a: Mapping[Key, Any], b: Mapping[Key, Any], loc: tuple[Key, ...], path: str,
        keys: tuple[Key, ...], pattern: str,
    ) -> None:
        """``env.distributions``: only what ``env.packages`` cannot say.

        A distribution added, removed or at another version is already one
        line under ``env.packages``; here each distribution at the same
        version is compared by its record, and "same version, other files"
        is the line that matters (``bits`` where the version counts).
        """
        how: dict[str, list[tuple[Key, Any, Any]]] = {}
        for name in sorted(a.keys() & b.keys(), key=_sort_key):
            da, db = a[name], b[name]
            if _same(da, db) or da.version != db.version:
                continue
            for field in type(da).model_fields:
                va, vb = getattr(da, field), getattr(db, field)
                if va == vb:
                    continue
                if field == "files":
                    self.found.append(self._files_difference(
                        name, da, db, (*loc, name, field), f"{path}[{name}].{field}"))
                else:
                    how.setdefault(field, []).append((name, va, vb))
        for field, changed in how.items():
            if len(changed) > FOLD_OVER:
                self.found.append(_folded(field, changed, loc, path, pattern))
                continue
            for name, va, vb in changed:
                self.walk(va, vb, (*loc, name, field), f"{path}[{name}].{field}",
                          (*keys, name), f"{pattern}[*].{field}", known_different=True)

    def _files_difference(self, name: Key, da: Any, db: Any, loc: tuple[Key, ...],
                          path: str) -> Difference:
        rule_name = "env.distributions[*].files"
        rule = RULES[rule_name]
        editable = [d.direct_url is not None and d.direct_url.editable for d in (da, db)]
        if any(editable):
            rule = REFINED["editable-files"]
            reason = f"{name} {da.version}: other files: {rule.why}"
        elif da.files is None or db.files is None:
            rule = replace(rule, impact=Impact.BENIGN)
            where = "a" if da.files is None else "b"
            reason = (f"{name} {da.version}: files not compared: {where} recorded no file list "
                      "(no RECORD); the version is compared")
        else:
            reason = f"{name} {da.version}: same version, other files (another build)"
        return Difference(location=loc, path=path, rule=rule_name, change=ChangeKind.CHANGED,
                          impact=rule.impact, reason=reason, before=da.files, after=db.files)

    def emit(
        self, a: Any, b: Any, change: ChangeKind, loc: tuple[Key, ...], path: str,
        keys: tuple[Key, ...], pattern: str,
    ) -> None:
        rule_name, rule = rule_for(path, pattern)
        self.found.append(Difference(
            location=loc, path=path, rule=rule_name, change=change, impact=rule.impact,
            reason=reason_for(rule, change, a, b, keys, path), before=a, after=b,
        ))


FOLD_OVER = 3
"""More distributions than this whose installer, tags or direct URL differ are one line:
an environment rebuilt by uv from one installed by pip differs in every installer."""


def _folded(field: str, changed: list[tuple[Key, Any, Any]], loc: tuple[Key, ...], path: str,
            pattern: str) -> Difference:
    """One line for a how-installed field that differs in many distributions."""
    rule_name = f"{pattern}[*].{field}"
    rule = RULES[rule_name]
    names = [str(name) for name, _, _ in changed]
    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    pairs = {(show_value(va), show_value(vb)) for _, va, vb in changed}
    label = rule.label.replace("{keys[0]} ", "")
    if len(pairs) == 1:
        (before, after), = pairs
        text = f"{label} {before} → {after} in {len(changed)} distributions ({shown})"
    else:
        text = f"{label} differs in {len(changed)} distributions ({shown})"
    return Difference(
        location=(*loc, "*", field), path=f"{path}[*].{field}", rule=rule_name,
        change=ChangeKind.CHANGED, impact=rule.impact, reason=f"{text}: {rule.why}",
        before={str(name): _json(va) for name, va, _ in changed},
        after={str(name): _json(vb) for name, _, vb in changed})


def _json(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


_CUDA_SUFFIX = re.compile(r"-cu(\d+)$")


def _cuda_major(name: Key) -> str | None:
    m = _CUDA_SUFFIX.search(str(name))
    return m.group(1) if m else None


def cuda_renames(a: Mapping[Key, Any], b: Mapping[Key, Any]) -> dict[str, str]:
    """``{name in a: name in b}`` for NVIDIA wheels renamed between CUDA majors.

    NVIDIA's CUDA 12 wheels carry the major in the name (``nvidia-cublas-cu12``);
    CUDA 13's drop it (``nvidia-cublas``, pinned through the ``cuda-toolkit``
    metapackage) or carry ``-cu13`` (``nvidia-cudnn-cu13``, ``nvidia-nccl-cu13``).
    An ``nvidia-*`` name only in ``a`` and one only in ``b`` with the same name
    once the suffix is dropped is one library under two wheel names; a base
    name that matches more than one on either side is left as it is.
    """
    def bases(names: set[Key]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in names:
            if isinstance(n, str) and n.startswith("nvidia-"):
                out.setdefault(_CUDA_SUFFIX.sub("", n), []).append(n)
        return out

    only_a, only_b = bases(a.keys() - b.keys()), bases(b.keys() - a.keys())
    return {olds[0]: only_b[base][0] for base, olds in only_a.items()
            if len(olds) == 1 and len(only_b.get(base, ())) == 1}


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
