"""``verify`` and ``explain --on slurm`` through submitit's local executor, end to end (issue 23).

A real single-host SLURM (slurmctld, slurmd, munge) is used when ``sbatch`` is on PATH:
``.ci/run`` as root starts one (``.ci/slurm-up``), and so do the tests when SLURM is
installed but not running (``tests/slurm_host.py``); without root that case skips with the
reason. The multi-node SLURM cases are in ``tests/test_cluster_nodes_e2e.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cluster_runs import (
    EXPLAIN_KEYS,
    RUN_ENV_LINE,
    explain_both,
    recorded_on,
    run_env_wheels,
    segments_run,
    segments_verify,
    threads_manifest,
)
from tests.runs import capture, make_repo, manifest_cli
from tests.slurm_host import require_slurm

pytest.importorskip("submitit", reason="the slurm extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def _repo(tmp_path: Path, local: bool) -> tuple[Path, Path]:
    repo = make_repo(tmp_path / "repo", {})
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# uncommitted\n")
    folder = tmp_path / "slurm"
    (repo / "pyproject.toml").write_text(
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(folder))}\nlocal = {'true' if local else 'false'}\n"
        "time_min = 10\n")
    path, _ = capture(repo, command=["python", "train.py", "--steps", "20"])
    return repo, path


def test_verify_on_slurm_local_executor_is_identical(tmp_path: Path) -> None:
    repo, manifest = _repo(tmp_path, local=True)
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "slurm", cwd=repo,
                        timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    report = json.loads(proc.stdout)
    assert report["verdict"] == "identical"
    job = report["job"]
    assert job["executor"] == "slurm" and job["job_id"]
    assert job["where"].startswith(str(tmp_path / "slurm" / "logs"))  # the log location
    assert report["plan"]["cluster"]["time_min"] == 10


def test_verify_on_real_slurm(tmp_path: Path) -> None:
    """A CPU run, then the same run as if recorded on two H100s: SLURM is asked for the typed
    GRES (``.ci/slurm-up`` gives n1 two of type h100) and places it there; a model no node
    has is refused before submission."""
    require_slurm()
    repo, manifest = _repo(tmp_path, local=False)
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "slurm", cwd=repo,
                        timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    if "gpu:h100:2" not in subprocess.run(["sinfo", "-h", "-N", "-o", "%N %G"],
                                          capture_output=True, text=True, check=False,
                                          timeout=120).stdout:
        pytest.skip("this SLURM declares no h100 GRES (.ci/slurm-up configures one)")
    h100 = recorded_on(manifest, tmp_path / "h100.json", "NVIDIA H100 80GB HBM3", 2)
    proc = manifest_cli("verify", str(h100), "--json", "--on", "slurm", cwd=repo, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    job = json.loads(proc.stdout)["job"]["job_id"]
    shown = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True,
                           text=True, check=False, timeout=120).stdout
    assert "gpu:h100:2" in shown and "NodeList=n1" in shown, shown
    a100 = recorded_on(manifest, tmp_path / "a100.json", "NVIDIA A100-SXM4-80GB", 1)
    before = _jobs_seen()
    proc = manifest_cli("verify", str(a100), "--json", "--on", "slurm", cwd=repo, timeout=600)
    assert proc.returncode == 3, proc.stderr.decode()
    assert ('the run recorded 1 × "NVIDIA A100-SXM4-80GB" (GRES gpu:a100) per node and the '
            'cluster has no node with them (it declares "h100")') in proc.stderr.decode()
    assert _jobs_seen() == before  # nothing submitted


def test_verify_on_real_slurm_in_the_runs_rebuilt_environment(tmp_path: Path) -> None:
    """``--env run``: the job rebuilds the run's environment on the shared folder (the
    executor's folder), proves it on the node and re-runs with its python; the report says
    so; explain's runs use it too. A file planted into that venv (same version, other files)
    is named by the next job."""
    require_slurm()
    repo, manifest = _repo(tmp_path, local=False)
    wheels = run_env_wheels(manifest)
    args = ("verify", str(manifest), "--json", "--on", "slurm", "--env", "run",
            "--find-links", str(wheels))
    proc = manifest_cli(*args, cwd=repo, timeout=1200)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    report = json.loads(proc.stdout)
    assert report["verdict"] == "identical", report["reason"]
    # the drift is the node's rebuilt environment's, and the line says so
    assert report["environment"]["line"] == f"{RUN_ENV_LINE}; {report['environment']['drift_of']}"
    assert not [d for d in report["drift"]
               if d["impact"] == "bits" and d["path"].startswith("env.packages[")]
    assert report["environment"]["proof"]["proven"] is True
    [node] = report["environment"]["nodes"]
    assert node["node"] and node["proven"]
    venv = Path(report["environment"]["venv"])
    assert venv.parent == tmp_path / "slurm" / "envs"  # on the shared folder, by digest
    assert [p.name for p in venv.parent.iterdir()] == [venv.name]  # no half-built copy left

    # explain's runs are jobs of their own, each in the same rebuilt environment
    proc = manifest_cli("explain", *args[1:], "--threads", "1", "--step", "2", cwd=repo,
                        timeout=1200)
    explained = json.loads(proc.stdout)
    assert proc.returncode in (0, 1), proc.stderr.decode()[-3000:]
    assert explained["environment"]["line"] == (  # the drift is the first job's node's
        f"{RUN_ENV_LINE}; {explained['environment']['drift_of']}")
    assert explained["jobs"] and all(
        j["environment"]["venv"] == str(venv) for j in explained["jobs"]), explained["jobs"]

    planted = next(venv.glob("lib/python*/site-packages/colorama/__init__.py"))
    planted.write_text(planted.read_text() + "\n# planted\n")
    proc = manifest_cli(*args, cwd=repo, timeout=1200)
    report = json.loads(proc.stdout)
    line = report["environment"]["line"]
    assert line.startswith("the run's environment, rebuilt but not proven"), line
    assert "colorama 0.4.6 other-build" in line, line
    assert report["environment"]["cached"] is True  # the same venv, its files hashed again


def _jobs_seen() -> int:
    """The controller's next job id: it moves with every submission, even a refused one."""
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                         check=False, timeout=120).stdout
    return next(int(line.split("=")[1]) for line in out.splitlines()
                if line.startswith("NEXT_JOB_ID"))


