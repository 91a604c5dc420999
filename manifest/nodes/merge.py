"""``manifest merge NODE.json…``: node records → the manifest of one multi-node run.

Each node of a multi-node run captures its own processes (a node record:
``command.topology.node`` set, its ranks only). Merge makes one manifest:

* **Order-free.** Records are sorted by their lowest rank and every list is
  rebuilt in rank, node or path order, so any order of arguments gives the
  same bytes, the same ``run_id`` and the same ``digest``.
* **One run or none.** Every record must name the same code, data, seeds,
  recipe (switches, thread count, hash seed, NCCL settings), torch/CUDA build,
  command (set aside the node rank) and layout (launcher, nodes, world size,
  backend); and the same rendezvous when both recorded one. The first
  disagreement is refused (exit 2) naming the node and the field.
* **The topology as a whole, before anything is sized by it**
  (``manifest.nodes.intake``): each node once, its index in range, its ranks
  on it; nodes and ranks cover the world exactly once, as many as were given.
* **Heterogeneous hardware is kept.** ``hardware`` holds node 0's facts and
  ``hardware.nodes`` every node's; the diff labels each difference.
* **Outputs where they were written.** Each artifact carries its node; the
  same file seen by several nodes with the same bytes (a shared directory)
  is kept once, at the lowest node. A declared output no node wrote fails
  the merged run, as it fails a single-node capture.
* **Restarts.** Elastic attempts (``outputs.segments``) are merged by restart
  number; a restart on another world size is named (``resized``).

The merged manifest is sealed like a capture; it is marked as sealed here
(so verify runs it without ``--trust``) only when every node record was. It
names the digest of every node record it holds (``observed.node_records``,
outside the run's identity), so a node can tell its launch's merge from
another's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from manifest.canonical import seal, to_document
from manifest.models import Manifest, Topology
from manifest.nodes.intake import MergeRefused as MergeRefused  # re-exported
from manifest.nodes.intake import NodeIntake
from manifest.nodes.patches import code_difference
from manifest.nodes.torchrun import as_every_node_runs, without_node_rank
from manifest.store import BlobStore

BUILD_FIELDS = ("python", "implementation", "torch", "torch_cuda", "torch_hip", "torch_git",
                "numpy", "cuda_runtime", "cudnn", "nccl", "blas")
"""What a node's torch/CUDA build is: nodes that differ here are not one run."""


def _checks(m: Manifest) -> list[tuple[str, Any]]:
    """(field, value) that every node record of one run must agree on, in report order."""
    assert m.command is not None and m.command.topology is not None
    t = m.command.topology
    out: list[tuple[str, Any]] = [("schema", m.schema_)]
    out += [(f"code.{k}", v) for k, v in m.code.model_dump(mode="json").items()
            if k != "unavailable"]
    out.append(("data", [d.model_dump(mode="json") for d in m.data]))
    out += [(f"env.{k}", getattr(m.env, k)) for k in BUILD_FIELDS]
    out += [("randomness.seed", m.randomness.seed),
            ("randomness.derivation", m.randomness.derivation),
            ("determinism.requested", m.determinism.requested),
            ("determinism.num_threads", m.determinism.num_threads),
            ("determinism.cublas_workspace_config", m.determinism.cublas_workspace_config),
            ("determinism.pythonhashseed", m.determinism.pythonhashseed)]
    out += [("command.argv", without_node_rank(m.command.argv)),
            ("command.cwd", m.command.cwd), ("command.outputs", m.command.outputs),
            ("command.datasets", m.command.datasets), ("command.code_env", m.command.code_env),
            ("command.topology.launcher", t.launcher), ("command.topology.nodes", t.nodes),
            ("command.topology.world_size", t.world_size),
            ("command.topology.nccl", t.nccl)]
    return out


def _flags(m: Manifest) -> list[tuple[int, Any]]:
    return [(p.rank, p.flags.model_dump(mode="json") if p.flags else None)
            for p in m.determinism.processes]


