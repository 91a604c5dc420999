"""What the cluster executors' tests share: explain here and on a cluster, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.runs import capture

EXPLAIN_KEYS = ("verdict", "cause", "first_step", "recorded_step", "steps_run", "findings")
"""What an explain names (step, op, module, line, numbers); timings, confinement and the plan's
executor are where it ran, not what it found."""


def explain_both(repo: Path, manifest: Path, *on: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(local, remote) ``explain --threads 1 --json``, run side by side: the remote one spends
    most of its time waiting on jobs, and the findings do not depend on the load."""
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "manifest", "explain", str(manifest), "--json", "--threads", "1",
         *where], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for where in ((), on)]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 1, err.decode()  # 1: the runs part, explained
            reports.append(json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return reports[0], reports[1]


def threads_manifest(repo: Path) -> Path:
    """A 4-step run recorded with 2 threads: ``--threads 1`` parts at step 1 (a reduction)."""
    manifest, _ = capture(repo, "--seed", "0", "--threads", "2", name="threads.json",
                          command=["python", "train.py", "--steps", "4"])
    return manifest
