"""``[tool.manifest]`` in the user's pyproject.toml: defaults for the CLI.

Recognised keys (all optional)::

    [tool.manifest]
    command = ["python", "train.py"]   # what `manifest capture` runs
    seed = 0
    threads = 2
    data = ["data/", "labels=meta/labels.csv"]
    outputs = ["out/*.safetensors"]
    store = ".manifest"
    resume = "--resume {checkpoint}"   # how the script resumes (verify --segments)

    [tool.manifest.gate]               # see manifest.gate.checks
    [tool.manifest.trust]              # see manifest.travel.policy
    [tool.manifest.executors.ray]      # see manifest.rerun.cluster (--on ray|slurm|k8s)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from manifest.errors import ConfigError

MAX_SEED = 2**53 - 1
"""The largest seed a manifest records (JSON's exact integer range)."""
MAX_THREADS = 65536

KNOWN_KEYS = frozenset({"command", "seed", "threads", "data", "outputs", "store", "gate",
                        "deterministic", "trust", "executors", "resume"})


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start``."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        # Anything by that name counts, so a FIFO or a symlink to a device is refused
        # by the bounded reader instead of passed over for a parent's file.
        if os.path.lexists(candidate):
            return candidate
    return None


def load_config(start: Path) -> tuple[dict[str, Any], Path | None]:
    """The ``[tool.manifest]`` table (empty if none) and the file it came from."""
    path = find_pyproject(start)
    if path is None:
        return {}, None
    import tomllib  # ~2 ms, paid only where a pyproject.toml is found

    from manifest.bounded import InputKind, read_user_text

    text = read_user_text(path, InputKind.CONFIG)
    assert text is not None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}.") from exc
    table = data.get("tool", {}).get("manifest", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[tool.manifest] in {path} must be a table.")
    unknown = sorted(set(table) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"[tool.manifest] in {path} has unknown key(s): {', '.join(unknown)}"
            f"{did_you_mean(unknown, KNOWN_KEYS)}.",
            hint=f"Known keys: {', '.join(sorted(KNOWN_KEYS))}.",
        )
    check_table(table, path)
    return table, path


def did_you_mean(words: list[str], known: frozenset[str] | set[str]) -> str:
    """``" (did you mean command?)"`` for the words with a close known one (difflib's ratio
    >= 0.6, the cutoff a mistyped verb is matched with), else ``""``."""
    import difflib

    pairs = []
    for word in words:
        close = difflib.get_close_matches(str(word), sorted(known), n=1, cutoff=0.6)
        if close:
            pairs.append(close[0] if len(words) == 1 else f"{close[0]} for {word}")
    return f" (did you mean {', '.join(pairs)}?)" if pairs else ""


def check_table(table: dict[str, Any], origin: Path | None) -> None:
    """Refuse wrong types and out-of-range numbers in ``[tool.manifest]``, whichever verb
    reads it (``gate --no-rerun`` trains nothing but still says the config is wrong)."""
    where = f"[tool.manifest] in {origin}"
    for key, low, high in (("seed", 0, MAX_SEED), ("threads", 1, MAX_THREADS)):
        value = table.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"{where}: {key} must be an integer from {low} to {high}, "
                              f"not {str(value)[:40]}.")
    command = table.get("command")
    if command is not None and not isinstance(command, str) and not (
            isinstance(command, list) and all(isinstance(a, str) for a in command)):
        raise ConfigError(f"{where}: command must be a string or a list of strings.")
    for key in ("data", "outputs"):
        string_list(table, key, origin)
    resume = table.get("resume")
    if resume is not None and (not isinstance(resume, (str, list)) or not all(
            isinstance(a, str) for a in (resume if isinstance(resume, list) else [resume]))
            or "{checkpoint}" not in "".join(resume)):
        raise ConfigError(f"{where}: resume must be a string or a list of strings holding "
                          "{checkpoint}, e.g. \"--resume {checkpoint}\".")
    if "store" in table and not isinstance(table["store"], str):
        raise ConfigError(f"{where}: store must be a string (a directory).")
    if "deterministic" in table and not isinstance(table["deterministic"], bool):
        raise ConfigError(f"{where}: deterministic must be true or false.")
    if "executors" in table and not isinstance(table["executors"], dict):
        raise ConfigError(f"{where}: executors must be a table ([tool.manifest.executors]).")
    if "gate" in table and not isinstance(table["gate"], dict):
        raise ConfigError(f"{where}: gate must be a table ([tool.manifest.gate]).")


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