def _refuse_disagreement(parts: list[tuple[str, Manifest, Topology]],
                         store: BlobStore | None = None) -> None:
    label0, first, t0 = parts[0]
    base = _checks(first)
    flags0 = _flags(first)
    want_flags = flags0[0][1] if flags0 else None
    backend = t0.backend
    rdzv = first.observed.rendezvous
    for label, m, t in parts:
        who = f"node {t.node} ({label})"
        for (name, want), (_, got) in zip(base, _checks(m), strict=True):
            if got != want:
                files = code_difference(first, m, store) if name.startswith("code.") else None
                raise MergeRefused(
                    f"{who} disagrees with node {t0.node} ({label0}) on {name}"
                    + (f" ({files})" if files else "") + ": these node records are not one "
                    "run, refusing to merge.",
                    hint="Capture every node from the same commit, data, seed, recipe and build"
                    + ("; a log or other file the run writes into the repository is code to "
                       "the other node's capture: write it outside the repository or into a "
                       "directory git ignores." if files else "."))
        for rank, flags in _flags(m):
            if flags != want_flags:
                raise MergeRefused(
                    f"{who} disagrees with node {t0.node} ({label0}) on the determinism "
                    f"switches of rank {rank} (determinism.processes[{rank}].flags): refusing "
                    "to merge.")
        if backend is not None and t.backend is not None and t.backend != backend:
            raise MergeRefused(f"{who} disagrees with node {t0.node} ({label0}) on "
                               f"command.topology.backend ({t.backend} vs {backend}).")
        if rdzv and m.observed.rendezvous and m.observed.rendezvous != rdzv:
            raise MergeRefused(
                f"{who} comes from another run (observed.rendezvous {m.observed.rendezvous} "
                f"vs {rdzv}): refusing to merge.")


