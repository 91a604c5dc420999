"""``verify --on k8s`` submitted, watched, collected and deleted through the official client
(issue 30), against ``tests.k8s_api``: a local server speaking the endpoints the client uses,
which runs each pod's commands here. No real API server runs on these machines: scheduling,
images, volumes and the Service's DNS are not exercised (docs/cluster.md says so).

* a claim: the bundle staged in the folder the claim holds, the pods' ``/bundle`` mapped to it;
* ``--bundle-url s3://…``: the bundle's tar uploaded to a moto S3 server and fetched by the
  init container with the remote-data clients;
* ``--timeout`` deletes the Job and says so once the API answers 404; a Job whose pods stay
  Pending is said to be waiting;
* ``--dry-run`` prints the objects and exits 0 saying nothing ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_runs import RUN_ENV_LINE, recorded_on, run_env_wheels
from tests.k8s_api import fake_kube
from tests.runs import capture, make_repo, manifest_cli

pytest.importorskip("kubernetes", reason="the k8s extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]

IMAGE = "registry.example/train@sha256:" + "0" * 64


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run, in a repository whose config stages k8s bundles in ``claim/`` beside it (the
    folder the claim's volume holds; the fake pods see it as /bundle)."""
    base = tmp_path_factory.mktemp("k8s")
    repo = make_repo(base / "repo", {"pyproject.toml": (
        "[tool.manifest.executors.k8s]\n"
        f"folder = {json.dumps(str(base / 'claim'))}\n")})
    path, _ = capture(repo, command=["python", "train.py", "--steps", "6"])
    return repo, path


def _claim(repo: Path) -> Path:
    return repo.parent / "claim"


def _verify(repo: Path, manifest: Path, env: dict[str, str], *args: str
            ) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "k8s", "--image", IMAGE,
                        *args, cwd=repo, env={**os.environ, **env}, timeout=600)
    return proc.returncode, json.loads(proc.stdout or b"{}"), proc.stderr.decode()


def _posted(kube: Any, kind: str) -> dict[str, Any]:
    [body] = [b for m, p, b in kube.requests if m == "POST" and p.endswith(f"/{kind}")]
    return dict(body)


def test_claim_submit_watch_collect_delete(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = recorded
    with fake_kube(tmp_path, claim_dir=_claim(repo)) as (kube, env):
        code, report, stderr = _verify(repo, manifest, env, "--claim", "bundles",
                                       "--namespace", "ml")
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    job = report["job"]
    assert job["executor"] == "k8s" and job["job_id"].startswith("manifest-")
    assert f"kubectl -n ml logs -l manifest/job={job['job_id']}" in job["where"]
    body = _posted(kube, "jobs")
    spec = body["spec"]["template"]["spec"]
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "bundles",
                                                           "readOnly": True}
    assert spec["containers"][0]["command"][1:4] == ["-I", "-m", "manifest.rerun.cluster.k8s"]
    assert body["spec"]["completionMode"] == "Indexed" and body["spec"]["completions"] == 1
    assert _posted(kube, "services")["spec"]["clusterIP"] == "None"
    deleted = [p for m, p, _ in kube.requests if m == "DELETE"]
    assert any(p.endswith(f"/jobs/{job['job_id']}") for p in deleted)  # collected, then gone
    assert any(p.endswith(f"/services/{job['job_id']}") for p in deleted)


def test_bundle_url_init_container_fetches_from_s3(recorded: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto is not installed")
    from moto.server import ThreadedMotoServer

    from tests.remote_fixtures import S3_ENV
    from tests.runs import free_port

    repo, manifest = recorded
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3_env = {**S3_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in s3_env}
    os.environ.update(s3_env)  # the fake pods inherit it, as a pod would from its spec
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="bundles")
        with fake_kube(tmp_path) as (kube, env):
            code, report, stderr = _verify(repo, manifest, {**env, **s3_env},
                                           "--bundle-url", "s3://bundles/re-runs")
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(
            Bucket="bundles")["Contents"]]
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    digest = report["job"]["bundle"].removeprefix("blake3:")
    assert keys == [f"re-runs/{digest}.tar"]
    spec = _posted(kube, "jobs")["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    assert init["command"][-3:] == ["fetch", f"s3://bundles/re-runs/{digest}.tar",
                                    f"/bundle/{digest}"]
    assert spec["volumes"] == [{"name": "bundle", "emptyDir": {}}]


