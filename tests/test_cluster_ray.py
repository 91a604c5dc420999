"""``verify`` and ``explain --on ray`` against a real Ray cluster on 127.0.0.1, started and
stopped here (issue 23).

The cluster is ``tests.ray_cluster.ray_cluster`` (the head, and a second raylet that
declares two GPUs of type H100 the way Ray does on such a node, ``--num-gpus 2`` and the
``accelerator_type:H100`` resource, which Ray accepts on a CPU machine): its own session
and a private temp dir; teardown stops the process groups and then any process left that
names the temp dir (Ray's daemons), by pid.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_runs import (
    EXPLAIN_KEYS,
    RUN_ENV_LINE,
    SEGMENT_KEYS,
    explain_both,
    recorded_on,
    run_env_wheels,
    segments_run,
    segments_verify,
    threads_manifest,
)
from tests.ray_cluster import ray_cluster
from tests.runs import capture, make_repo, manifest_cli

pytest.importorskip("ray.job_submission", reason="the ray extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    declared = {1: ["--num-gpus=2", '--resources={"accelerator_type:H100": 1}']}
    with ray_cluster(raylets=2, cpus=2, declare=declared) as address:
        yield address


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    repo = make_repo(tmp_path_factory.mktemp("ray") / "repo", {})
    # Uncommitted: the patch travels in the bundle and is checked on arrival.
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# uncommitted\n")
    path, doc = capture(repo, command=["python", "train.py", "--steps", "20"])
    assert doc["code"]["diff_digest"]
    return repo, path


def _verify(repo: Path, manifest: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "ray", *args, cwd=repo,
                        timeout=600)
    return proc.returncode, json.loads(proc.stdout or b"{}"), proc.stderr.decode()


def test_verify_on_ray_is_identical(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    with_credentials = ray_address.replace("http://", "http://alice:s3cret@")
    code, report, stderr = _verify(repo, manifest, "--address", with_credentials)
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    job = report["job"]
    assert job["executor"] == "ray"
    assert job["job_id"].startswith("manifest-")
    assert job["where"] == f"{ray_address}/#/jobs/{job['job_id']}"
    assert job["bundle"].startswith("blake3:")
    assert job["network"]  # the report states the re-run's network policy
    assert job["bytes_shipped"] > 0 and not job["outputs_fetched"]
    assert report["plan"]["executor"] == "ray"
    everything = json.dumps(report) + stderr
    assert "s3cret" not in everything and "alice" not in everything


def test_verify_on_ray_in_the_runs_rebuilt_environment(ray_address: str,
                                                       recorded: tuple[Path, Path]) -> None:
    """``--env run``: Ray's own ``pip``/``uv`` runtime_env layers a venv over the raylet's
    python (docs/cluster.md), so the job rebuilds the run's environment itself, into the
    node's cache, proves it there and re-runs with its python; the report says so."""
    repo, manifest = recorded
    wheels = run_env_wheels(manifest)
    code, report, stderr = _verify(repo, manifest, "--address", ray_address, "--env", "run",
                                   "--find-links", str(wheels))
    assert (code, report["verdict"]) == (0, "identical"), (report.get("reason"), stderr[-3000:])
    # the drift is the node's rebuilt environment's, and the line says so
    assert report["environment"]["line"] == f"{RUN_ENV_LINE}; {report['environment']['drift_of']}"
    assert report["environment"]["drift_of"].endswith("where the re-run ran, not this machine's")
    assert not [d for d in report["drift"]
               if d["impact"] == "bits" and d["path"].startswith("env.packages[")]
    assert report["environment"]["proof"]["proven"] is True
    assert report["environment"]["used"] == "run"
    [node] = report["environment"]["nodes"]
    assert node["proven"] and node["node"]
    assert "submitted" in stderr  # the executor's progress, rendered by the CLI


