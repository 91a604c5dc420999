"""A real Ray cluster on 127.0.0.1 for the tests: a head and, when asked, a second raylet.

Ray's own tests put several raylets on one machine (``ray.cluster_utils.Cluster``);
here they are ``ray start --block`` processes (through ``tests.ray_node``, which gives a
raylet more than Ray's fixed 30 s to register), each in its own session, with
every port chosen here so a Ray another user runs on this machine cannot clash.
A placement group with ``STRICT_SPREAD`` then really places one bundle on each.

A busy machine (issue 39: load 4 on 2 cores, the second raylet "did not come up") is
met by waiting for events, each with room to spare, never for a time:

* the head is up when its own raylet is alive in the cluster, not when its dashboard
  answers (that comes first; a raylet started in between finds no head node in the GCS
  and exits: "No node info found for head node");
* a raylet gives its dashboard agent a fixed 15 s to write its port files (Ray 2.60,
  ``NodeManager::WaitForDashboardAgentPorts``) and aborts when the agent, importing
  under load, is late: its ``ray start`` then waits for a node that will never come.
  Such a node is seen as its raylet process gone (found by its node-manager port) and
  started again, head or raylet, up to 10 times each;
* the agents' modules are imported once before anything starts, so a start reads them
  from the page cache.

Measured here (gVisor, 2 cores, other work running): at a load of 7 the head and a second
raylet came up with no restart; at a load of 11 the agent took about 17 s and every one
of 11 starts of the second raylet aborted (raising the processes' priority did not
help: this kernel does not schedule by it). The 15 s is Ray's, not a setting
(``RAY_agent_register_timeout_ms`` does not reach it).

Every ``ray start`` writes its output to a log in the cluster's temp dir; a cluster that
does not come up says the last lines of each, and of Ray's ``ray_process_exit.log``.

Teardown: SIGTERM to each process group and to every process naming the private
temp dir (Ray's daemons), then SIGKILL to whatever is left after 5 s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.runs import REPO, free_port

RESTARTS = 10
"""How often one node (head or raylet) is started again after its raylet died."""
PATIENCE_S = 900
"""The limit on the whole start, for a cluster that never comes up: 15 minutes. The
events above end the wait; this only ends a hopeless one."""
AGENT_MODULES = ("ray.dashboard.agent", "ray.dashboard.modules.reporter.reporter_agent",
                 "ray._private.runtime_env.agent.main", "ray.dashboard.modules.job.job_agent")


def processes_with(marker: str) -> list[int]:
    """Processes (not this one) whose command line holds ``marker``: a cluster's leftovers."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return [p for p in pids if p != os.getpid()]


def _ports() -> dict[str, int]:
    names = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")
    return {name: free_port() for name in names}


def _alive_nodes(address: str) -> int:
    import json

    try:
        with urllib.request.urlopen(f"{address}/nodes?view=summary", timeout=10) as r:  # noqa: S310
            doc = json.loads(r.read())
    except (OSError, ValueError):
        return 0
    summary = doc.get("data", {}).get("summary", [])
    return sum(1 for n in summary if n.get("raylet", {}).get("state") == "ALIVE")


def _why(temp: str) -> str:
    """The last words of the cluster's processes, for a cluster that did not come up."""
    lines = []
    for log in sorted(Path(temp).glob("*.log")) + sorted(Path(temp).glob(
            "session_*/logs/ray_process_exit.log")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            lines += [f"{log.name}: {line}" for line in tail]
    return "\n".join(lines)


@dataclass
class _Node:
    """One ``ray start --block`` and what is known of its raylet."""

    args: Callable[[], list[str]]
    """Its arguments, read at each start (a head started again gets new ports)."""
    what: str
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    """The raylet's node-manager port: its raylet process names it."""
    seen: bool = False
    """Its raylet process was running once."""
    starts: int = 0

    def start(self, env: dict[str, str], temp: str) -> None:
        self.stop()
        if self.proc is not None:  # reaped before it is replaced (an unreaped one is a
            try:                   # ResourceWarning, an error under the tests' filters)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.stop(signal.SIGKILL)
                self.proc.wait()
        ports = _ports()
        self.port, self.seen, self.starts = ports["node-manager-port"], False, self.starts + 1
        fd, _ = tempfile.mkstemp(prefix=f"{self.what}-", suffix=".log", dir=temp)
        with open(fd, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.ray_node", "start", *self.args(),
                 *(f"--{name}={port}" for name, port in ports.items())],
                env=env, cwd=REPO, start_new_session=True, stdout=log,
                stderr=subprocess.STDOUT)

    def raylet_died(self) -> bool:
        """Its ``ray start`` exited, or its raylet ran and is gone (an abort: the start
        would wait for it in vain)."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        running = bool(processes_with(f"--node_manager_port={self.port}"))
        self.seen = self.seen or running
        return self.seen and not running

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


def _warm(env: dict[str, str]) -> None:
    """Import the agents' modules once: a raylet gives its agent 15 s to start."""
    subprocess.run([sys.executable, "-c", "; ".join(f"import {m}" for m in AGENT_MODULES)],
                   env=env, cwd=REPO, check=False, capture_output=True, timeout=PATIENCE_S)


