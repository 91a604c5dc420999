"""A local stand-in for the few Kubernetes API endpoints ``--on k8s`` uses (issue 30).

No API server can run on these machines, so the tests speak to this one: a threaded HTTP
server on 127.0.0.1 that answers the official client's calls (create a Service and a Job,
read the Job's status, list its pods, read a pod's log, delete both), keeps every request
body, and "runs" each pod by starting its containers' commands as local processes: the
init container first (when the Job has one), then the main one, with
``JOB_COMPLETION_INDEX`` set and ``/bundle`` mapped to a directory here (the claim's
folder, or a per-pod ``emptyDir``). What this does not exercise: scheduling, images,
volumes, DNS of the headless Service (``MASTER_ADDR`` is pointed at 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.runs import free_port


class Pod:
    def __init__(self, name: str, index: int, proc: subprocess.Popen[bytes] | None,
                 init_failed: str | None = None) -> None:
        self.name, self.index, self.proc = name, index, proc
        self.log = b""
        self.init_failed = init_failed
        self.reader: threading.Thread | None = None
        if proc is not None:
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.proc.stdout:
            self.log = self.proc.stdout.read()

    def phase(self) -> str:
        if self.init_failed is not None:
            return "Failed"
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return "Running"
        if self.reader is not None:
            self.reader.join()
        return "Succeeded" if code == 0 else "Failed"


class FakeKube:
    """State of the fake cluster: requests seen, objects, pods."""

    def __init__(self, claim_dir: Path | None, *, hold: bool = False,
                 nodes: list[dict[str, Any]] | None = None) -> None:
        self.claim_dir = claim_dir
        self.hold = hold
        self.scratch: Path | None = None
        """Where the pods' ``emptyDir`` volumes of rebuilt environments are made (the test's
        temporary folder, so a rebuilt venv does not outlive it)."""
        self.nodes = nodes or []
        """The cluster's nodes as ``GET /api/v1/nodes`` lists them (labels, allocatable)."""
        """Keep pods Pending (never start them): a job that cannot be placed."""
        self.requests: list[tuple[str, str, Any]] = []
        self.services: dict[str, Any] = {}
        self.jobs: dict[str, Any] = {}
        self.pods: dict[str, list[Pod]] = {}
        self.port = free_port()
        self.lock = threading.Lock()

    # --------------------------------------------------------------- running pods
    def _bundle_dir(self, name: str, index: int) -> Path:
        if self.claim_dir is not None:
            return self.claim_dir
        return Path(tempfile.mkdtemp(prefix=f"fake-emptydir-{name}-{index}-"))

    def _command(self, command: list[str], bundle: Path, env_dir: Path) -> list[str]:
        """The container's command here: the interpreter this one, ``/bundle`` the pod's
        bundle folder, the rebuilt-environment volume (``/manifest-env``) the pod's own."""
        mounts = {"/bundle": bundle, "/manifest-env": env_dir}

        def here(word: str) -> str:
            for mount, folder in mounts.items():
                if word == mount or word.startswith(mount + "/"):
                    return str(folder) + word[len(mount):]
            return word

        return [sys.executable if i == 0 else here(word) for i, word in enumerate(command)]

    def start(self, name: str, job: dict[str, Any]) -> None:
        spec = job["spec"]["template"]["spec"]
        pods = []
        rdzv = free_port()
        for index in range(int(job["spec"]["completions"])):
            pod_name = f"{name}-{index}-abcde"
            if self.hold:
                pods.append(Pod(pod_name, index, None))
                continue
            bundle = self._bundle_dir(name, index)
            env_dir = Path(tempfile.mkdtemp(prefix=f"fake-env-{name}-{index}-",  # emptyDir
                                            dir=self.scratch))
            # The pods' stable names do not resolve here: each pod a loopback address.
            env = dict(os.environ, JOB_COMPLETION_INDEX=str(index), MASTER_ADDR="127.0.0.1",
                       PET_RDZV_ENDPOINT=f"127.0.0.1:{rdzv}",
                       PET_LOCAL_ADDR=f"127.0.0.{index + 1}")
            env.pop("PYTHONHASHSEED", None)
            failed = None
            for init in spec.get("initContainers") or []:
                done = subprocess.run(self._command(init["command"], bundle, env_dir), env=env,
                                      capture_output=True, check=False)
                if done.returncode != 0:
                    failed = done.stderr.decode()
            proc = None if failed else subprocess.Popen(
                self._command(spec["containers"][0]["command"], bundle, env_dir), env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            pods.append(Pod(pod_name, index, proc, failed))
        self.pods[name] = pods

    def status(self, name: str) -> dict[str, Any]:
        pods = self.pods.get(name, [])
        phases = [p.phase() for p in pods] if not self.hold else ["Pending"] * len(pods)
        status: dict[str, Any] = {
            "active": sum(ph in ("Running", "Pending") for ph in phases),
            "succeeded": sum(ph == "Succeeded" for ph in phases),
            "failed": sum(ph == "Failed" for ph in phases)}
        if status["active"] == 0 and pods:
            kind = "Failed" if status["failed"] else "Complete"
            status["conditions"] = [{"type": kind, "status": "True"}]
        return status

    def delete(self, name: str) -> None:
        self.jobs.pop(name, None)
        for pod in self.pods.pop(name, []):
            if pod.proc is not None and pod.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()

    # --------------------------------------------------------------- HTTP
    def handle(self, method: str, path: str, query: str, body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, body))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?", path)
        if m:
            if method == "POST":
                self.services[body["metadata"]["name"]] = body
                return 201, body
            if method == "DELETE":
                return (200, {"kind": "Status"}) if self.services.pop(m.group(2), None) \
                    else (404, _missing(m.group(2)))
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?(/status)?", path)
        if m:
            name = m.group(2)
            if method == "POST":
                name = body["metadata"]["name"]
                self.jobs[name] = body
                self.start(name, body)
                return 201, body
            if name not in self.jobs:
                return 404, _missing(name)
            if method == "GET":
                return 200, {**self.jobs[name], "status": self.status(name)}
            if method == "DELETE":
                self.delete(name)
                return 200, {"kind": "Status", "status": "Success"}
        if path == "/api/v1/nodes" and method == "GET":
            return 200, {"kind": "NodeList", "apiVersion": "v1", "items": self.nodes}
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path)
        if m and method == "GET":
            name = query.split("manifest%2Fjob%3D", 1)[-1].split("&")[0]
            items = [{"metadata": {"name": p.name, "annotations": {
                "batch.kubernetes.io/job-completion-index": str(p.index)}},
                "status": {"phase": "Pending" if self.hold else p.phase()}}
                for p in self.pods.get(name, [])]
            return 200, {"kind": "PodList", "apiVersion": "v1", "items": items}
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", path)
        if m and method == "GET":
            for pods in self.pods.values():
                for p in pods:
                    if p.name == m.group(2):
                        p.phase()
                        return 200, p.log.decode(errors="replace")
            return 404, _missing(m.group(2))
        return 404, _missing(path)


def _missing(name: str | None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
            "message": f"{name} not found", "code": 404}


@contextlib.contextmanager
def fake_kube(tmp: Path, *, claim_dir: Path | None = None, hold: bool = False,
              nodes: list[dict[str, Any]] | None = None
              ) -> Iterator[tuple[FakeKube, dict[str, str]]]:
    """The fake API server and the environment (KUBECONFIG) that points the client at it."""
    kube = FakeKube(claim_dir, hold=hold, nodes=nodes)
    kube.scratch = tmp

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _do(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path, _, query = self.path.partition("?")
            with kube.lock:
                code, doc = kube.handle(self.command, path, query, body)
            data = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(doc, str)
                             else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _do

    server = ThreadingHTTPServer(("127.0.0.1", kube.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{kube.port}"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    try:
        yield kube, {"KUBECONFIG": str(config)}
    finally:
        server.shutdown()
        server.server_close()
        for name in list(kube.pods):
            kube.delete(name)