def test_threads_changed_differs_located(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    recorded_threads = json.loads(manifest.read_text())["determinism"]["num_threads"]
    other = 1 if recorded_threads != 1 else 2
    code, report, stderr = _verify(repo, manifest, "--address", ray_address,
                                   "--threads", str(other))
    assert code == 1, stderr
    assert report["verdict"] == "differs"
    assert report["first_divergent_step"] is not None  # located: the step the runs part
    changed = [t for a in report["artifacts"] for t in a["tensors"]]
    assert changed and all(t["name"] for t in changed)
    assert "stayed on ray" in report["artifacts"][0]["detail"]


def test_edited_patch_is_refused_on_arrival(ray_address: str, tmp_path: Path) -> None:
    """A patch edited after the bundle was named (in transit, on shared storage) is refused
    by the job before anything runs; the same bundle unedited runs (positive control)."""
    import blake3

    from manifest.errors import NoVerdictError
    from manifest.launch.runner import LaunchSettings
    from manifest.rerun.cluster import cluster_options
    from manifest.rerun.cluster.bundle import PATCH, build_bundle
    from manifest.rerun.cluster.ray import RayExecutor

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "run.py").write_text("print('ran')\n")
    patch = b"diff --git a/run.py b/run.py\n"
    settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True)

    class Plan:
        verb, argv = "verify", ("python", "run.py")
        topology: dict[str, int] = {}  # noqa: RUF012 - a stand-in read only
        gpu = None
        settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True)

    executor = RayExecutor(cluster_options("ray", {"address": ray_address,
                                                   "timeout_s": 300}, {}))
    results = {}
    for edited in (False, True):
        bundle = build_bundle(
            tmp_path / f"bundle-{edited}", tree=tree, cwd=tree, mount_at=tree,
            argv=Plan.argv, outputs=[], patch=patch, commit="0" * 40,
            diff_digest="blake3:" + blake3.blake3(patch).hexdigest(),
            settings=settings.__dict__, env=dict(os.environ), sandbox=False)
        if edited:
            (bundle.path / PATCH).write_bytes(patch + b"+planted\n")
        job = executor.submit(Plan(), bundle)  # type: ignore[arg-type]
        try:
            results[edited] = executor._wait(job, Plan())  # type: ignore[arg-type]
        except NoVerdictError as exc:
            results[edited] = {"error": exc.message}
    assert results[False]["exit_code"] == 0
    assert "refused the bundle on arrival" in results[True]["error"]
    # The index records each file's size: a grown patch is refused before it is hashed.
    assert "refusing to run edited code" in results[True]["error"]


