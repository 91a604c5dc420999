"""How two topologies relate, and the node launches that re-run one on this machine.

Megatron-LM, DeepSpeed and TorchTitan promise bit-identical results only for
the same parallel layout; NCCL's rings and trees follow the rank → GPU map.
So verify says which case a re-run is in (:func:`relation`):

* ``same``: nodes, processes per node, rank → node/device, backend and NCCL
  settings all as recorded: the verdict is ``identical`` or ``differs``;
* ``equivalent``: the same world size and rank order under gloo, laid out on
  other nodes (2 nodes × 1 process against 1 node × 2 processes): gloo
  reduces over TCP in rank order whatever the host, so the same bits are
  expected, and the report says the layout was equivalent;
* ``changed-layout``: the same world size on another layout under NCCL (or
  another backend or NCCL settings): bits may differ;
* ``changed-world-size``: every sum is split over another number of ranks;
  the report gives max |Δ|, ULP and the first divergent step, never a bare
  ``differs``.

:func:`local_launches` turns a recorded torchrun command into one command
per node on ``127.0.0.1`` (a free port chosen when the plan is made, shown in
it): ``--nnodes``/``--nproc-per-node`` from the layout, ``--node-rank=i``
under torchrun's static rendezvous at the local endpoint (so node ``i`` holds
global ranks ``i × P …``, whichever launch starts first), a rendezvous timeout
so a node that fails to start does not hold the others for the static
rendezvous' default 10 minutes.

:func:`cluster_launch` is the same command for a cluster (``--on ray|slurm|k8s``),
under the same static rendezvous and timeout: one command for every node, without a
node rank or an endpoint, because those are only known where the job runs. Each
node's launch gets them as torchrun's own environment variables (:func:`node_env`:
``PET_NODE_RANK``, ``PET_RDZV_ENDPOINT``; torchrun reads ``PET_<OPTION>`` for any
option not on its command line, and under the static rendezvous the node rank so
read is node ``i``'s rank), so the bundle, which names the command, is one for
every node.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from manifest.errors import UsageError
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Topology
from manifest.nodes.torchrun import find_torchrun, option, with_options


@dataclass(frozen=True)
class Layout:
    nodes: int
    per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    def __str__(self) -> str:
        return (f"{self.nodes} node{'s' if self.nodes != 1 else ''} × {self.per_node} "
                f"process{'es' if self.per_node != 1 else ''}")


def parse_layout(text: str) -> Layout:
    """``NxP`` (nodes × processes per node), as ``--layout`` takes it."""
    match = re.fullmatch(r"\s*([1-9][0-9]{0,3})\s*[x×]\s*([1-9][0-9]{0,3})\s*", text)
    if match is None:
        raise UsageError(f"--layout {text!r} is not NODESxPROCESSES (e.g. 2x1 or 1x2).")
    return Layout(int(match.group(1)), int(match.group(2)))


def layout_of(topology: Topology) -> Layout:
    per_node = topology.local_world_size
    if per_node is None:
        per_node = max(1, topology.world_size // max(1, topology.nodes))
    return Layout(topology.nodes, per_node)


def describe(topology: Topology) -> str:
    return f"{layout_of(topology)}, {topology.backend or 'no process group'}"


@dataclass(frozen=True)
class Relation:
    kind: str
    """``same``, ``equivalent``, ``changed-layout`` or ``changed-world-size``."""
    recorded: str
    rerun: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"relation": self.kind, "recorded": self.recorded, "rerun": self.rerun,
                "text": self.text}


def _placement(t: Topology) -> list[tuple[int, int, int | None, str | None]]:
    return [(p.rank, p.node, p.local_rank, p.device) for p in t.ranks]


def relation(recorded: Topology, rerun: Topology) -> Relation:
    """Which case a re-run is in against its record (see the module docstring)."""
    a, b = describe(recorded), describe(rerun)
    if recorded.world_size != rerun.world_size:
        return Relation("changed-world-size", a, b,
                        f"changed topology: world size {recorded.world_size} → "
                        f"{rerun.world_size} ({a} → {b}); every sum is split over another "
                        "number of ranks, so the bits are not expected to match")
    if (recorded.backend != rerun.backend or recorded.nccl != rerun.nccl):
        return Relation("changed-layout", a, b,
                        f"changed collective settings ({a}, NCCL {recorded.nccl} → {b}, "
                        f"NCCL {rerun.nccl}): reductions may be taken in another order")
    if (recorded.nodes == rerun.nodes and recorded.local_world_size == rerun.local_world_size
            and _placement(recorded) == _placement(rerun)):
        return Relation("same", a, b, f"same topology: {a}")
    devices = {p.device for p in [*recorded.ranks, *rerun.ranks]}
    if recorded.backend == "gloo" and devices <= {"cpu", None}:
        return Relation("equivalent", a, b,
                        f"equivalent layout: {b} against the recorded {a}; same world size "
                        "and rank order, and gloo reduces in rank order on any host")
    return Relation("changed-layout", a, b,
                    f"changed layout: {a} → {b}, same world size; NCCL's rings and trees "
                    "follow the rank → device map, so bits may differ")


def free_port() -> int:
    """A TCP port free on loopback now, for the re-run's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


JOIN_TIMEOUT = 120
"""Seconds the nodes of a re-run wait for each other before giving up."""


