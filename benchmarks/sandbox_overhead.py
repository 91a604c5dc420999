"""What confinement costs: ``manifest verify``, ``explain`` and ``lab`` of the bundled
example, confined by bubblewrap, against the same verb with ``--no-sandbox``,
measured in the same run, interleaved (A, B, A, B …) so drift on a shared
machine hits both. Every verb re-runs through the one engine
(``manifest.rerun``), so the same two executors are compared for each.

Both sides do the same work (integrity, drift probes, scratch clone, re-run,
compare); the confined one adds starting bwrap and building its mount
namespace. Prints the median of N of each and the ratio, then the cost of the
sandbox alone: ``bwrap <verify's options> -- python -c pass`` against
``python -c pass``.

Measured here (2 cores, load average ~1.5, 20 steps, 3 pairs): verify 3.389 s
confined vs 3.348 s unconfined (1.01x), explain 5.790 vs 5.913 s (0.98x), lab
--runs 1 9.236 vs 9.688 s (0.95x): confinement is within the noise for every
verb; bwrap's start-up +4 ms, the keeper's +18 ms.

On a loaded machine the confined verify can come out *faster*: bwrap's
``--new-session`` puts the re-run in its own session, and with the kernel's
autogroup scheduling a new session gets its own share of the CPUs. Measured
here (2 cores, load average 12): confined 32.1 s, unconfined 68.4 s, median
of 7 pairs; the sandbox's own start-up is 16 ms (0.043 s vs 0.027 s, median
of 20). Quote the start-up figure as the overhead.

The unconfined side runs under the keeper (``manifest/rerun/_guard.py``); its own
start-up is printed last: ``python -I -S _guard.py -- python -c pass`` against
``python -c pass``.

    python benchmarks/sandbox_overhead.py [--runs 7] [--verbs verify,explain,lab]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]


def wall(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--verbs", default="verify,explain,lab")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per training")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from manifest.rerun.sandbox import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"no sandbox on this machine ({reason}); nothing to compare")
        return
    with tempfile.TemporaryDirectory(prefix="manifest-bench-sandbox-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        shutil.copy(REPO / "examples" / "train.py", repo / "train.py")
        (repo / ".gitignore").write_text("out/\n*.json\n")
        subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-qm", "bench"], cwd=repo, check=True)
        py = sys.executable
        train = ["python", "train.py", "--steps", str(args.steps)]
        cap = subprocess.run([py, "-m", "manifest", "capture", "-q", "--artifact",
                              "out/*.safetensors", "--", *train], cwd=repo,
                             check=True, capture_output=True)
        (repo / "run.json").write_bytes(cap.stdout)
        verbs = {
            "verify": [py, "-m", "manifest", "verify", "-q", "run.json"],
            # No --threads: A and B agree, so explain makes its two locating runs.
            "explain": [py, "-m", "manifest", "explain", "run.json"],
            "lab": [py, "-m", "manifest", "lab", "-q", "--runs", "1", "--artifact",
                    "out/*.safetensors", "--", *train],
        }
        for verb in args.verbs.split(","):
            base = verbs[verb]
            wall(base, repo)  # warm the page cache for both sides
            confined: list[float] = []
            open_: list[float] = []
            for _ in range(args.runs):
                confined.append(wall(base, repo))
                open_.append(wall([*base[:4], "--no-sandbox", *base[4:]], repo))
            a, b = statistics.median(confined), statistics.median(open_)
            print(f"{verb}, confined (bubblewrap)  {a:8.3f} s  median of {args.runs} "
                  f"(min {min(confined):.3f}, max {max(confined):.3f})")
            print(f"{verb} --no-sandbox            {b:8.3f} s  median of {args.runs} "
                  f"(min {min(open_):.3f}, max {max(open_):.3f})")
            ratios = sorted(x / y for x, y in zip(confined, open_, strict=True))
            print(f"{verb}: ratio confined / unconfined {a / b:6.3f}x (+{a - b:.3f} s); "
                  f"paired ratios {', '.join(f'{r:.3f}' for r in ratios)}")
        from manifest.rerun.sandbox import SandboxSpec, wrap

        spec = SandboxSpec(scratch=repo, mount_at=repo)
        bare = [py, "-c", "pass"]
        boxed = wrap(spec, bare, repo)
        starts = [(wall(boxed, repo), wall(bare, repo)) for _ in range(max(20, args.runs))]
        sa = statistics.median(x for x, _ in starts)
        sb = statistics.median(y for _, y in starts)
        print(f"sandbox start-up: bwrap + python -c pass {sa:.3f} s vs python -c pass "
              f"{sb:.3f} s (+{(sa - sb) * 1000:.0f} ms, median of {len(starts)})")
        from manifest.rerun.executor import GUARD

        kept = [py, "-I", "-S", str(GUARD), "--", *bare]
        guarded = [(wall(kept, repo), wall(bare, repo)) for _ in range(max(20, args.runs))]
        ga = statistics.median(x for x, _ in guarded)
        gb = statistics.median(y for _, y in guarded)
        print(f"keeper start-up: _guard.py + python -c pass {ga:.3f} s vs python -c pass "
              f"{gb:.3f} s (+{(ga - gb) * 1000:.0f} ms, median of {len(guarded)})")


if __name__ == "__main__":
    main()
