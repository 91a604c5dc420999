"""What ``verify --on ray`` costs over a local verify of the same run, paired (issue 23).

Starts a Ray head on 127.0.0.1 (2 CPUs, private temp dir, stopped at the end),
captures the bundled example (``examples/train.py``, uncommitted change so the
patch travels) and runs ``verify`` locally and ``verify --on ray`` alternately
``--pairs`` times. Prints the median wall time of each, the paired overhead, the
submit-to-result time the report gives, and the bytes shipped and returned
against the checkpoint's size.

    python benchmarks/cluster_overhead.py --pairs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from tests.runs import capture, make_repo, manifest_cli
    from tests.test_cluster_ray import ray_address

    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", {})
        (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# uncommitted\n")
        manifest, doc = capture(repo, command=["python", "train.py", "--steps", str(args.steps)])
        checkpoint = sum((repo / a["path"]).stat().st_size for a in doc["outputs"]["artifacts"])
        head = ray_address.__wrapped__()  # type: ignore[attr-defined]
        address = next(head)
        try:
            local: list[float] = []
            ray: list[float] = []
            reported: list[float] = []
            job: dict[str, object] = {}
            for _ in range(args.pairs):
                for on in ("local", "ray"):
                    extra = ["--on", "ray", "--address", address] if on == "ray" else []
                    started = time.perf_counter()
                    proc = manifest_cli("verify", str(manifest), "--json", *extra, cwd=repo)
                    wall = time.perf_counter() - started
                    report = json.loads(proc.stdout)
                    assert report["verdict"] == "identical", proc.stderr.decode()
                    (ray if on == "ray" else local).append(wall)
                    if on == "ray":
                        job = report["job"]
                        reported.append(float(job["submit_to_result_s"]))  # type: ignore[arg-type]
        finally:
            next(head, None)
    diffs = [r - lo for r, lo in zip(ray, local, strict=True)]
    print(f"pairs: {args.pairs}, example: {args.steps} steps")
    print(f"local verify median: {statistics.median(local):.2f} s")
    print(f"verify --on ray median: {statistics.median(ray):.2f} s")
    print(f"paired overhead median: {statistics.median(diffs):.2f} s "
          f"(min {min(diffs):.2f}, max {max(diffs):.2f})")
    print(f"submit -> result (report) median: {statistics.median(reported):.2f} s")
    print(f"bytes shipped: {job['bytes_shipped']}, returned: {job['bytes_returned']}, "
          f"checkpoint: {checkpoint}")


if __name__ == "__main__":
    main()
