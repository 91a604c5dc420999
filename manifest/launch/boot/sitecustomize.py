"""Launcher entry: prepares every Python process that ``manifest capture`` starts.

``manifest capture`` puts this directory first on ``PYTHONPATH``, so Python's
``site`` module imports this file at start-up, before any user code. It
first runs the ``sitecustomize`` that would otherwise have run (the next one
on ``sys.path``), so a user's or a distribution's own customisation still
happens, then installs the recipe.
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
    spec.loader.exec_module(module)


_chain()

if _here not in sys.path:
    sys.path.insert(0, _here)
import _manifest_launch  # type: ignore[import-not-found]  # noqa: E402

_manifest_launch.install()
