"""The reproducibility recipe as a Python API, for scripts that want no wrapper.

    import manifest
    manifest.seed_everything(42)
    with manifest.deterministic():
        train()

The steps are the launcher's own (``manifest.launch.boot``: ``_manifest_rng``,
``_manifest_switches``, ``_manifest_trail``), so a script that calls these and a
script run under ``manifest capture`` are prepared identically. Under the
launcher, ``trail`` points go into the process record that the capture merges
into ``outputs``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def _runtime(name: str) -> ModuleType:
    """A launcher module (``_manifest_rng`` …): the instance sitecustomize loaded, if any.

    Under the launcher that instance shares the state the process record is
    written from; elsewhere the package's copy is imported.
    """
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    return importlib.import_module(f"manifest.launch.boot.{name}")


def seed_everything(seed: int, *, check_hashseed: bool = True) -> None:
    """Seed python ``random``, numpy (if imported), torch CPU and every CUDA device.

    With ``check_hashseed``, warn (RuntimeWarning) when PYTHONHASHSEED was not
    fixed at interpreter start: str hashing, set order and anything derived
    from them then change from run to run, and no call at run time can fix it.
    """
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), not {seed}")
    if check_hashseed and sys.flags.hash_randomization and "PYTHONHASHSEED" not in os.environ:
        import warnings

        warnings.warn(
            "PYTHONHASHSEED is not set: set-iteration and hash order vary between runs; "
            "export PYTHONHASHSEED=0 before starting Python (manifest capture does this).",
            RuntimeWarning,
            stacklevel=2,
        )
    rt = _runtime("_manifest_rng")
    with contextlib.suppress(ImportError):
        import numpy  # noqa: F401  - seed numpy only if it is installed
    rt.seed_all(seed)


class _Deterministic(AbstractContextManager[None]):
    """Context manager and decorator: every deterministic flag on, restored on exit."""

    def __init__(self, warn_only: bool = False) -> None:
        self.warn_only = warn_only
        self._saved: list[dict[str, Any]] = []

    def __enter__(self) -> None:
        import torch

        rt = _runtime("_manifest_switches")
        self._saved.append(rt.snapshot_flags(torch))
        rt.apply_flags(torch, warn_only=self.warn_only)

    def __exit__(self, *exc: object) -> None:
        import torch

        _runtime("_manifest_switches").restore_flags(torch, self._saved.pop())

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with _Deterministic(self.warn_only):
                return func(*args, **kwargs)

        return wrapper


def deterministic(warn_only: bool = False) -> _Deterministic:
    """``with manifest.deterministic():`` or ``@manifest.deterministic()``."""
    return _Deterministic(warn_only)


def dataloader_kwargs(seed: int, rank: int = 0) -> dict[str, Any]:
    """``generator`` and ``worker_init_fn`` for ``torch.utils.data.DataLoader``.

    Follows PyTorch's reproducibility recipe: the loader's generator is seeded
    from (seed, rank), and each worker seeds python ``random`` and numpy from
    ``torch.initial_seed()``, which torch derives per worker from the generator.
    """
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + rank)
    return {"generator": generator, "worker_init_fn": _seed_worker}


def _seed_worker(worker_id: int) -> None:
    import random

    import torch

    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(worker_seed)


class Trail:
    """Fingerprints of a model's parameters every ``every`` optimizer steps.

    Hooks every optimizer's step (``register_optimizer_step_post_hook``). Each
    point is (step, blake3 of the state_dict tensors' names, dtypes, shapes and
    raw bytes). Under the launcher the points go into the process record, so
    ``manifest verify`` can name the first step at which two runs part.
    """

    def __init__(self, model: Any, every: int) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.model = model
        self.every = every
        self.steps = 0
        self.points: list[tuple[int, str]] = []
        self._handle = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            self.mark(self.steps)

    def mark(self, step: int) -> None:
        rt = _runtime("_manifest_trail")
        digest = rt.parameters_fingerprint(self.model)
        if digest is not None:
            self.points.append((step, digest))
            rt.record_trail(step, digest)

    def remove(self) -> None:
        self._handle.remove()


def log(**values: Any) -> None:
    """Report numbers of the current step, e.g. ``manifest.log(loss=loss.item())``.

    Under the launcher they go into the process record with the optimizer
    step they follow (``manifest lab`` reads ``loss`` to report the loss gap
    between runs); elsewhere this does nothing. Values must convert with
    ``float()`` (a 0-dim tensor does, at the cost of one device sync).
    """
    # detach(): float() of a tensor that requires grad warns (and would under -W error).
    _runtime("_manifest_trail").record_log({str(k): float(v.detach() if hasattr(v, "detach") else v)
                           for k, v in values.items()})


def trail(model: Any, every: int = 1) -> Trail:
    """Start a step trail for ``model`` (see :class:`Trail`)."""
    return Trail(model, every)


