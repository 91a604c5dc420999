"""The one re-run engine (``manifest.rerun``): every verb plans, trusts, confines and shows
its re-run the same way (issue 20, item 1).

* No module outside the engine starts a recorded command: only the executor
  calls the launcher (capture calls it for the command the user typed).
* explain shows the plan before an untrusted manifest runs and refuses it
  without ``--trust`` (it used to print nothing and run), and its report
  carries the plan, as verify's does.
* explain reaches data outside the repository the way verify does: a script
  run as ``--data ../data`` used to fail in explain's scratch clone with
  FileNotFoundError (no verdict) while verify said identical.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from manifest.canonical import dumps, load_manifest, seal, to_document
from manifest.rerun.sandbox import unavailable_reason
from tests.runs import capture, make_repo, manifest_cli

PACKAGE = Path(__file__).resolve().parent.parent / "manifest"

OUTSIDE_DATA = """
import argparse, pathlib, torch
from safetensors.torch import save_file
p = argparse.ArgumentParser()
p.add_argument('--data')
args = p.parse_args()
values = [float(v) for v in pathlib.Path(args.data, 'values.txt').read_text().split()]
x = torch.tensor(values).reshape(-1, 4)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
pathlib.Path('out').mkdir(exist_ok=True)
save_file(model.state_dict(), 'out/model.safetensors')
"""


def test_only_the_engine_starts_recorded_commands() -> None:
    """The launcher's entry point is called from the executor, and from capture alone."""
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else None)
                if name == "run_under_launcher":
                    callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == {"rerun/executor.py", "capture/run.py"}, callers


@pytest.fixture(scope="module")
def outside_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("engine")
    data = work / "data"
    data.mkdir()
    (data / "values.txt").write_text(" ".join(str(i / 7) for i in range(32)))
    repo = make_repo(work / "repo", {"fit.py": OUTSIDE_DATA}, example=False)
    manifest, _ = capture(repo, "--threads", "2", "--data", "../data",
                          command=["python", "fit.py", "--data", "../data"])
    return repo, manifest


@pytest.mark.slow
def test_explain_reaches_data_outside_the_repository(outside_run: tuple[Path, Path]) -> None:
    repo, manifest = outside_run
    verify = manifest_cli("verify", str(manifest), "--json", cwd=repo)
    assert verify.returncode == 0, verify.stderr.decode()
    report = json.loads(verify.stdout)
    assert report["verdict"] == "identical"
    assert report["plan"]["inputs"][0]["outside"] is True
    explain = manifest_cli("explain", "--threads", "1", str(manifest), "--json", cwd=repo)
    stderr = explain.stderr.decode()
    assert "FileNotFoundError" not in stderr
    assert explain.returncode in (0, 1), stderr  # a verdict, not "no verdict"
    doc = json.loads(explain.stdout)
    assert doc["verdict"] in ("agree", "parted")
    assert doc["plan"]["verb"] == "explain"
    assert doc["plan"]["executor"] in ("local-confined", "local-unconfined")
    assert doc["confinement"] == doc["plan"]["confinement"]


@pytest.mark.slow
def test_explain_shows_the_plan_and_needs_trust_for_a_received_manifest(
        outside_run: tuple[Path, Path], tmp_path: Path) -> None:
    repo, manifest = outside_run
    doc = to_document(load_manifest(manifest.read_bytes()))
    doc["command"]["argv"] = ["python", "fit.py", "--data", "../data", "--edited"]
    received = tmp_path / "received.json"
    received.write_bytes(dumps(seal(doc)))  # re-sealed, as anyone can: not sealed here
    refused = manifest_cli("explain", str(received), cwd=repo)
    stderr = refused.stderr.decode()
    assert refused.returncode == 2, stderr
    assert "explain would run:" in stderr and "--edited" in stderr
    assert "links: " in stderr and "/data (read-only) (outside the repository)" in stderr
    assert "re-running" not in stderr
    # Positive control: the same manifest with --trust is shown as allowed and runs.
    trusted = manifest_cli("explain", "--step", "1", str(received), "--trust", cwd=repo)
    stderr = trusted.stderr.decode()
    assert "explain will run (--trust):" in stderr
    assert "re-running" in stderr


