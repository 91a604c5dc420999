"""Wall time of ``manifest capture`` beside ``python -m torch.utils.collect_env``.

    python benchmarks/capture_latency.py [--runs 7] [--repo PATH] [--check] [--against DIR]

Both commands run as subprocesses from the same interpreter, in the same git
repository (a small throw-away one unless ``--repo`` is given), interleaved
round by round so load on the machine hits them alike; bare ``python -c
pass`` is measured the same way as the floor every Python command pays. Each
command runs once untimed first, so bytecode caches exist (as after any
``pip install``), and ``PYTHONDONTWRITEBYTECODE`` is removed from the
children's environment for the same reason. Reported: median and minimum
wall time of each, the median CPU time (user+sys of the child, less
sensitive to other load on the machine), and collect_env / capture.

``--against DIR`` adds a row: the same capture run from the source tree in
DIR (say ``git archive HEAD manifest | tar -x -C DIR``), the same way and in
the same rounds, so a change is measured against the code before it on the
same load. Both of those rows start through ``python -c`` with that tree
first on ``sys.path`` (what the console script does, less its file lookup).

Target (issue 16): capture <= 0.25 s and >= 12x faster than collect_env.
``--check`` exits 1 when the medians miss it. ``benchmarks/data_hashing.py``
runs this first, so one run prints every row of issue 16's table.
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
from dataclasses import dataclass, field
from pathlib import Path

TARGET_S = 0.25
TARGET_RATIO = 12.0


@dataclass
class Timings:
    label: str
    argv: list[str]
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.wall)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; output discarded, failure raises."""
    cpu0 = _child_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): "
                         f"{proc.stderr.decode(errors='replace').strip()}")
    return wall, _child_cpu() - cpu0


def make_repo(base: Path) -> Path:
    """A small repository like a user's: a few files, one commit, a lockfile."""
    repo = base / "project"
    repo.mkdir()
    ident = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "train.py").write_text("print('train')\n")
    (repo / "model.py").write_text("class Model:\n    pass\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\n")
    (repo / ".gitignore").write_text("*.json\n.manifest/\n")
    subprocess.run(["git", *ident, "add", "."], cwd=repo, check=True)
    subprocess.run(["git", *ident, "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


def capture_argv() -> list[str]:
    script = Path(sys.executable).parent / "manifest"
    if script.exists():
        return [str(script), "capture", "-q"]
    return [sys.executable, "-m", "manifest.cli", "capture", "-q"]


def tree_argv(tree: Path) -> list[str]:
    """``manifest capture -q`` run from the source tree at ``tree``, as the console script does."""
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); "
            "from manifest.cli import main; sys.exit(main())")
    return [sys.executable, "-c", code, "capture", "-q"]


def has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each (>= 5)")
    parser.add_argument("--repo", type=Path, help="repository to capture (default: a temp one)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="also time capture from the source tree in DIR (e.g. an older "
                        "commit's), against this tree's, in the same rounds")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    if args.against is not None and not (args.against / "manifest" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: no manifest package there")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    tmp = Path(tempfile.mkdtemp(prefix="manifest-bench-"))
    try:
        repo = args.repo.resolve() if args.repo else make_repo(tmp)
        commands = [
            Timings("python -c pass", [sys.executable, "-c", "pass"]),
            Timings("manifest capture", capture_argv()),
        ]
        if args.against is not None:
            here = Path(__file__).resolve().parents[1]
            commands += [Timings("capture, this tree (python -c)", tree_argv(here)),
                         Timings(f"capture, {args.against.name} (python -c)",
                                 tree_argv(args.against.resolve()))]
        if has_torch():
            commands.append(Timings("python -m torch.utils.collect_env",
                                    [sys.executable, "-m", "torch.utils.collect_env"]))
        for cmd in commands:  # warm-up: bytecode caches, page cache
            run_once(cmd.argv, repo, env)
        for _ in range(args.runs):
            for cmd in commands:
                wall, cpu = run_once(cmd.argv, repo, env)
                cmd.wall.append(wall)
                cmd.cpu.append(cpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'command':36} {'median':>8} {'min':>8} {'cpu med':>8}   ({args.runs} runs)")
    for cmd in commands:
        print(f"{cmd.label:36} {cmd.median():8.3f} {min(cmd.wall):8.3f} "
              f"{statistics.median(cmd.cpu):8.3f}")
    capture = commands[1].median()
    ok = capture <= TARGET_S
    if args.against is not None:
        mine, theirs = commands[2], commands[3]
        paired = [t / m for m, t in zip(mine.wall, theirs.wall, strict=True)]
        print(f"{theirs.label} / this tree: {statistics.median(paired):.3f} median of the "
              f"{args.runs} paired rounds ({min(paired):.3f}-{max(paired):.3f}); CPU "
              f"{statistics.median(theirs.cpu) / statistics.median(mine.cpu):.3f}")
    if commands[-1].label.startswith("python -m torch"):
        ratio = commands[-1].median() / capture
        ok = ok and ratio >= TARGET_RATIO
        print(f"collect_env / capture: {ratio:.1f}x (target >= {TARGET_RATIO:.0f}x)")
    else:
        print("collect_env: torch is not installed, not measured")
    print(f"capture median {capture:.3f} s (target <= {TARGET_S} s): {'met' if ok else 'MISSED'}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
