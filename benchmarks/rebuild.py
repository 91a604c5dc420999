"""A rebuilt, proven environment against uv alone on the same list, cold and warm.

    python benchmarks/rebuild.py [--manifest RUN.json] [--rounds 3]
                                 [--find-links DIR]... [--index-url URL]...

The environment is the bundled example's: ``examples/train.py`` captured in a scratch git
repository (or ``--manifest``), whose imported distributions (torch 2.13.0+cpu, numpy,
safetensors …) ``manifest env build`` rebuilds. Sources default to this machine's
wheelhouse (``/opt/wheels``, where the torch wheel lies) and its file:// simple indexes
(``/opt/pypi/simple``, ``/opt/pypi-more/simple``), where they exist, then PyPI: nothing is
fetched from the network but what those lack (nvidia-ml-py, from PyPI, on both sides).

Each round, in alternating order so load on the machine hits both sides alike:

* **cold**: ``manifest env build`` with an empty cache (an empty ``XDG_CACHE_HOME``: uv's
  cache and the environment cache both empty), against ``uv venv`` + ``uv pip install
  --no-deps --link-mode copy name==version …`` from the same sources with an empty uv
  cache: the same files unpacked, without locating, hashing and proving;
* **warm**: the same two again on their warm caches (``manifest env build`` finds its venv
  by key and checks it; uv alone builds a new venv from its cache).

Printed: each side's median wall time and the median of the paired ratios
(manifest / uv). Goal: within 1.5x of uv cold, <= 2 s warm.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

DEFAULT_LINKS = ["/opt/wheels"]
DEFAULT_INDEXES = ["/opt/pypi/simple", "/opt/pypi-more/simple"]
PYPI = "https://pypi.org/simple"
"""Last: what the local indexes lack (nvidia-ml-py, which the example imports through
manifest's own NVML probe)."""


def _capture(work: Path) -> Path:
    repo = work / "example"
    repo.mkdir()
    shutil.copy2(HERE / "examples" / "train.py", repo / "train.py")
    for args in (["init", "-q"], ["add", "train.py"],
                 ["-c", "user.email=b@example.org", "-c", "user.name=bench", "commit", "-qm",
                  "example"]):
        subprocess.run(["git", *args], cwd=repo, check=True, timeout=120)
    out = repo / "run.json"
    with out.open("wb") as fh:
        subprocess.run([sys.executable, "-m", "manifest", "capture", "-q", "--seed", "1",
                        "--artifact", "out/*.safetensors", "--", sys.executable, "train.py"],
                       cwd=repo, stdout=fh, check=True, timeout=1800)
    return out


def _timed(argv: list[str], env: dict[str, str], cwd: Path, ok: tuple[int, ...] = (0,)
           ) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=3600, check=False)
    took = time.perf_counter() - t0
    if done.returncode not in ok:
        raise SystemExit(f"{argv[:4]} failed: {done.stderr.strip()[-800:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="a captured run (default: capture "
                        "the bundled example)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--find-links", action="append", default=None)
    parser.add_argument("--index-url", action="append", default=None)
    args = parser.parse_args()

    import uv

    from manifest.canonical import load_manifest
    from manifest.pyenv.rebuild import recorded_pins, scrubbed_environment

    uv_bin = uv.find_uv_bin()
    links = args.find_links or [d for d in DEFAULT_LINKS if Path(d).is_dir()]
    indexes = args.index_url or [
        *(Path(d).as_uri() for d in DEFAULT_INDEXES if Path(d).is_dir()), PYPI]
    with tempfile.TemporaryDirectory(prefix="rebuild-bench-") as tmp:
        work = Path(tmp)
        manifest_path = args.manifest or _capture(work)
        m = load_manifest(manifest_path.read_bytes())
        pins = [p for p in recorded_pins(m, None) if p.kind in ("index", "archive")]
        print(f"environment: {len(pins)} distributions "
              f"({', '.join(f'{p.name}=={p.version}' for p in pins)})")
        sources = [a for f in links for a in ("--find-links", f)]
        sources += [a for i in indexes for a in ("--index-url", i)]
        ours = [sys.executable, "-m", "manifest", "env", "build", str(manifest_path.resolve()),
                "--json", *sources]
        # uv alone searches every index for the pinned version (by default it stops at the
        # first index that has the name, and the local ones hold other numpy versions).
        uv_sources = ["--index-strategy", "unsafe-best-match"]
        uv_sources += [a for f in links for a in ("--find-links", f)]
        if indexes:
            uv_sources += ["--index-url", indexes[0]]
            uv_sources += [a for i in indexes[1:] for a in ("--extra-index-url", i)]
        rows: dict[str, list[float]] = {"ours cold": [], "uv cold": [], "ours warm": [],
                                        "uv warm": []}
        for r in range(args.rounds):
            ours_env = dict(scrubbed_environment(), XDG_CACHE_HOME=str(work / f"ours-{r}"))
            uv_env = dict(scrubbed_environment(), XDG_CACHE_HOME=str(work / f"uv-{r}"))

            def uv_alone(tag: str, env: dict[str, str] = uv_env, r: int = r) -> float:
                venv = work / f"uv-venv-{r}-{tag}"
                t0 = time.perf_counter()
                subprocess.run([uv_bin, "venv", "-q", "--no-config", str(venv)], env=env,
                               check=True, timeout=600)
                took = time.perf_counter() - t0
                return took + _timed([uv_bin, "pip", "install", "-q", "--no-config",
                                      "--no-deps", "--link-mode", "copy", "--python",
                                      str(venv / "bin" / "python"), *uv_sources,
                                      *(f"{p.name}=={p.version}" for p in pins)], env, work)

            order = ["ours", "uv"] if r % 2 == 0 else ["uv", "ours"]
            for phase in ("cold", "warm"):
                for side in order:
                    took = (_timed(ours, ours_env, work, (0, 1)) if side == "ours"
                            else uv_alone(phase))
                    rows[f"{side} {phase}"].append(took)
            proof = json.loads(subprocess.run(ours, env=ours_env, cwd=work, capture_output=True,
                                              text=True, timeout=600).stdout)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items())
                  + f"; {proof['line']}")
        for phase in ("cold", "warm"):
            o, u = rows[f"ours {phase}"], rows[f"uv {phase}"]
            ratio = statistics.median(a / b for a, b in zip(o, u, strict=True))
            print(f"{phase}: manifest env build {statistics.median(o):.2f} s, uv alone "
                  f"{statistics.median(u):.2f} s, paired ratio {ratio:.2f}x (median of "
                  f"{len(o)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
