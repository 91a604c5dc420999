"""What recording each distribution by content costs the env probe and a whole capture.

    python benchmarks/capture_env.py [--rounds 15] [--captures 7] [--against REV]

Two measurements, each paired round by round so load on the machine hits
both sides alike:

1. In this process (``--rounds``): the package scan the env probe did before
   (``installed_distributions``) against it plus what it adds now
   (``probe_distributions``, ``probe_sources``, ``environment_digest``),
   with the record cache warm (the usual capture: every RECORD unchanged since
   the last one) and cold (``use_cache=False``: every RECORD read, as after a
   fresh install of everything).
2. ``manifest capture -q`` of a small git repository as subprocesses
   (``--captures``; 0 skips it), in CPU seconds of the child (on a machine
   shared with other work, wall time mostly measures the others), four trees
   taking turns in each round: the tree at ``--against REV`` (default
   :data:`BEFORE_RECORDS`: today's capture before distribution records), a
   copy of this tree whose ``probe_env`` records no distributions
   (:data:`RECORDS_OFF`: the records' own cost, without what other work added
   since), and this tree with the record cache warm and cold (an empty
   ``XDG_CACHE_HOME`` each round).

Printed: medians, and the median of the paired ratios after / before and of
the paired differences, against each peer. The target: warm capture within 1.03x of
the records-off copy. Measured 2026-12-06 on the shared 2-core machine (21 rounds):
warm 1.026x the records-off copy (+7 ms CPU of ~240 ms), 1.064x the capture at
199c525 (the rest is what other work added since); cold 1.40x records-off (every
RECORD read once after a fresh install).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

BEFORE_RECORDS = "199c525"
"""The last commit whose capture recorded names and versions only."""


def _timed(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_timed(f: Callable[[], object]) -> float:
    t0 = time.process_time()
    f()
    return time.process_time() - t0


def probe_rounds(rounds: int, timer: Callable[[Callable[[], object]], float],
                 ) -> dict[str, list[float]]:
    from manifest.probes.distributions import (
        distribution_paths,
        environment_digest,
        locate_distributions,
        probe_distributions,
        probe_sources,
    )
    from manifest.probes.env import installed_distributions

    cache = Path(tempfile.mkdtemp(prefix="manifest-bench-cache-")) / "distributions.json"

    def after(use_cache: bool) -> None:
        """What ``probe_env`` does now: one scan, then the records, sources and digest."""
        where = distribution_paths()
        located = locate_distributions(where)
        found = probe_distributions(where, cache_file=cache, use_cache=use_cache,
                                    located=located)
        probe_sources()
        environment_digest(found)

    after(True)  # fill the cache and the page cache
    rows: dict[str, list[float]] = {"before": [], "after, cache warm": [],
                                    "after, cache cold": []}
    for _ in range(rounds):
        rows["before"].append(timer(installed_distributions))
        rows["after, cache warm"].append(timer(lambda: after(True)))
        rows["after, cache cold"].append(timer(lambda: after(False)))
    return rows


RECORDS_OFF = {
    "distributions = probe_distributions(where, located=located)": "distributions = None",
    "for name, record in distributions.items():": "for name, record in {}.items():",
    "sources=probe_sources(),": "sources=None,",
    "environment_digest=environment_digest(distributions),": "environment_digest=None,",
}
"""The lines of ``probe_env`` that record distributions, and what they read when off."""


def tree_without_records(tmp: Path) -> Path:
    """A copy of this tree's ``manifest`` package whose ``probe_env`` records no distributions."""
    out = tmp / "records-off"
    shutil.copytree(HERE / "manifest", out / "manifest",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env_py = out / "manifest" / "probes" / "env.py"
    text = env_py.read_text(encoding="utf-8")
    for line, off in RECORDS_OFF.items():
        if line not in text:
            raise SystemExit(f"probe_env changed: {line!r} not found; update RECORDS_OFF")
        text = text.replace(line, off)
    env_py.write_text(text, encoding="utf-8")
    return out


def tree_at(tmp: Path, rev: str) -> Path:
    out = tmp / "old"
    out.mkdir()
    archive = subprocess.run(["git", "archive", rev, "manifest"], cwd=HERE,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def capture_rounds(rounds: int, rev: str) -> dict[str, list[float]]:
    """CPU seconds of ``manifest capture -q`` from each tree, the trees taking turns
    within a round (the order rotates, so a burst of load is not always on one)."""
    from benchmarks.capture_latency import make_repo, tree_argv

    tmp = Path(tempfile.mkdtemp(prefix="manifest-bench-"))
    repo = make_repo(tmp)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    warm_cache = tmp / "cache-warm"

    def run(argv: list[str], cache_home: Path) -> float:
        """CPU seconds (user + sys) of one capture: wall time on a shared machine is mostly
        other people's load."""
        env = dict(base, XDG_CACHE_HOME=str(cache_home))
        cpu0 = _child_cpu()
        proc = subprocess.run(argv, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"capture failed: {proc.stderr.decode(errors='replace').strip()}")
        return _child_cpu() - cpu0

    sides: dict[str, tuple[list[str], Callable[[int], Path]]] = {
        f"capture at {rev}": (tree_argv(tree_at(tmp, rev)), lambda n: warm_cache),
        "capture, records off": (tree_argv(tree_without_records(tmp)), lambda n: warm_cache),
        "capture, cache warm": (tree_argv(HERE), lambda n: warm_cache),
        "capture, cache cold": (tree_argv(HERE), lambda n: tmp / f"cache-cold-{n}"),
    }
    for argv, cache_of in sides.values():  # bytecode compiled, caches filled
        run(argv, cache_of(-1))
    rows: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for n in range(rounds):
        for name in names[n % len(names):] + names[:n % len(names)]:
            argv, cache_of = sides[name]
            rows[name].append(run(argv, cache_of(n)))
    return rows


def report(rows: dict[str, list[float]], unit: float, unit_name: str,
           peers: int = 1) -> None:
    """Medians, then each later row against each of the first ``peers`` rows: the median
    of the paired ratios and of the paired differences."""
    names = list(rows)
    print(f"{'':28} {'median ' + unit_name:>12} {'min ' + unit_name:>10}")
    for name in names:
        print(f"{name:28} {statistics.median(rows[name]) * unit:12.2f} "
              f"{min(rows[name]) * unit:10.2f}")
    for peer in names[:peers]:
        before = rows[peer]
        for name in names[peers:]:
            pairs = list(zip(rows[name], before, strict=True))
            ratio = statistics.median(a / b for a, b in pairs)
            extra = statistics.median(a - b for a, b in pairs)
            print(f"{name} / {peer}: {ratio:.3f}x, {extra * unit:+.2f} {unit_name} "
                  "(medians of the paired rounds)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--captures", type=int, default=7)
    parser.add_argument("--against", metavar="REV", default=BEFORE_RECORDS,
                        help="the commit whose capture is the other peer (default "
                        f"{BEFORE_RECORDS}, the last one before distribution records); the "
                        "first peer is this tree with the records switched off")
    args = parser.parse_args()
    from manifest.probes.env import installed_distributions

    print(f"{len(installed_distributions())} distributions on this interpreter's path")
    print(f"\nenv probe, in process, wall ({args.rounds} paired rounds)")
    report(probe_rounds(args.rounds, _timed), 1e3, "ms")
    print(f"\nenv probe, in process, CPU ({args.rounds} paired rounds)")
    report(probe_rounds(args.rounds, _cpu_timed), 1e3, "ms")
    if args.captures:
        print(f"\nmanifest capture -q of a small repository, CPU (user+sys) "
              f"({args.captures} paired rounds)")
        report(capture_rounds(args.captures, args.against), 1e3, "ms", peers=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
