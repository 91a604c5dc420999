"""How one difference is worded: its reason sentence and short value forms.

The rule table (``manifest.diff.rules``) gives each field a label, a why and
whether its values are worth showing; this module turns a rule plus the two
values into the sentence a reader sees (``cuDNN 9.1.0 → 9.3.0: convolution
kernels may change``). Digests are cut to 19 characters and commits to 12, so
a line stays under a terminal width; lists of more than 8 values become a
count. :func:`show_value` is also what the renderers in ``manifest.cli`` use
for ``run_id`` and table cells, so a value reads the same everywhere.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from manifest.diff.result import ChangeKind, Key
from manifest.diff.rules import Rule

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
        from manifest.models import EnvRead

        if value and len(value) <= 8 and all(isinstance(v, EnvRead) for v in value.values()):
            return ", ".join(f"{k} ({v.site})" for k, v in value.items())
        return f"{len(value)} entries"
    return _summarise_model(value)


def _summarise_model(value: Any) -> str:
    from manifest.models import Artifact, Dataset, EnvRead, Gpu, Submodule, Tensor

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
    if isinstance(value, EnvRead):
        return f"read at {value.site}"
    return "recorded"


def reason_for(
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

