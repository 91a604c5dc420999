"""The single-host SLURM the real-SLURM cases use: the one answering here, else one they start.

``.ci/run`` starts it as root before the tests (``.ci/slurm-up``: munge, slurmctld, two
slurmd). README's test command alone, on a machine where SLURM is installed but its
daemons are not running (a reboot), starts them the same way, once per session; without
root, or with no SLURM installed, those cases skip and say why.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM_UP = Path(__file__).resolve().parent.parent / ".ci" / "slurm-up"


def _controller_answers() -> bool:
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


@functools.cache
def why_no_slurm() -> str | None:
    """None when a SLURM controller answers here (started now if need be), else why not."""
    if shutil.which("sbatch") is None:
        return "no SLURM here (sbatch not on PATH; .ci/slurm-up as root installs and starts one)"
    if _controller_answers():
        return None
    if os.geteuid() != 0:
        return ("sbatch is here but no SLURM controller answers; starting one "
                "(.ci/slurm-up) needs root")
    try:
        subprocess.run([str(SLURM_UP)], capture_output=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no SLURM controller answers and .ci/slurm-up failed: {exc}"
    if _controller_answers():
        return None
    return "sbatch is here but no SLURM controller answers, and .ci/slurm-up started none"


def require_slurm() -> None:
    """Skip the calling test, with the reason, when no real SLURM can be had here."""
    reason = why_no_slurm()
    if reason is not None:
        pytest.skip(reason)
