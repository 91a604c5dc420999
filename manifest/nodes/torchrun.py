"""Reading and rewriting a torchrun command line.

A multi-node run is one command per node that differs only in its node rank
(``--node-rank=i``), and names a rendezvous point on the cluster
(``--rdzv-endpoint=host:port``, or ``--master-addr``/``--master-port``). To
compare the nodes' commands merge sets the node rank aside; to re-run the
nodes on this machine verify points the rendezvous at ``127.0.0.1`` on a port
free here, and may change the node count and processes per node (an
equivalent layout).

torchrun spells each option with dashes or underscores and takes its value
as ``--opt=value`` or ``--opt value``; its own options end at the first word
that is not one (the training script). ``python -m torch.distributed.run``
and ``torch.distributed.launch`` read the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_VALUED = {
    "nnodes", "nproc_per_node", "node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_id",
    "rdzv_conf", "master_addr", "master_port", "max_restarts", "monitor_interval",
    "start_method", "role", "log_dir", "redirects", "tee", "local_addr", "rdzv_timeout",
    "logs_specs", "local_ranks_filter", "event_log_handler", "module_name",
}
"""torchrun's options that take a value (the rest are switches: --standalone, -m …)."""

_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class TorchrunLine:
    """Where torchrun's own options lie in an argv: ``argv[start:end]``."""

    start: int
    end: int


def _key(word: str) -> str:
    return word.lstrip("-").split("=", 1)[0].replace("-", "_")


def find_torchrun(argv: list[str]) -> TorchrunLine | None:
    """The span of torchrun's options in ``argv`` (after ``env``, ``srun`` …), or None."""
    for i, word in enumerate(argv):
        base = os.path.basename(word)
        if base == "torchrun":
            start = i + 1
        elif (re.fullmatch(r"python[0-9.]*", base) and i + 2 < len(argv)
              and argv[i + 1] == "-m" and argv[i + 2] in _MODULES):
            start = i + 3
        else:
            continue
        j = start
        while j < len(argv) and argv[j].startswith("-"):
            if "=" not in argv[j] and _key(argv[j]) in _VALUED:
                j += 1
            j += 1
        return TorchrunLine(start, min(j, len(argv)))
    return None


def option(argv: list[str], name: str) -> str | None:
    """The value of torchrun's ``--name`` (dashes or underscores), or None."""
    line = find_torchrun(argv)
    if line is None:
        return None
    i = line.start
    while i < line.end:
        word = argv[i]
        if _key(word) == name:
            if "=" in word:
                return word.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
        i += 2 if "=" not in word and _key(word) in _VALUED else 1
    return None


def with_options(argv: list[str], values: dict[str, str | None]) -> list[str]:
    """``argv`` with torchrun's options in ``values`` replaced (None: removed), or added
    right after ``torchrun`` when absent; the training script's own words untouched."""
    line = find_torchrun(argv)
    if line is None:
        return list(argv)
    head, opts, tail = argv[:line.start], argv[line.start:line.end], argv[line.end:]
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(opts):
        word = opts[i]
        key = _key(word)
        takes = "=" not in word and key in _VALUED
        if key in values:
            seen.add(key)
            value = values[key]
            if value is not None:
                dashed = word.split("=", 1)[0] if "=" in word else word
                out.append(f"{dashed}={value}")
        else:
            out.append(word)
            if takes and i + 1 < len(opts):
                out.append(opts[i + 1])
        i += 2 if takes else 1
    added = [f"--{k.replace('_', '-')}={v}" for k, v in values.items()
             if k not in seen and v is not None]
    return [*head, *added, *out, *tail]


def without_node_rank(argv: list[str]) -> list[str]:
    """The command as every node runs it: torchrun's node rank set aside."""
    if find_torchrun(argv) is None:
        return list(argv)
    return with_options(argv, {"node_rank": None})


RENDEZVOUS = ("rdzv_endpoint", "rdzv_id", "master_addr", "master_port")
"""Where and under which id a launch met (host, port, run id): chosen per launch by
whoever starts it, so another head node or port is the same run."""


def as_every_node_runs(argv: list[str]) -> list[str]:
    """The command of a merged multi-node run: the node rank and the rendezvous endpoint
    (host, port, run id) set aside, so two launches of the same run from different heads
    name the same run. A re-run picks its own endpoint (``manifest.nodes.layout``)."""
    if find_torchrun(argv) is None:
        return list(argv)
    return with_options(argv, {"node_rank": None, **dict.fromkeys(RENDEZVOUS)})