def local_launches(argv: list[str], layout: Layout, port: int) -> list[list[str]]:
    """One torchrun command per node of ``layout``, all meeting on ``127.0.0.1:port``.

    Node ``i`` is ``--node-rank=i`` under ``--rdzv-backend=static``: the verdict compares
    each rank's trail with the recorded rank's, so node ``i`` must hold global ranks
    ``i × per_node …`` whatever order the launches start in. torchrun honours
    ``--node-rank`` only under the static rendezvous: under c10d (``--node-rank`` or
    PET_NODE_RANK alike) it says ``node_rank is only used for static rdzv_backend. It will
    be ignored for rdzv_backend=c10d.`` and the dynamic rendezvous numbers the nodes by
    sorting its participants' ``<addr>_<pid>_<n>`` names: on one host by process id, an
    order of start-up and of pid wrap-around; across hosts by address as text
    (``127.0.0.10`` before ``127.0.0.2``). The static rendezvous takes node 0 as the
    store's host (``rank == 0``: no ``is_host`` guess, so no two launches on one host both
    try to serve), and gives each node ``rank = --node-rank``. Its settings are
    :func:`_launch_options`'."""
    if find_torchrun(argv) is None:
        raise UsageError("the recorded command does not start torchrun, so its nodes cannot "
                         "be re-run on this machine.",
                         hint="Re-run it where it ran (--on slurm|k8s|ray).")
    values = {**_launch_options(argv, layout), "rdzv_endpoint": f"127.0.0.1:{port}"}
    return [with_options(argv, {**values, "node_rank": str(i)}) for i in range(layout.nodes)]


def _conf_items(conf: str | None) -> dict[str, str]:
    """``--rdzv-conf``'s ``key=value,…`` as torchrun reads it (keys and values stripped)."""
    items: dict[str, str] = {}
    for part in (conf or "").split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            items[key.strip()] = value.strip()
    return items


def rdzv_timeout(argv: list[str]) -> int:
    """The static rendezvous' ``timeout`` for a re-run of ``argv``: the recorded
    ``--rdzv-conf`` one when it is a whole number of seconds (torchrun's ``int()``), else
    :data:`JOIN_TIMEOUT`, so a node that fails to start does not hold the others for
    torchrun's default of 10 minutes."""
    value = _conf_items(option(argv, "rdzv_conf")).get("timeout", "")
    return int(value) if value.isdecimal() and int(value) > 0 else JOIN_TIMEOUT


def _launch_options(argv: list[str], layout: Layout) -> dict[str, str | None]:
    """What every node's launch shares, here or on a cluster: the layout, the static
    rendezvous, and its one setting, ``timeout`` (:func:`rdzv_timeout`: the store's wait
    for every node, also its default for each operation). A recorded run's c10d settings
    (``join_timeout``, ``last_call_timeout``, ``read_timeout`` …) mean nothing to it and
    are left out; they tune how nodes meet, never what the ranks compute."""
    return {
        "nnodes": str(layout.nodes), "nproc_per_node": str(layout.per_node),
        "rdzv_backend": "static",
        "rdzv_id": option(argv, "rdzv_id") or "manifest-verify",
        "rdzv_conf": f"timeout={rdzv_timeout(argv)}",
        "master_addr": None, "master_port": None, "standalone": None,
    }


def cluster_launch(argv: list[str], layout: Layout) -> list[str]:
    """The torchrun command every node of a cluster re-run runs: ``layout``'s node and
    process counts, the static rendezvous and its timeout (:func:`_launch_options`, as a
    local re-run has them), no node rank and no endpoint (:func:`node_env` gives them to
    each node where it runs). The timeout is the same on every node, so it stays on the
    command (a recorded ``timeout`` is carried)."""
    if find_torchrun(argv) is None:
        raise UsageError("the recorded command does not start torchrun, so its nodes cannot "
                         "be placed one torchrun per node.")
    values = {**_launch_options(argv, layout), "rdzv_endpoint": None, "node_rank": None}
    return with_options(argv, values)


def node_env(node: int, host: str, port: int) -> dict[str, str]:
    """What one node's launch of :func:`cluster_launch` needs: its node rank and node 0's
    endpoint, as torchrun's own variables, read where the command names neither. Under the
    static rendezvous ``PET_NODE_RANK`` is the node's rank (torchrun passes it as
    ``rank``, no warning), and node 0, rank 0, serves the store at the endpoint (it
    listens on every address of its host, so the endpoint is only how the others reach
    it: nothing to tell node 0, and no host-name guess to miss on Ray)."""
    return {"PET_NODE_RANK": str(node), "PET_RDZV_ENDPOINT": f"{host}:{port}"}


def ranks_held(records: list[ProcessRecord]) -> list[int]:
    """The global ranks whose records one node's launch returned (its workers' ``rank``),
    in order: node ``i`` of a re-run holds ``i × P …``."""
    return sorted({int(r.get("rank") or 0) for r in records
                   if isinstance(r, dict) and isinstance(r.get("rank"), int)
                   and not r.get("mp_child")})


def held_line(node: int, records: list[ProcessRecord], where: str = "") -> str:
    """The line a node's job log gets: ``manifest: node I held global ranks …``."""
    held = ", ".join(map(str, ranks_held(records))) or "none"
    return f"manifest: node {node} held global ranks {held}{where}\n"


def rendezvous_host(addresses: list[str]) -> str:
    """How the nodes reach node 0, from the address the engine gives each node (node 0's
    first): its address, or ``127.0.0.1`` when every node is on one host (a host reaches
    itself on loopback whatever the engine calls it)."""
    if len(addresses) > 1 and len(set(addresses)) == 1:
        return "127.0.0.1"
    return addresses[0]
