"""A rebuilt venv's interpreter, asked without being trusted: its env section probed for
drift, and a private bytecode folder for everything started from it.

The venv's ``__pycache__`` is outside the proof (``manifest.pyenv.prove``), so its python
never reads it: a fresh 0700 ``PYTHONPYCACHEPREFIX`` (or ``-X pycache_prefix`` under
``-I``) for the re-run and the probe alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def private_pycache() -> str:
    """A fresh private (0700) temporary folder for a rebuilt venv's python to keep its
    bytecode in (``PYTHONPYCACHEPREFIX``, or ``-X pycache_prefix`` under ``-I``): Python
    then neither reads nor writes the venv's ``__pycache__``, so a ``.pyc`` planted there
    (which the proof leaves out) never replaces a proven module."""
    import tempfile

    return tempfile.mkdtemp(prefix="manifest-pycache-")


_PROBE = """\
import json, sys
args = json.loads(sys.argv[1])
own = list(sys.path)
sys.path[:0] = [args["tool"]]
sys.path.extend(p for p in args["helpers"] if p not in own)
import manifest.probes.env as probe
probe.distribution_paths = lambda: list(own)
env = probe.probe_env(cuda_driver=args["driver"], cuda_driver_reason=args["reason"])
sys.stdout.write(env.model_dump_json())
"""
"""The env probe run by another interpreter: the distributions on its own path only
(``distribution_paths`` is that path), this tool and its dependencies (pydantic …)
appended after it, so they are importable without being counted as the run's."""


def probe_env_in(python: Path, machine_env: Mapping[str, Any]) -> dict[str, Any]:
    """The env section as ``python`` (a rebuilt venv's interpreter) sees it, for drift: the
    run's environment is compared, not the verifier's. ``machine_env`` (this process's
    probe) gives the CUDA driver facts, which belong to the machine, not the venv."""
    import json
    import subprocess
    import sys
    import tempfile

    import manifest
    from manifest.errors import NoVerdictError

    with tempfile.TemporaryDirectory(prefix="manifest-probe-") as tool:
        os.symlink(Path(manifest.__file__).resolve().parent, Path(tool) / "manifest")
        helpers = [p for p in sys.path if p and os.path.isdir(p)]
        args = {"tool": tool, "helpers": helpers, "driver": machine_env.get("cuda_driver"),
                "reason": (machine_env.get("unavailable") or {}).get("cuda_driver")}
        try:
            prefix = f"pycache_prefix={Path(tool) / 'pycache'}"  # -I ignores PYTHON* vars
            done = subprocess.run([str(python), "-I", "-X", prefix, "-c", _PROBE,
                                   json.dumps(args)],
                                  capture_output=True, text=True, check=False, timeout=600,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NoVerdictError(f"the rebuilt environment's interpreter {python} could not "
                                 f"be probed: {exc}") from exc
    tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
    try:
        doc: Any = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise NoVerdictError(f"the rebuilt environment's interpreter {python} could not be "
                             f"probed: {tail}")
    return with_this_tool(doc, machine_env)


def with_this_tool(doc: dict[str, Any], machine_env: Mapping[str, Any]) -> dict[str, Any]:
    """The rebuilt environment's probe with this tool's own distribution as this machine has
    it: a rebuild never installs it (``pyenv.sources.SELF_DISTRIBUTIONS``), the re-run
    imports this copy (``RunEnvironment.tool_folder``), so that is the one compared."""
    from manifest.canonical import blake3_name, canonical_bytes
    from manifest.probes.distributions import environment_digest
    from manifest.pyenv.sources import SELF_DISTRIBUTIONS

    packages = dict(doc.get("packages") or {})
    dists = dict(doc.get("distributions") or {})
    for name in SELF_DISTRIBUTIONS:
        if name in (machine_env.get("packages") or {}):
            packages[name] = machine_env["packages"][name]
        if name in (machine_env.get("distributions") or {}):
            dists[name] = machine_env["distributions"][name]
    from manifest.models import Distribution

    listing = sorted(f"{n}=={v}" for n, v in packages.items())
    return dict(doc, packages=packages, distributions=dists,
                packages_digest=blake3_name(canonical_bytes(listing)),
                environment_digest=environment_digest(
                    {n: Distribution.model_validate(d) for n, d in dists.items()}))