def test_timeout_cancels_the_job(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    code, _, stderr = _verify(repo, manifest, "--address", ray_address, "--timeout", "1")
    assert code == 3, stderr
    assert "did not finish within 1 s" in stderr and "cancelled" in stderr


def test_segments_over_their_time_are_each_cancelled(ray_address: str, tmp_path: Path) -> None:
    """Every stretch's job is waited for with the limit and cancelled past it, confirmed by
    Ray (STOPPED); none is left running and none gives a verdict."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    repo = segments_run(tmp_path, steps=20, every=10)
    code, doc, stderr = segments_verify(repo, "--at", "5,15", "--on", "ray", "--address",
                                        ray_address, "--timeout", "1")
    assert code == 3, stderr
    reasons = [s["reason"] for s in doc["segments"]]
    assert len(reasons) == 2 and all("did not finish within 1 s" in r and "cancelled" in r
                                     for r in reasons), reasons
    client = JobSubmissionClient(ray_address)
    ids = [line.split("ray job ", 1)[1].split()[0] for line in stderr.splitlines()
           if "submitted" in line]
    assert len(ids) == 2
    assert {client.get_job_status(i) for i in ids} == {JobStatus.STOPPED}


def test_explain_on_ray_names_what_a_local_explain_names(
        ray_address: str, recorded: tuple[Path, Path]) -> None:
    """explain runs the plan four times (two op windows writing to its writable
    directories): on Ray each is a job, and the findings are the local ones."""
    repo, _ = recorded
    manifest = threads_manifest(repo)
    here, there = explain_both(repo, manifest, "--on", "ray", "--address", ray_address)
    assert here["verdict"] == "parted" and here["findings"], here  # positive control
    assert {k: there[k] for k in EXPLAIN_KEYS} == {k: here[k] for k in EXPLAIN_KEYS}
    assert here["findings"][0]["op"].startswith("aten::")
    assert there["plan"]["executor"] == "ray" and "jobs" not in here
    assert [j["run"] for j in there["jobs"]] == list(there["timings_s"])
    assert all(j["executor"] == "ray" and j["job_id"].startswith("manifest-")
               for j in there["jobs"])


def test_segments_on_ray_run_as_jobs_side_by_side_and_find_what_a_local_replay_finds(
        ray_address: str, tmp_path: Path) -> None:
    """verify --segments --on ray (issue 29, item 5): every stretch a Ray job of its own, all
    submitted before any is waited for; the fault between two checkpoints is found at its
    step there as here, and the end checkpoints are compared from the tables the jobs send
    back. The checkpoints lie in a directory git does not ignore: placed in the scratch
    clone they must not make the bundle's patch another one."""
    repo = segments_run(tmp_path)
    at = ("--at", "5,13,35")
    code, here, _ = segments_verify(repo, *at)
    assert code == 1 and [s["verdict"] for s in here["segments"]] == [
        "identical", "differs", "identical"], here  # the local replay: the control
    code, there, stderr = segments_verify(repo, *at, "--on", "ray", "--address", ray_address)
    assert code == 1, stderr
    assert [{k: s[k] for k in SEGMENT_KEYS} for s in there["segments"]] == [
        {k: s[k] for k in SEGMENT_KEYS} for s in here["segments"]]
    assert there["segments"][1]["first_divergent_step"] == 13
    assert there["segments"][1]["end_checkpoints"] == {"ckpts/ckpt/step-20.pt": False}
    assert there["segments"][2]["end_checkpoints"] == {"ckpts/ckpt/step-40.pt": True,
                                                       "ckpts/model.safetensors": True}
    jobs = [s["job"] for s in there["segments"]]
    assert all(j["executor"] == "ray" for j in jobs) and len({j["job_id"] for j in jobs}) == 3
    assert there["executor"].startswith("Ray Jobs at") and "job" not in here["segments"][0]
    # Submitted one after another, then waited for: all three "submitted" lines come before
    # anything else the executor says about them.
    said = [line for line in stderr.splitlines() if "ray job" in line]
    assert [("submitted" in line) for line in said[:3]] == [True, True, True], stderr
    # Ray's own record of the jobs: they ran side by side (one had started before another
    # ended), not one after another.
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_address)
    spans = sorted((int(info.start_time or 0), int(info.end_time or 0)) for info in
                   (client.get_job_info(j["job_id"]) for j in jobs))
    assert all(0 < a < b for a, b in spans), spans
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans


def test_the_recorded_gpu_model_is_placed_on_the_raylet_that_declares_it(
        ray_address: str, recorded: tuple[Path, Path], tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    repo, manifest = recorded
    client = JobSubmissionClient(ray_address)
    gpu_nodes = {n["node_id"] for n in _nodes(ray_address)
                 if "accelerator_type:H100" in n["resources_total"]}
    assert len(gpu_nodes) == 1
    h100 = recorded_on(manifest, tmp_path / "h100.json", "NVIDIA H100 80GB HBM3", 2)
    code, report, stderr = _verify(repo, h100, "--address", ray_address)
    assert code == 0, stderr
    info = client.get_job_info(report["job"]["job_id"])
    assert info.driver_node_id in gpu_nodes  # placed where the model is
    # refused where no raylet declares the model: one sentence, nothing submitted
    before = len(client.list_jobs())
    a100 = recorded_on(manifest, tmp_path / "a100.json", "NVIDIA A100-SXM4-80GB", 1)
    code, _, stderr = _verify(repo, a100, "--address", ray_address)
    assert code == 3, stderr
    assert ('the run recorded 1 × "NVIDIA A100-SXM4-80GB" (accelerator_type:A100) per node '
            'and the cluster has no node with them (it declares "H100")') in stderr
    assert "nothing was submitted" in stderr
    assert len(client.list_jobs()) == before


def _nodes(address: str) -> list[dict[str, Any]]:
    from ray.util.state import list_nodes

    return [{"node_id": n.node_id, "resources_total": n.resources_total}
            for n in list_nodes(address=address, detail=True) if n.state == "ALIVE"]