@contextlib.contextmanager
def ray_cluster(*, raylets: int = 1, cpus: int = 2,
                declare: dict[int, list[str]] | None = None) -> Iterator[str]:
    """The Jobs API address of a Ray cluster of ``raylets`` nodes with ``cpus`` CPUs each;
    ``declare`` adds ``ray start`` arguments to node I (0 is the head): GPUs and custom
    resources, which Ray takes as declared."""
    temp = tempfile.mkdtemp(prefix="mfray-", dir="/tmp")  # socket paths must stay short
    at = {"port": free_port(), "dash": free_port()}
    # No idle workers started ahead of tasks: on a loaded machine they starve the raylet
    # that is registering. A raylet asks the GCS for the head node
    # RAY_NUM_REDIS_GET_RETRIES times, 2 s apart (20 by default), then exits: 150 is
    # five minutes.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               RAY_USAGE_STATS_ENABLED="0", RAY_enable_worker_prestart="0",
               RAY_prestart_worker_first_driver="0", RAY_NUM_REDIS_GET_RETRIES="150")
    def head_args() -> list[str]:
        if head.starts > 1:  # what the last head left holds its ports: new ones, and away
            for pid in processes_with(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            at.update(port=free_port(), dash=free_port())
        return ["--head", "--block", f"--num-cpus={cpus}", f"--temp-dir={temp}",
                *(declare or {}).get(0, []),
                f"--port={at['port']}", f"--dashboard-port={at['dash']}",
                "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1",
                "--include-dashboard=true", "--disable-usage-stats"]

    def raylet_args(i: int) -> list[str]:
        return ["--block", f"--address=127.0.0.1:{at['port']}", f"--num-cpus={cpus}",
                "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                *(declare or {}).get(i, [])]

    head = _Node(head_args, "head")
    others = [_Node(functools.partial(raylet_args, i), f"raylet{i}")
              for i in range(1, raylets)]
    try:
        _warm(env)
        deadline = time.monotonic() + PATIENCE_S

        def wait_for(count: int, nodes: list[_Node], what: str) -> None:
            while (alive := _alive_nodes(f"http://127.0.0.1:{at['dash']}")) < count:
                for node in nodes:
                    if node.raylet_died() and alive < count:
                        if node.starts > RESTARTS:
                            raise RuntimeError(f"{what}: {node.what}'s raylet died "
                                               f"{node.starts} times (load "
                                               f"{os.getloadavg()[0]:.1f})\n{_why(temp)}")
                        node.start(env, temp)
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{what}: {alive} of {count} raylets alive after {PATIENCE_S} s, "
                        f"{sum(n.starts - 1 for n in nodes)} restarts, load "
                        f"{os.getloadavg()[0]:.1f}\n{_why(temp)}")
                time.sleep(1)

        head.start(env, temp)
        wait_for(1, [head], "the Ray head did not come up")
        for node in others:
            node.start(env, temp)
        wait_for(raylets, others, f"{raylets} raylets did not come up")
        yield f"http://127.0.0.1:{at['dash']}"
    finally:
        procs = [n.proc for n in (head, *others) if n.proc is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for node in reversed((head, *others)):
                node.stop(sig)
            for pid in processes_with(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            stop_by = time.monotonic() + 5
            while (any(p.poll() is None for p in procs) or processes_with(temp)) \
                    and time.monotonic() < stop_by:
                time.sleep(0.2)
        for proc in procs:
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":  # a cluster to try things against: python -m tests.ray_cluster 2
    with ray_cluster(raylets=int(sys.argv[1]) if len(sys.argv) > 1 else 2) as where:
        print(where, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        signal.sigwait({signal.SIGTERM, signal.SIGINT})  # then the teardown above runs
