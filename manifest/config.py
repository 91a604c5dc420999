"""``[tool.manifest]`` in the user's pyproject.toml: defaults for the CLI.

Recognised keys (all optional)::

    [tool.manifest]
    command = ["python", "train.py"]   # what `manifest capture` runs
    seed = 0
    threads = 2
    data = ["data/", "labels=meta/labels.csv"]
    outputs = ["out/*.safetensors"]
    store = ".manifest"

    [tool.manifest.gate]               # see manifest.gate.checks
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from manifest.errors import ConfigError

KNOWN_KEYS = frozenset({"command", "seed", "threads", "data", "outputs", "store", "gate",
                        "deterministic"})


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start``."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(start: Path) -> tuple[dict[str, Any], Path | None]:
    """The ``[tool.manifest]`` table (empty if none) and the file it came from."""
    path = find_pyproject(start)
    if path is None:
        return {}, None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}.") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}.") from exc
    table = data.get("tool", {}).get("manifest", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[tool.manifest] in {path} must be a table.")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"[tool.manifest] in {path} has unknown key(s): {', '.join(unknown)}.",
            hint=f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
        )
    return table, path


def string_list(table: dict[str, Any], key: str, origin: Path | None, *,
                section: str = "[tool.manifest]") -> list[str] | None:
    """A list-of-strings value (a lone string counts as a list of one), validated."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{section} in {origin}: {key} must be a list of strings.")
    return list(value)
