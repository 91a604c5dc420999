"""What confinement costs: ``manifest verify`` of the bundled example, confined
by bubblewrap, against the same verify with ``--no-sandbox``, measured in the
same run, interleaved (A, B, A, B …) so drift on a shared machine hits both.

Both sides do the same work (integrity, drift probes, scratch clone, re-run,
compare); the confined one adds starting bwrap and building its mount
namespace. Prints the median of N of each and the ratio, then the cost of the
sandbox alone: ``bwrap <verify's options> -- python -c pass`` against
``python -c pass``.

On a loaded machine the confined verify can come out *faster*: bwrap's
``--new-session`` puts the re-run in its own session, and with the kernel's
autogroup scheduling a new session gets its own share of the CPUs. Measured
here (2 cores, load average 12): confined 32.1 s, unconfined 68.4 s, median
of 7 pairs; the sandbox's own start-up is 16 ms (0.043 s vs 0.027 s, median
of 20). Quote the start-up figure as the overhead.

    python benchmarks/sandbox_overhead.py [--runs 7]
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
        cap = subprocess.run([py, "-m", "manifest", "capture", "-q", "--artifact",
                              "out/*.safetensors", "--", "python", "train.py"], cwd=repo,
                             check=True, capture_output=True)
        (repo / "run.json").write_bytes(cap.stdout)
        confined: list[float] = []
        open_: list[float] = []
        base = [py, "-m", "manifest", "verify", "-q", "run.json"]
        wall(base, repo)  # warm the page cache for both sides
        for _ in range(args.runs):
            confined.append(wall(base, repo))
            open_.append(wall([*base, "--no-sandbox"], repo))
        a, b = statistics.median(confined), statistics.median(open_)
        print(f"verify, confined (bubblewrap)  {a:8.3f} s  median of {args.runs} "
              f"(min {min(confined):.3f}, max {max(confined):.3f})")
        print(f"verify --no-sandbox            {b:8.3f} s  median of {args.runs} "
              f"(min {min(open_):.3f}, max {max(open_):.3f})")
        print(f"ratio confined / unconfined    {a / b:8.3f}x  (+{a - b:.3f} s)")
        from manifest.rerun.sandbox import SandboxSpec, wrap

        spec = SandboxSpec(scratch=repo, mount_at=repo)
        bare = [py, "-c", "pass"]
        boxed = wrap(spec, bare, repo)
        starts = [(wall(boxed, repo), wall(bare, repo)) for _ in range(max(20, args.runs))]
        sa = statistics.median(x for x, _ in starts)
        sb = statistics.median(y for _, y in starts)
        print(f"sandbox start-up: bwrap + python -c pass {sa:.3f} s vs python -c pass "
              f"{sb:.3f} s (+{(sa - sb) * 1000:.0f} ms, median of {len(starts)})")


if __name__ == "__main__":
    main()
