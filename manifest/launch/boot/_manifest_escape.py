"""Whether a command line starts a Python process that will run outside the recipe.

The launcher reaches a Python process by two routes (``sitecustomize`` on
``PYTHONPATH``, and the ``torch_manifest.pth`` start-up hook wherever
``MANIFEST_LAUNCH`` is set), and both need ``site``. So a Python process is
outside the recipe when it is started with ``-S`` (no ``site``), or with an
environment that lost ``MANIFEST_LAUNCH`` (``env -i``, ``subprocess.run(...,
env={...})``), or with ``-I``/``-E`` (``PYTHONPATH`` ignored) by an
interpreter that has no start-up hook. ``describe_start`` reads a command
line the way ``env``, ``sh -c`` and the interpreter would and says which
case it is; the launcher's audit hook asks it for every process a prepared
process starts (``_manifest_observe``), and the capture asks it for the
command itself. What it cannot see (a shell script's own lines) is left to
the parent's watch over the processes that left no record
(``manifest.launch.outside``).

The description keeps the interpreter, its options and the script or module
name, never the script's arguments: a token on a command line must not
enter a manifest. Standard library only; nothing here runs unless a process
is being started.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot._manifest_wire import CONFIG_VAR
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        from _manifest_wire import CONFIG_VAR
    except ImportError:  # as a package module (the host's lookouts, manifest.launch.outside)
        from manifest.launch.boot._manifest_wire import CONFIG_VAR

MARKER = CONFIG_VAR
HOOK_FILE = "torch_manifest.pth"
_PYTHON = re.compile(r"(python|pypy)[0-9.]*")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_WITH_VALUE = frozenset("WXcm")
"""Interpreter options that take a value (``-W``, ``-X``) or end the options (``-c``, ``-m``)."""
_MAX_DEPTH = 8


def _text(value: Any) -> str:
    return os.fsdecode(value) if isinstance(value, bytes | os.PathLike) else str(value)


def describe_start(argv: Sequence[Any], env: Mapping[Any, Any] | None = None,
                   executable: Any = None) -> dict[str, str] | None:
    """``{"command", "reason"}`` if ``argv`` starts a Python process outside the recipe.

    ``env`` is the environment it gets (None: this process's); ``executable``
    the program actually run when it differs from ``argv[0]``.
    """
    words = [_text(a) for a in argv]
    environ = {_text(k): _text(v) for k, v in (os.environ if env is None else env).items()}
    if executable is not None and words:
        words[0] = _text(executable)
    return _describe(words, environ, 0)


def _describe(words: list[str], env: dict[str, str], depth: int) -> dict[str, str] | None:
    if not words or depth > _MAX_DEPTH:
        return None
    name = os.path.basename(words[0])
    if name == "env":
        rest = _unwrap_env(words[1:], env)
        return None if rest is None else _describe(rest, env, depth + 1)
    if name in _SHELLS and len(words) >= 3 and words[1] == "-c":
        rest = _first_shell_command(words[2], env)
        return None if rest is None else _describe(rest, env, depth + 1)
    if not _PYTHON.fullmatch(name):
        return None
    flags, shown = _interpreter_options(words[1:])
    command = " ".join([name, *shown])
    if "S" in flags:
        return {"command": command,
                "reason": "-S skips site, so neither the launcher's sitecustomize nor its "
                          "start-up hook ran"}
    if not env.get(MARKER):
        return {"command": command,
                "reason": f"started with an environment without {MARKER} (scrubbed, or "
                          "replaced by the caller)"}
    isolated = "I" in flags or "E" in flags
    if (isolated or not _launcher_on_path(env.get("PYTHONPATH", ""))) and not _has_hook(
            words[0], env):
        why = "-I/-E ignore PYTHONPATH" if isolated else "PYTHONPATH no longer holds the launcher"
        return {"command": command,
                "reason": f"{why}, and this interpreter has no {HOOK_FILE} start-up hook"}
    return None


def _launcher_on_path(pythonpath: str) -> bool:
    return any(os.path.isfile(os.path.join(p, "_manifest_launch.py"))
               for p in pythonpath.split(os.pathsep) if p)


def from_audit_event(event: str, args: tuple[Any, ...]) -> dict[str, str] | None:
    """:func:`describe_start` for an audit event that starts a program (``subprocess.Popen``,
    ``os.exec``, ``os.posix_spawn``, ``os.spawn``, ``os.system``); None for other events."""
    if event == "os.system":
        return describe_start(["/bin/sh", "-c", _text(args[0])])
    if event == "subprocess.Popen":
        program, argv, _cwd, env = args
    elif event == "os.spawn":
        _mode, program, argv, env = args
    elif event in ("os.exec", "os.posix_spawn"):
        program, argv, env = args
    else:
        return None
    if isinstance(argv, str | bytes | os.PathLike):
        argv = [argv]
    return describe_start(list(argv), env, program)


def _unwrap_env(args: list[str], env: dict[str, str]) -> list[str] | None:
    """``env [-i] [-u NAME] [NAME=VALUE]... CMD``: CMD, with ``env`` updated as env would."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-i", "-", "--ignore-environment"):
            env.clear()
        elif a in ("-u", "--unset", "-C", "--chdir") and i + 1 < len(args):
            if a in ("-u", "--unset"):
                env.pop(args[i + 1], None)
            i += 1
        elif a.startswith("--unset="):
            env.pop(a.partition("=")[2], None)
        elif a.startswith("-u") and len(a) > 2:
            env.pop(a[2:], None)
        elif a in ("-S", "--split-string") or a.startswith(("-S", "--split-string=")):
            return None  # a command in one string: not read here
        elif a == "--":
            return args[i + 1:]
        elif a.startswith("-"):
            pass  # -0, -v, --debug …: no effect on the environment
        elif "=" in a:
            key, _, value = a.partition("=")
            env[key] = value
        else:
            return args[i:]
        i += 1
    return None


