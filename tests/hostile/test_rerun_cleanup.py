"""A re-run never outlives the verb that started it, confined or not (issue 20, item 6).

The script under test starts a grandchild that leaves the process group
(``start_new_session``), then sleeps. The verb (verify, explain, lab) is killed
with SIGKILL, which no handler can see; every process whose command line
carries the run's token must then be gone. Unconfined, the keeper
(``manifest/rerun/_guard.py``) gets the kernel's parent-death signal and kills
the command's group and every descendant it adopted; confined, bubblewrap's
``--die-with-parent`` and PID namespace do it.

Positive control: the same script under a plain parent killed the same way
leaves both processes running (that is what an unconfined re-run did before).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from manifest.rerun.sandbox import unavailable_reason
from tests.runs import capture, make_repo

pytestmark = pytest.mark.slow

SLOW = """
import os, pathlib, subprocess, sys, time
pathlib.Path('out').mkdir(exist_ok=True)
pathlib.Path('out/w.bin').write_bytes(b'w')
if os.environ.get('SLOW'):
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]],
                     start_new_session=True)
    pathlib.Path('started').write_text('')
    time.sleep(600)
"""


def _alive(token: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``token``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


def _wait_gone(token: str, timeout: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _alive(token)
        if not left:
            return []
        time.sleep(0.1)
    return _alive(token)


def _kill_all(token: str) -> None:
    for pid in _alive(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _wait_started(proc: subprocess.Popen[bytes], where: Path, token: str) -> None:
    deadline = time.monotonic() + 180  # a loaded machine: wait for the event, with room
    while not (list(where.glob("**/started")) and len(_alive(token)) >= 2):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            _kill_all(token)
            _, err = proc.communicate()
            raise AssertionError(f"the run did not start: {(err or b'').decode()}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def slow_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    token = f"manifest-cleanup-{uuid.uuid4().hex}"
    repo = make_repo(tmp_path_factory.mktemp("cleanup") / "repo", {"slow.py": SLOW},
                     example=False)
    manifest, _ = capture(repo, command=["python", "slow.py", token], outputs="out/*.bin")
    return repo, manifest, token


SANDBOX = [pytest.param("--no-sandbox", id="unconfined"),
           pytest.param("confined", id="confined",
                        marks=pytest.mark.skipif(unavailable_reason() is not None,
                                                 reason=f"{unavailable_reason()}"))]


@pytest.mark.parametrize("mode", SANDBOX)
@pytest.mark.parametrize("verb", ["verify", "explain", "lab"])
def test_a_killed_verb_leaves_no_process(slow_repo: tuple[Path, Path, str], tmp_path: Path,
                                          verb: str, mode: str) -> None:
    repo, manifest, token = slow_repo
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    for stale in repo.glob("started"):
        stale.unlink()
    env = {**os.environ, "TMPDIR": str(tmpdir), "SLOW": "1"}
    env.pop("PYTHONHASHSEED", None)
    flags = ["--no-sandbox"] if mode == "--no-sandbox" else ["--require-sandbox"]
    if verb == "lab":
        args = ["lab", "--runs", "1", *flags, "--", "python", "slow.py", token]
        where = repo  # the lab runs in place
    else:
        args = [verb, str(manifest), *flags]
        where = tmpdir
    proc = subprocess.Popen([sys.executable, "-m", "manifest", *args], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_started(proc, where, token)
        started = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
        left = _wait_gone(token)
        took = time.monotonic() - started
        assert not left, f"{verb} {mode}: processes outlived it: {left}"
        print(f"{verb} {mode}: every process gone {took:.2f} s after SIGKILL")
    finally:
        _kill_all(token)
        for stale in repo.glob("started"):
            stale.unlink()


def test_positive_control_a_plain_parent_leaves_orphans(tmp_path: Path) -> None:
    token = f"manifest-control-{uuid.uuid4().hex}"
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; subprocess.run([sys.executable, sys.argv[1], sys.argv[2]])",
         str(script), token],
        cwd=tmp_path, env={**os.environ, "SLOW": "1"}, stderr=subprocess.DEVNULL)
    try:
        _wait_started(parent, tmp_path, token)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=120)
        time.sleep(1.0)
        assert len(_alive(token)) == 2, "the control should leave the script and its grandchild"
    finally:
        _kill_all(token)
