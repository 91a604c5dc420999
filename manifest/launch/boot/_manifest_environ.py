"""The environment variables the run's own code read, with a digest of each value.

A script that reads ``LRSCALE`` from the environment computes another run
under another value, and nothing else in a manifest shows it: the argv, the
code and the seeds are the same. This hook of the launcher (installed by
``_manifest_launch`` before user code) adds to the process record::

    "environ": {"LRSCALE": {"site": "train.py:12", "set": true,
                            "digest": "blake3:…"}},
    "environ_dropped": 0

the first read of each variable, where it happened and the blake3 of the value
it returned (UTF-8, ``surrogateescape``), or ``set: false`` when it was unset
(``os.environ.get("LRSCALE", "1.0")`` falls back: that is an input too). The
value itself never leaves the process, and this plain digest never reaches a
manifest: capture keys it with the user's key (``manifest.capture.environ``).
A value the project's one redactor (``manifest/redact.py``: URL userinfo,
token shapes, secret-named query parameters, the value of a secret-named
variable …) would change is marked ``"secret": true``:
``DATABASE_URL=postgresql://alice:hunter2@db/prod`` has a secret-free name and
a guessable value (a dictionary of passwords gives ``hunter2`` back).
``manifest.capture.environ`` turns the record into
``determinism.processes[*].environ``, keeping no plain digest of any value
(a secret's, by name or by shape, not even a keyed one in identity), and drops
the variables compared elsewhere by their exact names.

What is hooked: ``os._Environ.__getitem__``, the one method that
``os.environ[...]``, ``.get``, ``os.getenv``, ``in``, ``.setdefault`` and
``.pop`` all reach (``os.environb`` is the same class), and ``__iter__``, to
tell a copy from a read. The rule, one sentence: **a read counts when the
frame that asked for one named variable is the run's own code**, where

* ``os`` and ``collections.abc`` frames are plumbing (``.get`` → the caller):
  their file is theirs *and* their globals are their module's dict;
* a frame is a library's by the code's real origin, not its file name, which
  the script chooses (``compile(src, "<frozen os>", "exec")``, a site-packages
  path): its globals must be an imported module's own dict (not
  ``__main__``'s), and its file that frozen module's ``<frozen NAME>``
  (``__spec__.origin == "frozen"``) or a real file under a library prefix
  (:func:`_library`);
* a C callable has no frame, so ``os.environ.__getitem__("X")``,
  ``map(os.environ.__getitem__, names)`` and
  ``operator.itemgetter("X")(os.environ)`` are the calling script's reads;
* three standard-library helpers exist to hand a named variable's value to
  their caller, and are looked through to it: ``os.path.expandvars``,
  ``string.Template.substitute`` / ``safe_substitute`` (with
  ``os.environ`` as the mapping) and ``collections.ChainMap``'s
  ``__getitem__``, ``get``, ``__contains__`` and ``__missing__``;
* every other frame outside the run's code reads for itself: torch, numpy,
  this tool, and the standard library configuring itself —
  ``os.path.expanduser`` (``HOME``), ``tempfile`` (``TMPDIR``),
  ``getpass.getuser`` (``USER``), ``locale`` (``LANG``), argparse's help
  width (``COLUMNS``). Attributing those to the script too would be one rule
  ("the nearest non-library caller"), but a script that writes
  ``expanduser("~/data")`` would then get one run_id per home directory and a
  ``bits`` cause on every other machine, for a path whose files the data
  digests already compare; a variable the script names itself
  (``expandvars("$HOME/data")``) is its read;
* a copy is not a read of every variable: ``dict(os.environ)``,
  ``{**os.environ}``, ``.copy()``, ``.items()`` and iteration hand the whole
  environment on (usually to a subprocess). A C caller's read at the very
  instruction of the script's that iterated the environment is a copy's; a
  subscript in the script's own code (``{k: os.environ[k] for k in
  os.environ}``) is a read.

Not seen (known limits): reads that go around ``os.environ``
(``posix.environ``, ``os.environ._data``, ``getenv`` from C or ctypes, a
subclass or a replacement of ``os.environ``), a script that picks variables
from a copy (``dict(os.environ)["X"]``, ``Template.substitute(**os.environ)``,
``[v for k, v in os.environ.items() if …]``), reads through any other library
helper (the script's config library reading ``MYAPP_LR``), a non-Python child
(``sh -c 'echo $X'``, a shell, a compiled program: it reads what it inherits),
code a script runs inside a library module's own namespace under that
library's real file name (``exec(code, torch.__dict__)``), a read in another
thread while this one digests a value (one flag, not a lock: a read is
missed, never blocked), and a C callable's read at the instruction that last
iterated the environment (taken for a copy). Only
the first read of a name is kept, with the value it returned. At most
:data:`MAX_READS` names are kept; the names read past it are counted
(``environ_dropped``, up to :data:`DROPPED_CAP`), so the manifest says the
list is incomplete.

Cost (2-core dev machine at load 3; the reviewer's ``perf.py``, 200,000 calls, under
``manifest capture``, this hook and the first release's in one window, 3 runs each):
``os.path.expanduser("~")`` (a library's two reads of ``HOME``) 3.61-3.67 µs against
5.85-5.90 µs (1.19-1.22 µs without capture); a repeated ``os.environb.get`` 0.33 µs
against 0.99-1.02 µs (bytes keys were never settled; 0.26 µs without); a repeated own
``os.environ.get`` 0.38 µs against 0.33 µs (0.28 µs without); an unset one 1.0 µs, as
before. A repeated
read stops at a set of settled keys (``str`` and ``bytes`` alike); a library's read
stops after one or two frames, at a set of functions known not to be the run's. What
is left for a library's read is mostly ``sys._getframe``, an audited call: 0.57 µs under
the launcher's audit hook, 0.04 µs without (``benchmarks/environ_reads.py`` times each
read hooked and unhooked in one process). The redactor is loaded at the first value
kept: 7 ms where ``re`` and ``dataclasses`` are already loaded (torch loads both), 21-43
ms in a bare interpreter; each kept value is then checked once (80-200 µs).

Standard library only, like every module of this directory: imported at
start-up of every Python process ``manifest capture`` starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

MAX_READS = 256
"""Variables kept per process; a read of another one past it is counted, not kept."""
DROPPED_CAP = 65536
"""Names counted past :data:`MAX_READS` (then the count says "at least")."""

_PLUMBING_FILES = frozenset({"<frozen os>", "<frozen _collections_abc>"})
"""Where ``os`` and ``collections.abc`` live when frozen (3.11+); their files are added."""
_KEYED_CALLS = frozenset({"get", "__contains__", "getenv", "getenvb", "setdefault", "pop"})
"""Plumbing that reads one named variable; anything else there (``copy``, ``__iter__``,
``__or__``, ``items`` views …) reads the whole environment."""

_env: dict[str, Any] = {
    "skip": (),
    "where": None,
    "busy": False,
    "record": {},
    "copying": None,  # (frame id, instruction) that last iterated the environment
    "helpers": frozenset(),
    "helper_modules": None,
    "redact": None,
    "errors": 0,
    "os_globals": None,
    "abc_globals": None,
}
_reads: dict[str, Any] = {}
"""This process's reads (the dict its record holds)."""
_done: set[Any] = set()
"""Keys, ``str`` or ``bytes`` as the caller gave them, settled for good (kept, or counted
past the limit): a repeated read stops at this set."""
_not_own: dict[tuple[str, int], Any] = {}
"""Functions that read for themselves (libraries, the standard library, this tool), by file
and first line, each with its module's globals (the same file and line in other globals is
not that function): their reads stop after one look at one or two frames. Not by code
object (hashing one hashes its bytecode and constants) nor by ``id`` (an audited call: 1.3
µs under the launcher's audit hook)."""
_dropped: set[str] = set()
_original: Any = None
_original_iter: Any = None
_subscript: frozenset[int] | None = None


