"""``--on k8s``: the Indexed Job and headless Service rendered from a plan (issue 23).

The objects are built with the official client's models and read back into them
(``V1Job``/``V1Service``), pinned by a golden YAML file; the pods' entrypoint runs
here as two ranks (``JOB_COMPLETION_INDEX`` 0 and 1, gloo over localhost). The image
defaults to the container image the manifest recorded (``verify --on k8s --dry-run``
against a second golden file); without one and without ``--image``, one sentence, exit 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import free_port, make_repo, manifest_cli

pytest.importorskip("kubernetes", reason="the k8s extra is not installed")

GOLDEN = Path(__file__).parent / "golden" / "k8s" / "job.yaml"
GOLDEN_RECORDED = Path(__file__).parent / "golden" / "k8s" / "recorded-image.yaml"
IMAGE = "registry.example/train@sha256:" + "0" * 64
NAME = "blake3:" + "ab" * 32


def _objects() -> tuple[object, object]:
    from manifest.rerun.cluster.k8s import job_name, render

    return render(name=job_name(NAME), bundle_name=NAME, image="registry.example/train@sha256:"
                  + "0" * 64, namespace="ml", nodes=2, threads=4, gpus=8, claim="bundles")


def test_rendered_objects_match_the_golden_file() -> None:
    from manifest.rerun.cluster.k8s import to_yaml

    text = to_yaml(_objects())
    if os.environ.get("MANIFEST_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_rendered_objects_validate_against_the_client_models() -> None:
    import yaml  # type: ignore[import-untyped]
    from kubernetes.client import ApiClient, V1Job, V1Service

    api = ApiClient()
    service_doc, job_doc = yaml.safe_load_all(GOLDEN.read_text())
    service = api._ApiClient__deserialize(service_doc, "V1Service")
    job = api._ApiClient__deserialize(job_doc, "V1Job")
    assert isinstance(service, V1Service) and isinstance(job, V1Job)
    assert service.spec.cluster_ip == "None"
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.completions == job.spec.parallelism == 2
    assert job.spec.backoff_limit == 0
    pod = job.spec.template.spec
    assert pod.subdomain == service.metadata.name == job.metadata.name
    assert pod.containers[0].resources.limits == {"cpu": "4", "nvidia.com/gpu": "8"}
    # A field the API does not have is refused by the model (positive control).
    from kubernetes.client import V1JobSpec

    with pytest.raises(TypeError):
        V1JobSpec(template=None, completionIndex=3)


def test_rank_from_completion_index() -> None:
    from manifest.rerun.cluster.k8s import rank_env

    env = rank_env(1, 2, "manifest-abab")
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "manifest-abab-0.manifest-abab"


GLOO = """
import os
from pathlib import Path
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.arange(4, dtype=torch.float32) * (dist.get_rank() + 1)
dist.all_reduce(t)
Path("out").mkdir(exist_ok=True)
torch.save({"t": t}, f"out/rank{dist.get_rank()}.pt")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_entrypoint_runs_two_ranks_over_gloo(tmp_path: Path) -> None:
    from manifest.rerun.cluster.bundle import build_bundle

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "dist.py").write_text(GLOO)
    settings = {"seed": 0, "derivation": "same", "threads": 1, "deterministic": True,
                "trail": "off", "ops": None, "root": str(tree), "hashseed": None}
    bundle = build_bundle(tmp_path / "bundle", tree=tree, cwd=tree, mount_at=tree,
                          argv=[sys.executable, "dist.py"], outputs=["out/*.pt"], patch=None,
                          commit=None, diff_digest=None, settings=settings,
                          env=dict(os.environ), sandbox=False)
    port = str(free_port())
    procs = []
    for index in (0, 1):
        env = dict(os.environ, JOB_COMPLETION_INDEX=str(index), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "manifest.rerun.cluster.k8s", str(bundle.path),
             "--expect", bundle.name, "--service", "svc", "--nodes", "2",
             "--out", str(tmp_path / "out")], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE))
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()
    tables = {}
    for index in (0, 1):
        doc = json.loads((tmp_path / "out" / str(index) / "result.json").read_text())
        assert [r["rank"] for r in doc["records"]] == [index]
        tables.update({a["path"]: a["tensors"] for a in doc["artifacts"]})
    assert set(tables) == {"out/rank0.pt", "out/rank1.pt"}
    # all_reduce gave both ranks the same tensor: the same digest in both tables.
    assert tables["out/rank0.pt"] == tables["out/rank1.pt"]


