"""Op audit for ``manifest lab``: which aten ops a run hit, where, and how often.

Loaded by the launcher only when ``MANIFEST_AUDIT`` names a directory (the
lab's audit run), so no other run imports it. It reuses the op recorder of
``_manifest_ops`` without fingerprints (no tensor is read): each op costs a
Python call, a module-stack look-up and a walk up the stack to the user's
line, which is why the lab audits one extra run and times the others.

Why an audit and not the flag: on CPU, torch 2.13 raises under
``use_deterministic_algorithms(True)`` for none of the ops it documents as
nondeterministic on CUDA, so a CPU-only machine learns which of them a model
hits only by watching the ops go by. Every op is counted here; the lab
decides which of them matter (``manifest.ops.catalogue``).

File (JSON, ``<dir>/audit-<pid>.json``, written at exit)::

    {"format": "manifest-audit/v1", "pid", "mp_child",
     "ops": [[op, module, module_type, where, device, count], ...]}
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
from typing import Any

FORMAT = "manifest-audit/v1"

_state: dict[str, Any] = {"counts": {}, "recorder": None, "dir": None, "pid": None}


def _on_op(ev: Any) -> None:
    key = (ev.op, ev.module, ev.module_type, ev.where, ev.device)
    counts = _state["counts"]
    counts[key] = counts.get(key, 0) + 1


def start(directory: str) -> None:
    """Record every aten op of this process from now until it exits."""
    if _state["recorder"] is not None:
        return
    import _manifest_ops  # type: ignore[import-not-found]

    recorder = _manifest_ops.OpRecorder(_on_op, fingerprint=False)
    recorder.__enter__()
    _state.update(recorder=recorder, dir=directory, pid=os.getpid())
    atexit.register(finish)


def finish() -> None:
    recorder = _state["recorder"]
    if recorder is None or _state["pid"] != os.getpid():
        return  # a forked worker inherited the state: only the recording process writes
    _state["recorder"] = None
    # A mode stack the script left unbalanced must not lose the counts.
    with contextlib.suppress(Exception):
        recorder.__exit__(None, None, None)
    mp = sys.modules.get("multiprocessing")
    doc = {"format": FORMAT, "pid": os.getpid(),
           "mp_child": bool(mp is not None and mp.parent_process() is not None),
           "ops": [[*key, n] for key, n in sorted(_state["counts"].items())]}
    path = os.path.join(str(_state["dir"]), f"audit-{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        os.replace(path + ".tmp", path)
    except OSError:
        pass