def _subscript_ops() -> frozenset[int]:
    """The opcodes of a direct ``os.environ[name]`` (``BINARY_OP`` with ``NB_SUBSCR`` from
    Python 3.14), looked up at the first such read: ``opcode`` costs 0.5 ms to import."""
    global _subscript
    if _subscript is None:
        import opcode

        _subscript = frozenset(opcode.opmap[name] for name in ("BINARY_SUBSCR", "BINARY_OP")
                               if name in opcode.opmap)
    return _subscript


def _helper_codes() -> frozenset[Any]:
    """The standard library's substitution helpers that read a variable the caller named
    (module docstring), from the modules already imported."""
    string, collections = sys.modules.get("string"), sys.modules.get("collections")
    if _env["helper_modules"] == (string, collections):
        return _env["helpers"]  # type: ignore[no-any-return]
    codes: set[Any] = {os.path.expandvars.__code__}
    template = getattr(string, "Template", None)
    for method in ("substitute", "safe_substitute"):
        code = getattr(getattr(template, method, None), "__code__", None)
        if code is not None:
            codes.add(code)
            codes.update(c for c in code.co_consts if hasattr(c, "co_name"))
    chain = getattr(collections, "ChainMap", None)
    for method in ("__getitem__", "get", "__contains__", "__missing__"):
        code = getattr(getattr(chain, method, None), "__code__", None)
        if code is not None:
            codes.add(code)
            codes.update(c for c in code.co_consts if hasattr(c, "co_name"))
    _env["helpers"], _env["helper_modules"] = frozenset(codes), (string, collections)
    return _env["helpers"]  # type: ignore[no-any-return]


