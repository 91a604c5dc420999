"""What ``verify --segments`` costs against a full re-run, and what it catches.

    python benchmarks/segments.py cost [--steps 300] [--every 30] [--segments 3] [--rounds 1]
                                      [--on slurm|ray [--address URL]]
    python benchmarks/segments.py detect [--steps 100] [--every 10] [--trials 20]

Both use the bundled example (``examples/train.py``: ``--save-every``,
``--resume``) in a throw-away git repository with ``[tool.manifest] resume``.

``cost``: one capture, then a full ``verify`` and ``verify --segments N`` of the
same manifest, interleaved round by round (paired: the same machine load hits
both). Reported: each wall time, their ratio, and the share of steps the
segments replayed; the claim is ratio <= share + fixed start-up per segment.
With ``--on``, the same ``--segments N`` also runs as one cluster job per stretch
(SLURM through ``sbatch`` when it is on PATH, else submitit's local executor;
Ray at ``--address``), in the same rounds: its wall time against the local,
one-after-another replay is the gain of running stretches side by side.

``detect``: each trial captures the run with one silent fault, a weight moved by
one ULP before the optimizer step drawn uniformly from 1..steps (``NUDGE_AT``,
outside the recorded identity), then runs ``verify --segments N``, whose stretches
are drawn from a fresh nonce each time (``manifest.verify.stretches``). Reported: how many
trials said ``differs``, against the report's own ``p_catch_single_bad_step``, and
whether every fault inside a replayed stretch was caught at its own step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUDGE = """        if os.environ.get("NUDGE_AT") == str(step + 1):
            with torch.no_grad():  # a silent fault: one weight moved by one ULP
                model.fc.bias[0] = torch.nextafter(model.fc.bias[0], torch.tensor(1e9))
        opt.step()
"""


def _repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    text = (REPO / "examples" / "train.py").read_text().replace("        opt.step()\n", NUDGE)
    (repo / "train.py").write_text(text)
    (repo / ".gitignore").write_text("out/\n*.json\n")
    (repo / "pyproject.toml").write_text('[tool.manifest]\nresume = "--resume {checkpoint}"\n')
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "bench"], cwd=repo, check=True)
    return repo


def _manifest(*args: str, cwd: Path, env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if k != "NUDGE_AT"}
    full.update(env or {})
    out = subprocess.run([sys.executable, "-m", "manifest", *args], cwd=cwd, env=full,
                         capture_output=True)
    if check and out.returncode not in (0, 1):
        raise SystemExit(f"manifest {' '.join(args)} failed ({out.returncode}):\n"
                         + out.stderr.decode()[-3000:])
    return out


def _capture(repo: Path, steps: int, every: int, nudge: int | None = None) -> None:
    env = {"NUDGE_AT": str(nudge)} if nudge else {}
    out = _manifest("capture", "--seed", "0", "--artifact", "out/*.safetensors", "--",
                    "python", "train.py", "--steps", str(steps), "--save-every", str(every),
                    cwd=repo, env=env)
    (repo / "run.json").write_bytes(out.stdout)


def cost(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        began = time.monotonic()
        _capture(repo, args.steps, args.every)
        capture_s = time.monotonic() - began
        full_s: list[float] = []
        seg_s: list[float] = []
        on_s: list[float] = []
        share = None
        if args.on == "slurm":
            folder = Path(tmp) / "slurm"
            local = "false" if shutil.which("sbatch") else "true"
            with open(repo / "pyproject.toml", "a") as f:
                f.write(f"[tool.manifest.executors.slurm]\nfolder = {json.dumps(str(folder))}\n"
                        f"local = {local}\ntime_min = 60\n")
        for _ in range(args.rounds):
            began = time.monotonic()
            out = _manifest("verify", "--trust", "run.json", cwd=repo)
            full_s.append(time.monotonic() - began)
            assert out.returncode == 0, out.stdout.decode()
            began = time.monotonic()
            out = _manifest("verify", "--trust", "run.json", "--segments", str(args.segments),
                            "--format", "json", cwd=repo)
            seg_s.append(time.monotonic() - began)
            doc = json.loads(out.stdout)
            assert doc["verdict"] == "identical", doc
            share = doc["share_checked"]
            if args.on:
                where = ["--address", args.address] if args.address else []
                began = time.monotonic()
                out = _manifest("verify", "--trust", "run.json", "--segments",
                                str(args.segments), "--format", "json", "--on", args.on,
                                *where, cwd=repo)
                on_s.append(time.monotonic() - began)
                there = json.loads(out.stdout)
                assert there["verdict"] == "identical", there
        print(json.dumps({"steps": args.steps, "every": args.every, "segments": args.segments,
                          "capture_s": round(capture_s, 1),
                          "full_verify_s": [round(x, 1) for x in full_s],
                          "segments_verify_s": [round(x, 1) for x in seg_s],
                          "ratio": [round(s / f, 3) for s, f in zip(seg_s, full_s, strict=True)],
                          "share_checked": share,
                          **({f"segments_on_{args.on}_s": [round(x, 1) for x in on_s],
                              f"on_{args.on}_vs_local_segments": [
                                  round(o / s, 3) for o, s in zip(on_s, seg_s, strict=True)]}
                             if args.on else {})}, indent=2))


def detect(args: argparse.Namespace) -> None:
    draw = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        for trial in range(args.trials):
            bad = draw.randint(1, args.steps)
            _capture(repo, args.steps, args.every, nudge=bad)
            out = _manifest("verify", "--trust", "run.json", "--segments", str(args.segments),
                            "--format", "json", cwd=repo)
            doc = json.loads(out.stdout)
            covered = any(s["start"] < bad <= s["end"] for s in doc["segments"])
            first = [s["first_divergent_step"] for s in doc["segments"]
                     if s["first_divergent_step"] is not None]
            rows.append({"trial": trial, "bad_step": bad, "covered": covered,
                         "verdict": doc["verdict"], "first_divergent": first})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    caught = sum(r["verdict"] == "differs" for r in rows)
    exact = all((r["verdict"] == "differs") == r["covered"]
                and (not r["covered"] or r["first_divergent"] == [r["bad_step"]]) for r in rows)
    print(json.dumps({"steps": args.steps, "every": args.every, "segments": args.segments,
                      "trials": len(rows), "caught": caught, "rate": caught / len(rows),
                      "p_catch_single_bad_step": doc["p_catch_single_bad_step"],
                      "caught_exactly_the_covered_ones_at_their_step": exact}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name, steps, every in (("cost", 300, 30), ("detect", 100, 10)):
        p = sub.add_parser(name)
        p.add_argument("--steps", type=int, default=steps)
        p.add_argument("--every", type=int, default=every)
        p.add_argument("--segments", type=int, default=3)
        p.add_argument("--rounds", type=int, default=1)
        p.add_argument("--trials", type=int, default=20)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--on", choices=("slurm", "ray"), default=None)
        p.add_argument("--address", default=None, help="Ray: the Jobs API address")
    args = parser.parse_args()
    cost(args) if args.what == "cost" else detect(args)


if __name__ == "__main__":
    main()
