"""Launcher overhead: `manifest capture -- CMD` vs the bare CMD, for processes that import torch.

Prints the median of N wall-clock runs of each, and the ratio. Two commands:
``python -c "import torch"`` (the worst case: start-up is all there is) and
the bundled example's training (a real, if small, run).

    python benchmarks/launcher_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def median_of(cmd: list[str], cwd: Path, runs: int) -> float:
    wall(cmd, cwd)  # warm the page cache
    return statistics.median(wall(cmd, cwd) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cases = {
            "import torch": [py, "-c", "import torch"],
            "example training": [py, str(REPO / "examples" / "train.py"), "--out", str(out)],
        }
        print(f"{'command':<18} {'bare s':>8} {'capture s':>10} {'ratio':>7}")
        for name, cmd in cases.items():
            bare = median_of(cmd, REPO, args.runs)
            captured = median_of([py, "-m", "manifest", "capture", "-q", "--", *cmd], REPO,
                                 args.runs)
            print(f"{name:<18} {bare:>8.3f} {captured:>10.3f} {captured / bare:>7.2f}x")


if __name__ == "__main__":
    main()
