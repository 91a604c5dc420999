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
  ``MASTER_ADDR``, ``MASTER_PORT``, and for a multi-node torchrun the
  ``PET_*`` variables of ``manifest.nodes.layout.node_env``); CPU and GPU
  requests follow the recorded thread and GPU counts, and a node selector on the GPU
  product label that NVIDIA's GPU feature discovery sets (``nvidia.com/gpu.product``;
  key and names configurable) puts the pods on the recorded GPU model; before
  submitting, the nodes' labels say whether the cluster has it;
* the image is the user's (``--image``) or the container image the manifest
  recorded (``env.container.image_digest``, when it names a repository),
  decided when the plan is made (:func:`with_recorded_image`): without one
  the verb stops with one sentence (exit 2) before anything is built;
* the bundle reaches the pods one of two ways, both mounted at ``/bundle``:
  a PersistentVolumeClaim (``claim``) whose volume holds ``folder``, where
  the bundle is staged as ``folder/<hash>``; or an init container that
  fetches ``<bundle_url>/<hash>.tar`` from an object store with the
  remote-data clients (``manifest.data.remote``: ``s3://``, ``gs://``) into
  an ``emptyDir`` (:func:`fetch_main`), the tar uploaded here first
  (:func:`upload_bundle`); the pods then run ``python -I -m
  manifest.rerun.cluster.k8s BUNDLE --expect NAME`` (:func:`main`), which
  sets the rank variables and runs the remote entrypoint, whose arrival
  check proves the bundle is the one named.

Submission, watching and collection go through the official client
(``CoreV1Api``, ``BatchV1Api``; the kubeconfig loaded the client's own way,
nothing of it in the plan): create the Service and the Job, poll the Job's
status (queued while every pod is ``Pending``), read each pod's log for the
result the entrypoint prints between marker lines, and delete both objects
when done. Ctrl-C, SIGTERM and ``--timeout`` delete the Job (propagation
``Background``: its pods go too), and the cancel is reported once the API
answers 404 for it.

With ``--env run`` the pods run the run's environment: the image the run recorded
(``env.container.image_digest``, the default ``--image``) is that environment, so
nothing is rebuilt; with any other image an init container rebuilds and proves it into
an ``emptyDir`` volume at :data:`ENV_MOUNT` (``python -I -m manifest.rerun.remote BUNDLE
--env-only``), where the re-run finds it (``render(rebuild=True)``).

``--dry-run`` prints both objects as YAML, submits nothing, says so and exits 0: the
executor returns them as the job's result (``job["printed"]``, :class:`PrintedJob`), never
as an exception, and the CLI prints them.

Not run against a real cluster here (none can run on these machines): the
tests speak to a local HTTP server that answers the endpoints used and runs
the pod entrypoint locally for each index.

Longer than 500 lines because the rendered Job, its watcher and the pods' entrypoint
(``python -m manifest.rerun.cluster.k8s``, named in every rendered Job and its golden
file) share one Job's names and constants.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.errors import ManifestError, NoVerdictError, UsageError
from manifest.rerun.cluster.image import image_for
from manifest.rerun.cluster.remote_run import ClusterExecutor

if TYPE_CHECKING:
    from manifest.rerun.cluster.bundle import Bundle
    from manifest.rerun.cluster.options import K8sOptions
    from manifest.rerun.plan import RerunPlan

MASTER_PORT = 29500
BUNDLE_MOUNT = "/bundle"
ENV_MOUNT = "/manifest-env"
"""Where the pod's volume of rebuilt environments is mounted (``--env run``)."""
LABEL = "manifest/job"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def printed(objects: list[dict[str, Any]], *, as_json: bool) -> str:
    """``--dry-run``'s objects as the CLI prints them on stdout: YAML, or with ``--format
    json`` a ``v1`` ``List`` that ``kubectl apply -f`` reads too."""
    if as_json:
        import json

        doc = {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    import yaml  # type: ignore[import-untyped]

    return "---\n".join(yaml.safe_dump(o, sort_keys=True) for o in objects)


class PrintedJob:
    """``--dry-run``: the Job rendered, nothing submitted (a
    :class:`~manifest.rerun.cluster.remote_run.Submission` that has already ended). Its
    result is the objects and the sentence that says where the bundle is staged; the verb
    returns them (``job["printed"]``) and the CLI prints them, exit 0."""

    def __init__(self, name: str, objects: list[dict[str, Any]], message: str) -> None:
        self.job_id = name
        self.where = "(not submitted: --dry-run)"
        self.doc = {"printed": {"objects": objects, "message": message}}

    def finished(self) -> bool:
        return True

    def state(self) -> str:
        return "printed"

    def queued(self) -> bool:
        return False

    def result(self) -> dict[str, Any] | None:
        return self.doc

    def log_tail(self) -> str:
        return ""

    def cancel(self) -> str | None:
        return "printed"


def job_name(bundle_name: str) -> str:
    return "manifest-" + bundle_name.removeprefix("blake3:")[:12]


def render(*, name: str, bundle_name: str, image: str, namespace: str, nodes: int,
           threads: int, gpus: int, claim: str | None, python: str = "python",
           bundle_url: str | None = None, node_selector: dict[str, str] | None = None,
           rebuild: bool = False) -> tuple[Any, Any]:
    """(V1Service, V1Job) for one re-run, built from the client's models. The bundle comes
    from ``claim`` (a PersistentVolumeClaim holding it as ``<hash>``) or, with
    ``bundle_url``, from an init container that fetches ``<bundle_url>/<hash>.tar``.
    ``rebuild`` (``--env run`` where the image is not the run's recorded one): an init
    container rebuilds and proves the run's environment into an ``emptyDir`` volume at
    :data:`ENV_MOUNT` (``python -m manifest.rerun.remote --env-only``), and the re-run finds
    it there, its proof checked again against the files (``manifest.pyenv.cache``)."""
    from kubernetes import client

    labels = {"app.kubernetes.io/name": "torch-manifest", LABEL: name}
    service = client.V1Service(
        api_version="v1", kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1ServiceSpec(cluster_ip="None", selector={LABEL: name},
                                  ports=[client.V1ServicePort(name="rendezvous",
                                                              port=MASTER_PORT)]))
    resources = {"cpu": str(threads)}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    digest = bundle_name.removeprefix("blake3:")
    volumes, mounts, init = [], [], None
    if bundle_url:
        volumes.append(client.V1Volume(name="bundle",
                                       empty_dir=client.V1EmptyDirVolumeSource()))
        init = [client.V1Container(
            name="fetch-bundle", image=image,
            command=[python, "-I", "-m", "manifest.rerun.cluster.k8s", "fetch",
                     f"{bundle_url.rstrip('/')}/{digest}.tar", f"{BUNDLE_MOUNT}/{digest}"],
            volume_mounts=[client.V1VolumeMount(name="bundle", mount_path=BUNDLE_MOUNT)])]
        mounts.append(client.V1VolumeMount(name="bundle", mount_path=BUNDLE_MOUNT,
                                           read_only=True))
    elif claim:
        volumes.append(client.V1Volume(
            name="bundle", persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                claim_name=claim, read_only=True)))
        mounts.append(client.V1VolumeMount(name="bundle", mount_path=BUNDLE_MOUNT,
                                           read_only=True))
    env_args: list[str] = []
    if rebuild:
        volumes.append(client.V1Volume(name="environment",
                                       empty_dir=client.V1EmptyDirVolumeSource()))
        env_mount = client.V1VolumeMount(name="environment", mount_path=ENV_MOUNT)
        env_args = ["--env-cache", ENV_MOUNT]
        init = [*(init or []), client.V1Container(
            name="rebuild-environment", image=image,
            command=[python, "-I", "-m", "manifest.rerun.remote", f"{BUNDLE_MOUNT}/{digest}",
                     "--expect", bundle_name, "--env-only", *env_args],
            volume_mounts=[*mounts, env_mount])]
        mounts.append(env_mount)
    container = client.V1Container(
        name="rerun", image=image,
        command=[python, "-I", "-m", "manifest.rerun.cluster.k8s",
                 f"{BUNDLE_MOUNT}/{digest}",
                 "--expect", bundle_name, "--service", name, "--nodes", str(nodes),
                 *env_args],
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
                                      init_containers=init, containers=[container],
                                      volumes=volumes or None,
                                      node_selector=node_selector or None))))
    return service, job


