"""The wheelhouse of the run-environment test (``tests/test_verify_run_env.py``), filled once.

The bundled example's run imports torch, numpy, safetensors and what they import; its
environment is rebuilt from wheels, and tests reach no network. So ``.ci/run`` fills a
folder once, before the tests, with ``pip download`` of exactly the versions installed in
the test venv (pip's own configuration decides where they come from: a local find-links
folder or index where the machine has one), plus another numpy for the verifier's venv:

    python tests/run_env_wheels.py          # fills wheelhouse(); prints what it could not

The test skips, naming the missing wheels, when the folder does not hold them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

EXAMPLE_IMPORTS = ("torch", "numpy", "safetensors", "nvidia-ml-py", "sympy", "mpmath",
                   "tqdm", "colorama", "typing-extensions")
"""What the bundled example's run imports (``env.imported``, torch 2.13 on CPU); the test
checks the captured run's own list against the folder."""


def other_numpy() -> str:
    """A numpy version for the verifier's venv that is not the one installed here."""
    return "2.3.5" if metadata.version("numpy") != "2.3.5" else "2.4.6"


def wheelhouse() -> Path:
    """``$MANIFEST_TEST_WHEELS``, else ``$XDG_CACHE_HOME/manifest-tests/run-env-wheels``."""
    named = os.environ.get("MANIFEST_TEST_WHEELS")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "manifest-tests" / "run-env-wheels"


def fill(folder: Path) -> list[str]:
    """Download each pinned wheel into ``folder``; the requirements that failed."""
    from manifest.models import always_counts
    from manifest.pyenv.sources import SELF_DISTRIBUTIONS, normalise

    folder.mkdir(parents=True, exist_ok=True)
    # a rebuild also installs what counts for the bits unimported (torch*, nvidia-* …)
    always = {normalise(d.metadata["Name"]) for d in metadata.distributions()}
    names = [*EXAMPLE_IMPORTS, *sorted(n for n in always if always_counts(n)
                                      and n not in SELF_DISTRIBUTIONS
                                      and n not in EXAMPLE_IMPORTS)]
    wanted = [f"{name}=={metadata.version(name)}" for name in names]
    wanted.append(f"numpy=={other_numpy()}")
    failed = []
    for requirement in wanted:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--only-binary", ":all:", "-d", str(folder), requirement],
                              capture_output=True, text=True, check=False, timeout=1800)
        if done.returncode != 0:
            failed.append(requirement)
    return failed


if __name__ == "__main__":
    missing = fill(wheelhouse())
    for requirement in missing:
        sys.stderr.write(f"run-env wheelhouse: could not download {requirement}\n")
