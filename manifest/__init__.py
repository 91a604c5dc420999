"""manifest: content-addressable manifests for PyTorch training runs.

The public surface is listed in ``__all__``; heavy parts load on first use
so ``import manifest`` never imports torch, git or pynvml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Manifest",
    "ManifestError",
    "__version__",
    "dataloader_kwargs",
    "deterministic",
    "load_manifest",
    "log",
    "seed_everything",
    "trail",
]

if TYPE_CHECKING:
    from manifest.canonical import load_manifest
    from manifest.errors import ManifestError
    from manifest.launch.recipe import dataloader_kwargs, deterministic, log, seed_everything, trail
    from manifest.models import Manifest

_LAZY = {
    "Manifest": "manifest.models",
    "ManifestError": "manifest.errors",
    "load_manifest": "manifest.canonical",
    "seed_everything": "manifest.launch.recipe",
    "deterministic": "manifest.launch.recipe",
    "dataloader_kwargs": "manifest.launch.recipe",
    "trail": "manifest.launch.recipe",
    "log": "manifest.launch.recipe",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'manifest' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