def test_explain_on_slurm_names_what_a_local_explain_names(tmp_path: Path) -> None:
    """explain's four runs (two op windows writing to its writable directories) as four
    submitit jobs: the findings are the local ones."""
    repo = make_repo(tmp_path / "repo", {})
    folder = tmp_path / "slurm"
    (repo / "pyproject.toml").write_text(
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(folder))}\nlocal = true\ntime_min = 10\n")
    manifest = threads_manifest(repo)
    here, there = explain_both(repo, manifest, "--on", "slurm")
    assert here["verdict"] == "parted" and here["findings"], here  # positive control
    assert {k: there[k] for k in EXPLAIN_KEYS} == {k: here[k] for k in EXPLAIN_KEYS}
    assert there["plan"]["executor"] == "slurm" and "jobs" not in here
    assert [j["run"] for j in there["jobs"]] == list(there["timings_s"])
    assert all(j["where"].startswith(str(folder / "logs")) for j in there["jobs"])


def test_lab_on_slurm_runs_the_users_tree(tmp_path: Path) -> None:
    """lab runs in the user's tree: what git lists (an untracked helper the script imports
    included, .venv not) is shipped, the outputs come back, and the recipe run is the one a
    local lab gets (same run_id); two remote recipe runs are bit-identical."""
    import os
    import subprocess
    import sys

    repo = make_repo(tmp_path / "repo", {})
    (repo / "helper.py").write_text("LOADED = True\n")  # untracked, not ignored
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\nimport helper  # noqa\n")
    (repo / ".venv").mkdir()
    (repo / ".venv" / "big.bin").write_bytes(b"\0" * (1 << 20))  # not shipped
    folder = tmp_path / "slurm"
    (repo / "pyproject.toml").write_text(
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(folder))}\nlocal = true\ntime_min = 10\n")
    lab = [sys.executable, "-m", "manifest", "lab", "--threads", "2", "--seed", "0",
           "--artifact", "out/*.safetensors", "--format", "json", "-q"]
    train = ["--", "python", "train.py", "--steps", "4"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    # Local first: both write out/ in the same tree.
    here = subprocess.run([*lab, "--runs", "1", *train], cwd=repo, env=env,
                          capture_output=True, timeout=600, check=False)
    assert here.returncode == 0, here.stderr.decode()
    there = subprocess.run([*lab, "--runs", "2", "--on", "slurm", *train], cwd=repo, env=env,
                           capture_output=True, timeout=600, check=False)
    assert there.returncode == 0, there.stderr.decode()
    local, remote = json.loads(here.stdout), json.loads(there.stdout)
    assert remote["plan"]["executor"] == "slurm"
    assert remote["recipe"]["bit_identical"] and remote["recipe"]["tensors_compared"] > 0
    assert remote["identity"]["recipe_run_id"] == local["identity"]["recipe_run_id"]
    assert remote["catalogue"]["audit_error"] is None  # the audit files came back
    assert remote["catalogue"]["ops_total"] == local["catalogue"]["ops_total"] > 0


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return segments_run(tmp_path_factory.mktemp("slurm-seg"))


@pytest.mark.parametrize("local", [True, False], ids=["submitit-local", "real-slurm"])
def test_segments_on_slurm_are_jobs_of_their_own(segmented: Path, tmp_path: Path,
                                                 local: bool) -> None:
    """verify --segments --on slurm (issue 29, item 5): one SLURM job per stretch, each
    finding what a replay here finds (the fault at step 13, the changed checkpoint at the
    end of its stretch, the untouched ones)."""
    if not local:
        require_slurm()
    folder = tmp_path / "slurm"
    (segmented / "pyproject.toml").write_text(
        '[tool.manifest]\nresume = "--resume {checkpoint}"\n'
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(folder))}\nlocal = {'true' if local else 'false'}\n"
        "time_min = 10\n")
    code, doc, stderr = segments_verify(segmented, "--at", "5,13,35", "--on", "slurm")
    assert code == 1, stderr
    got = [(s["start"], s["end"], s["verdict"], s["first_divergent_step"], s["steps_compared"])
           for s in doc["segments"]]
    assert got == [(0, 10, "identical", None, 10), (10, 20, "differs", 13, 3),
                   (30, 40, "identical", None, 10)], doc
    assert doc["segments"][2]["end_checkpoints"] == {"ckpts/ckpt/step-40.pt": True,
                                                     "ckpts/model.safetensors": True}
    jobs = [s["job"] for s in doc["segments"]]
    assert len({j["job_id"] for j in jobs}) == 3 and all(j["executor"] == "slurm" for j in jobs)
    assert all(j["where"].startswith(str(folder / "logs")) for j in jobs)
    assert stderr.count("slurm job") >= 3 and "submitted" in stderr
