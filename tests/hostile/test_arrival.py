"""A cluster bundle on arrival (issue 31): opened once, without following links, checked as
opened, by the installed package.

``tests/hostile/conformance/bundle/<case>.json``: a good bundle is built, then
``plant`` maps a path of the bundle (relative to its root) to what is put there
instead, in order:

* ``outside-copy``: an identical copy of what was there, outside the bundle, and a
  symlink to it (the check used to hash through the link, and an edit after it ran);
* ``copy-of:REL``: a plain copy of the bundle's REL;
* ``link:TARGET``, ``fifo``, ``socket``, ``chardev`` (a character device, where this
  user may make one), ``dir``, ``bytes:N``, ``sparse:N`` (N bytes on no disk),
  ``text:…``;
* ``planted-code``: a Python file that, imported, writes a marker file.

``start`` is how the entrypoint is started: ``isolated`` (default, ``python -I -m
manifest.rerun.remote BUNDLE OUT`` as SLURM and Kubernetes run it), ``ray`` (the same
from inside the bundle with ``.``, as Ray Jobs runs it with the bundle as
``working_dir``), or ``plain-m-in-bundle-with-real-package`` (``python -m`` from inside
the bundle without ``-I``: the bundle is first on ``sys.path``).

Every ``*_fail`` case ends with exit 3 and one sentence, within a second of work (the
limit is generous for a busy machine; the figure is printed), and nothing ran: the
bundle's command never wrote its output, no tree was copied, the planted code never
ran. Each class has a positive control below: a plain ``os.open`` follows the planted
link, a plain walk never ends on ``-> .`` links, a plain read of a FIFO blocks, ``python
-m`` from the bundle imports the planted package, a check-then-copy by path copies what
was swapped in after the check.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_sentence

HERE = Path(__file__).parent / "conformance" / "bundle"
LIMIT_S = 20.0
SCRIPT = ("from pathlib import Path\nPath('out').mkdir(exist_ok=True)\n"
          "Path('out/x.txt').write_text('hello')\n")
PLANTED = ("import os, pathlib\n"
           "pathlib.Path(os.environ['PLANTED_MARKER']).write_text('planted code ran')\n")


def _cases() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def build(tmp_path: Path) -> tuple[Path, str]:
    """A good bundle of a two-file tree and a patch (what a cluster executor ships)."""
    import blake3

    from manifest.rerun.cluster.bundle import build_bundle

    tree = tmp_path / "src"
    (tree / "sub").mkdir(parents=True)
    (tree / "train.py").write_text(SCRIPT)
    (tree / "sub" / "data.bin").write_bytes(b"\x00\x01" * 100)
    patch = b"diff --git a/train.py b/train.py\n"
    settings = {"seed": 0, "derivation": "same", "threads": 1, "deterministic": True,
                "trail": "off", "ops": None, "root": str(tree), "hashseed": None}
    bundle = build_bundle(
        tmp_path / "bundle", tree=tree, cwd=tree, mount_at=tree,
        argv=[sys.executable, "train.py"], outputs=["out/*.txt"], patch=patch,
        commit="0" * 40, diff_digest="blake3:" + blake3.blake3(patch).hexdigest(),
        settings=settings, env={"OMP_NUM_THREADS": "1"}, sandbox=False)
    return bundle.path, bundle.name


class Planter:
    def __init__(self, bundle: Path, outside: Path) -> None:
        self.bundle = bundle
        self.outside = outside
        self.sockets: list[socket.socket] = []

    def plant(self, plants: dict[str, str]) -> None:
        for rel, what in plants.items():
            path = self.bundle / rel
            kind, _, arg = what.partition(":")
            if kind == "outside-copy":
                copy = self.outside / rel.replace("/", "_")
                if path.is_dir():
                    shutil.copytree(path, copy)
                    shutil.rmtree(path)
                else:
                    shutil.copyfile(path, copy)
                    path.unlink()
                path.symlink_to(copy)
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "copy-of":
                shutil.copyfile(self.bundle / arg, path)
            elif kind == "link":
                path.symlink_to(arg)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "socket":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(str(path))
                self.sockets.append(sock)
            elif kind == "chardev":
                try:
                    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
                except PermissionError:
                    pytest.skip("this user cannot make a device node")
            elif kind == "dir":
                path.mkdir()
            elif kind == "bytes":
                path.write_bytes(b" " * int(arg))
            elif kind == "sparse":  # a file of that many bytes that takes no disk
                with open(path, "wb") as fh:
                    fh.truncate(int(arg))
            elif kind == "text":
                path.write_text(arg)
            elif kind == "planted-code":
                path.write_text(PLANTED)
            else:
                raise AssertionError(f"unknown plant {what!r}")

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _start(bundle: Path, out: Path, name: str, how: str, env: dict[str, str]
           ) -> subprocess.CompletedProcess[str]:
    if how == "isolated":
        argv, cwd = [sys.executable, "-I", "-m", "manifest.rerun.remote", str(bundle),
                     str(out), "--expect", name], bundle.parent
    elif how == "ray":
        argv, cwd = [sys.executable, "-I", "-m", "manifest.rerun.remote", ".", str(out),
                     "--expect", name], bundle
    else:
        assert how == "plain-m-in-bundle-with-real-package"
        argv, cwd = [sys.executable, "-m", "manifest.rerun.remote", ".", str(out),
                     "--expect", name], bundle
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=LIMIT_S * 3, check=False)


@pytest.mark.parametrize("name", _cases())
def test_bundle_case(name: str, tmp_path: Path) -> None:
    case: dict[str, Any] = json.loads((HERE / f"{name}.json").read_text())
    assert name.endswith(("_ok", "_fail")), name
    bundle, expect = build(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    planter = Planter(bundle, outside)
    try:
        planter.plant(case.get("plant", {}))
        marker = tmp_path / "planted-ran"
        env = {**os.environ, "PLANTED_MARKER": str(marker), **case.get("env", {})}
        out = tmp_path / "out"
        started = time.monotonic()
        proc = _start(bundle, out, expect, case.get("start", "isolated"), env)
        elapsed = time.monotonic() - started
    finally:
        planter.close()
    print(f"bundle/{name}: exit {proc.returncode} in {elapsed:.3f} s")
    assert proc.returncode == case["exit"], proc.stderr
    assert not marker.exists(), "the planted code ran"
    assert "Traceback" not in proc.stderr
    if case["exit"] == 0:
        assert (out / "tree" / "out" / "x.txt").read_text() == "hello"
        return
    assert elapsed < LIMIT_S, elapsed
    assert_one_sentence(proc.stderr)
    assert "refused" in proc.stderr
    if case.get("stderr"):
        assert case["stderr"] in proc.stderr, proc.stderr
    assert not (out / "tree").exists(), "a refused bundle was copied"
    assert not list(out.glob("tree*")), "a refused bundle left its copy behind"
    assert json.loads((out / "result.json").read_text())["refused"]


# ------------------------------------------------------------ positive controls


def test_control_a_plain_open_follows_the_planted_link(tmp_path: Path) -> None:
    bundle, _ = build(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    Planter(bundle, outside).plant({"tree/train.py": "outside-copy"})
    (outside / "tree_train.py").write_text("print('edited after the check')\n")
    fd = os.open(bundle / "tree" / "train.py", os.O_RDONLY)  # what the old check did
    try:
        assert b"edited after the check" in os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    tree = os.open(bundle / "tree", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="Too many levels of symbolic links") as err:
            os.open("train.py", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=tree)
        assert err.value.errno == errno.ELOOP
    finally:
        os.close(tree)


def test_control_a_plain_walk_of_two_dot_links_does_not_end(tmp_path: Path) -> None:
    bundle, _ = build(tmp_path)
    Planter(bundle, tmp_path).plant({"tree/a": "link:.", "tree/b": "link:."})
    seen = 0
    for _ in os.walk(bundle / "tree", followlinks=True):  # what the old _walk did
        seen += 1
        if seen > 2000:
            break
    assert seen > 2000, "a plain walk that follows links ended on its own"


def test_control_hashing_a_planted_sparse_file_does_not_end_in_seconds(tmp_path: Path) -> None:
    import blake3

    huge = tmp_path / "data.bin"
    with open(huge, "wb") as fh:
        fh.truncate(64 << 30)
    h, read, started = blake3.blake3(), 0, time.monotonic()
    with open(huge, "rb") as fh:  # what the check did: read it all, whatever its size
        while time.monotonic() - started < 2 and (chunk := fh.read(1 << 20)):
            h.update(chunk)
            read += len(chunk)
    assert read < 64 << 30, "64 GiB were hashed in 2 s"


def test_control_a_plain_open_of_a_fifo_index_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "bundle.json"
    os.mkfifo(fifo)
    code = f"open({str(fifo)!r}, 'rb').read()"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], timeout=2, check=False)


def test_control_a_plain_read_of_dev_zero_runs_out_of_memory() -> None:
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "open('/dev/zero', 'rb').read()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode != 0 and "MemoryError" in proc.stderr, proc.stderr


def test_control_python_m_from_the_bundle_imports_the_planted_package(tmp_path: Path) -> None:
    bundle, name = build(tmp_path)
    marker = tmp_path / "planted-ran"
    Planter(bundle, tmp_path).plant({
        "manifest/__init__.py": "planted-code", "manifest/rerun/__init__.py": "planted-code",
        "manifest/rerun/remote.py": "planted-code"})
    env = {**os.environ, "PLANTED_MARKER": str(marker)}
    subprocess.run([sys.executable, "-m", "manifest.rerun.remote", ".", "--expect", name],
                   cwd=bundle, env=env, capture_output=True, timeout=120, check=False)
    assert marker.exists(), "python -m from the bundle did not import the planted package"


def test_control_check_then_copy_by_path_copies_what_was_swapped_in(tmp_path: Path) -> None:
    """The old order (hash each file by its path, then copy the tree by path) runs what was
    put there in between; ours copies from the descriptor it hashed, so whatever the timing
    of a swap, either the bundle is refused or the copy is the checked bytes."""
    from manifest.rerun.cluster.bundle import BundleRefused, check_bundle, file_digest

    bundle, name = build(tmp_path)
    target = bundle / "tree" / "train.py"
    index = json.loads((bundle / "bundle.json").read_text())
    assert file_digest(target) == index["files"]["train.py"]  # the old check passes
    evil = tmp_path / "evil.py"
    evil.write_text("print('swapped in')\n")
    os.replace(evil, target)  # between the check and the copy
    shutil.copytree(bundle / "tree", tmp_path / "plain-copy")
    assert "swapped in" in (tmp_path / "plain-copy" / "train.py").read_text()

    good = SCRIPT.encode()
    for attempt in range(30):
        bundle, name = build(tmp_path / f"race{attempt}")
        target = bundle / "tree" / "train.py"
        stop = threading.Event()

        def swap(target: Path = target, stop: threading.Event = stop) -> None:
            n = 0
            while not stop.is_set():
                staged = target.parents[2] / f".swap{n}"  # beside the bundle
                staged.write_text("print('swapped in')\n" if n % 2 else SCRIPT)
                os.replace(staged, target)
                n += 1

        thread = threading.Thread(target=swap)
        thread.start()
        copy = tmp_path / f"race{attempt}" / "copy"
        try:
            check_bundle(bundle, name, copy_to=copy)
        except BundleRefused:
            assert not copy.exists()
        else:
            assert (copy / "train.py").read_bytes() == good
        finally:
            stop.set()
            thread.join()
