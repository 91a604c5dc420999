"""``--on k8s``: the re-run as a Kubernetes Indexed Job plus a headless Service.

Rendered from the plan with the official client's models (``kubernetes.client``),
so a field the API does not have fails here, not on the cluster:

* a headless ``Service`` (``clusterIP: None``) selecting the Job's pods, so
  each pod has a stable name, ``<job>-<index>.<service>``; rank 0's is
  ``MASTER_ADDR``;
* an Indexed ``Job`` with one completion per recorded node, all in
  parallel, ``backoffLimit: 0`` (a re-run that fails is a result, not
  something to retry); each pod's rank is ``JOB_COMPLETION_INDEX``
  (:func:`rank_env` turns it into ``NODE_RANK``/``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``); CPU and GPU requests follow the recorded
  thread and GPU counts;
* the image is the user's (``--image``) or the container image the manifest
  recorded (``env.container.image_digest``, when it names a repository),
  decided when the plan is made (:func:`with_recorded_image`): without one
  the verb stops with one sentence (exit 2) before anything is built;
  the bundle is read from a PersistentVolumeClaim (``claim``) mounted at
  ``/bundle``; the pods run ``python -I -m manifest.rerun.cluster.k8s BUNDLE
  --expect NAME`` (:func:`main`), which sets the rank variables and runs the
  remote entrypoint.

``--dry-run`` prints both objects as YAML and submits nothing. Submission
needs a kubeconfig (the client's own loading; nothing of it enters the plan).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from manifest.errors import NoVerdictError, UsageError
from manifest.rerun.cluster.remote_run import ClusterExecutor

if TYPE_CHECKING:
    from manifest.rerun.cluster import ClusterOptions
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.plan import RerunPlan

MASTER_PORT = 29500
BUNDLE_MOUNT = "/bundle"


def job_name(bundle_name: str) -> str:
    return "manifest-" + bundle_name.removeprefix("blake3:")[:12]


def render(*, name: str, bundle_name: str, image: str, namespace: str, nodes: int,
           threads: int, gpus: int, claim: str | None, python: str = "python"
           ) -> tuple[Any, Any]:
    """(V1Service, V1Job) for one re-run, built from the client's models."""
    from kubernetes import client

    labels = {"app.kubernetes.io/name": "torch-manifest", "manifest/job": name}
    service = client.V1Service(
        api_version="v1", kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1ServiceSpec(cluster_ip="None", selector={"manifest/job": name},
                                  ports=[client.V1ServicePort(name="rendezvous",
                                                              port=MASTER_PORT)]))
    resources = {"cpu": str(threads)}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    volumes, mounts = [], []
    if claim:
        volumes.append(client.V1Volume(
            name="bundle", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                claim_name=claim, read_only=True)))
        mounts.append(client.V1VolumeMount(name="bundle", mount_path=BUNDLE_MOUNT,
                                           read_only=True))
    container = client.V1Container(
        name="rerun", image=image,
        command=[python, "-I", "-m", "manifest.rerun.cluster.k8s",
                 f"{BUNDLE_MOUNT}/{bundle_name.removeprefix('blake3:')}",
                 "--expect", bundle_name, "--service", name, "--nodes", str(nodes)],
        resources=client.V1ResourceRequirements(requests=resources, limits=resources),
        volume_mounts=mounts or None)
    job = client.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1JobSpec(
            completion_mode="Indexed", completions=nodes, parallelism=nodes, backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(restart_policy="Never", subdomain=name,
                                      containers=[container], volumes=volumes or None))))
    return service, job


def to_yaml(objects: tuple[Any, ...]) -> str:
    """The objects as a multi-document YAML stream, keys as the API spells them."""
    import yaml  # type: ignore[import-untyped]
    from kubernetes.client import ApiClient

    api = ApiClient()
    return "---\n".join(yaml.safe_dump(api.sanitize_for_serialization(o), sort_keys=True)
                        for o in objects)


def rank_env(index: int, nodes: int, service: str) -> dict[str, str]:
    """The rank variables for the pod with ``JOB_COMPLETION_INDEX`` = ``index``: rank 0's stable
    hostname (``<job>-0.<service>``; the Job and the Service share the name) is the
    rendezvous address."""
    return {"NODE_RANK": str(index), "RANK": str(index), "WORLD_SIZE": str(nodes),
            "MASTER_ADDR": f"{service}-0.{service}", "MASTER_PORT": str(MASTER_PORT)}


def image_for(options: ClusterOptions, recorded_image: str | None) -> str:
    """The pods' image: ``--image`` (or ``[tool.manifest.executors.k8s] image``), else the
    container image the manifest recorded (``env.container.image_digest``) when it names a
    repository (``registry/train@sha256:…``). A bare ``sha256:…`` (podman's image id) is
    not something a node can pull: it, or no recorded image, is one sentence (exit 2)."""
    from manifest.rerun.cluster.image import check_reference

    if options.image:
        return check_reference(options.image)
    if recorded_image and not recorded_image.startswith("sha256:"):
        return check_reference(recorded_image, "recorded in env.container.image_digest")
    if recorded_image:
        raise UsageError(f"--on k8s needs an image a node can pull: the manifest recorded "
                         f"only the image id {recorded_image}; pass --image "
                         f"REPOSITORY@{recorded_image}.")
    raise UsageError("--on k8s needs an image: --image, [tool.manifest.executors.k8s] image, "
                     "or a manifest that recorded its container image "
                     "(MANIFEST_CONTAINER_IMAGE_DIGEST=registry/train@sha256:… at capture).")


def with_recorded_image(options: ClusterOptions, recorded_image: str | None) -> ClusterOptions:
    """``options`` with the image decided (:func:`image_for`) before anything runs, so the plan
    shows it and a missing one stops the verb before a workspace is built."""
    from dataclasses import replace

    return replace(options, image=image_for(options, recorded_image))


class KubernetesExecutor(ClusterExecutor):
    """Renders the Job and Service; ``--dry-run`` prints them, else submits them."""

    def submit(self, plan: RerunPlan, bundle: Bundle) -> Any:
        topology = plan.topology or {}
        name = job_name(bundle.name)
        service, job = render(
            name=name, bundle_name=bundle.name,
            image=image_for(self.options, None), namespace=self.options.namespace,
            nodes=int(topology.get("nodes") or 1), threads=plan.settings.threads,
            gpus=int(topology.get("gpus") or 0), claim=self.options.claim,
            python=self.options.python)
        if self.options.dry_run:
            sys.stdout.write(to_yaml((service, job)))
            raise NoVerdictError("--dry-run: the Job and Service above were not submitted.")
        raise NoVerdictError(
            "submitting to Kubernetes is not built yet: use --dry-run and kubectl apply "
            "(the pods run the checked entrypoint).")


def main(argv: list[str] | None = None) -> int:
    """What each pod runs: rank variables from ``JOB_COMPLETION_INDEX``, then the remote
    entrypoint on the bundle (``manifest.rerun.remote``)."""
    import argparse

    from manifest.rerun.remote import main as remote_main

    parser = argparse.ArgumentParser(prog="python -m manifest.rerun.cluster.k8s")
    parser.add_argument("bundle")
    parser.add_argument("--expect", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    for key, value in rank_env(index, args.nodes, args.service).items():
        os.environ.setdefault(key, value)  # a test may point MASTER_ADDR at localhost
    rest = [args.bundle, *([f"{args.out}/{index}"] if args.out else []),
            "--expect", args.expect, "--emit"]
    return remote_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
