"""Python processes of a run that ran outside the recipe: found, named, and said.

The launcher reaches every Python process that keeps ``MANIFEST_LAUNCH`` in
its environment and runs ``site`` (``docs/launcher.md``). A process that
does not (``python -S``, ``env -i python``, ``-I`` under an interpreter
without the start-up hook) runs with no seeds, no switches and no record.
Three lookouts name it, each where the others are blind:

1. the command line itself, read as ``env``/``sh -c``/the interpreter would
   (``run_under_launcher``);
2. inside every prepared process, the audit events that start a program
   (``_manifest_observe``: ``subprocess``, ``os.exec*``, ``posix_spawn``,
   ``os.system``), with the call site;
3. :class:`PythonWatch`, which follows the run's process tree through
   ``/proc`` (Linux) while it runs and reads each new Python process's own
   command line and start-up environment: it sees what a shell script starts.
   It polls every :data:`POLL_S` seconds, so a process that lives less than
   that can pass unseen; it skips forks (same program and command line as
   the parent: they carry the parent's launcher state) and the children of a
   prepared Python process (lookout 2 watches those, with a better site).

All three judge with one function, ``_manifest_escape.describe_start``. The
manifest keeps each finding in ``determinism.outside_recipe`` (interpreter,
options and script name, never the script's arguments; the reason; where it
was started), and :func:`outside_recipe` turns it into sentences for verify
and the renderers: a run with processes outside the recipe never reads as a
run under it.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from manifest.launch.boot import _manifest_escape as escape

POLL_S = 0.1
"""One walk of the run's process tree: a few /proc reads per live process (~0.1 ms)."""
COMMAND_LINE = "the command line"
_PYTHON = re.compile(r"(python|pypy)[0-9.]*")
MAX_FOUND = 32
KEEPER_ARGS = ("-I", "-S",
               str(Path(__file__).resolve().parent.parent / "rerun" / "_guard.py"))
"""How the re-run engine starts its keeper (``manifest.rerun.executor``)."""


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _words(raw: bytes | None) -> list[str]:
    return [os.fsdecode(w) for w in (raw or b"").split(b"\0") if w]


class _Proc:
    __slots__ = ("cmdline", "env", "exe", "ppid")

    def __init__(self, ppid: int, exe: str, cmdline: list[str], env: dict[str, str] | None):
        self.ppid, self.exe, self.cmdline, self.env = ppid, exe, cmdline, env


class PythonWatch:
    """Names the Python processes under this one that started outside the recipe.

    ``with PythonWatch() as watch: …run…`` then ``watch.found``: a list of
    ``{"command", "reason", "site"}``. Does nothing where ``/proc`` has no
    ``children`` files (not Linux).
    """

    def __init__(self, root: int | None = None, tid: int | None = None) -> None:
        self.root = root if root is not None else os.getpid()
        self.tid = tid if tid is not None else threading.get_native_id()
        self.found: list[dict[str, str]] = []
        self._seen: dict[int, _Proc | None] = {}
        self._keepers: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PythonWatch:
        if os.path.exists(f"/proc/{self.root}/task/{self.tid}/children"):
            # The root is known, so that its own forks (subprocess before exec) are skipped.
            self._look(self.root, 0, judge=False)
            self._thread = threading.Thread(target=self._loop, name="manifest-python-watch",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while True:
            try:
                self.scan()
            except Exception:  # the watch must never fail the run
                return
            if self._stop.wait(POLL_S):
                return

    def _children(self, pid: int, tid: int | None = None) -> list[int]:
        raw = _read(f"/proc/{pid}/task/{tid or pid}/children")
        return [int(p) for p in (raw or b"").split()]

    def scan(self) -> None:
        """One walk of the tree below the root (children of each process's main thread).

        The unconfined re-run's keeper (``manifest/rerun/_guard.py``, a Python
        process run with ``-I -S`` on purpose) is not part of the run: it is
        seen through, its child judged as the command line's own."""
        todo = [(c, self.root) for c in self._children(self.root, self.tid)]
        while todo:
            pid, ppid = todo.pop()
            self._look(pid, ppid)
            through = ppid if pid in self._keepers else pid
            todo.extend((c, through) for c in self._children(pid))

    def _look(self, pid: int, ppid: int, *, judge: bool = True) -> None:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return
        cmdline = _words(_read(f"/proc/{pid}/cmdline"))
        known = self._seen.get(pid)
        if known is not None and known.exe == exe and known.cmdline == cmdline:
            return  # the same program since we last looked
        if not _PYTHON.fullmatch(os.path.basename(exe)) or (
                ppid == self.root and tuple(cmdline[1:4]) == KEEPER_ARGS):
            if ppid == self.root and tuple(cmdline[1:4]) == KEEPER_ARGS:
                self._keepers.add(pid)
            self._seen[pid] = _Proc(ppid, exe, cmdline, None)
            return
        environ: dict[str, str] = {}
        for item in _words(_read(f"/proc/{pid}/environ")):
            key, eq, val = item.partition("=")
            if eq:
                environ[key] = val
        self._seen[pid] = _Proc(ppid, exe, cmdline, environ)
        if not judge:
            return
        parent = self._seen.get(ppid)
        if parent is not None and parent.exe == exe and parent.cmdline == cmdline:
            return  # a fork: it carries its parent's state, recipe or not
        if (parent is not None and parent.env is not None and parent.env.get(escape.MARKER)
                and escape.describe_start(parent.cmdline, parent.env) is None):
            return  # started by a prepared Python process, whose audit hook names it
        if not cmdline or len(self.found) >= MAX_FOUND:
            return
        verdict = escape.describe_start(cmdline, environ)
        if verdict is None:
            return
        verdict["site"] = COMMAND_LINE if ppid == self.root else f"under {_short(parent)}"
        if verdict not in self.found:
            self.found.append(verdict)


def _short(proc: _Proc | None) -> str:
    """A parent named by its program and first operand, never its other arguments."""
    if proc is None or not proc.cmdline:
        return "a process that has exited"
    words = [os.path.basename(proc.cmdline[0])]
    for w in proc.cmdline[1:]:
        if not w.startswith("-"):
            words.append(os.path.basename(w))
            break
    return " ".join(words)


def merge_found(*groups: Any) -> list[dict[str, str]]:
    """Findings of every lookout, once each, in a stable order (identity must not
    depend on which process reported first)."""
    seen: dict[tuple[str, str, str], dict[str, str]] = {}
    for group in groups:
        for item in group or ():
            if not isinstance(item, dict):
                continue
            key = (str(item.get("command", "")), str(item.get("reason", "")),
                   str(item.get("site", "")))
            if key[0] and key[1]:
                seen.setdefault(key, {"command": key[0], "reason": key[1], "site": key[2]})
    return [seen[k] for k in sorted(seen)][:MAX_FOUND]


def outside_recipe(manifest: Any) -> list[str]:
    """One sentence per Python process the run started outside the recipe (none: [])."""
    det = getattr(manifest, "determinism", None)
    found = getattr(det, "outside_recipe", None) or []
    return [f"{p.command} ({p.site}) ran outside the recipe: {p.reason}; its seeds, switches "
            "and outputs were not recorded" for p in found]
