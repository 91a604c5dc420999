"""Launcher entry: prepares every Python process that ``manifest capture`` starts.

Python's ``site`` module imports this file at start-up, before any user code,
by one of two routes that end here: ``manifest capture`` puts this directory
first on ``PYTHONPATH``, and the start-up hook ``torch_manifest.pth``
(installed at the top of site-packages with the package) puts it first on
``sys.path`` in any process whose environment carries ``MANIFEST_LAUNCH``,
so a command that replaces ``PYTHONPATH`` (``env PYTHONPATH=tools python
main.py``) is still prepared. The hook steps aside when the directory is
already on the path; ``site`` imports ``sitecustomize`` once; and
``_manifest_launch.install`` is a no-op the second time: one launcher per
process, whichever route brought it.

It first runs the ``sitecustomize`` that would otherwise have run (the next
one on ``sys.path``), so a user's or a distribution's own customisation
still happens, then installs the recipe. That module is kept in
``sys.modules`` under its own name, as plain Python keeps it: what it holds
(``torch.library`` registrations, objects with finalizers) lives as long as
the process, and ``import sitecustomize`` in user code finds it. Like
``site``, an error in it is printed and start-up goes on.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # The import that is running this file returns sys.modules["sitecustomize"] once
    # it finishes, so the chained module takes this one's place there for good.
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # what site.execsitecustomize does with its own
        if _self is not None:
            sys.modules["sitecustomize"] = _self
        else:
            sys.modules.pop("sitecustomize", None)
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             f"{type(exc).__name__}: {exc}\n")


_self = sys.modules.get(__name__)
_chain()

if _here not in sys.path:
    sys.path.insert(0, _here)
import _manifest_launch  # type: ignore[import-not-found]  # noqa: E402

_manifest_launch.install()