def _first_shell_command(script: str, env: dict[str, str]) -> list[str] | None:
    """The first simple command of ``sh -c SCRIPT`` (leading ``NAME=VALUE`` applied)."""
    import shlex

    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return None
    words: list[str] = []
    for t in tokens:
        if t and set(t) <= set(";&|()<>"):
            break
        words.append(t)
    while words and (words[0] == "exec" or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        key, eq, value = words.pop(0).partition("=")
        if eq:
            env[key] = value
    return words or None


def _interpreter_options(args: list[str]) -> tuple[set[str], list[str]]:
    """The interpreter's one-letter options, and the words that describe the start."""
    flags: set[str] = set()
    shown: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--check-hash-based-pycs":
            i += 2
            continue
        if a.startswith("--") or a == "-" or not a.startswith("-"):
            if a != "--" and a != "-" and not a.startswith("--"):
                shown.append(os.path.basename(a))  # the script: its name, not its path
            elif a == "--" and i + 1 < len(args):
                shown.append(os.path.basename(args[i + 1]))
            return flags, shown
        letters = a[1:]
        kept = ""
        for j, c in enumerate(letters):
            if c in _WITH_VALUE:
                value = letters[j + 1:] or (args[i + 1] if i + 1 < len(args) else "")
                if kept:
                    shown.append("-" + kept)
                if c == "m":
                    shown += ["-m", value]
                elif c == "c":
                    shown += ["-c", "…"]
                if c in "cm":
                    flags.add(c)
                    return flags, shown
                if not letters[j + 1:]:
                    i += 1
                break
            flags.add(c)
            kept += c
        else:
            if kept:
                shown.append("-" + kept)
        i += 1
    return flags, shown


def _has_hook(program: str, env: Mapping[str, str]) -> bool:
    """Whether the interpreter ``program`` loads the start-up hook: this one if the hook is
    in its site-packages; another if its prefix's site-packages (``<prefix>/bin/python``,
    ``<prefix>/lib/python3.X/site-packages``, a virtual environment's layout) holds it."""
    import shutil

    found = program if os.sep in program else shutil.which(program, path=env.get("PATH"))
    if not found:
        return False
    found = os.path.abspath(found)
    # A virtual environment's python is a link to the base interpreter: the same file,
    # another site-packages. The directory it is started from decides which.
    if sys.executable and os.path.dirname(found) == os.path.dirname(
            os.path.abspath(sys.executable)):
        import site

        return any(os.path.isfile(os.path.join(d, HOOK_FILE)) for d in site.getsitepackages())
    import glob

    prefix = os.path.dirname(os.path.dirname(found))
    return bool(glob.glob(os.path.join(glob.escape(prefix), "lib", "python*", "*-packages",
                                       HOOK_FILE)))
