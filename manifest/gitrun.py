"""Hardened calls to the ``git`` program: the one place git is run.

A repository is data, but its ``.git/config`` can name commands that git
runs on its own: ``core.fsmonitor``, hooks, and the drivers a
``.gitattributes`` line selects (``filter.<x>.clean``/``smudge``/``process``,
``diff.<x>.textconv``/``command``, ``merge.<x>.driver``). A colleague's
repository, or a pull request checked out in CI, can plant any of them, and
git would run it during our ``diff``, ``add --intent-to-add`` (which hashes a
racily-clean file through its clean filter), ``checkout`` or gate's
``diff --name-only``. So every invocation goes through :func:`run_git`, which

* passes ``-c core.fsmonitor=false -c core.hooksPath=/dev/null``, no pager,
  no external diff, no automatic gc/maintenance;
* for the commands that can read a file through a filter, first lists the
  filter drivers the repository's *own* config (local and worktree scope,
  includes followed) defines, and blanks each one with ``-c`` (an empty
  command is no filter; ``required=false`` so git does not refuse), one
  ``git config`` call, ~2 ms, cached per directory; drivers from the user's
  global config (git-lfs) stay, since the user chose them;
* gives every ``diff`` ``--no-ext-diff --no-textconv`` (an empty
  ``textconv``/``command`` is not "none" to git: it tries to run "" and
  fails, so those drivers are switched off by flag, not by config);
* uses ``--no-optional-locks`` so reading never rewrites the user's index;
* drops every inherited ``GIT_*`` variable (``GIT_DIR``, ``GIT_INDEX_FILE``,
  ``GIT_EXTERNAL_DIFF`` …), ignores the system config and disables terminal
  prompts;
* never uses a shell.

``tests/hostile/test_git_config.py`` plants each of these and shows plain git
running it (the positive control) and this runner not running it.

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
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "--no-optional-locks",
)

DRIVER_COMMANDS = frozenset({"add", "apply", "checkout", "diff", "diff-files", "diff-index",
                             "reset", "restore", "stash", "status", "switch", "update-index"})
"""Commands that can read a working-tree file through a filter or diff driver."""

DIFF_COMMANDS = frozenset({"diff", "diff-files", "diff-index", "diff-tree"})

_driver_cache: dict[str, tuple[str, ...]] = {}

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
    blanked = repo_drivers(cwd) if args and args[0] in DRIVER_COMMANDS else ()
    overrides = [part for item in (*blanked, *config) for part in ("-c", item)]
    if args and args[0] in DIFF_COMMANDS:
        # Last, before any "--", so an option earlier in args cannot turn them back on.
        rest = list(args[1:])
        cut = rest.index("--") if "--" in rest else len(rest)
        args = [args[0], *rest[:cut], "--no-ext-diff", "--no-textconv", *rest[cut:]]
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


CONFIG_KEYS = r"^(remote\..*\.url|filter\..*\.(clean|smudge|process))$"
"""What capture reads from git config: remote URLs and filter drivers, in one call."""


def read_config(cwd: Path) -> list[tuple[bytes, bytes, bytes]]:
    """(scope, key, value) of every remote URL and filter driver git config sees in ``cwd``.

    One ``git config`` call answers both the code probe (remote URLs, the
    repository's own filters) and :func:`repo_drivers`, which it primes. With
    a git older than 2.26 (no ``--show-scope``) every entry counts as
    ``local``: the repository's own, so every driver is switched off. Raises
    ``FileNotFoundError`` when git is missing and ``NotADirectoryError`` for a
    bad ``cwd``, as ``subprocess`` does.
    """
    proc = subprocess.run(
        ["git", *HARDENING, "config", "-z", "--show-scope", "--get-regexp", CONFIG_KEYS],
        cwd=cwd, env=git_env(), capture_output=True, check=False)
    scoped = proc.returncode != 129
    if not scoped:
        proc = subprocess.run(["git", *HARDENING, "config", "-z", "--get-regexp", CONFIG_KEYS],
                              cwd=cwd, env=git_env(), capture_output=True, check=False)
    entries: list[tuple[bytes, bytes, bytes]] = []
    scope = b"local"
    for item in proc.stdout.split(b"\0"):
        if not item:
            continue
        if scoped and b"\n" not in item:
            scope = item
            continue
        key, _, value = item.partition(b"\n")
        entries.append((scope, key, value))
    _driver_cache[os.fspath(cwd)] = _blanking(entries)
    return entries


def _blanking(entries: list[tuple[bytes, bytes, bytes]]) -> tuple[str, ...]:
    blanked: list[str] = []
    for scope, key, _ in entries:
        if scope not in (b"local", b"worktree") or not key.startswith(b"filter."):
            continue
        name = key.decode("utf-8", "surrogateescape")
        for override in (f"{name}=", f"{name.rsplit('.', 1)[0]}.required=false"):
            if override not in blanked:
                blanked.append(override)
    return tuple(blanked)


def repo_drivers(cwd: Path) -> tuple[str, ...]:
    """``-c`` overrides that blank every driver the repository's own config defines.

    Keyed by directory for the life of the process: capture and verify ask
    about one or two repositories, and a repository does not rewrite its
    config while we read it. :func:`read_config` refreshes the entry.
    """
    cached = _driver_cache.get(os.fspath(cwd))
    if cached is not None:
        return cached
    try:
        read_config(cwd)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    return _driver_cache[os.fspath(cwd)]
