"""Seeding and fingerprinting the global random generators (python, numpy, torch).

The seed hook of the launcher: ``_manifest_launch`` calls ``seed_python`` at
start-up and ``seed_numpy``/``seed_all`` the moment the script imports numpy
or torch; the recipe API (``manifest.seed_everything``) calls ``seed_all``, so
both seed in exactly the same way. ``_manifest_observe`` fingerprints the
same generators to tell whether a script drew from one before reseeding it.

Fingerprints are blake3 over each generator's full state (python's 625
words, numpy's MT19937 key, torch's CPU state and every *initialised* CUDA
device's state), so two processes with the same fingerprint will draw the
same numbers. Nothing here initialises CUDA or imports numpy or torch: a
library the script never imported is neither seeded nor read.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the record's type, for mypy only: nothing more loads at start-up
    from manifest.launch.boot._manifest_wire import RngFingerprints

# ------------------------------------------------------------------ hashing


def blake3_hex(chunks: Sequence[bytes | memoryview]) -> str | None:
    try:
        import blake3
    except ImportError:
        return None
    h = blake3.blake3()
    for chunk in chunks:
        h.update(chunk)
    return "blake3:" + str(h.hexdigest())


def python_rng_fingerprint() -> str | None:
    version, internal, gauss = random.getstate()
    return blake3_hex([json.dumps([version, list(internal), gauss]).encode()])


def numpy_rng_fingerprint() -> str | None:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    header = json.dumps([str(name), int(pos), int(has_gauss), float(cached)]).encode()
    return blake3_hex([header, keys.tobytes()])


def torch_rng_fingerprints() -> tuple[str | None, list[str]]:
    torch = sys.modules.get("torch")
    if torch is None:
        return None, []
    cpu = blake3_hex([torch.get_rng_state().numpy().tobytes()])
    cuda: list[str] = []
    # Never initialise CUDA just to look at it: only read states that exist.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for state in torch.cuda.get_rng_state_all():
            digest = blake3_hex([state.numpy().tobytes()])
            if digest:
                cuda.append(digest)
    return cpu, cuda


def rng_fingerprints() -> RngFingerprints:
    cpu, cuda = torch_rng_fingerprints()
    return {
        "python": python_rng_fingerprint(),
        "numpy": numpy_rng_fingerprint(),
        "torch_cpu": cpu,
        "cuda": cuda,
    }


# ------------------------------------------------------------------ seeding


def seed_python(seed: int) -> None:
    random.seed(seed)


def seed_numpy(seed: int) -> None:
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


def seed_torch(seed: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        # manual_seed seeds the CPU generator and queues every CUDA device's
        # seed lazily: it does not initialise CUDA.
        torch.manual_seed(seed)


def seed_all(seed: int) -> None:
    seed_python(seed)
    seed_numpy(seed)
    seed_torch(seed)
