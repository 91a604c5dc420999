"""What recording the environment variables a run read costs a read (issue 36, item 6).

One child under the real launcher (``sitecustomize`` on ``PYTHONPATH``) times, in the
same process, each kind of read hooked and then with ``os._Environ.__getitem__`` and
``__iter__`` put back (min of 7 × 20,000 calls each, twice): a library's read
(``os.path.expanduser("~")``: two reads of ``HOME``), the script's repeated own read
(``os.environ.get``), the same through ``os.environb`` (bytes keys), an unset one, and
then how long loading the project's redactor took at the first value kept.

    python benchmarks/environ_reads.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """\
import json, os, sys, time
import _manifest_environ as hook

def best(f, n=20000, k=7):
    out = []
    for _ in range(k):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out.append((time.perf_counter() - t) / n * 1e6)
    return min(out)

CASES = {
    "expanduser (library)": lambda: os.path.expanduser("~"),
    "os.environ.get (own, repeated)": lambda: os.environ.get("LRSCALE"),
    "os.environb.get (own, repeated)": lambda: os.environb.get(b"LRSCALE"),
    "os.environ.get unset (own, repeated)": lambda: os.environ.get("NOT_SET_HERE"),
}
t = time.perf_counter()
os.environ.get("LRSCALE")  # the first value kept: loads the redactor
first = (time.perf_counter() - t) * 1e3
cls = type(os.environ)
rows = {name: [] for name in CASES}
for _ in range(2):
    for name, f in CASES.items():
        hooked = best(f)
        cls.__getitem__, cls.__iter__ = hook._original, hook._original_iter
        plain = best(f)
        cls.__getitem__, cls.__iter__ = hook._getitem, hook._iter
        rows[name].append((hooked, plain))
print(json.dumps({"rows": rows, "first_ms": first}))
"""


def main() -> None:
    from manifest.launch.runner import LaunchSettings

    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records"
        records.mkdir()
        script = Path(tmp) / "bench.py"
        script.write_text(CHILD)
        settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True,
                                  trail="off", root=tmp, numeric=False)
        env = settings.child_env(records)
        env["LRSCALE"] = "1"
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env,
                              capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'read':40} {'hooked µs':>18} {'unhooked µs':>18}")
    for name, pairs in result["rows"].items():
        hooked = "–".join(f"{h:.2f}" for h in sorted({round(h, 2) for h, _ in pairs}))
        plain = "–".join(f"{p:.2f}" for p in sorted({round(p, 2) for _, p in pairs}))
        print(f"{name:40} {hooked:>18} {plain:>18}")
    print(f"first value kept (loads the redactor): {result['first_ms']:.1f} ms")


if __name__ == "__main__":
    main()
