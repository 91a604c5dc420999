"""The re-run's environment (``manifest.rerun.environment``) without training: which one the
report names, what a rebuilt venv's re-run sees, and the launcher in an interpreter that
has none of this tool's dependencies.

A real venv made by uv (no package in it, 0.1 s) stands in for a rebuilt environment: the
launcher must run there, the tool's recipe API must import there, and nothing of the
verifier's own site-packages may (pydantic is the positive control: importable here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.canonical import load_manifest
from manifest.launch.runner import LaunchSettings, run_under_launcher
from manifest.rerun.environment import RunEnvironment, this_machine
from manifest.rerun.interpreter import probe_env_in, with_this_tool
from tests.pyenv_wheels import GOLDEN


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([uv.find_uv_bin(), "venv", "-q", "--no-config", "--python", sys.executable,
                    str(venv)], check=True, timeout=300)
    return venv


def _recorded() -> dict[str, object]:
    doc = load_manifest(GOLDEN.read_bytes()).model_dump(mode="json")
    dist = {"version": "2.0.0", "tags": ["cp311-cp311-linux_x86_64"], "installer": "pip",
            "direct_url": None, "files": "blake3:" + "a" * 64}
    doc["env"]["distributions"] = {"numpy": dist, "torch": dict(dist, version="2.13.0+cpu"),
                                   "rich": dict(dist, version="13.0")}
    doc["env"]["imported"] = ["numpy", "torch"]
    return doc


def test_the_report_says_how_many_of_the_runs_distributions_differ() -> None:
    from manifest.canonical import seal

    recorded = seal(_recorded())
    dists = dict(recorded.env.distributions or {})
    same = {n: d.model_dump(mode="json") for n, d in dists.items()}
    assert this_machine(recorded, {"distributions": same}).line == (
        "this machine's: the run's distributions, files identical")
    other = dict(same, numpy=dict(same["numpy"], version="2.3.5"))
    assert this_machine(recorded, {"distributions": other}).line == (
        "this machine's: 1 distribution differs")
    # rich was never imported: another rich here is not one of the run's distributions
    other = {n: d for n, d in dict(other, rich=dict(same["rich"], version="14.0")).items()
             if n != "torch"}
    assert this_machine(recorded, {"distributions": other}).line == (
        "this machine's: 2 distributions differ")
    assert this_machine(recorded, {"distributions": other}).python is None


def test_a_rebuilt_venv_comes_first_and_nothing_of_this_one_leaks(tmp_path: Path) -> None:
    used = RunEnvironment("the run's environment (rebuilt, files identical)",
                          tmp_path / "venv" / "bin" / "python", {"proven": True})
    env = used.apply({"PATH": "/usr/bin", "VIRTUAL_ENV": "/mine", "CONDA_PREFIX": "/c",
                      "PYTHONPATH": "/code"}, tmp_path / "tool")
    assert env["PATH"] == f"{tmp_path / 'venv' / 'bin'}{os.pathsep}/usr/bin"
    assert env["VIRTUAL_ENV"] == str(tmp_path / "venv") and "CONDA_PREFIX" not in env
    assert env["PYTHONNOUSERSITE"] == "1"
    assert env["PYTHONPATH"] == f"/code{os.pathsep}{tmp_path / 'tool'}"  # the run's own first
    here = RunEnvironment("this machine's: 1 distribution differs")
    assert here.apply({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}  # this machine's: as is
    assert used.to_json()["used"] == "run" and here.to_json()["used"] == "here"


def test_the_launcher_runs_in_a_venv_without_this_tools_dependencies(
        bare_venv: Path, tmp_path: Path) -> None:
    python = bare_venv / "bin" / "python"
    used = RunEnvironment("the run's environment (rebuilt, files identical)", python, {})
    tool = used.tool_folder(tmp_path)
    assert sorted(p.name for p in tool.iterdir()) == ["blake3", "manifest"]
    env = used.apply(dict(os.environ), tool)
    check = ("import importlib.util as u, sys; import manifest.launch.recipe; "
             "print(sys.prefix, u.find_spec('pydantic') is None, u.find_spec('numpy') is None)")
    # positive control: this interpreter has pydantic (and numpy)
    assert subprocess.run([sys.executable, "-c", "import pydantic, numpy"],
                          check=False).returncode == 0
    done = subprocess.run(["python", "-c", check], env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    prefix, no_pydantic, no_numpy = done.stdout.split()
    assert Path(prefix) == bare_venv and no_pydantic == "True" and no_numpy == "True"
    settings = LaunchSettings(seed=3, derivation="rank", threads=1, deterministic=True)
    result = run_under_launcher(["python", "-c", "import random; print(random.random())"],
                                tmp_path, settings, base_env=env)
    assert result.exit_code == 0
    [record] = result.records
    assert record["rank"] == 0  # the launcher ran there and wrote its record


def test_drift_is_probed_in_the_rebuilt_interpreter(bare_venv: Path) -> None:
    from manifest.capture.snapshot import probe_machine

    here = probe_machine()[0]
    assert "pydantic" in here["packages"]  # positive control: this environment's
    seen = probe_env_in(bare_venv / "bin" / "python", here)
    assert "pydantic" not in seen["packages"] and "numpy" not in seen["packages"]
    assert seen["python"] == here["python"]
    assert seen["cuda_driver"] == here["cuda_driver"]  # the machine's, not the venv's
    for name in ("torch-manifest", "manifest"):  # this tool: the copy the re-run imports
        if name in here["packages"]:
            assert seen["packages"][name] == here["packages"][name]
    again = with_this_tool(dict(seen, packages={}), here)
    assert set(again["packages"]) <= {"torch-manifest", "manifest"}
    # an interpreter where the probe cannot run: one sentence (environment_for then says
    # the drift shown is this machine's), never a traceback
    from manifest.errors import NoVerdictError

    with pytest.raises(NoVerdictError, match="could not be probed"):
        probe_env_in(Path("/bin/false"), here)


def test_a_vanished_distribution_is_named_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's torch is served by no source (the capture's pip sources are an empty
    folder and index, and so is the one given): no verdict, torch named, and nothing was
    re-run; plain verify re-runs the same manifest (the control). Untrusted (sealed on
    another machine), ``--env run`` is refused before anything is rebuilt."""
    from tests.runs import manifest_cli
    from tests.travel import capture_run, dirty_repo, other_machine

    pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for name, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(empty),
                        "PIP_INDEX_URL": empty.as_uri()}.items():
        monkeypatch.setenv(name, value)
    repo = dirty_repo(tmp_path / "repo")
    capture_run(repo)
    here = dict(other_machine(tmp_path / "verifier"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = manifest_cli("verify", "run.json", "--env", "run", "--find-links", str(empty),
                        cwd=repo, env=here)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and stderr.count("\n") == 1, stderr
    assert "its environment is not rebuilt either (--env run)" in stderr
    assert not (tmp_path / "cache" / "manifest" / "envs").exists()
    proc = manifest_cli("verify", "run.json", "--env", "run", "--find-links", str(empty),
                        "--trust", "--json", cwd=repo, env=here)
    stderr = proc.stderr.decode()
    assert proc.returncode == 3, stderr
    report = proc.stdout.decode()
    assert "could not be rebuilt" in report and "torch" in report and "vanished" in report
    assert "re-running" not in stderr and "Traceback" not in stderr
    assert not (tmp_path / "cache" / "manifest" / "envs").exists() or not any(
        p for p in (tmp_path / "cache" / "manifest" / "envs").iterdir()
        if not p.name.startswith("."))
    proc = manifest_cli("verify", "run.json", "--trust", cwd=repo, env=here)
    assert "re-running" in proc.stderr.decode(), proc.stderr.decode()


def test_env_flags_that_cannot_apply_are_refused_before_anything_runs(tmp_path: Path) -> None:
    from tests.runs import manifest_cli

    (tmp_path / "run.json").write_bytes(GOLDEN.read_bytes())
    cases = {("--env", "run", "--at", "3"): "--segments and --at replay stretches",
             # with --on the records are checked here, before anything is submitted
             ("--env", "run", "--on", "slurm", "--trust"): "does not record its distributions",
             # untrusted: refused before any record is read or anything rebuilt
             ("--env", "run", "--on", "slurm"): "its environment is not rebuilt either",
             ("--find-links", "wheels"): "pass --env run"}
    for args, expected in cases.items():
        proc = manifest_cli("verify", "run.json", *args, cwd=tmp_path)
        stderr = proc.stderr.decode()
        assert proc.returncode == 2 and expected in stderr, (args, stderr)
        assert stderr.count("\n") == 1 and "Traceback" not in stderr
