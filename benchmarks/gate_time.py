"""The gate's cost on the bundled example: wall time vs twice the bare training.

The gate trains twice (capture, then the re-run in a scratch clone), so the
fair yardstick is two bare runs of the same smoke command with the same
thread count. The ratio is gate / (2 × bare); the rest is probes, data
digests, the scratch clone, the tensor compare and the baseline diff.
Medians of N runs each, in a fresh git repository holding a copy of
``examples/gate_repo`` with its baseline recorded there.

    python benchmarks/gate_time.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gate_repo"
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]


def wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("out", ".manifest"))
        (repo / "manifests" / "baseline.json").unlink(missing_ok=True)
        subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "example"], cwd=repo, check=True)
        env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
        gate = [sys.executable, "-m", "manifest", "gate", "-q"]
        wall([*gate, "--update-baseline"], repo, env)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "baseline"], cwd=repo, check=True)

        config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["manifest"]
        command = [sys.executable if a == "python" else a for a in config["gate"]["command"]]
        threads = str(config["threads"])
        bare_env = dict(env, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        wall(command, repo, bare_env)  # warm the file cache
        bare = [wall(command, repo, bare_env) for _ in range(args.runs)]
        gated = [wall(gate, repo, env) for _ in range(args.runs)]
    b, g = statistics.median(bare), statistics.median(gated)
    print(f"smoke command: {' '.join(config['gate']['command'])} (threads {threads})")
    print(f"bare training, median of {args.runs}: {b:.2f} s   "
          f"(runs: {', '.join(f'{x:.2f}' for x in bare)})")
    print(f"manifest gate, median of {args.runs}: {g:.2f} s   "
          f"(runs: {', '.join(f'{x:.2f}' for x in gated)})")
    print(f"gate / (2 × bare) = {g / (2 * b):.2f}")


if __name__ == "__main__":
    main()
