"""The environment variables the run's own code read, with a digest of each value.

A script that reads ``LRSCALE`` from the environment computes another run
under another value, and nothing else in a manifest shows it: the argv, the
code and the seeds are the same. This hook of the launcher (installed by
``_manifest_launch`` before user code) adds to the process record::

    "environ": {"LRSCALE": {"site": "train.py:12", "set": true,
                            "digest": "blake3:…"}}

the first read of each variable, where it happened and the blake3 of the value
it returned (UTF-8, ``surrogateescape``), or ``set: false`` when it was unset
(``os.environ.get("LRSCALE", "1.0")`` falls back: that is an input too). The
value itself never leaves the process. ``manifest.capture.environ`` turns the
record into ``determinism.processes[*].environ``, dropping the digest of a
secret-looking name (the project's one rule, ``manifest.redact``) and the
variables compared elsewhere.

What is hooked: ``os._Environ.__getitem__``, the one method that
``os.environ[...]``, ``.get``, ``os.getenv``, ``in``, ``.setdefault`` and
``.pop`` all reach (``os.environb`` is the same class). What counts:

* only reads made by the run's own code: the first frame below ``os`` and
  ``collections.abc`` (the access plumbing) must lie outside the interpreter's
  and libraries' prefixes and outside this tool (the same prefixes as the
  call sites of ``_manifest_observe``). torch, numpy and the standard library
  read dozens of variables at import (``TORCH_HOME``, ``HOME`` through
  ``os.path.expanduser`` …); those are theirs, and a variable that changes
  numerics through a library is on the allow-list that ``env.variables``
  already records;
* only keyed reads: ``dict(os.environ)``, ``{**os.environ}``,
  ``os.environ.copy()`` and iteration hand the whole environment on (usually
  to a subprocess) without the script using each value; they are not reads
  of every variable;
* not the launcher's reads (its frames are this tool's).

Not seen: reads that go around ``os.environ`` (``posix.environ``,
``os.environ._data``, ``getenv`` from C or ctypes), a script that picks its
variables by iterating the environment, and a read in another thread while
this one digests a value (one flag, not a lock: a read is missed, never
blocked). Only the first read of a name is kept, with the value it returned.

Cost (2-core dev machine, min of 7 × 20,000 calls): ``os.environ.get`` of a
variable already recorded 0.74 µs, as unhooked; a library's read, which walks
the frames each time, 5.5 µs. ``import torch`` (2.13) makes 89 reads: under
0.5 ms. At most :data:`MAX_READS` variables are kept.

Standard library only, like every module of this directory: imported at
start-up of every Python process ``manifest capture`` starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

MAX_READS = 256

_PLUMBING_FILES = frozenset({"<frozen os>", "<frozen _collections_abc>"})
"""Where ``os`` and ``collections.abc`` live when frozen (3.11+); their files are added."""
_KEYED_CALLS = frozenset({"get", "__contains__", "getenv", "getenvb", "setdefault", "pop"})
"""Plumbing that reads one named variable; anything else there (``copy``, ``__iter__``,
``__or__``, ``items`` views …) reads the whole environment."""


_env: dict[str, Any] = {
    "skip": (),
    "where": None,
    "busy": False,
}
_reads: dict[str, Any] = {}
"""This process's reads (the dict its record holds)."""
_original: Any = None
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


def _plumbing(name: str) -> bool:
    return name in _PLUMBING_FILES


def _reader(frame: Any) -> Any:
    """The frame that asked for one variable, or None when the whole environment was read."""
    calls = []
    while frame is not None and _plumbing(frame.f_code.co_filename):
        calls.append(frame.f_code.co_name)
        frame = frame.f_back
    if frame is None:
        return None
    if calls:
        return frame if _KEYED_CALLS.issuperset(calls) else None
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    return frame if 0 <= lasti < len(code) and code[lasti] in _subscript_ops() else None


def _digest(value: str | bytes) -> str | None:
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    try:
        import blake3
    except ImportError:
        return None
    return "blake3:" + str(blake3.blake3(data).hexdigest())


def _note(key: Any, value: str | bytes | None) -> None:
    reads = _reads
    if _env["busy"]:
        return
    name = os.fsdecode(key) if isinstance(key, bytes) else key
    if not isinstance(name, str) or name in reads or len(reads) >= MAX_READS:
        return
    frame = _reader(sys._getframe(3))  # _note <- _safe_note <- _getitem <- the caller
    if frame is None:
        return
    filename = frame.f_code.co_filename
    if filename.startswith(_env["skip"]) or filename.startswith("<frozen"):
        return
    _env["busy"] = True
    try:
        reads[name] = {"site": _env["where"](filename, frame.f_lineno),
                       "set": value is not None,
                       "digest": None if value is None else _digest(value)}
    finally:
        _env["busy"] = False


def _getitem(self: Any, key: Any) -> Any:
    try:
        value = _original(self, key)
    except KeyError:
        if key not in _reads:
            _safe_note(key, None)
        raise
    if key not in _reads:  # the common case, a variable already seen, stops here
        _safe_note(key, value)
    return value


def _safe_note(key: Any, value: str | bytes | None) -> None:
    with contextlib.suppress(Exception):  # never break the user's read
        _note(key, value)


def install(record: dict[str, Any], skip: tuple[str, ...],
            where: Callable[[str, int], str]) -> None:
    """Record this process's own reads into ``record["environ"]`` (called before user code).

    ``skip``: path prefixes whose code is not the run's (libraries, this tool);
    ``where``: ``file:line`` as the other call sites write it.
    """
    global _PLUMBING_FILES, _original
    _PLUMBING_FILES = _PLUMBING_FILES | {
        f for f in (getattr(os, "__file__", None),
                    getattr(sys.modules.get("_collections_abc"), "__file__", None)) if f}
    _reads.clear()
    record["environ"] = _reads
    _env.update(skip=skip, where=where)
    cls = type(os.environ)
    if _original is None:
        _original = cls.__getitem__
        cls.__getitem__ = _getitem  # type: ignore[method-assign]
