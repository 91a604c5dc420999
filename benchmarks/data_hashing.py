"""Benchmark: `manifest hash` against the tools people use to digest data.

Not a timed test: run it by hand, read the figures::

    python benchmarks/data_hashing.py [--quick] [--dir /tmp] [--big-gib 2]
        [--small-files 50000] [--many 1000000] [--no-capture]

It generates its own data in a temporary directory (removed afterwards):

  (a) one file of 2 GiB,
  (b) 50,000 files of 4 KiB in 100 directories,

and times whole commands, page cache warm, best of ``--repeat`` runs:
``manifest hash --no-cache`` (every byte read), ``b3sum`` (the reference
Rust implementation, Debian package b3sum), ``find | xargs b3sum`` and
``find | xargs -P2 b3sum``, ``md5sum``, ``dvc add`` (on the big file, when
``dvc`` is installed), and ``cat > /dev/null`` (the read ceiling). Then
(c) the warm re-hash of both with the cache, and the proof that it reads no
file contents: the dataset's pages are evicted from the page cache
(``posix_fadvise DONTNEED``), and ``/proc/PID/io`` of the finished command
(which includes the workers it reaped) shows ``read_bytes`` (from storage)
and ``rchar`` (through ``read()``) for a cold and a warm run.

(d) Peak memory of ``manifest hash --json`` (the listing written to the
store) over ``--many`` files of 16 bytes in folders of 1,000, and over a
tenth of them: the largest single process of the command (``wait4``'s
``ru_maxrss``), which must be flat in the file count.

Two references are printed beside the targets, each measured in the same
run: the fixed cost of ``manifest hash`` (a one-byte file; with ``python -c
pass`` for the interpreter alone), which is the whole gap to ``b3sum`` on one
big file (same algorithm, same cores), and ``find -printf`` over the small
tree, one ``stat`` per file in C on one core: the work any correct warm check
must do (editing a file in place changes no directory's mtime, so every file
must be looked at).

Peers that are not installed are skipped, and the report says so. Unless
``--no-capture``, ``benchmarks/capture_latency.py`` runs first, and the last
lines print each row of issue 16's table against its peer, all measured in
this run. ``--quick`` shrinks the data (0.5 GiB, 10,000 files, 100,000 for
memory) to see the shape in a minute; the table's figures need the full sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
SMALL = 4096


@dataclass
class Timing:
    label: str
    seconds: float | None
    note: str = ""


def manifest_cmd() -> list[str]:
    script = Path(sys.executable).with_name("manifest")
    return [str(script)] if script.exists() else [sys.executable, "-m", "manifest.cli"]


def run_timed(cmd: Sequence[str], *, cwd: Path | None = None) -> tuple[float, str, dict[str, int]]:
    """Wall time of a whole command, its stdout, and its /proc/PID/io (workers included)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err_file:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=err_file)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        # WNOWAIT leaves the child a zombie, so /proc/PID/io is still there; it
        # includes the I/O of the workers the command reaped.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        elapsed = time.perf_counter() - started
        io: dict[str, int] = {}
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/io") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                io[key] = int(value)
        proc.wait()
        err_file.seek(0)
        err = err_file.read()
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-500:]}")
    return elapsed, out.decode(), io


def best(cmd: Sequence[str], repeat: int, *, cwd: Path | None = None) -> tuple[float, str]:
    times: list[float] = []
    out = ""
    for _ in range(repeat):
        elapsed, out, _ = run_timed(cmd, cwd=cwd)
        times.append(elapsed)
        if elapsed > 3.0:  # slow peers: one run is enough to see the gap
            break
    return min(times), out


def shell(script: str) -> list[str]:
    return ["bash", "-c", script]


_PEAK = """
import os, sys
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def peak_rss_mb(cmd: Sequence[str]) -> float:
    """Peak resident memory, in MB, of the largest process among a command and its workers.

    A process forked from this one starts with this one's (large) peak, and
    exec keeps it; so a fresh small interpreter forks the command instead.
    """
    proc = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True,
                          check=False)
    maxrss_kib, code = (int(x) for x in proc.stdout.split())
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}): {proc.stderr[-500:]}")
    return maxrss_kib * 1024 / 1e6


def make_many(root: Path, count: int) -> None:
    """``count`` files of 16 bytes in folders of 1,000 (the shape of a sharded dataset)."""
    for i in range(count):
        if i % 1000 == 0:
            folder = root / f"d{i // 1000:05d}"
            folder.mkdir(parents=True)
        fd = os.open(folder / f"f{i % 1000:04d}.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, os.urandom(16))
        os.close(fd)


def evict(paths: Sequence[Path]) -> None:
    """Drop the page-cache pages of these files (only theirs; no root needed)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ------------------------------------------------------------------- data


