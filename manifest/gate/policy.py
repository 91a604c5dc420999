"""The gate's policy (``[tool.manifest.gate]``, validated) and the project it runs in."""


from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifest.config import did_you_mean, string_list
from manifest.errors import (
    ConfigError,
)

CHECK_NAMES = ("determinism", "baseline", "hygiene")


# ------------------------------------------------------------------ policy


@dataclass(frozen=True)
class GatePolicy:
    """``[tool.manifest.gate]`` with its defaults (see the module docstring)."""

    baseline: str = "manifests/baseline.json"
    command: tuple[str, ...] | None = None
    checks: tuple[str, ...] = CHECK_NAMES
    same_env: bool = False
    allow_equivalent: bool = False
    """A baseline from another runner type passes when the fresh run is ``equivalent`` to it
    (the same run up to rounding, judged against the baseline's noise envelope, which
    ``--update-baseline`` then measures)."""
    code_paths: tuple[str, ...] = (".",)
    manifests: tuple[str, ...] = ()
    allow_dirty: bool = True
    require_lockfile: bool = True
    require_data: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "command": None if self.command is None else list(self.command),
            "checks": list(self.checks),
            "same_env": self.same_env,
            "allow_equivalent": self.allow_equivalent,
            "code_paths": list(self.code_paths),
            "manifests": list(self.manifests),
            "allow_dirty": self.allow_dirty,
            "require_lockfile": self.require_lockfile,
            "require_data": self.require_data,
        }


_POLICY_KEYS = frozenset(GatePolicy.__dataclass_fields__)


def parse_policy(table: Any, origin: Path | None) -> GatePolicy:
    """Validate ``[tool.manifest.gate]``; unknown keys and wrong types are ConfigError."""
    if table is None:
        return GatePolicy()
    where = f"[tool.manifest.gate] in {origin}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table.")
    unknown = sorted(set(table) - _POLICY_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s): {', '.join(unknown)}"
                          f"{did_you_mean(unknown, _POLICY_KEYS)}.",
                          hint=f"Known keys: {', '.join(sorted(_POLICY_KEYS))}.")

    def strings(key: str) -> tuple[str, ...] | None:
        value = string_list(table, key, origin, section="[tool.manifest.gate]")
        return None if value is None else tuple(value)

    def flag(key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false.")
        return value

    baseline = table.get("baseline", GatePolicy.baseline)
    if not isinstance(baseline, str) or not baseline:
        raise ConfigError(f"{where}: baseline must be a path (a string).")
    command = table.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    checks = strings("checks")
    if checks is not None:
        bad = sorted(set(checks) - set(CHECK_NAMES))
        if bad:
            raise ConfigError(f"{where}: unknown check(s) {', '.join(bad)}"
                              f"{did_you_mean(bad, set(CHECK_NAMES))}.",
                              hint=f"Checks: {', '.join(CHECK_NAMES)}.")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(a, str) for a in command)):
        raise ConfigError(f"{where}: command must be a non-empty list of strings.")
    defaults = GatePolicy()
    return GatePolicy(
        baseline=baseline,
        command=None if command is None else tuple(command),
        checks=checks if checks is not None else defaults.checks,
        same_env=flag("same_env", defaults.same_env),
        allow_equivalent=flag("allow_equivalent", defaults.allow_equivalent),
        code_paths=strings("code_paths") or defaults.code_paths,
        manifests=strings("manifests") or defaults.manifests,
        allow_dirty=flag("allow_dirty", defaults.allow_dirty),
        require_lockfile=flag("require_lockfile", defaults.require_lockfile),
        require_data=flag("require_data", defaults.require_data),
    )


# ------------------------------------------------------------------ project


@dataclass(frozen=True)
class Project:
    """Where the gate runs: the pyproject's directory and its git root."""

    dir: Path
    root: Path
    config: dict[str, Any]
    origin: Path
    policy: GatePolicy

    def rel(self, path: Path) -> str:
        """``path`` relative to the repository root, POSIX style."""
        try:
            return Path(os.path.relpath(path, self.root)).as_posix()
        except ValueError:
            return path.as_posix()

    @property
    def baseline_path(self) -> Path:
        return self.dir / self.policy.baseline


def load_project(cwd: Path) -> Project:
    from manifest.config import load_config
    from manifest.rerun.workspace import repo_root_of

    table, origin = load_config(cwd)
    if origin is None:
        raise ConfigError(f"no pyproject.toml at or above {cwd}.",
                          hint="The gate reads [tool.manifest] and [tool.manifest.gate] from it.")
    policy = parse_policy(table.get("gate"), origin)
    project_dir = origin.parent.resolve()
    root = repo_root_of(project_dir) or project_dir
    return Project(project_dir, root.resolve(), table, origin, policy)


