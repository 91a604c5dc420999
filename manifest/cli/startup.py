"""What the ``manifest`` process sets up before it builds a single model.

Third-party pydantic plugins stay out. Pydantic loads every plugin that any
installed distribution registers (entry-point group ``pydantic``) the first
time it builds a validator, and lets it observe every validation: code from
whatever is installed, running inside the tool that checks someone else's
run, with the manifest's bytes in hand. ``PYDANTIC_DISABLE_PLUGINS`` is
pydantic's own switch, but an environment variable would reach the training
command this process launches and change *its* pydantic; and even with it set
pydantic imports ``importlib.metadata`` to look (~20 ms of CPU, then ~5 ms to
scan ~150 distributions: a sixth of ``manifest capture``). So the CLI, and
only the CLI (never ``import manifest`` inside a user's process), puts a
stand-in for pydantic's plugin loader in ``sys.modules`` that reports no
plugins. Any other name asked of the stand-in comes from the real module, so
a pydantic that grows a new import from it still works.

The cyclic garbage collector is off while the process imports its modules.
Importing pydantic and the models leaves ~39,000 objects the collector tracks
and almost no garbage (63 collections find 581 objects), and the collections
at interpreter exit walk all of them once more. Measured on the 2-core
box (``benchmarks/capture_latency.py``'s child, 15 runs, medians): importing
``manifest.capture.run`` and exiting took 158 ms, 137 ms with the collector
off for the imports and those objects frozen afterwards (``gc.freeze``: the
permanent generation, never walked again). :func:`pause_collector` turns it
off only when ``main`` runs as the process's entry point (never for a
``main([...])`` called inside a test or a user's program, whose own garbage
would be frozen too); :func:`resume_collector` freezes and turns it back on
once the verb has imported what it needs, so a long captured run is collected
as usual.
"""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

LOADER = "pydantic.plugin._loader"


def _no_plugins() -> tuple[()]:
    return ()


def _from_real_loader(name: str) -> Any:
    if name.startswith("__"):  # the import system probes __path__ and friends
        raise AttributeError(name)
    import importlib.machinery
    import importlib.util

    import pydantic.plugin

    spec = importlib.machinery.PathFinder.find_spec("_loader", list(pydantic.plugin.__path__))
    if spec is None or spec.loader is None:
        raise AttributeError(name)
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    return getattr(real, name)


def keep_pydantic_plugins_out() -> None:
    """Make pydantic find no plugins in this process (a no-op once it has looked)."""
    if LOADER in sys.modules:
        return
    stand_in = types.ModuleType(LOADER, "manifest: no pydantic plugins in this process")
    setattr(stand_in, "get_plugins", _no_plugins)  # noqa: B010 (a module built at run time)
    setattr(stand_in, "__getattr__", _from_real_loader)  # noqa: B010
    sys.modules[LOADER] = stand_in


_paused = False


def pause_collector() -> None:
    """Turn the cyclic collector off for the imports (see the module docstring)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collector() -> None:
    """Freeze what is allocated so far and turn the collector back on, if it was paused here."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
