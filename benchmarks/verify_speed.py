"""Verify's cost: wall time vs the bare training, and tensor-compare throughput.

1. ``manifest verify`` of a captured run of the bundled example vs running the
   bare training command (median of N each; ratio). Verify includes the
   integrity check, drift probes, a scratch clone, the re-run and the compare.
2. Tensor compare on a ~500 MB safetensors checkpoint: digest both files
   tensor by tensor and compare the tables (what verify does), in GB/s of
   checkpoint bytes per file pair, beside the peer ``safetensors.torch.load_file``
   of both files + ``torch.equal`` per tensor, measured in the same run.

    python benchmarks/verify_speed.py [--runs 5] [--mb 500]
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


def verify_vs_bare(runs: int, tmp: Path) -> None:
    repo = tmp / "repo"
    repo.mkdir()
    shutil.copy(REPO / "examples" / "train.py", repo / "train.py")
    (repo / ".gitignore").write_text("out/\n*.json\n")
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "bench"], cwd=repo, check=True)
    py = sys.executable
    cap = subprocess.run([py, "-m", "manifest", "capture", "-q", "--artifact", "out/*.safetensors",
                          "--", "python", "train.py"], cwd=repo, check=True,
                         capture_output=True)
    (repo / "run.json").write_bytes(cap.stdout)
    bare = statistics.median(wall([py, "train.py"], repo) for _ in range(runs))
    ver = statistics.median(wall([py, "-m", "manifest", "verify", "-q", "run.json"], repo)
                            for _ in range(runs))
    print(f"bare training      {bare:8.3f} s (median of {runs})")
    print(f"manifest verify    {ver:8.3f} s (median of {runs})")
    print(f"ratio              {ver / bare:8.2f}x")


def compare_throughput(mb: int, tmp: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from manifest.weights.compare import compare_artifacts
    from manifest.weights.tables import digest_artifact

    n_tensors = 20
    per = mb * 2**20 // 4 // n_tensors
    torch.manual_seed(0)
    tensors = {f"layer{i}.weight": torch.randn(per) for i in range(n_tensors)}
    a, b = tmp / "a.safetensors", tmp / "b.safetensors"
    save_file(tensors, str(a))
    tensors["layer7.weight"][123] += 1e-3
    save_file(tensors, str(b))
    del tensors
    size = a.stat().st_size
    for f in (a, b):
        f.read_bytes()  # page cache warm for both contenders

    def ours() -> None:
        da, db = digest_artifact(a, "m"), digest_artifact(b, "m")
        delta = compare_artifacts(da, db, recorded_file=a, new_file=b)
        assert [t.name for t in delta.tensors] == ["layer7.weight"]

    def peer() -> None:
        ta, tb = load_file(str(a)), load_file(str(b))
        assert [k for k in ta if not torch.equal(ta[k], tb[k])] == ["layer7.weight"]

    for name, fn in (("manifest digest+compare", ours), ("load_file+torch.equal", peer)):
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
        print(f"{name:<26} {t:7.3f} s  {2 * size / t / 1e9:6.2f} GB/s (both files, "
              f"{size / 1e6:.0f} MB each)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--skip-verify", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_verify:
            verify_vs_bare(args.runs, Path(tmp))
        compare_throughput(args.mb, Path(tmp))


if __name__ == "__main__":
    main()