def make_big(path: Path, size: int) -> None:
    block = os.urandom(64 << 20)
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            piece = block[: min(len(block), size - written)]
            # Vary each block so no filesystem could deduplicate it.
            fh.write(written.to_bytes(8, "little") + piece[8:])
            written += len(piece)


def make_small(root: Path, count: int) -> list[Path]:
    paths = []
    per_dir = 500
    for i in range(count):
        folder = root / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            folder.mkdir(parents=True)
        path = folder / f"f{i % per_dir:04d}.bin"
        path.write_bytes(os.urandom(SMALL))
        paths.append(path)
    return paths


# ----------------------------------------------------------------- report


def rate(nbytes: int, files: int, seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{nbytes / seconds / 1e9:7.2f} GB/s  {files / seconds:10,.0f} files/s"


def table(title: str, rows: list[Timing], nbytes: int, files: int, ours: float) -> None:
    print(f"\n{title}")
    for row in rows:
        if row.seconds is None:
            print(f"  {row.label:34s}  skipped: {row.note}")
            continue
        ratio = row.seconds / ours
        print(f"  {row.label:34s} {row.seconds:7.3f} s  {rate(nbytes, files, row.seconds)}"
              f"   manifest is {ratio:5.2f}x {row.note}")


def target(label: str, value: float | None, goal: float, *, at_most: bool = False) -> None:
    if value is None:
        print(f"  {label:52s}  n/a (peer not installed)")
        return
    ok = value <= goal if at_most else value >= goal
    sign = "<=" if at_most else ">="
    print(f"  {label:52s} {value:7.2f}  (target {sign} {goal})  {'met' if ok else 'MISSED'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where to create the temporary data")
    parser.add_argument("--big-gib", type=float, default=2.0)
    parser.add_argument("--small-files", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dvc", default=shutil.which("dvc"), help="dvc executable")
    parser.add_argument("--many", type=int, default=1_000_000,
                        help="files for the peak-memory case (and a tenth of them)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--no-capture", action="store_true",
                        help="skip benchmarks/capture_latency.py")
    args = parser.parse_args(argv)
    if args.quick:
        args.big_gib, args.small_files, args.many, args.repeat = 0.5, 10_000, 100_000, 1
    # Bytecode caches exist after any ``pip install``; with this variable set
    # every timed run would compile the package from source (~10 ms each).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    capture_rows: list[str] = []
    if not args.no_capture:
        capture_rows = run_capture_latency(quick=args.quick)

    ours = manifest_cmd()
    b3sum = shutil.which("b3sum")
    md5sum = shutil.which("md5sum")
    dvc = args.dvc if args.dvc and os.access(args.dvc, os.X_OK) else None
    print(f"machine: {os.cpu_count()} CPUs, {sys.platform}, load average "
          f"{os.getloadavg()[0]:.2f} (figures are only as quiet as the machine); "
          f"manifest: {' '.join(ours)}")
    print(f"peers: b3sum={'yes' if b3sum else 'not installed'}, "
          f"md5sum={'yes' if md5sum else 'not installed'}, dvc={dvc or 'not installed'}")

    work = Path(tempfile.mkdtemp(prefix="manifest-bench-", dir=args.dir))
    try:
        big = work / "big.bin"
        tree = work / "small"
        store = work / "store"
        big_size = int(args.big_gib * GIB)
        warm_up = work / "warm-up.bin"
        warm_up.write_bytes(b"x")
        run_timed([*ours, "hash", "-q", "--store", str(store), str(warm_up)])  # writes .pyc
        t = time.perf_counter()
        make_big(big, big_size)
        files = make_small(tree, args.small_files)
        print(f"generated {big_size / GIB:.2f} GiB file and {len(files):,} x 4 KiB files "
              f"in {time.perf_counter() - t:.1f} s under {work}")
        # Let the racy window (2 s) pass so the cold runs may fill the cache.
        time.sleep(2.2)
        small_bytes = SMALL * len(files)
        find = f"find {tree} -type f -print0"

        # ---------------------------------------------------------- (a) big
        run_timed(shell(f"cat {big} > /dev/null"))  # warm the page cache
        rows_a: list[Timing] = []
        t_ours_a, root_a = best([*ours, "hash", "-q", "--no-cache", "--store", str(store),
                                 str(big)], args.repeat)
        rows_a.append(Timing("manifest hash --no-cache", t_ours_a))
        t_cat_a, _ = best(shell(f"cat {big} > /dev/null"), args.repeat)
        rows_a.append(Timing("cat > /dev/null (read ceiling)", t_cat_a))
        t_b3_a: float | None = None
        if b3sum:
            t_b3_a, out = best([b3sum, str(big)], args.repeat)
            same = out.split()[0] == root_a.strip().removeprefix("blake3:")
            rows_a.append(Timing("b3sum", t_b3_a, "(same digest)" if same else "(DIFFERENT!)"))
        else:
            rows_a.append(Timing("b3sum", None, "not installed (apt-get install b3sum)"))
        if md5sum:
            rows_a.append(Timing("md5sum", best([md5sum, str(big)], args.repeat)[0]))
        else:
            rows_a.append(Timing("md5sum", None, "not installed"))

        # ------------------------------------------------------- (b) small
        run_timed(shell(f"{find} | xargs -0 cat > /dev/null"))
        rows_b: list[Timing] = []
        t_ours_b, _ = best([*ours, "hash", "-q", "--no-cache", "--store", str(store),
                            str(tree)], args.repeat)
        rows_b.append(Timing("manifest hash --no-cache", t_ours_b))
        rows_b.append(Timing("find | xargs cat > /dev/null",
                             best(shell(f"{find} | xargs -0 cat > /dev/null"), args.repeat)[0]))
        t_x1: float | None = None
        t_x2: float | None = None
        if b3sum:
            t_x1, _ = best(shell(f"{find} | xargs -0 {b3sum} > /dev/null"), args.repeat)
            t_x2, _ = best(shell(f"{find} | xargs -0 -P2 {b3sum} > /dev/null"), args.repeat)
            rows_b.append(Timing("find | xargs b3sum", t_x1))
            rows_b.append(Timing("find | xargs -P2 b3sum", t_x2))
        else:
            rows_b.append(Timing("find | xargs b3sum", None, "b3sum not installed"))
        if md5sum:
            rows_b.append(Timing("find | xargs md5sum",
                                 best(shell(f"{find} | xargs -0 {md5sum} > /dev/null"),
                                      args.repeat)[0]))

        # ------------------------------------------------------- floors: what
        # no implementation can go under on this machine. A warm re-hash must
        # stat every file (an in-place edit changes no directory's mtime):
        # find does exactly that in C, one process. The start-up every
        # ``manifest hash`` pays (interpreter, imports, store, cache) is its
        # time on a one-byte file.
        t_stat_floor, _ = best(shell(f"find {tree} -printf '%s %T@ %C@ %i\\n' > /dev/null"),
                               args.repeat)
        rows_b.append(Timing("find -printf (stat every file, C)", t_stat_floor,
                             "(floor of any warm check)"))
        tiny = work / "tiny.bin"
        tiny.write_bytes(b"x")
        t_start, _ = best([*ours, "hash", "-q", "--no-cache", "--store", str(store), str(tiny)],
                          args.repeat)
        t_python, _ = best([sys.executable, "-c", "pass"], args.repeat)
        rows_a.append(Timing("manifest hash of a 1-byte file", t_start, "(its fixed cost)"))
        rows_a.append(Timing("python -c pass", t_python, "(the interpreter alone)"))

        # -------------------------------------------------------- (c) warm
        t_warm_a, warm_root_a = best([*ours, "hash", "-q", "--store", str(store), str(big)],
                                     args.repeat)
        t_warm_b, _ = best([*ours, "hash", "-q", "--store", str(store), str(tree)],
                           args.repeat)
        assert warm_root_a == root_a, "warm and cold roots differ"

        # --------------------------------------------- (c) proof of no reads
        proof: list[str] = []
        warm_read_b = -1
        small_label = f"{len(files) // 1000}k files"
        for label, path, paths, nbytes in ((f"{big_size / GIB:g} GiB file", big, [big], big_size),
                                           (small_label, tree, files, small_bytes)):
            for kind, extra in (("cold --no-cache", ["--no-cache"]), ("warm, cache", [])):
                evict(paths)
                elapsed, _, io = run_timed([*ours, "hash", "-q", *extra, "--store", str(store),
                                            str(path)])
                if label == small_label and extra == []:
                    warm_read_b = io.get("read_bytes", -1)
                proof.append(f"  {label:10s} {kind:16s} {elapsed:7.3f} s   "
                             f"read_bytes {io.get('read_bytes', -1) / 1e6:9.1f} MB   "
                             f"rchar {io.get('rchar', -1) / 1e6:9.1f} MB   "
                             f"(dataset {nbytes / 1e6:,.0f} MB)")

        # -------------------------------------------------------- dvc (last:
        # `dvc add` moves the file into its cache and leaves a copy behind)
        t_dvc: float | None = None
        t_dvc_re: float | None = None
        if dvc:
            dvc_dir = work / "dvc"
            dvc_dir.mkdir()
            os.link(big, dvc_dir / "big.bin")
            subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=dvc_dir, check=True)
            subprocess.run([dvc, "config", "core.analytics", "false"], cwd=dvc_dir, check=True)
            t_dvc, _, _ = run_timed([dvc, "add", "-q", "big.bin"], cwd=dvc_dir)
            t_dvc_re, _, _ = run_timed([dvc, "add", "-q", "big.bin"], cwd=dvc_dir)
            rows_a.append(Timing("dvc add (cold)", t_dvc))
            rows_a.append(Timing("dvc add (again, unchanged)", t_dvc_re))
        else:
            rows_a.append(Timing("dvc add", None, "not installed (pip install dvc)"))
        rows_a.append(Timing("manifest hash (warm, cache)", t_warm_a))
        rows_b.append(Timing("manifest hash (warm, cache)", t_warm_b))

        table(f"(a) one file of {big_size / GIB:.2f} GiB", rows_a, big_size, 1, t_ours_a)
        table(f"(b) {len(files):,} files of 4 KiB", rows_b, small_bytes, len(files), t_ours_b)

        print("\n(c) what a run reads, dataset evicted from the page cache first "
              "(/proc/PID/io of the command, its workers included)")
        print("\n".join(proof))

        # ------------------------------------------------------ (d) memory
        peaks: list[tuple[int, float]] = []
        for count in (args.many // 10, args.many):
            many = work / f"many-{count}"
            make_many(many, count)
            peaks.append((count, peak_rss_mb([*ours, "hash", "-q", "--json", "--no-cache",
                                              "--store", str(work / f"store-{count}"),
                                              str(many)])))
        # The trees are removed with the rest, after the report: removing a
        # million files takes longer than hashing them on a busy machine.
        print("\n(d) peak memory of manifest hash --json (largest single process)")
        for count, peak in peaks:
            print(f"  {count:>9,} files  {peak:7.1f} MB")

        print(f"\nload average now {os.getloadavg()[0]:.2f}\ntargets")
        target("(a) manifest vs b3sum (x faster)", t_b3_a / t_ours_a if t_b3_a else None, 1.2)
        target("(a) manifest GB/s / read-ceiling GB/s", t_cat_a / t_ours_a, 0.55)
        target("(a) manifest vs dvc add (x faster)", t_dvc / t_ours_a if t_dvc else None, 20)
        target("(b) manifest vs find|xargs b3sum (x faster)", t_x1 / t_ours_b if t_x1 else None,
               1.0)
        target("(b) manifest vs find|xargs -P2 b3sum (x faster)",
               t_x2 / t_ours_b if t_x2 else None, 0.8)
        target("(c) warm re-hash of the 50k-file tree, seconds", t_warm_b, 0.35, at_most=True)

        print("\nissue 16 (whole commands; each peer measured in this run)")
        for row in capture_rows:
            print(f"  {row}")
        target(f"{big_size / GIB:.2f} GiB file, page cache: b3sum s / manifest s",
               t_b3_a / t_ours_a if t_b3_a else None, 1.0)
        target(f"{len(files):,} x 4 KiB, no cache: xargs -P2 b3sum s / manifest s",
               t_x2 / t_ours_b if t_x2 else None, 1.0)
        target(f"warm re-hash / cold, {len(files):,} files "
               f"({t_warm_b:.3f} s / {t_ours_b:.3f} s)", t_warm_b / t_ours_b, 0.1, at_most=True)
        if t_b3_a:
            print(f"  {'  floor: b3sum s / (b3sum s + manifest fixed cost s)':52s} "
                  f"{t_b3_a / (t_b3_a + t_start):7.2f}  (same algorithm, same cores)")
        print(f"  {'  reference: (fixed cost + find stat pass) s / cold s':52s} "
              f"{(t_start + t_stat_floor) / t_ours_b:7.2f}  (one stat per file, C, one core)")
        print(f"  {'warm re-hash, evicted first: read_bytes of the data read':52s} "
              f"{warm_read_b / 1e6:7.2f} MB  (target 0: no file contents read)")
        target(f"peak memory, {peaks[-1][0]:,} files, MB", peaks[-1][1], 100, at_most=True)
        target(f"peak memory growth {peaks[0][0]:,} -> {peaks[-1][0]:,} files, MB",
               peaks[-1][1] - peaks[0][1], 5, at_most=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run_capture_latency(*, quick: bool) -> list[str]:
    """Run benchmarks/capture_latency.py; return its summary lines (row 1 of the table)."""
    script = Path(__file__).with_name("capture_latency.py")
    proc = subprocess.run([sys.executable, str(script), "--runs", "5" if quick else "9"],
                          capture_output=True, text=True, check=False)
    print(proc.stdout, end="")
    lines = proc.stdout.strip().splitlines()
    return [line for line in lines if "collect_env /" in line or line.startswith("capture median")]


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.exit(main())