def test_env_run_rebuilds_in_an_init_container_and_the_pod_runs_in_it(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    """``--env run`` where the pods run another image than the run's: an init container
    rebuilds and proves the run's environment into the pod's volume, the re-run finds it
    there (its proof checked again) and runs with its python; the report says so."""
    repo, manifest = recorded
    wheels = run_env_wheels(manifest)
    with fake_kube(tmp_path, claim_dir=_claim(repo)) as (kube, env):
        code, report, stderr = _verify(repo, manifest, env, "--claim", "bundles",
                                       "--env", "run", "--find-links", str(wheels))
    assert code == 0, stderr[-3000:]
    assert report["verdict"] == "identical", report["reason"]
    assert report["environment"]["line"].startswith(RUN_ENV_LINE)  # and whose drift it is
    assert report["environment"]["proof"]["proven"] is True
    assert report["environment"]["cached"] is True  # built by the init container
    spec = _posted(kube, "jobs")["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    assert init["name"] == "rebuild-environment" and "--env-only" in init["command"]
    assert {"name": "environment", "emptyDir": {}} in spec["volumes"]


def test_timeout_deletes_the_job_and_a_pending_job_is_said(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = recorded
    with fake_kube(tmp_path, claim_dir=_claim(repo), hold=True) as (kube, env):
        code, _, stderr = _verify(repo, manifest, env, "--claim", "bundles", "--timeout", "3")
    assert code == 3, stderr
    assert "did not finish within 3 s (--timeout); it was cancelled (k8s reports the Job is " \
           "deleted)" in stderr
    assert any(m == "DELETE" and "/jobs/" in p for m, p, _ in kube.requests)


def test_dry_run_exits_0_and_says_nothing_ran(recorded: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    repo, manifest = recorded
    with fake_kube(tmp_path) as (kube, env):
        proc = manifest_cli("verify", str(manifest), "--on", "k8s", "--image", IMAGE,
                            "--dry-run", "--bundle-url", "s3://bundles/x", cwd=repo,
                            env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr.decode()
    assert "kind: Job" in proc.stdout.decode() and "initContainers" in proc.stdout.decode()
    assert "nothing was submitted and nothing ran" in proc.stderr.decode()
    assert kube.requests == []  # not one API call


def test_dry_run_says_where_the_bundle_is_and_prints_json_when_asked(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 39: the printed Job could not be applied: nothing said where the bundle was
    staged, that the claim must hold it, or that the image needs torch-manifest;
    ``--format json`` printed YAML; and with no way to bring the bundle the dry run printed
    a Job the real submit refuses."""
    repo, manifest = recorded
    with fake_kube(tmp_path) as (kube, env):
        proc = manifest_cli("verify", str(manifest), "--on", "k8s", "--image", IMAGE,
                            "--dry-run", "--claim", "bundles", "--format", "json", cwd=repo,
                            env={**os.environ, **env})
        stderr = proc.stderr.decode()
        assert proc.returncode == 0, stderr
        doc = json.loads(proc.stdout)  # today's code printed YAML here
        assert doc["kind"] == "List" and [o["kind"] for o in doc["items"]] == ["Service", "Job"]
        spec = doc["items"][1]["spec"]["template"]["spec"]
        assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == "bundles"
        digest = spec["containers"][0]["command"][4].removeprefix("/bundle/")
        staged = _claim(repo) / digest
        assert f"The bundle is staged at {staged}" in stderr
        assert f"the claim bundles must hold the folder {_claim(repo)} at its root" in stderr
        assert "must contain Python, torch-manifest" in stderr
        assert (staged / "bundle.json").is_file()  # kept: the staging folder is removed

        # The same dry run with no way to bring the bundle refuses as the real submit does.
        proc = manifest_cli("verify", str(manifest), "--on", "k8s", "--image", IMAGE,
                            "--dry-run", cwd=repo, env={**os.environ, **env})
        [line] = proc.stderr.decode().splitlines()[-1:]
        assert proc.returncode == 2, proc.stderr.decode()
        assert proc.stdout == b""
        assert line.startswith("manifest: --on k8s needs a way to bring the bundle to the pods")
    assert kube.requests == []  # not one API call


H100 = "NVIDIA H100 80GB HBM3"


def _node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": str(gpus)}}}


def test_the_recorded_gpu_model_is_asked_for_and_refused_where_no_node_has_it(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = recorded
    h100 = recorded_on(manifest, tmp_path / "h100.json", H100, 2, mig=False, ecc=True)
    others = [_node("a", "NVIDIA-A100-SXM4-80GB", 8), _node("b", "NVIDIA-H100-80GB-HBM3", 1)]
    with fake_kube(tmp_path, claim_dir=_claim(repo), nodes=others) as (kube, env):
        code, _, stderr = _verify(repo, h100, env, "--claim", "bundles")
    assert code == 3, stderr
    assert ("the run recorded 2 × \"NVIDIA H100 80GB HBM3\" (nvidia.com/gpu.product="
            "NVIDIA-H100-80GB-HBM3) per node and the cluster has no node with them") in stderr
    assert '"NVIDIA-A100-SXM4-80GB"' in stderr and "nothing was submitted" in stderr
    assert not [p for m, p, _ in kube.requests if m == "POST"]  # nothing submitted
    # control: a node with two of them takes the job, which carries count and selector
    fits = [*others, _node("c", "NVIDIA-H100-80GB-HBM3", 2)]
    with fake_kube(tmp_path, claim_dir=_claim(repo), nodes=fits) as (kube, env):
        code, report, stderr = _verify(repo, h100, env, "--claim", "bundles")
    spec = _posted(kube, "jobs")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert "ECC mode on" in stderr and "MIG mode off" in stderr  # named: no request holds them
    assert report["verdict"] in {"identical", "differs"}, stderr
    # --other-gpu: no selector, the count only, and it says so
    with fake_kube(tmp_path, claim_dir=_claim(repo), nodes=others) as (kube, env):
        code, _, stderr = _verify(repo, h100, env, "--claim", "bundles", "--other-gpu")
    spec = _posted(kube, "jobs")["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec
    assert "--other-gpu: the re-run may run on another GPU model" in stderr