def _plumbing(frame: Any) -> bool:
    """Whether a frame is ``os``'s or ``collections.abc``'s own code: its file is theirs and
    its globals are their module's dict (code a script compiled under ``<frozen os>`` runs
    in the script's globals, and is the script's)."""
    g = frame.f_globals
    return frame.f_code.co_filename in _PLUMBING_FILES and (
        g is _env["os_globals"] or g is _env["abc_globals"])


def _known(frame: Any) -> bool:
    """Whether the frame's function was settled as not the run's: same file, same first
    line and the same module's globals (a script's code compiled under a library's file
    name and line runs in other globals)."""
    code = frame.f_code
    return _not_own.get((code.co_filename, code.co_firstlineno)) is frame.f_globals


def _library(frame: Any) -> bool:
    """Whether a frame is a library's (or the standard library's, or this tool's) by the
    code's real origin, not the file name its code object carries, which is the script's
    to choose (``compile(src, "<frozen os>", "exec")``, a path under site-packages): its
    globals must be the dict of an imported module other than ``__main__`` (found by its
    ``__spec__``'s name, else its ``__name__``), and its file
    either that frozen module's own ``<frozen NAME>`` (``__spec__.origin == "frozen"``) or
    a real file under a library prefix."""
    g: dict[str, Any] = frame.f_globals
    spec = g.get("__spec__")
    # By the spec's name first: _collections_abc sets its __name__ to "collections.abc".
    name = getattr(spec, "name", None) or g.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or name == "__main__" or getattr(module, "__dict__", None) is not g:
        return False  # exec'd in a namespace no imported module owns: the script's code
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen"):
        return (filename == f"<frozen {name}>"
                and getattr(spec, "origin", None) == "frozen")
    return filename.startswith(_env["skip"]) and os.path.isfile(filename)


def _asker(key: Any, frame: Any) -> Any:
    """The run's own frame that asked for this one variable, or None (module docstring)."""
    calls = []
    while frame is not None and _plumbing(frame):
        calls.append(frame.f_code.co_name)
        frame = frame.f_back
    if frame is None or _known(frame):
        return None
    if calls and not _KEYED_CALLS.issuperset(calls):
        return None  # copy(), items(), iteration: the whole environment
    helpers = _helper_codes()
    helped = False
    while frame is not None and frame.f_code in helpers:
        frame, helped = frame.f_back, True
    if frame is None:
        return None
    if _library(frame):
        if not helped:
            _not_own[(frame.f_code.co_filename, frame.f_code.co_firstlineno)] = frame.f_globals
        return None
    if helped and (id(frame), frame.f_lasti) == _env["copying"]:
        return None  # dict(ChainMap(os.environ, …)): a copy through the helper
    if calls or helped:
        return frame
    code, lasti = frame.f_code.co_code, frame.f_lasti
    if 0 <= lasti < len(code) and code[lasti] in _subscript_ops():
        return frame
    # Called into by a C callable the script called (map, operator.itemgetter, a bound
    # __getitem__), or by a copy (dict(os.environ), {**os.environ}), which iterates the
    # environment from the very instruction that then takes each value.
    return None if (id(frame), lasti) == _env["copying"] else frame


def _digest(value: str | bytes) -> str | None:
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    try:
        import blake3
    except ImportError:
        return None
    return "blake3:" + str(blake3.blake3(data).hexdigest())