def test_contradictory_sandbox_flags_are_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{}")
    for verb in (["explain", "x.json"], ["lab"]):
        proc = manifest_cli(*verb, "--no-sandbox", "--require-sandbox", cwd=tmp_path)
        stderr = proc.stderr.decode()
        assert proc.returncode == 2, stderr
        assert "contradict each other" in stderr and "Traceback" not in stderr


@pytest.mark.slow
def test_the_unconfined_keeper_is_not_a_process_of_the_run(
        outside_run: tuple[Path, Path]) -> None:
    """The keeper is a Python process run with ``-I -S`` on purpose: the process watch
    sees through it, so an unconfined re-run is not said to run outside the recipe."""
    repo, manifest = outside_run
    verify = manifest_cli("verify", str(manifest), "--no-sandbox", "--json", cwd=repo)
    assert verify.returncode == 0, verify.stderr.decode()
    report = json.loads(verify.stdout)
    assert report["plan"]["executor"] == "local-unconfined"
    assert report["outside_recipe"] == [], report["outside_recipe"]


def test_a_stored_blob_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A clone that commits ``.manifest/blobs/…`` as a FIFO must not hang verify: the store
    reads through the bounded reader (regular files only)."""
    import os
    import time

    repo = make_repo(tmp_path / "repo", {"w.py": "import pathlib\npathlib.Path('out').mkdir("
                                         "exist_ok=True)\npathlib.Path('out/w.bin')"
                                         ".write_bytes(b'w')\n"}, example=False)
    (repo / "extra.py").write_text("x = 1\n")  # untracked: the patch becomes a blob
    manifest, doc = capture(repo, command=["python", "w.py"], outputs="out/*.bin")
    digest = doc["code"]["diff_digest"]
    blob = repo / ".manifest" / "blobs" / digest.replace(":", "-")
    assert blob.is_file()
    blob.unlink()
    os.mkfifo(blob)
    started = time.monotonic()
    proc = manifest_cli("verify", str(manifest), "--no-sandbox", cwd=repo, timeout=120)
    elapsed = time.monotonic() - started
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert "FIFO" in stderr and "Traceback" not in stderr
    assert elapsed < 60, elapsed


def test_lab_takes_an_absolute_artifact_glob_inside_its_tree(tmp_path: Path) -> None:
    """capture records ``--artifact /abs/out/*.bin`` as typed; the lab (in place) takes it
    too: the plan sees it relative to the tree, and each run's copy is kept apart (it used
    to be copied onto itself: 'are the same file'). One outside the tree is one sentence."""
    script = ("import pathlib\npathlib.Path('out').mkdir(exist_ok=True)\n"
              "pathlib.Path('out/w.bin').write_bytes(b'weights')\n")
    repo = make_repo(tmp_path / "repo", {"w.py": script}, example=False)
    inside = manifest_cli("lab", "--runs", "1", "--format", "json", "--artifact",
                          str(repo / "out" / "*.bin"), "--", "python", "w.py", cwd=repo)
    assert inside.returncode == 0, inside.stderr.decode()
    report = json.loads(inside.stdout)
    assert report["recipe"]["bit_identical"] is True
    assert report["plan"]["outputs"] == ["out/*.bin"]
    outside = manifest_cli("lab", "--runs", "1", "--artifact", str(tmp_path / "*.bin"), "--",
                           "python", "w.py", cwd=repo)
    stderr = outside.stderr.decode()
    assert outside.returncode == 2, stderr
    assert "lies outside the tree the lab runs in" in stderr and "Traceback" not in stderr


_ON_TERMINAL = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(1, termios.TIOCSCTTY, 0)\n"  # the pty is our controlling terminal
    "attrs = termios.tcgetattr(1)\n"
    "attrs[3] |= termios.TOSTOP\n"  # stty tostop: a background job that writes is stopped
    "termios.tcsetattr(1, termios.TCSANOW, attrs)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


@contextlib.contextmanager
def _on_terminal(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """``python ARGV`` as the foreground job of a terminal with ``tostop`` set (as a verb
    typed at a shell); stdin is /dev/null, as the launcher gives the command. Killed
    (its whole session) at the end."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", _ON_TERMINAL, *argv],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)


def test_the_unconfined_keeper_is_not_stopped_by_the_terminal() -> None:
    """The keeper puts the command in a session of its own (as bubblewrap's
    --new-session does). In a process group of the verb's session it was a background
    job of the user's terminal: a write under ``stty tostop`` (SIGTTOU) or getpass's
    read of /dev/tty (SIGTTIN) stopped it, and the verb waited forever."""
    from manifest.rerun.executor import GUARD

    command = ("import getpass; print('written', flush=True); "
               "getpass.getpass('key: ')")  # /dev/tty is not ours: EOF from stdin
    with _on_terminal(["-I", "-S", str(GUARD), "--", sys.executable, "-c", command]) as proc:
        assert proc.wait(timeout=120) == 1  # getpass's EOFError, not a stopped job
    # Positive control: the same command in a process group of its own is stopped.
    with _on_terminal(["-c", "import subprocess, sys; subprocess.run("
                       "[sys.executable, '-c', sys.argv[1]], process_group=0)",
                       command]) as control, pytest.raises(subprocess.TimeoutExpired):
        control.wait(timeout=3)


@pytest.mark.slow
def test_explain_in_place_refuses_a_tree_that_is_not_the_recorded_code(tmp_path: Path) -> None:
    """explain --in-place runs the tree as it is, like verify --in-place, so it checks the
    tree is the recorded code first (verify did, explain did not: an edited script ran,
    and a parting was blamed on the environment)."""
    script = ("import pathlib, torch\nfrom safetensors.torch import save_file\n"
              "m = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
              "for _ in range(2):\n    opt.zero_grad()\n    m(torch.ones(3, 2)).sum().backward()\n"
              "    opt.step()\npathlib.Path('out').mkdir(exist_ok=True)\n"
              "save_file(m.state_dict(), 'out/m.safetensors')\n")
    repo = make_repo(tmp_path / "repo", {"fit.py": script}, example=False)
    manifest, _ = capture(repo, command=["python", "fit.py"])
    with (repo / "fit.py").open("a") as fh:
        fh.write("torch.manual_seed(1)\n")
    for verb in ("explain", "verify"):  # verify: the control, it always refused
        proc = manifest_cli(verb, str(manifest), "--in-place", "--format", "json", cwd=repo)
        assert proc.returncode == 3, proc.stderr.decode()
        report = json.loads(proc.stdout)
        assert report["reason"].startswith("--in-place: the tree has uncommitted changes")
        assert report["plan"] is None  # refused before anything was planned or run


def test_a_kept_scratch_tree_is_not_swept_by_the_next_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--keep`` keeps the scratch tree past the next re-run: the sweep for trees whose
    verb died used to remove it a minute later (its lock is free, like a killed one's)."""
    import tempfile

    from manifest.rerun.scratch import scratch_dir, sweep

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with scratch_dir(keep=True) as kept:
        (kept / "w").mkdir()
    with scratch_dir(keep=False) as gone:
        pass
    dead = tmp_path / "manifest-verify-dead"  # the control: a killed verb's, lock free
    dead.mkdir()
    (dead / ".lock").touch()
    for path in (kept, dead):
        os.utime(path, (0, 0))
    assert not gone.exists()
    assert sweep() == [dead]
    assert (kept / "w").is_dir()


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}")
def test_a_confined_failure_says_so_in_every_verb(tmp_path: Path) -> None:
    """A re-run that fails confined (a write to the read-only home) says what failed and
    that it ran confined, with --no-sandbox, in verify and explain as in the lab (explain
    said only 'the re-run failed (exit 1)', verify gave no hint)."""
    script = ("import os, pathlib, torch\nfrom safetensors.torch import save_file\n"
              "m = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
              "opt.zero_grad()\nm(torch.ones(3, 2)).sum().backward()\nopt.step()\n"
              "if os.environ.get('CACHE'):\n    pathlib.Path(os.environ['CACHE']).mkdir()\n"
              "pathlib.Path('out').mkdir(exist_ok=True)\n"
              "save_file(m.state_dict(), 'out/m.safetensors')\n")
    repo = make_repo(tmp_path / "repo", {"fit.py": script}, example=False)
    manifest, _ = capture(repo, command=["python", "fit.py"])
    cache = Path.home() / f".cache-manifest-test-{os.getpid()}"  # read-only when confined
    for verb in ("verify", "explain"):
        proc = manifest_cli(verb, str(manifest), "--format", "json", cwd=repo,
                            env={"CACHE": str(cache)})
        assert proc.returncode == 3, proc.stderr.decode()
        reason = json.loads(proc.stdout)["reason"]
        assert "Read-only file system" in reason, reason
        assert "the run was confined" in reason and "--no-sandbox" in reason, reason
    assert not cache.exists()
