"""Pack, sign and verify cost, each beside a peer measured in the same run.

Two runs: the bundled example (``examples/train.py``, dirty tree) and a
snapshot with a 10,000-file dataset (its listing blob is the pack's bulk).
Peers: ``manifest show`` of the same manifest (the same interpreter start-up,
pydantic import and validation: what is left is the pack's own work) and
``tar czf`` of the same manifest and blobs (a pack that checks nothing, for
time and size); ``show`` of the unsigned manifest beside the signed one; and
``model_signing sign key`` / ``verify key`` of the same weights (the OMS
reference tool) beside ``manifest attest --oms``.
Medians of N runs.

    python benchmarks/travel_speed.py [--runs 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]
MANIFEST = [sys.executable, "-m", "manifest"]


def run(cmd: list[str], cwd: Path) -> bytes:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True).stdout


def median_wall(cmd: list[str], cwd: Path, runs: int) -> float:
    run(cmd, cwd)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(cmd, cwd)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_key(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "key.pem", folder / "key.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def setup(base: Path) -> tuple[Path, Path]:
    example = base / "example"
    example.mkdir()
    shutil.copy(REPO / "examples" / "train.py", example / "train.py")
    (example / ".gitignore").write_text("out/\n*.json\n*.mfpack\n*.sig\n*.tgz\n*.jsonl\n")
    run([*GIT, "init", "-q"], example)
    run([*GIT, "add", "-A"], example)
    run([*GIT, "commit", "-q", "-m", "example"], example)
    (example / "train.py").write_text((example / "train.py").read_text() + "# edit\n")
    (example / "run.json").write_bytes(run(
        [*MANIFEST, "capture", "-q", "--seed", "0", "--artifact", "out/*.safetensors", "--",
         sys.executable, "train.py"], example))

    dataset = base / "dataset"
    (dataset / "data").mkdir(parents=True)
    for i in range(10_000):
        sub = dataset / "data" / f"{i // 1000:02d}"
        sub.mkdir(exist_ok=True)
        (sub / f"{i:05d}.txt").write_bytes(os.urandom(256))
    (dataset / ".gitignore").write_text("data/\n*.json\n*.mfpack\n*.sig\n*.tgz\n")
    run([*GIT, "init", "-q"], dataset)
    run([*GIT, "commit", "-q", "--allow-empty", "-m", "empty"], dataset)
    (dataset / "run.json").write_bytes(run([*MANIFEST, "capture", "-q", "--data", "data"],
                                           dataset))
    return example, dataset


def blob_paths(repo: Path) -> list[str]:
    doc = json.loads((repo / "run.json").read_bytes())
    names = [doc["code"]["diff_digest"], *(d["listing"] for d in doc["data"])]
    return [".manifest/blobs/" + n.replace(":", "-") for n in names if n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build the fixtures here and keep them")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="travel-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        example, dataset = setup(base)
        private, public = make_key(base)
        print(f"{'case':<34} {'manifest':>12} {'peer':>12} {'ratio':>7}")
        for name, repo in (("bundled example", example), ("10,000-file dataset", dataset)):
            pack = [*MANIFEST, "pack", "run.json", "-o", "run.mfpack"]
            tar = ["tar", "czf", "run.tgz", "run.json", *blob_paths(repo)]
            show = [*MANIFEST, "show", "run.json"]
            a, b = median_wall(pack, repo, args.runs), median_wall(show, repo, args.runs)
            c = median_wall(tar, repo, args.runs)
            print(f"{'pack ' + name + ' vs show (s)':<34} {a:>12.3f} {b:>12.3f} {a / b:>7.2f}")
            print(f"{'  vs tar czf (s)':<34} {a:>12.3f} {c:>12.3f} {a / c:>7.2f}")
            size, tsize = (repo / "run.mfpack").stat().st_size, (repo / "run.tgz").stat().st_size
            print(f"{'  size (bytes), vs tar.gz':<34} {size:>12,} {tsize:>12,} "
                  f"{size / tsize:>7.2f}")
        sign = [*MANIFEST, "sign", "run.json", "--key", str(private)]
        a = median_wall(sign, example, args.runs)
        print(f"{'sign --key (s)':<34} {a:>12.3f}")
        home = base / "home"
        (home / "manifest").mkdir(parents=True, exist_ok=True)
        (home / "manifest" / "trust.toml").write_text(f'keys = ["{public}"]\n')
        os.environ["XDG_CONFIG_HOME"] = str(home)
        show = [*MANIFEST, "show", "run.json"]
        a = median_wall(show, example, args.runs)
        (example / "run.json.sig").rename(example / "keep.sig")
        b = median_wall(show, example, args.runs)
        (example / "keep.sig").rename(example / "run.json.sig")
        print(f"{'show, signed vs unsigned (s)':<34} {a:>12.3f} {b:>12.3f} {a / b:>7.2f}")
        attest = [*MANIFEST, "attest", "run.json", "--key", str(private), "-o", "a.jsonl",
                  "--oms", "model.sig"]
        ms_sign = [sys.executable, "-m", "model_signing", "sign", "key",
                   "out/model.safetensors", "--signature", "ref.sig", "--private_key",
                   str(private)]
        a, b = median_wall(attest, example, args.runs), median_wall(ms_sign, example, args.runs)
        print(f"{'attest --oms vs model_signing sign':<34} {a:>12.3f} {b:>12.3f} {a / b:>7.2f}")
        ms_verify = [sys.executable, "-m", "model_signing", "verify", "key",
                     "out/model.safetensors", "--signature", "model.sig", "--public_key",
                     str(public)]
        b = median_wall(ms_verify, example, args.runs)
        print(f"{'model_signing verify of ours (s)':<34} {'':>12} {b:>12.3f}")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