def test_image_from_the_flag_then_the_record() -> None:
    from manifest.errors import UsageError
    from manifest.rerun.cluster import cluster_options
    from manifest.rerun.cluster.image import image_for
    from manifest.rerun.cluster.options import K8sOptions

    given = cluster_options("k8s", {"image": "mine:1"}, {})
    bare = cluster_options("k8s", {}, {})
    assert isinstance(given, K8sOptions)
    assert isinstance(bare, K8sOptions)
    assert image_for(given, IMAGE) == "mine:1"  # the user's wins
    assert image_for(bare, IMAGE) == IMAGE
    # podman's image id names no repository: a node could not pull it
    with pytest.raises(UsageError, match=r"pass --image REPOSITORY@sha256:0+\.$"):
        image_for(bare, "sha256:" + "0" * 64)
    with pytest.raises(UsageError, match="needs an image"):
        image_for(bare, None)


def _capture(repo: Path, name: str, image: str | None) -> Path:
    env = {"MANIFEST_CONTAINER_IMAGE_DIGEST": image or ""}  # empty: not recorded
    proc = manifest_cli("capture", "--seed", "0", "--threads", "2", "--artifact",
                        "out/*.safetensors", "--", "python", "train.py", "--steps", "1",
                        cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    path = repo / name
    path.write_bytes(proc.stdout)
    if image is not None:  # without: a podman host records its own image id (still refused)
        assert json.loads(proc.stdout)["env"]["container"]["image_digest"] == image
    return path


@pytest.mark.slow
def test_recorded_image_is_the_default(tmp_path: Path) -> None:
    # The dry run keeps the bundle in the folder the claim holds: here, not in ~/.cache.
    repo = make_repo(tmp_path / "repo", {"pyproject.toml": (
        "[tool.manifest.executors.k8s]\n"
        f"folder = {json.dumps(str(tmp_path / 'claim'))}\n")})
    recorded = _capture(repo, "recorded.json", IMAGE)
    proc = manifest_cli("verify", str(recorded), "--on", "k8s", "--dry-run", "--claim",
                        "bundles", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()  # --dry-run: printed, not submitted
    said = proc.stderr.decode()
    assert "nothing ran" in said and "manifest: re-running" not in said
    # The bundle's name depends on this machine's environment delta: a placeholder.
    text = proc.stdout.decode()
    found = re.search(r"--expect\n\s+- blake3:([0-9a-f]{64})\n", text)
    assert found, text
    text = text.replace(found[1], "<bundle>").replace(found[1][:12], "<bundle12>")
    if os.environ.get("MANIFEST_UPDATE_GOLDEN"):
        GOLDEN_RECORDED.write_text(text)
    assert text == GOLDEN_RECORDED.read_text()
    assert f"image: {IMAGE}" in text
    # --image wins over the record.
    proc = manifest_cli("verify", str(recorded), "--on", "k8s", "--dry-run", "--image",
                        "registry.example/other:1", "--claim", "bundles", cwd=repo)
    assert "image: registry.example/other:1" in proc.stdout.decode()

    none = _capture(repo, "none.json", None)
    proc = manifest_cli("verify", str(none), "--on", "k8s", "--dry-run", "--claim", "bundles",
                        cwd=repo)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert not proc.stdout  # refused before anything is rendered
    [line] = stderr.splitlines()
    assert line.startswith("manifest: --on k8s needs an image")
