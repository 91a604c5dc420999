"""``--env run`` in the gate and the lab: the re-run of a recorded command in the run's
own environment, rebuilt by uv from the wheels ``.ci/run`` keeps
(``tests/run_env_wheels.py``) and proven, and the report names it.

The gate re-runs its fresh capture of ``examples/gate_repo``; the lab hands a parted
recipe run (``os.urandom`` in the script) to explain, which re-runs it. Without uv or
the wheels, the slow tests skip and say what is missing; nothing reaches the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from manifest.canonical import load_manifest
from manifest.pyenv.sources import SELF_DISTRIBUTIONS, rebuild_set
from tests.run_env_wheels import wheelhouse
from tests.runs import REPO, git, make_repo, manifest_cli
from tests.test_gate import checks, gate
from tests.test_lab import SCATTER_SCRIPT

REBUILT = "the run's environment (rebuilt, files identical)"


def _wheels_for(run: Path) -> Path:
    """The wheel folder, or a skip naming what the run needs and the folder lacks."""
    pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")
    folder = wheelhouse()
    recorded = load_manifest(run.read_bytes()).env
    assert recorded.distributions and recorded.imported is not None
    have = {p.name.split("-")[0].lower().replace("_", "-") + "==" + p.name.split("-")[1]
            for p in folder.glob("*.whl")} if folder.is_dir() else set()
    missing = sorted(f"{n}=={recorded.distributions[n].version}"
                     for n in rebuild_set(recorded.distributions, recorded.imported) or []
                     if n not in SELF_DISTRIBUTIONS
                     and f"{n}=={recorded.distributions[n].version}" not in have)
    if missing:
        pytest.skip(f"the wheelhouse {folder} lacks {', '.join(missing)} "
                    "(python tests/run_env_wheels.py fills it; .ci/run does)")
    return folder


def test_gate_env_run_without_a_rerun_is_bad_usage(tmp_path: Path) -> None:
    proc = manifest_cli("gate", "--no-rerun", "--env", "run", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().endswith("--no-rerun re-runs nothing.")
    # the control: --find-links alone is refused for its own reason, not this one
    alone = manifest_cli("gate", "--no-rerun", "--find-links", str(tmp_path), cwd=tmp_path)
    assert alone.returncode == 2 and b"pass --env run" in alone.stderr


@pytest.mark.slow
def test_gate_reruns_in_the_rebuilt_environment(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "examples" / "gate_repo", repo,
                    ignore=shutil.ignore_patterns("out", ".manifest"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "example")
    # what the smoke run imports, to skip early when the wheels are not there (3: the
    # project's declared weights are not written by this probe)
    probe = manifest_cli("capture", "-q", "-o", str(tmp_path / "probe.json"), "--",
                         "python", "-c", "import torch, safetensors", cwd=repo)
    assert probe.returncode in (0, 3), probe.stderr.decode()[-2000:]
    wheels = _wheels_for(tmp_path / "probe.json")

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    code, report, text = gate(repo, "--env", "run", "--find-links", str(wheels), env=env)
    determinism = checks(report)["determinism"]
    assert determinism["status"] == "pass", text[-3000:]
    assert report["environment"]["used"] == "run"
    assert report["environment"]["line"] == REBUILT
    assert f"environment: {REBUILT}" in determinism["details"]
    assert f"manifest: {REBUILT}" in text  # the proof, as progress before the re-run
    assert code in (0, 1), text[-3000:]  # the baseline check: none committed here


@pytest.mark.slow
def test_lab_explains_a_parted_recipe_in_the_rebuilt_environment(tmp_path: Path) -> None:
    from manifest.lab.runs import _explain
    from manifest.rerun.environment import RebuildOptions
    from manifest.rerun.plan import RerunOptions

    repo = make_repo(tmp_path / "repo", {"pool.py": SCATTER_SCRIPT}, example=False)
    run = tmp_path / "run.json"
    proc = manifest_cli("capture", "-q", "-o", str(run), "--artifact", "out/*.safetensors",
                        "--threads", "2", "--", "python", "pool.py", cwd=repo,
                        env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    wheels = _wheels_for(run)

    explained = _explain(load_manifest(run.read_bytes()), repo, 1, RerunOptions(),
                         RebuildOptions(find_links=(str(wheels),)))
    assert explained.environment == REBUILT, explained
    assert explained.verdict == "parted" and explained.step == 1, explained
