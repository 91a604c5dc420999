"""A real Ray cluster on 127.0.0.1 for the tests: a head and, when asked, a second raylet.

Ray's own tests put several raylets on one machine (``ray.cluster_utils.Cluster``);
here they are ``ray start --block`` processes (through ``tests.ray_node``, which gives a
raylet more than Ray's fixed 30 s to register), each in its own session, with
every port chosen here so a Ray another user runs on this machine cannot clash.
A placement group with ``STRICT_SPREAD`` then really places one bundle on each.

Teardown: SIGTERM to each process group and to every process naming the private
temp dir (Ray's daemons), then SIGKILL to whatever is left after 5 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.runs import REPO, free_port


def processes_with(marker: str) -> list[int]:
    """Processes (not this one) whose command line holds ``marker``: a cluster's leftovers."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return [p for p in pids if p != os.getpid()]


def _ports(prefix: str = "") -> list[str]:
    names = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")
    return [f"--{name}={free_port()}" for name in names]


def _alive_nodes(address: str) -> int:
    import json

    try:
        with urllib.request.urlopen(f"{address}/nodes?view=summary", timeout=3) as r:  # noqa: S310
            doc = json.loads(r.read())
    except (OSError, ValueError):
        return 0
    summary = doc.get("data", {}).get("summary", [])
    return sum(1 for n in summary if n.get("raylet", {}).get("state") == "ALIVE")


@contextlib.contextmanager
def ray_cluster(*, raylets: int = 1, cpus: int = 2) -> Iterator[str]:
    """The Jobs API address of a Ray cluster of ``raylets`` nodes with ``cpus`` CPUs each."""
    temp = tempfile.mkdtemp(prefix="mfray-", dir="/tmp")  # socket paths must stay short
    port, dash = free_port(), free_port()
    # No idle workers started ahead of tasks: on a loaded machine they starve the raylet
    # that is registering (Ray gives it a fixed 30 s).
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               RAY_USAGE_STATS_ENABLED="0", RAY_enable_worker_prestart="0",
               RAY_prestart_worker_first_driver="0")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.ray_node", "start", "--head", "--block",
         f"--num-cpus={cpus}", f"--temp-dir={temp}",
         f"--port={port}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
         "--node-ip-address=127.0.0.1", "--include-dashboard=true", "--disable-usage-stats",
         *_ports()],
        env=env, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)]
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/version", timeout=2):  # noqa: S310
                    break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise RuntimeError("the Ray head did not come up") from None
                time.sleep(1)
        def worker() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.ray_node", "start", "--block",
                 f"--address=127.0.0.1:{port}", f"--num-cpus={cpus}",
                 "--node-ip-address=127.0.0.1", "--disable-usage-stats", *_ports()],
                env=env, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)

        workers = [worker() for _ in range(raylets - 1)]
        procs.extend(workers)
        # A raylet that still fails to come up (a loaded machine: seen here at a load of 10
        # on 2 cores) is started again, up to 6 times.
        restarts = 0
        deadline = time.monotonic() + 480
        while (alive := _alive_nodes(address)) < raylets:
            if procs[0].poll() is not None or time.monotonic() > deadline or restarts > 6:
                raise RuntimeError(
                    f"{raylets} raylets did not come up: {alive} alive, head "
                    f"{'exited' if procs[0].poll() is not None else 'running'}, "
                    f"{restarts} restarts, load {os.getloadavg()[0]:.1f}")
            for i, proc in enumerate(procs[1:], start=1):
                if proc.poll() is not None:
                    restarts += 1
                    procs[i] = worker()
            time.sleep(1)
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in reversed(procs):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            for pid in processes_with(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while (any(p.poll() is None for p in procs) or processes_with(temp)) \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
        for proc in procs:
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":  # a cluster to try things against: python -m tests.ray_cluster 2
    with ray_cluster(raylets=int(sys.argv[1]) if len(sys.argv) > 1 else 2) as where:
        print(where, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        signal.sigwait({signal.SIGTERM, signal.SIGINT})  # then the teardown above runs