def _matches(path: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(
        path, pattern.replace("**/", ""))


def _artifacts(parts: list[tuple[str, Manifest, Topology]]) -> list[dict[str, Any]]:
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for _, m, t in parts:
        assert m.outputs is not None
        for artifact in m.outputs.artifacts:
            doc = artifact.model_dump(mode="json")
            doc["node"] = artifact.node if artifact.node is not None else t.node
            same = {k: v for k, v in doc.items() if k != "node"}
            key = (artifact.path, str(sorted(same.items(), key=lambda kv: kv[0])))
            if key not in chosen or doc["node"] < chosen[key]["node"]:
                chosen[key] = doc
    return sorted(chosen.values(), key=lambda a: (a["path"], a["node"]))


def _segments(parts: list[tuple[str, Manifest, Topology]]) -> list[dict[str, Any]] | None:
    by_restart: dict[int, dict[str, Any]] = {}
    for _, m, t in parts:
        assert m.outputs is not None
        for seg in m.outputs.segments or []:
            entry = by_restart.setdefault(seg.restart, {
                "restart": seg.restart, "world_size": seg.world_size, "ranks": set(),
                "error": None})
            entry["ranks"].update(seg.ranks)
            if seg.error and entry["error"] is None:
                entry["error"] = f"node {t.node}: {seg.error}"
    if not by_restart:
        return None
    out: list[dict[str, Any]] = []
    previous = None
    for restart in sorted(by_restart):
        entry = by_restart[restart]
        world = entry["world_size"]
        merged = {**entry, "ranks": sorted(entry["ranks"])}
        if previous is not None and world is not None and world != previous:
            merged["resized"] = f"{previous} → {world}"
        out.append(merged)
        previous = world if world is not None else previous
    return out


def _compute(parts: list[tuple[str, Manifest, Topology]]) -> dict[str, Any] | None:
    records = [m.observed.compute for _, m, _ in parts]
    if any(c is None for c in records):
        return None
    ranks = sorted((r.model_dump(mode="json") for c in records if c for r in c.ranks),
                   key=lambda r: int(r["rank"]))
    energies = [c.energy_j for c in records if c]
    out: dict[str, Any] = {
        "wall_s": max(c.wall_s for c in records if c), "ranks": ranks,
        "gpu_count": sum(c.gpu_count for c in records if c),
        "gpu_hours": sum(c.gpu_hours for c in records if c), "gpus": [],
        "unavailable": {}}
    if all(e is not None for e in energies):
        out["energy_j"] = sum(e for e in energies if e is not None)
    else:
        out["unavailable"] = {"energy_j": "not read on every node"}
    return out


def merge_nodes(records: Sequence[tuple[str, Manifest]],
                note: Callable[[str], None] | None = None,
                store: BlobStore | None = None) -> Manifest:
    """One manifest of the run the node ``records`` (label, manifest) belong to.

    ``note`` hears what the user should know (a restart on another world size);
    ``store``, the local blob store, lets a refusal name the files whose uncommitted
    changes differ (``manifest.nodes.patches``).
    """
    if not records:
        raise MergeRefused("merge needs at least one node record.")
    # The topology as a whole first (manifest.nodes.intake): nothing below is sized by a
    # claim that the records given do not bear out.
    intake = NodeIntake(len(records))
    checked = [(label, m, intake.add(label, m)) for label, m in records]
    intake.finish()
    parts = sorted(checked, key=lambda p: (min(r.rank for r in p[2].ranks), p[2].node or 0))
    _refuse_disagreement(parts, store)
    _, first, t0 = parts[0]
    assert first.command is not None and first.outputs is not None
    doc = to_document(first)

    imported = sorted({name for _, m, _ in parts for name in (m.env.imported or [])})
    if first.env.imported is not None:
        doc["env"]["imported"] = imported
    nodes = sorted({t.node for _, _, t in parts if t.node is not None})
    per_node: dict[int, dict[str, Any]] = {}
    for _, m, t in parts:
        if t.node is not None and t.node not in per_node:
            hw = m.hardware.model_dump(mode="json", exclude={"nodes"})
            per_node[t.node] = {"node": t.node, **hw}
    doc["hardware"]["nodes"] = [per_node[n] for n in nodes]

    def by_rank(section: str, kind: str) -> list[dict[str, Any]]:
        items = [p.model_dump(mode="json") for _, m, _ in parts
                 for p in getattr(getattr(m, section), kind)]
        return sorted(items, key=lambda p: int(p["rank"]))

    doc["randomness"]["processes"] = by_rank("randomness", "processes")
    doc["randomness"]["unavailable"] = {}
    doc["determinism"]["processes"] = by_rank("determinism", "processes")
    outside = {(o.command, o.site): o.model_dump(mode="json") for _, m, _ in parts
               for o in m.determinism.outside_recipe or []}
    doc["determinism"].pop("outside_recipe", None)
    if outside:
        doc["determinism"]["outside_recipe"] = [outside[k] for k in sorted(outside)]

    ranks = sorted((r for _, _, t in parts for r in t.ranks), key=lambda r: r.rank)
    counts = {n: sum(1 for r in ranks if r.node == n) for n in {r.node for r in ranks}}
    backends = sorted({t.backend for _, _, t in parts if t.backend is not None})
    topology = t0.model_dump(mode="json")
    topology.pop("node", None)
    topology.update({
        "ranks": [r.model_dump(mode="json") for r in ranks],
        "backend": backends[0] if backends else None,
        "local_world_size": next(iter(counts.values())) if len(set(counts.values())) == 1
        else None,
    })
    doc["command"]["topology"] = topology
    # The command every node ran: node records differ only in --node-rank, and c10d
    # rendezvous hands out node ranks in arrival order whatever --node-rank says. The
    # endpoint (host, port, run id) is the launch's, not the run's: set aside too (the
    # records above agreed on it, and observed.rendezvous keeps the run id).
    doc["command"]["argv"] = as_every_node_runs(first.command.argv)

    outputs = doc["outputs"]
    failed = [(t.node, m.outputs) for _, m, t in parts
              if m.outputs is not None and m.outputs.status != "ok"]
    outputs["artifacts"] = _artifacts(parts)
    outputs["processes"] = by_rank("outputs", "processes")
    workers = sum(m.outputs.workers or 0 for _, m, _ in parts if m.outputs is not None)
    outputs.pop("workers", None)
    if workers:
        outputs["workers"] = workers
    outputs["status"], outputs["exit_code"], outputs["error"] = "ok", 0, None
    if failed:
        node, bad = failed[0]
        outputs["status"], outputs["exit_code"] = bad.status, bad.exit_code
        outputs["error"] = f"node {node}: {bad.error}"
    else:
        unmatched = [g for g in first.command.outputs
                     if not any(_matches(a["path"], g) for a in outputs["artifacts"])]
        if unmatched:
            outputs["status"] = "failed"
            outputs["error"] = ("declared output(s) matched no file on any node: "
                                + ", ".join(unmatched))
    outputs.pop("segments", None)
    segments = _segments(parts)
    if segments is not None:
        outputs["segments"] = segments
        for seg in segments:
            if seg.get("resized") and note is not None:
                note(f"restart {seg['restart']} resumed on another world size "
                     f"({seg['resized']}).")

    observed = doc["observed"]
    observed["started_at"] = min(m.observed.started_at for _, m, _ in parts)
    observed["finished_at"] = max(m.observed.finished_at for _, m, _ in parts)
    observed["duration_s"] = max(m.observed.duration_s for _, m, _ in parts)
    observed["pids"] = []  # process ids of several hosts name nothing together
    # Which captures this merge holds: a node's capture --nodes takes a run.json as its
    # launch's merge only when its own record's digest is here (manifest.nodes.gather).
    observed["node_records"] = [m.digest for _, m, _ in sorted(parts, key=lambda p: p[2].node or 0)]
    recording = sorted((c for _, m, _ in parts for c in m.observed.recording or []),
                       key=lambda c: c.rank)
    observed["recording"] = [c.model_dump(mode="json") for c in recording] or None
    observed.pop("compute", None)
    compute = _compute(parts)
    if compute is not None:
        observed["compute"] = compute
    return seal(doc)

