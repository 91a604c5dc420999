"""Wall time of the whole ``manifest diff`` command on two large manifests.

Two manifests with 1,000 installed packages and 10,000 tensors each, in two
cases:

* ``rerun``: 5 package versions and 100 tensors differ (a typical
  "what changed since last week" question);
* ``seed``: the seed differs, so every one of the 10,000 tensors differs
  (the largest table the diff can be asked for).

Each command runs as a fresh process (interpreter start-up, imports, reading,
validating and digest-checking both files, diffing, rendering), the way a
user or CI job runs it. Peers measured in the same run, on the same files:
``python -c pass`` (start-up alone) and a plain ``json.load`` of both files in
a fresh interpreter. The figure to read is the median; the target is < 0.5 s.

    python benchmarks/diff_speed.py [--repeat 7]
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
from typing import Any

import blake3

from manifest.canonical import dumps, seal, to_document

PACKAGES = 1_000
TENSORS = 10_000


def d(label: str) -> str:
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def big_manifest(seed: int, changed_packages: int, changed_tensors: int) -> bytes:
    fingerprints = {"python": d(f"py{seed}"), "numpy": d(f"np{seed}"),
                    "torch_cpu": d(f"cpu{seed}"), "cuda": []}
    packages = {f"package-{i:04d}": "1.0.0" for i in range(PACKAGES)}
    for i in range(changed_packages):
        packages[f"package-{i:04d}"] = "1.0.1"
    tensors = {
        f"blocks.{i // 10}.layer{i % 10}.weight": {
            "dtype": "float32", "shape": [256, 256],
            "digest": d(f"w{i}:{'b' if i < changed_tensors else 'a'}"),
        }
        for i in range(TENSORS)
    }
    doc: dict[str, Any] = {
        "schema": "manifest/v1",
        "code": {"commit": "0" * 40, "dirty": False, "diff_digest": None, "untracked_files": 0,
                 "submodules": [], "shallow": False, "detached": False, "lockfiles": {}},
        "data": [{"name": "corpus", "path": "data", "root": d("corpus"), "files": 100,
                  "bytes": 10**9}],
        "env": {"python": "3.11.9", "implementation": "CPython", "torch": "2.4.0",
                "torch_cuda": None, "torch_hip": None, "torch_git": None, "numpy": "1.26.4",
                "cuda_runtime": None, "cuda_driver": None, "cudnn": None, "nccl": None,
                "blas": "mkl", "packages": packages,
                "packages_digest": d(f"packages{changed_packages}"),
                "container": {"runtime": None, "image_digest": None, "source": None},
                "variables": {"OMP_NUM_THREADS": "2"}},
        "hardware": {"gpus": None, "gpu_count": 0, "gpu_driver": None, "cpu_model": "CPU",
                     "cpu_isa": ["avx2"]},
        "randomness": {"seed": seed, "derivation": "same",
                       "processes": [{"rank": 0, "seed": seed, "at_start": fingerprints}]},
        "determinism": {"requested": True, "num_threads": 2, "cublas_workspace_config": None,
                        "pythonhashseed": "0"},
        "command": {"argv": ["python", "train.py"], "cwd": ".", "outputs": ["model.safetensors"],
                    "datasets": ["corpus"]},
        "outputs": {"status": "ok", "exit_code": 0,
                    "artifacts": [{"path": "model.safetensors", "digest": d(f"f{changed_tensors}"),
                                   "bytes": TENSORS * 256 * 256 * 4, "format": "safetensors",
                                   "tensors": tensors}]},
        "observed": {"tool_version": "0.1.0", "started_at": "2025-01-01T00:00:00Z",
                     "finished_at": "2025-01-01T01:00:00Z", "duration_s": 3600.0,
                     "hostname_hash": None, "branch": None, "remote_url": None, "store": None,
                     "logical_cpus": 2},
    }
    # Sealed twice: seal() names the dict it is given, which leaves out the
    # fields filled by defaults; the second pass names the full document.
    return dumps(seal(to_document(seal(doc))))


def diff_command() -> list[str]:
    script = Path(sys.executable).with_name("manifest")
    if script.is_file():
        return [str(script), "diff"]
    found = shutil.which("manifest")
    return [found, "diff"] if found else [sys.executable, "-m", "manifest.cli", "diff"]


def wall(argv: list[str], repeat: int, expect: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()}")
    return times


BREAKDOWN = """
import sys, time
t0 = time.perf_counter()
from manifest.canonical import load_manifest
from manifest.diff.engine import diff_manifests
from manifest.cli.render_diff import render_diff
import rich.console, rich.table
t1 = time.perf_counter()
blobs = [open(p, "rb").read() for p in sys.argv[1:3]]
for blob in blobs:
    load_manifest(blob, verify=False)
t2 = time.perf_counter()
a, b = (load_manifest(blob) for blob in blobs)
t3 = time.perf_counter()
result = diff_manifests(a, b)
t4 = time.perf_counter()
with open("/dev/null", "w") as sink:
    render_diff(result, a_file="a", b_file="b", file=sink)
t5 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {(t3 - t2) - (t2 - t1):.3f} {t4 - t3:.3f} {t5 - t4:.3f}")
"""


def breakdown(a: str, b: str) -> str:
    """Where one run's time goes: imports, parse+validate, digest check, diff, table."""
    out = subprocess.run([sys.executable, "-c", BREAKDOWN, a, b], capture_output=True,
                         text=True, check=True).stdout.split()
    names = ("imports", "parse+validate", "digest/run_id check", "diff", "table")
    return ", ".join(f"{n} {float(t):.3f}" for n, t in zip(names, out, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description="manifest diff wall time")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        files = {
            "a": big_manifest(seed=42, changed_packages=0, changed_tensors=0),
            "rerun": big_manifest(seed=42, changed_packages=5, changed_tensors=100),
            "seed": big_manifest(seed=43, changed_packages=0, changed_tensors=TENSORS),
        }
        for name, data in files.items():
            (base / f"{name}.json").write_bytes(data)
        a = str(base / "a.json")
        size = len(files["a"]) / 1e6
        print(f"{PACKAGES} packages, {TENSORS} tensors, {size:.1f} MB per manifest; "
              f"median of {args.repeat} fresh processes on {sys.platform}, "
              f"python {sys.version.split()[0]}")
        peer_start = statistics.median(wall([sys.executable, "-c", "pass"], args.repeat, 0))
        load = ("import json,sys\nfor p in sys.argv[1:]:\n    json.load(open(p, 'rb'))")
        peer_json = statistics.median(
            wall([sys.executable, "-c", load, a, str(base / "rerun.json")], args.repeat, 0))
        print(f"  peer  python -c pass                     {peer_start:6.3f} s")
        print(f"  peer  python json.load of both files     {peer_json:6.3f} s")
        for case in ("rerun", "seed"):
            b = str(base / f"{case}.json")
            for extra in ([], ["--json"]):
                argv = [*diff_command(), a, b, *extra]
                times = wall(argv, args.repeat, 1)
                med = statistics.median(times)
                label = f"manifest diff ({case}{', --json' if extra else ''})"
                print(f"  {label:40s} {med:6.3f} s (min {min(times):.3f})  = "
                      f"{med / peer_json:4.1f}x json.load peer, {med / peer_start:4.1f}x start-up"
                      f"  [{'under' if med < 0.5 else 'OVER'} the 0.5 s target]")
            print(f"    in-process, {case}: {breakdown(a, b)} s")


if __name__ == "__main__":
    main()