def as_documents(objects: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The client's models as plain documents, keys as the API spells them."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    return [api.sanitize_for_serialization(o) for o in objects]


def to_yaml(objects: tuple[Any, ...]) -> str:
    """The objects as a multi-document YAML stream, keys as the API spells them."""
    return printed(as_documents(objects), as_json=False)


def rank_env(index: int, nodes: int, service: str) -> dict[str, str]:
    """The rank variables for the pod with ``JOB_COMPLETION_INDEX`` = ``index``: rank 0's stable
    hostname (``<job>-0.<service>``; the Job and the Service share the name) is the
    rendezvous address. A torchrun per node reads its node rank and that endpoint from
    the ``PET_*`` variables (``manifest.nodes.layout.node_env``; static rendezvous: pod
    ``index`` is node ``index``, and pod 0 serves it)."""
    from manifest.nodes.layout import node_env

    master = f"{service}-0.{service}"
    return {"NODE_RANK": str(index), "RANK": str(index), "WORLD_SIZE": str(nodes),
            "MASTER_ADDR": master, "MASTER_PORT": str(MASTER_PORT),
            **(node_env(index, master, MASTER_PORT) if nodes > 1 else {})}


def _api_error(exc: BaseException, what: str) -> NoVerdictError:
    from manifest.redact import redact_text

    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or str(exc)
    return NoVerdictError(f"Kubernetes refused to {what}"
                          + (f" ({status} {reason})" if status else f": {redact_text(reason)}"))


class KubernetesJob:
    """One submitted Indexed Job (a :class:`~manifest.rerun.cluster.remote_run.Submission`)."""

    def __init__(self, api: Any, name: str, namespace: str, nodes: int) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.job_id = name
        self.namespace = namespace
        self.nodes = nodes
        self.where = f"kubectl -n {namespace} logs -l {LABEL}={name} (job {name})"
        self._logs: dict[int, str] | None = None
        self.deleted = False

    def _job(self) -> Any:
        return self.batch.read_namespaced_job_status(self.job_id, self.namespace)

    def state(self) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            status = self._job().status
        except ApiException as exc:
            if exc.status == 404:
                return "deleted"
            raise
        for condition in status.conditions or []:
            if condition.type in ("Complete", "Failed") and condition.status == "True":
                return str(condition.type)
        if (status.succeeded or 0) + (status.failed or 0) >= self.nodes:
            return "Complete" if not status.failed else "Failed"
        return "Pending" if self.queued() else f"Running ({status.active or 0} active)"

    def finished(self) -> bool:
        return self.state() in ("Complete", "Failed", "deleted")

    def _pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{LABEL}={self.job_id}").items)

    def queued(self) -> bool:
        pods = self._pods()
        return not pods or all((p.status.phase or "Pending") == "Pending" for p in pods)

    def logs(self) -> dict[int, str]:
        if self._logs is None:
            logs: dict[int, str] = {}
            for pod in self._pods():
                annotations = pod.metadata.annotations or {}
                index = int(annotations.get(INDEX_ANNOTATION, len(logs)))
                # Unparsed: the client's str() of a log is the repr of its bytes.
                response = self.core.read_namespaced_pod_log(
                    pod.metadata.name, self.namespace, container="rerun",
                    _preload_content=False)
                logs[index] = bytes(response.data).decode("utf-8", "replace")
            self._logs = logs
        return self._logs

    def result(self) -> dict[str, Any] | None:
        from manifest.rerun.cluster.placement import combine_results
        from manifest.rerun.remote import decode_result

        logs = self.logs()
        docs = [decode_result(logs[i]) for i in sorted(logs)]
        try:
            if len(docs) != self.nodes or any(d is None for d in docs):
                return None
            return combine_results([d for d in docs if d is not None])
        finally:
            self.delete()

    def log_tail(self) -> str:
        from manifest.rerun.remote import BEGIN

        parts = []
        for index, log in sorted(self.logs().items()):
            parts.append(f"[pod {index}]\n" + (log[:log.find(BEGIN)] if BEGIN in log else log))
        return "\n".join(parts)

    def delete(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        if self.deleted:
            return
        body = client.V1DeleteOptions(propagation_policy="Background")
        for call in (self.batch.delete_namespaced_job, self.core.delete_namespaced_service):
            try:
                call(self.job_id, self.namespace, body=body)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.deleted = True

    def cancel(self) -> str | None:
        from manifest.rerun.cluster.remote_run import CANCEL_CONFIRM_S

        self.delete()
        deadline = time.monotonic() + CANCEL_CONFIRM_S
        while time.monotonic() < deadline:
            if self.state() == "deleted":
                return "the Job is deleted"
            time.sleep(0.5)
        return None


def api_client() -> Any:
    """The official client, configured from the kubeconfig (or in-cluster service account)."""
    from kubernetes import client, config

    try:
        config.load_kube_config()
    except Exception:  # no kubeconfig: inside a pod, the service account
        try:
            config.load_incluster_config()
        except Exception as exc:
            raise UsageError("--on k8s needs a kubeconfig (KUBECONFIG or ~/.kube/config) "
                             "or to run inside a cluster.") from exc
    return client.ApiClient()


def _object(url: str) -> tuple[Any, str]:
    """(the remote-data URL of the object's folder, the object's key) for ``s3://B/K``."""
    from manifest.data.remote.url import parse_url

    if not url.startswith(("s3://", "gs://")):
        raise UsageError(f"--bundle-url must be s3:// or gs://, not {url}.")
    folder, _, name = url.rpartition("/")
    where = parse_url(folder + "/")
    return where, where.prefix + name


def upload_bundle(path: Path, url: str) -> int:
    """Write the bundle directory as one tar to ``url`` (``s3://…`` or ``gs://…``): the
    object the init container fetches. Returns its size in bytes."""
    import io
    import tarfile


    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for item in sorted(path.rglob("*")):
            if item.is_file() and not item.is_symlink():
                tar.add(item, arcname=item.relative_to(path).as_posix(), recursive=False)
    data = buffer.getvalue()
    where, key = _object(url)
    try:
        if where.provider == "s3":
            import boto3

            boto3.client("s3").put_object(Bucket=where.bucket, Key=key, Body=data)
        elif where.provider == "gcs":
            from google.cloud import storage

            storage.Client().bucket(where.bucket).blob(key).upload_from_string(data)
        else:
            raise UsageError(f"--bundle-url must be s3:// or gs://, not {url}.")
    except ImportError as exc:
        raise UsageError(f"--bundle-url {url}: its client library is missing: pip install "
                         f"'torch-manifest[{where.provider}]'.") from exc
    except ManifestError:
        raise
    except Exception as exc:
        from manifest.data.remote.url import scrub

        raise NoVerdictError(f"cannot upload the bundle to {url}: {scrub(str(exc))}") from exc
    return len(data)


class KubernetesExecutor(ClusterExecutor):
    """Renders the Job and Service; ``--dry-run`` prints them, else submits and watches them."""

    options: K8sOptions

    def node_selector(self, plan: RerunPlan) -> dict[str, str]:
        """The recorded GPU model as a node selector (none: no GPU, or ``--other-gpu``)."""
        from manifest.rerun.cluster.hardware import k8s_selector

        if plan.gpu is None or self.options.other_hardware:
            return {}
        return k8s_selector(plan.gpu, self.options.gpu_label, self.options.gpu_products)

    def placement_problem(self, plan: RerunPlan) -> str | None:
        """Whether enough nodes carry the selector's label value, from the API's node list
        (None: nothing to ask, a dry run, or the API cannot be asked)."""
        from manifest.rerun.cluster.hardware import missing_model
        from manifest.rerun.cluster.placement import need_of

        selector = self.node_selector(plan)
        if not selector or self.options.dry_run or plan.gpu is None:
            return None
        try:
            from kubernetes import client

            nodes = client.CoreV1Api(api_client()).list_node(_request_timeout=30).items
        except Exception:  # no kubeconfig, unreachable, forbidden: submission will say
            return None
        ((key, value),) = selector.items()
        declared = [str((n.metadata.labels or {}).get(key)) for n in nodes
                    if (n.metadata.labels or {}).get(key)]
        per_node = []
        for n in nodes:
            if (n.metadata.labels or {}).get(key) == value:
                allocatable = (n.status.allocatable or {}) if n.status else {}
                per_node.append((str(n.metadata.name),
                                 int(str(allocatable.get("nvidia.com/gpu", "0")) or 0)))
        need = need_of(plan.topology, plan.settings.threads)
        return missing_model(plan.gpu, declared, wanted=f"{key}={value}", nodes=need.nodes,
                             per_node=per_node)

    def recorded_image(self) -> str | None:
        """``--env run`` with the image the run recorded (``env.container.image_digest``,
        the default ``--image``): that image is the run's environment, so nothing is
        rebuilt; None otherwise."""
        request = self.options.environment
        if request is None:
            return None
        recorded = (request.get("env", {}).get("container") or {}).get("image_digest")
        image = self.options.image
        return image if recorded and image == recorded else None

    def env_cache(self) -> str | None:
        return ENV_MOUNT

    def environment_request(self) -> dict[str, Any] | None:
        """The rebuild request, unless the pods run the run's own recorded image."""
        return None if self.recorded_image() else super().environment_request()

    def _result(self, doc: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = super()._result(doc, *args, **kwargs)
        image = self.recorded_image()
        if image is not None and result.job is not None:
            result.job["environment"] = {
                "used": "run", "line": f"the run's environment (its recorded image {image})"}
        return result

    def stage(self) -> Path:
        import tempfile

        from manifest.rerun.cluster.options import default_folder

        base = Path(self.options.folder) if self.options.folder else default_folder("k8s")
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=base))

    def submit(self, plan: RerunPlan, bundle: Bundle) -> KubernetesJob | PrintedJob:
        from kubernetes.client.exceptions import ApiException

        from manifest.rerun.cluster.placement import need_of

        need = need_of(plan.topology, plan.settings.threads)
        name = job_name(bundle.name)
        image = image_for(self.options, None)
        service, job = render(
            name=name, bundle_name=bundle.name,
            image=image, namespace=self.options.namespace,
            nodes=need.nodes, threads=need.cpus, gpus=need.gpus, claim=self.options.claim,
            python=self.options.python, bundle_url=self.options.bundle_url,
            node_selector=self.node_selector(plan),
            rebuild=self.environment_request() is not None)
        if not (self.options.bundle_url or self.options.claim):  # --dry-run too: the Job
            # it would print could not get its bundle
            raise UsageError("--on k8s needs a way to bring the bundle to the pods: --claim "
                             "PVC, a PersistentVolumeClaim whose volume holds the folder "
                             "([tool.manifest.executors.k8s] claim, folder), or --bundle-url "
                             "s3://BUCKET/PREFIX for an init container to fetch it from.")
        digest = bundle.name.removeprefix("blake3:")
        if self.options.dry_run:
            target = self._keep(bundle)
            return PrintedJob(name, as_documents((service, job)),
                              "--dry-run: the Job and Service above were printed; nothing "
                              "was submitted and nothing ran. "
                              + self._needs(target, image))
        if self.options.bundle_url:
            upload_bundle(bundle.path, f"{self.options.bundle_url.rstrip('/')}/{digest}.tar")
        else:
            self._keep(bundle)
        api = api_client()
        handle = KubernetesJob(api, name, self.options.namespace, need.nodes)
        try:
            handle.core.create_namespaced_service(self.options.namespace, service)
        except ApiException as exc:
            if exc.status != 409:  # already there: a previous re-run of the same bundle
                raise _api_error(exc, f"create the Service {name}") from exc
        try:
            handle.batch.create_namespaced_job(self.options.namespace, job)
        except ApiException as exc:
            raise _api_error(exc, f"create the Job {name}") from exc
        return handle


    @staticmethod
    def _keep(bundle: Bundle) -> Path:
        """The bundle at ``folder/<hash>`` (out of the staging directory, which goes): the
        claim's volume holds the folder, so the pods see it at ``/bundle/<hash>``."""
        import shutil

        target = bundle.path.parent.parent / bundle.name.removeprefix("blake3:")
        if not target.exists():
            shutil.copytree(bundle.path, target)
        return target

    def _needs(self, target: Path, image: str) -> str:
        """What applying the printed objects needs, in words (the dry run's message)."""
        digest = target.name
        if self.options.bundle_url:
            url = f"{self.options.bundle_url.rstrip('/')}/{digest}.tar"
            bring = (f"The bundle is staged at {target}; a real submit uploads it as one tar "
                     f"to {url} (a dry run uploads nothing), which the init container fetches.")
        else:
            bring = (f"The bundle is staged at {target}: the claim {self.options.claim} must "
                     f"hold the folder {target.parent} at its root, so that the pods find it "
                     f"at {BUNDLE_MOUNT}/{digest}.")
        return (f"{bring} The image {image} must contain Python, "
                "torch-manifest (pip install torch-manifest) and what the script imports.")


def fetch_main(url: str, dest: str) -> int:
    """The init container: fetch ``url`` (the bundle's tar) with the remote-data clients and
    unpack it into ``dest``; the main container's arrival check proves what it holds."""
    import io
    import tarfile

    from manifest.data.remote.registry import open_source

    where, key = _object(url)
    found: list[Any] = []
    source = open_source(where, None)
    source.list_pins(found.append, checksums=False)
    pins = [p for p in found if where.prefix + p.key == key]
    if len(pins) != 1:
        sys.stderr.write(f"manifest fetch: {url}: {len(pins)} objects match, not one.\n")
        return 3
    data = b"".join(source.read(pins[0]))
    Path(dest).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(dest, filter="data")  # no links out, no devices, no absolute names
    return 0


def main(argv: list[str] | None = None) -> int:
    """What each pod runs: rank variables from ``JOB_COMPLETION_INDEX``, then the remote
    entrypoint on the bundle (``manifest.rerun.remote``); ``fetch URL DEST`` is the init
    container's part (:func:`fetch_main`)."""
    import argparse

    from manifest.rerun.remote import main as remote_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fetch"] and len(argv) == 3:
        return fetch_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(prog="python -m manifest.rerun.cluster.k8s",
                                     allow_abbrev=False)
    parser.add_argument("bundle")
    parser.add_argument("--expect", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--out")
    parser.add_argument("--env-cache")
    args = parser.parse_args(argv)
    index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    for key, value in rank_env(index, args.nodes, args.service).items():
        os.environ.setdefault(key, value)  # a test may point MASTER_ADDR at localhost
    rest = [args.bundle, *([f"{args.out}/{index}"] if args.out else []),
            "--expect", args.expect, "--emit",
            *(["--env-cache", args.env_cache] if args.env_cache else [])]
    return remote_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
