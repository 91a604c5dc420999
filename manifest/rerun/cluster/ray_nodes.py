"""The driver of a multi-node re-run on Ray: ``python -m manifest.rerun.cluster.ray_nodes``.

``--on ray`` submits this as the Ray job's entrypoint when the plan has more
than one node (``manifest.rerun.cluster.placement``). Running on the cluster,
it:

1. asks Ray for a placement group of one bundle per node, ``STRICT_SPREAD``
   (each bundle on another Ray node), each bundle the CPUs and GPUs one node
   of the recorded run used; if Ray cannot place it within ``--place-timeout``
   seconds it prints an ``unplaced`` result naming the nodes Ray has, and
   exits 3 (nothing ran);
2. asks bundle 0's node for its address and a free port: the rendezvous;
3. starts one task per bundle; each runs the remote entrypoint
   (``python -I -m manifest.rerun.remote``) on the job's ``working_dir`` (the
   bundle, unpacked by Ray on that node and checked on arrival there), with
   ``PET_NODE_RANK`` and ``PET_RDZV_ENDPOINT`` set for the bundle's torchrun
   (static rendezvous: bundle ``i``'s torchrun is node ``i``, and node 0 serves it);
4. says in the job's log which global ranks each node held (``manifest: node I held
   global ranks …``), then prints the nodes' results as one (``combine_results``)
   between the marker lines the submitter reads from the job's log.

Each node's entrypoint is a child of its Ray worker that dies with it
(``PR_SET_PDEATHSIG``), so ``ray job stop`` (the verb's cancel) ends the
nodes' runs, not only this driver. The placement group belongs to the job
and is removed with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the Ray worker that started it dies."""
    import ctypes

    with_libc = ctypes.CDLL(None, use_errno=True)
    with_libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def rendezvous_point() -> tuple[str, int]:
    """This node's address as Ray knows it, and a port free on it now."""
    import ray

    host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    return host, port


def run_node(node: int, host: str, port: int, expect: str, python: str) -> dict[str, Any]:
    """One node's launch: the remote entrypoint on this node's copy of the bundle."""
    from manifest.nodes.layout import node_env
    from manifest.rerun.remote import RESULT, RESULT_FORMAT

    bundle = Path.cwd()
    with tempfile.TemporaryDirectory(prefix=f"manifest-node{node}-") as out:
        env = {**os.environ, **node_env(node, host, port)}
        proc = subprocess.run(
            [python, "-I", "-m", "manifest.rerun.remote", str(bundle), out, "--expect", expect],
            env=env, preexec_fn=_die_with_parent, check=False)
        try:
            doc: dict[str, Any] = json.loads((Path(out) / RESULT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"format": RESULT_FORMAT, "bundle": expect,
                    "refused": f"node {node}'s entrypoint exited {proc.returncode} without a "
                               "result"}
        import ray

        doc["placed_on"] = ray.get_runtime_context().get_node_id()  # the Ray node it ran on
        return doc


def _nodes_seen() -> str:
    import ray

    seen = []
    for n in ray.nodes():  # type: ignore[no-untyped-call]
        if n.get("Alive"):
            res = n.get("Resources", {})
            seen.append(f"{n.get('NodeManagerAddress')} ({res.get('CPU', 0):g} CPU"
                        + (f", {res.get('GPU', 0):g} GPU" if res.get("GPU") else "") + ")")
    return ", ".join(seen) or "no alive node"


def main(argv: list[str] | None = None) -> int:
    from manifest.errors import EXIT_NO_VERDICT
    from manifest.nodes.layout import held_line, rendezvous_host
    from manifest.rerun.cluster.placement import NodeNeed, combine_results
    from manifest.rerun.remote import RESULT_FORMAT, encode_result

    parser = argparse.ArgumentParser(prog="python -m manifest.rerun.cluster.ray_nodes",
                                     allow_abbrev=False)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--expect", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--cpus", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--resource", action="append", default=[], metavar="NAME=AMOUNT",
                        help="a custom resource each node's task asks for (the GPU model)")
    parser.add_argument("--place-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address="auto", log_to_driver=True, logging_level=logging.WARNING)
    need = NodeNeed(args.nodes, args.cpus, args.gpus)
    shape: dict[str, float] = {"CPU": float(args.cpus)}
    if args.gpus:
        shape["GPU"] = float(args.gpus)
    resources = {name: float(amount) for name, _, amount in
                 (r.partition("=") for r in args.resource)}
    shape.update(resources)
    group = placement_group([dict(shape) for _ in range(args.nodes)], strategy="STRICT_SPREAD",
                            name=f"manifest-{args.expect.removeprefix('blake3:')[:12]}")
    if not group.wait(timeout_seconds=args.place_timeout):
        doc = {"format": RESULT_FORMAT, "bundle": args.expect,
               "unplaced": f"Ray did not place {need} (placement group STRICT_SPREAD) within "
                           f"{args.place_timeout:g} s; its nodes: {_nodes_seen()}"}
        sys.stdout.write("\n".join(encode_result(doc)) + "\n")
        return EXIT_NO_VERDICT

    def on(index: int) -> Any:
        return PlacementGroupSchedulingStrategy(placement_group=group,
                                                placement_group_bundle_index=index)

    where = ray.remote(num_cpus=0)(rendezvous_point)
    points = ray.get([where.options(scheduling_strategy=on(i)).remote()
                      for i in range(args.nodes)])
    host = rendezvous_host([address for address, _ in points])
    port = points[0][1]
    sys.stdout.write(f"manifest: {args.nodes} nodes placed (STRICT_SPREAD); rendezvous at "
                     f"{host}:{port}\n")
    sys.stdout.flush()
    task = ray.remote(run_node)
    pending = [task.options(num_cpus=args.cpus, num_gpus=args.gpus, resources=resources,
                            scheduling_strategy=on(i)).remote(
        i, host, port, args.expect, args.python) for i in range(args.nodes)]
    docs = ray.get(pending)
    for i, doc in enumerate(docs):
        sys.stdout.write(held_line(i, doc.get("records") or [],
                                   f" (Ray node {str(doc.get('placed_on') or '?')[:12]})"))
    combined = combine_results(docs)
    combined["placed_on"] = [d.get("placed_on") for d in docs]
    sys.stdout.write("\n".join(encode_result(combined)) + "\n")
    sys.stdout.flush()
    return int(combined.get("exit_code", EXIT_NO_VERDICT)) if "refused" not in combined \
        else EXIT_NO_VERDICT


if __name__ == "__main__":
    raise SystemExit(main())
