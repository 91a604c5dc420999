"""What the cluster executors' tests share: explain here and on a cluster, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.runs import EXAMPLE, capture, make_repo, manifest_cli

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


NUDGE = """        if os.environ.get("NUDGE_AT") == str(step + 1):
            with torch.no_grad():  # a silent fault: one weight moved by one ULP
                model.fc.bias[0] = torch.nextafter(model.fc.bias[0], torch.tensor(1e9))
        opt.step()
"""


def nudged_example() -> str:
    """The bundled example, nudging a weight by one ULP before optimizer step ``NUDGE_AT``
    (the variable is not part of the recorded identity: a re-run does not nudge)."""
    text = EXAMPLE.read_text()
    assert text.count("        opt.step()\n") == 1
    return text.replace("        opt.step()\n", NUDGE)


def segments_run(base: Path, *, steps: int = 40, every: int = 10, nudge_at: int = 13,
                 out: str = "ckpts") -> Path:
    """A repository and ``run.json``: the nudged example captured with a checkpoint every
    ``every`` steps under ``out/`` (by default a directory git does not ignore, so a replay's
    placed checkpoint must not count as a change to the code)."""
    repo = make_repo(base / "repo", {
        "train.py": nudged_example(),
        "pyproject.toml": '[tool.manifest]\nresume = "--resume {checkpoint}"\n'})
    cap = manifest_cli("capture", "--seed", "0", "--artifact", f"{out}/*.safetensors", "--",
                       "python", "train.py", "--steps", str(steps), "--save-every", str(every),
                       "--out", out, cwd=repo, env={"NUDGE_AT": str(nudge_at)})
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    return repo


def segments_verify(repo: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """``verify --segments``/``--at`` as JSON, without the nudge in the environment."""
    env = {k: v for k, v in os.environ.items() if k != "NUDGE_AT"}
    out = manifest_cli("verify", "--trust", "run.json", "--format", "json", *args, cwd=repo,
                       env=env, timeout=900)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    return out.returncode, json.loads(out.stdout or b"{}"), out.stderr.decode()


SEGMENT_KEYS = ("start", "end", "checkpoint", "verdict", "first_divergent_step",
                "steps_compared", "end_checkpoints", "reason")
"""What a replayed stretch found (its time and job are where it ran)."""


def recorded_on(manifest: Path, out: Path, name: str, count: int, *, mig: bool | None = None,
                ecc: bool | None = None) -> Path:
    """The run as if captured on ``count`` GPUs that NVML names ``name`` (what the fake
    NVML records at capture), sealed here: what a cluster re-run must ask the engine for."""
    from manifest.canonical import dumps, seal
    from manifest.trust import record_sealed

    doc = json.loads(manifest.read_bytes())
    doc["hardware"]["gpus"] = [{"index": i, "name": name, "memory_bytes": 80 << 30,
                                "compute_capability": "9.0", "mig_mode": mig,
                                "ecc_mode": ecc} for i in range(count)]
    doc["hardware"]["gpu_count"] = count
    sealed = seal(doc)
    out.write_bytes(dumps(sealed))
    assert record_sealed(sealed.digest)
    return out


RUN_ENV_LINE = "the run's environment (rebuilt, files identical)"
"""The report's line for a re-run in the run's environment, rebuilt and proven."""


def run_env_wheels(manifest: Path) -> Path:
    """The wheelhouse ``.ci/run`` fills (``tests/run_env_wheels.py``) when it holds a wheel of
    every distribution the run's rebuild installs; else the test skips, naming the missing."""
    import pytest

    from manifest.pyenv.sources import SELF_DISTRIBUTIONS, rebuild_set
    from tests.run_env_wheels import wheelhouse

    pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")
    env = json.loads(manifest.read_bytes())["env"]
    wanted = {f"{n}=={env['distributions'][n]['version']}"
              for n in rebuild_set(env["distributions"], env["imported"]) or []
              if n not in SELF_DISTRIBUTIONS}
    folder = wheelhouse()
    have = {p.name.split("-")[0].lower().replace("_", "-") + "==" + p.name.split("-")[1]
            for p in folder.glob("*.whl")} if folder.is_dir() else set()
    missing = sorted(w for w in wanted if w not in have)
    if missing:
        pytest.skip(f"the wheelhouse {folder} lacks {', '.join(missing)} "
                    "(python tests/run_env_wheels.py fills it; .ci/run does)")
    return folder
