"""Hardened calls to the ``git`` program.

Every git invocation in manifest goes through :func:`run_git`, which

* passes ``-c core.fsmonitor=false -c core.hooksPath=/dev/null`` so a
  repository's own config cannot make us run its fsmonitor command or hooks
  (filter drivers, the other command a repository's config can name for
  ``git diff``, are switched off by the code probe, which knows their names);
* uses ``--no-optional-locks`` so reading never rewrites the user's index;
* drops every inherited ``GIT_*`` variable (``GIT_DIR``, ``GIT_INDEX_FILE``,
  ``GIT_EXTERNAL_DIFF`` …) and disables terminal prompts;
* never uses a shell.

Why not GitPython: importing it costs ~0.11 s of the 0.25 s budget of
``manifest capture`` (measured, see benchmarks/capture_latency.py), and each
call we make is a plain porcelain/plumbing command whose argv we want to
control exactly. One small runner keeps the hardening in one place.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from manifest.errors import ManifestError

HARDENING = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.pager=cat",
    "-c",
    "diff.external=",
    "--no-optional-locks",
)

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class GitMissingError(ManifestError):
    """The git program is not installed."""


class GitFailedError(ManifestError):
    """A git command exited non-zero."""

    def __init__(self, message: str, *, returncode: int, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: the caller's, minus every GIT_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["LC_ALL"] = "C"
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    input_bytes: bytes | None = None,
    check: bool = True,
    config: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git <hardening> [-c CONFIG]... args`` in ``cwd``; return the completed process."""
    overrides = [part for item in config for part in ("-c", item)]
    try:
        proc = subprocess.run(
            ["git", *HARDENING, *overrides, *args],
            cwd=cwd,
            env=git_env(env),
            input=input_bytes,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise GitMissingError("git is not installed or not on PATH.") from exc
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitFailedError(
            f"git {args[0]} failed: {err[-1] if err else 'exit ' + str(proc.returncode)}",
            returncode=proc.returncode,
            stderr=proc.stderr.decode("utf-8", "replace"),
        )
    return proc
