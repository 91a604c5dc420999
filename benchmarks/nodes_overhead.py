"""Capture overhead on a two-node torchrun run against bare torchrun, paired; merge time.

Each pair runs the same two-node job (two torchrun launches on 127.0.0.1,
c10d rendezvous, gloo, CPU, ``examples/train.py``) once bare and once with
every node under ``manifest capture``, in alternating order, each node in
its own clone; the wall time of a pair member is from the first launch to
the last node's exit. Prints the median of each and the ratio, then the time
``manifest.nodes.merge`` takes for 64 synthetic node records (8 ranks each).

    python benchmarks/nodes_overhead.py [PAIRS] [STEPS]
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _job(repos: list[Path], steps: str, *, captured: bool, out: Path) -> float:
    port = _port()
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    procs = []
    started = time.perf_counter()
    for i, repo in enumerate(repos):
        shutil.rmtree(repo / "out", ignore_errors=True)
        torchrun = ["torchrun", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={i}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=b",
                    "train.py", "--steps", steps]
        cmd = ([sys.executable, "-m", "manifest", "capture", "--artifact", "out/*.safetensors",
                "-o", str(out / f"node{i}.json"), "--", *torchrun] if captured else torchrun)
        procs.append(subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=180))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    elapsed = time.perf_counter() - started
    if any(codes):
        # gloo's teardown can abort a bare worker ("terminate called without an active
        # exception") while its peer still waits at torchelastic's exit barrier: retried.
        return -1.0
    return elapsed


def _timed(repos: list[Path], steps: str, *, captured: bool, out: Path) -> float:
    for _ in range(3):
        elapsed = _job(repos, steps, captured=captured, out=out)
        if elapsed >= 0:
            return elapsed
        print(f"retrying a failed {'captured' if captured else 'bare'} job", file=sys.stderr)
    raise SystemExit("a two-node job failed three times")


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    steps = sys.argv[2] if len(sys.argv) > 2 else "200"
    from tests.runs import git, make_repo

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        origin = make_repo(tmp / "origin", {})
        repos = []
        for i in range(2):
            git(tmp, "clone", "-q", str(origin), str(tmp / f"n{i}"))
            repos.append(tmp / f"n{i}")
        _timed(repos, "5", captured=False, out=tmp)  # warm the page cache
        bare: list[float] = []
        captured: list[float] = []
        for k in range(pairs):
            order = (False, True) if k % 2 == 0 else (True, False)
            for flag in order:
                (captured if flag else bare).append(_timed(repos, steps, captured=flag, out=tmp))
        b, c = statistics.median(bare), statistics.median(captured)
        print(f"two-node run, {steps} steps, {pairs} pairs: bare torchrun {b:.2f} s, "
              f"under manifest capture {c:.2f} s (medians); ratio {c / b:.3f}")

    from manifest.nodes.merge import merge_nodes
    from tests.test_nodes import node_record

    records = [node_record(i, nodes=64, per_node=8) for i in range(64)]
    times = []
    for _ in range(5):
        started = time.perf_counter()
        merge_nodes([(f"n{i}", m) for i, m in enumerate(records)])
        times.append(time.perf_counter() - started)
    print(f"merge of 64 node records (512 ranks): {statistics.median(times) * 1000:.0f} ms "
          "(median of 5)")


if __name__ == "__main__":
    main()