def _redactor() -> Any:
    """The project's one redactor (``manifest/redact.py``, standard library only), loaded
    from its file next to this directory when the run's Python cannot import ``manifest``."""
    if _env["redact"] is None:
        module = sys.modules.get("manifest.redact") or sys.modules.get("_manifest_redact")
        if module is None:
            import importlib.util

            here = os.path.dirname(os.path.abspath(__file__))
            path = os.path.join(os.path.dirname(os.path.dirname(here)), "redact.py")
            spec = importlib.util.spec_from_file_location("_manifest_redact", path)
            if spec is None or spec.loader is None:
                raise ImportError(path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["_manifest_redact"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules["_manifest_redact"]
                raise
        _env["redact"] = module
    return _env["redact"]


def _secret_shaped(value: str | bytes) -> bool:
    """Whether the redactor would change the value (URL userinfo, a token's shape, a
    secret-named query parameter, the value of a secret-named variable …). True when
    the redactor cannot be loaded: withholding a plain digest is the safe failure."""
    text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
    try:
        redact = _redactor()
        return bool(redact.redact_text(text) != text or redact.redact_url(text) != text)
    except Exception:  # any failure withholds the plain digest
        return True


def _note(key: Any, value: str | bytes | None, frame: Any) -> None:
    asker = _asker(key, frame)
    if asker is None:
        return
    name = os.fsdecode(key) if isinstance(key, bytes) else key
    if not isinstance(name, str):
        return
    if name in _reads:  # read before as the other of str / bytes
        _done.add(key)
        return
    if len(_reads) >= MAX_READS:
        if len(_dropped) < DROPPED_CAP:
            _dropped.add(name)
            _done.add(key)
        _env["record"]["environ_dropped"] = len(_dropped)
        return
    _env["busy"] = True
    try:
        item: dict[str, Any] = {"site": _env["where"](asker.f_code.co_filename, asker.f_lineno),
                                "set": value is not None,
                                "digest": None if value is None else _digest(value)}
        if value is not None and _secret_shaped(value):
            item["secret"] = True
        _reads[name] = item
        _done.add(key)
    finally:
        _env["busy"] = False


def _getitem(self: Any, key: Any) -> Any:
    try:
        value = _original(self, key)
    except KeyError:
        if key not in _done and not _env["busy"]:
            _settle(key, None, sys._getframe(1))
        raise
    if key not in _done and not _env["busy"]:  # a variable already settled stops here
        _settle(key, value, sys._getframe(1))
    return value


def _settle(key: Any, value: str | bytes | None, frame: Any) -> None:
    """Note a read unless a function known not to be the run's asked for it, directly or
    through one plumbing frame (a library's repeated read stops here)."""
    if _known(frame):
        return
    back = frame.f_back
    if back is not None and _known(back) and _plumbing(frame):
        return
    try:
        _note(key, value, frame)
    except Exception:  # never break the user's read (counted, for a debugger)
        _env["errors"] += 1


def _chain_iter() -> Any:
    """``collections.ChainMap.__iter__``'s code (None before ``collections`` is imported):
    a copy of a ChainMap over the environment iterates it from there for the caller."""
    chain = getattr(sys.modules.get("collections"), "ChainMap", None)
    return getattr(getattr(chain, "__iter__", None), "__code__", None)


def _iter(self: Any) -> Any:
    """``os.environ``'s own iteration, noting the instruction of the run that drives it:
    the frame and instruction where a copy then takes each value (see :func:`_asker`)."""
    if not _env["busy"]:
        frame: Any = sys._getframe(1)
        while frame is not None and (_plumbing(frame) or frame.f_code is _chain_iter()):
            frame = frame.f_back
        _env["copying"] = None if frame is None else (id(frame), frame.f_lasti)
    yield from _original_iter(self)


def install(record: dict[str, Any], skip: tuple[str, ...],
            where: Callable[[str, int], str]) -> None:
    """Record this process's own reads into ``record["environ"]`` (called before user code).

    ``skip``: path prefixes whose code is not the run's (libraries, this tool);
    ``where``: ``file:line`` as the other call sites write it. ``record["environ_dropped"]``
    counts the names read past :data:`MAX_READS`.
    """
    global _PLUMBING_FILES, _original, _original_iter
    _PLUMBING_FILES = _PLUMBING_FILES | {
        f for f in (getattr(os, "__file__", None),
                    getattr(sys.modules.get("_collections_abc"), "__file__", None)) if f}
    for state in (_reads, _done, _not_own, _dropped):
        state.clear()
    record["environ"] = _reads
    record["environ_dropped"] = 0
    _env.update(skip=skip, where=where, record=record, copying=None, os_globals=vars(os),
                abc_globals=vars(sys.modules.get("_collections_abc", os)))
    cls = type(os.environ)
    if _original is None:
        _original, _original_iter = cls.__getitem__, cls.__iter__
        cls.__getitem__ = _getitem  # type: ignore[method-assign]
        cls.__iter__ = _iter  # type: ignore[method-assign]
