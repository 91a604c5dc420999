"""Nothing is left behind, and nothing but a regular file is replaced (issue 10, item 7).

* ``-o`` onto a symlink, a FIFO, a directory or a device is refused; the
  target is still what it was (positive control: a regular file is replaced).
* A write killed with SIGKILL leaves its temporary file (positive control:
  the leftover is there), and the next gate run removes it.
* A verify stopped by SIGTERM or SIGINT removes its scratch clone; one killed
  with SIGKILL leaves it (positive control), and the next verify sweeps it.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from manifest.store import atomic_write, sweep_temp
from tests.conftest import GitRepo, run_cli
from tests.runs import capture, make_repo

# ------------------------------------------------------------------ -o


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "dangling-symlink"])
def test_output_refuses_what_is_not_a_regular_file(tmp_path: Path, cli_env: dict[str, str],
                                                   kind: str) -> None:
    target = tmp_path / "target"
    kept = tmp_path / "kept.json"
    kept.write_text("keep me")
    if kind == "symlink":
        target.symlink_to(kept)
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "nowhere")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    before = os.lstat(target)
    result = run_cli("schema", "-o", str(target), cwd=tmp_path, env=cli_env, timeout=20)
    assert result.returncode == 2, result.stderr
    assert "refusing to write" in result.stderr or "cannot write" in result.stderr
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
    assert kept.read_text() == "keep me"
    assert not (tmp_path / "nowhere").exists()


def test_output_onto_a_device_is_refused_not_replaced(tmp_path: Path,
                                                      cli_env: dict[str, str]) -> None:
    """``-o /dev/stdout`` as root used to replace the device symlink by a regular file."""
    for device in ("/dev/null", "/dev/stdout"):
        before = os.lstat(device)
        result = run_cli("schema", "-o", device, cwd=tmp_path, env=cli_env, timeout=20)
        assert result.returncode == 2, result.stderr
        assert stat.S_IFMT(os.lstat(device).st_mode) == stat.S_IFMT(before.st_mode)


def test_output_replaces_a_regular_file(tmp_path: Path, cli_env: dict[str, str]) -> None:
    target = tmp_path / "schema.json"
    target.write_text("old")
    result = run_cli("schema", "-o", str(target), cwd=tmp_path, env=cli_env, timeout=20)
    assert result.returncode == 0, result.stderr
    assert target.read_text().startswith("{")
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------ killed writes

KILLED_WRITER = """
import os, sys, time
from pathlib import Path
import manifest.store as store
real_fsync = os.fsync
def stall(fd):
    Path(sys.argv[2]).write_text("in the middle")
    time.sleep(60)
os.fsync = stall
store.atomic_write(Path(sys.argv[1]), b"x" * 100000)
"""


def test_kill_9_during_baseline_write_leaves_nothing_after_next_gate(
        repo: GitRepo, tmp_path: Path, cli_env: dict[str, str]) -> None:
    repo.write("pyproject.toml", "[tool.manifest]\ncommand = ['true']\n")
    baseline = repo.path / "manifests" / "baseline.json"
    baseline.parent.mkdir()
    flag = tmp_path / "flag"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(baseline), str(flag)],
                             env=cli_env)
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    leftovers = [p.name for p in baseline.parent.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".baseline.json.")  # control
    result = run_cli("gate", "--no-rerun", cwd=repo.path, env=cli_env, timeout=60)
    assert "Traceback" not in result.stderr
    assert list(baseline.parent.iterdir()) == []


def test_sweep_keeps_a_live_writers_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    live = tmp_path / f".out.json.{os.getpid()}.abc.tmp"
    live.write_text("being written")
    dead = tmp_path / ".out.json.999999999.abc.tmp"
    dead.write_text("killed")
    other = tmp_path / ".other.json.999999999.abc.tmp"
    other.write_text("not ours")
    assert sweep_temp(target) == [dead]
    atomic_write(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, "out.json"])


# -------------------------------------------------- scratch clones

SLOW = """
import os, pathlib, time
pathlib.Path('out').mkdir(exist_ok=True)
pathlib.Path('out/w.bin').write_bytes(b'w')
if os.environ.get('SLOW'):
    pathlib.Path('started').write_text('')
    time.sleep(120)
"""


@pytest.fixture
def slow_run(tmp_path: Path) -> tuple[Path, Path]:
    repo = make_repo(tmp_path / "repo", {"slow.py": SLOW}, example=False)
    manifest, _ = capture(repo, command=["python", "slow.py"], outputs="out/*.bin")
    return repo, manifest


def _start_verify(repo: Path, manifest: Path, tmpdir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmpdir), "SLOW": "1"}
    env.pop("PYTHONHASHSEED", None)
    # A test run started in the background by a non-interactive shell (nohup
    # ... &) inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler: the verify under test must start with SIGINT's
    # default, as from a terminal.
    proc = subprocess.Popen([sys.executable, "-m", "manifest", "verify", str(manifest)],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    # The clone sits at <scratch>/w/[up/…]/tree (inputs outside the repository land in w/).
    while not list(tmpdir.glob("manifest-verify-*/**/started")):  # wherever the tree sits
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"verify did not start: {err.decode()}")
        time.sleep(0.1)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopped_verify_removes_its_scratch_clone(slow_run: tuple[Path, Path], tmp_path: Path,
                                                  signum: int) -> None:
    repo, manifest = slow_run
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = _start_verify(repo, manifest, tmpdir)
    proc.send_signal(signum)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        raise AssertionError(f"verify did not stop on signal {signum}: {stderr.decode()}") from None
    assert proc.returncode in (128 + signum, 130), stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert list(tmpdir.glob("manifest-verify-*")) == []


@pytest.mark.slow
def test_killed_verify_leaves_a_clone_that_the_next_verify_sweeps(
        slow_run: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = slow_run
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = _start_verify(repo, manifest, tmpdir)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    [left] = tmpdir.glob("manifest-verify-*")  # positive control: SIGKILL cannot clean up
    old = time.time() - 3600
    os.utime(left, (old, old))
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop("PYTHONHASHSEED", None)
    done = subprocess.run([sys.executable, "-m", "manifest", "verify", str(manifest)], cwd=repo,
                          env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert list(tmpdir.glob("manifest-verify-*")) == []

