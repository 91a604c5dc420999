"""The confined re-run (issue 10, item 2).

A trusted command can still misbehave. The probe script below, when its
``PROBE_*`` variables are set (they are only at verify time), tries to write
a file outside the repository, to write into a dataset that verify linked
in, to write into the user's real repository, and to reach a server on the
host's loopback. Positive control: ``--no-sandbox`` lets every attempt
succeed; confined, every one fails, the user's files are unchanged and the
verdict is still ``identical``. Where bubblewrap cannot run (not installed,
no user namespaces) those tests skip, and the tests of the unconfined path
(``MANIFEST_BWRAP`` naming a missing program) show the report says "not
confined" and ``--require-sandbox`` refuses before anything runs.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from manifest.rerun.sandbox import SandboxSpec, unavailable_reason, wrap
from tests.runs import capture, make_repo, manifest_cli


def _user_files(repo: Path) -> dict[str, bytes]:
    """Every file of the user's tree except the tool's own local store (verify's
    data-hash cache lives there, written by verify itself, not by the command)."""
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file() and not p.is_relative_to(repo / ".manifest")}

pytestmark = pytest.mark.slow

PROBE = """
import os, pathlib, socket, sys
pathlib.Path('out').mkdir(exist_ok=True)
pathlib.Path('out/w.bin').write_bytes(pathlib.Path('data/in.txt').read_bytes())

def attempt(name, fn):
    try:
        fn()
        print(f"PROBE {name} ok", file=sys.stderr)
    except OSError as exc:
        print(f"PROBE {name} {type(exc).__name__}", file=sys.stderr)

if os.environ.get("PROBE_OUTSIDE"):
    attempt("outside", lambda: pathlib.Path(os.environ["PROBE_OUTSIDE"]).write_text("pwned"))
    attempt("dataset", lambda: pathlib.Path("data/in.txt").write_text("pwned"))
    attempt("user-repo", lambda: pathlib.Path(os.environ["PROBE_REPO"], "pwned.txt")
            .write_text("pwned"))
    def connect():
        with socket.create_connection(("127.0.0.1", int(os.environ["PROBE_PORT"])), timeout=3):
            pass
    attempt("network", connect)
"""

needs_bwrap = pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=f"no sandbox here: {unavailable_reason()}")


@pytest.fixture
def server() -> Iterator[int]:
    """A TCP server on the host's loopback that accepts anything."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    sock.close()


@pytest.fixture
def probe_repo(tmp_path: Path) -> tuple[Path, Path]:
    repo = make_repo(tmp_path / "repo", {"probe.py": PROBE}, example=False)
    (repo / "data").mkdir()  # ignored by git: verify links it in
    (repo / "data" / "in.txt").write_text("input")
    manifest, _ = capture(repo, "--data", "data", command=["python", "probe.py"],
                          outputs="out/*.bin")
    return repo, manifest


def _verify(repo: Path, manifest: Path, env: dict[str, str], *args: str) -> tuple[
        int, dict[str, str], dict[str, object], str]:
    proc = manifest_cli("verify", str(manifest), "--json", *args, cwd=repo, env=env)
    stderr = proc.stderr.decode()
    probes = dict(line.split()[1:3] for line in stderr.splitlines() if line.startswith("PROBE "))
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, probes, report, stderr


def _env(tmp_path: Path, repo: Path, port: int) -> dict[str, str]:
    return {"PROBE_OUTSIDE": str(tmp_path / "outside.txt"), "PROBE_REPO": str(repo),
            "PROBE_PORT": str(port)}


@needs_bwrap
def test_unconfined_rerun_reaches_everything(probe_repo: tuple[Path, Path], tmp_path: Path,
                                             server: int) -> None:
    """Positive control: without the sandbox each attempt lands (but the dataset is a copy)."""
    repo, manifest = probe_repo
    code, probes, report, stderr = _verify(repo, manifest, _env(tmp_path, repo, server),
                                           "--no-sandbox")
    assert probes == {"outside": "ok", "dataset": "ok", "user-repo": "ok", "network": "ok"}, \
        stderr
    assert str(report["confinement"]).startswith("not confined")
    assert (tmp_path / "outside.txt").exists() and (repo / "pwned.txt").exists()
    # Unconfined, a small dataset is copied into the scratch tree: the write lands there.
    assert (repo / "data" / "in.txt").read_text() == "input"
    assert code == 0, stderr


@needs_bwrap
def test_confined_rerun_writes_only_the_scratch_tree(probe_repo: tuple[Path, Path],
                                                     tmp_path: Path, server: int) -> None:
    repo, manifest = probe_repo
    before = _user_files(repo)
    code, probes, report, stderr = _verify(repo, manifest, _env(tmp_path, repo, server))
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    assert str(report["confinement"]).startswith("bubblewrap")
    # /tmp is private (the write lands in the sandbox's tmpfs, or finds no directory).
    assert probes["outside"] in ("ok", "FileNotFoundError"), probes
    assert not (tmp_path / "outside.txt").exists()
    assert probes["dataset"] in ("OSError", "PermissionError"), probes  # read-only bind
    assert (repo / "data" / "in.txt").read_text() == "input"
    assert probes["user-repo"] == "ok"  # the scratch tree sits at the repository's path...
    assert not (repo / "pwned.txt").exists()  # ...so the user's own tree is not touched
    assert probes["network"] in ("ConnectionRefusedError", "OSError", "TimeoutError"), probes
    assert _user_files(repo) == before


@needs_bwrap
def test_network_flag_lets_the_rerun_connect(probe_repo: tuple[Path, Path], tmp_path: Path,
                                             server: int) -> None:
    repo, manifest = probe_repo
    _, probes, report, stderr = _verify(repo, manifest, _env(tmp_path, repo, server),
                                        "--network")
    assert probes["network"] == "ok", stderr
    assert "network allowed" in str(report["confinement"])


def test_without_bubblewrap_the_report_says_not_confined(probe_repo: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    repo, manifest = probe_repo
    env = {"MANIFEST_BWRAP": str(tmp_path / "no-such-bwrap")}
    code, _, report, stderr = _verify(repo, manifest, env)
    assert code == 0, stderr
    assert str(report["confinement"]).startswith("not confined (bubblewrap")
    code, _, report, stderr = _verify(repo, manifest, env, "--require-sandbox")
    assert code == 3
    assert "--require-sandbox" in stderr and "re-running" not in stderr
    assert not any(line.startswith("PROBE") for line in stderr.splitlines())


def test_wrap_puts_the_tree_last_writable_and_binds_read_only(tmp_path: Path) -> None:
    spec = SandboxSpec(scratch=tmp_path / "s", mount_at=Path("/home/u/repo"),
                       ro_binds=[(tmp_path / "d", Path("/home/u/repo/data"))],
                       rw_paths=[tmp_path / "records"])
    argv = wrap(spec, ["python", "train.py"], Path("/home/u/repo"))
    joined = " ".join(argv)
    assert "--ro-bind / /" in joined and "--tmpfs /tmp" in joined
    assert f"--bind {tmp_path / 's'} /home/u/repo" in joined
    assert f"--ro-bind {tmp_path / 'd'} /home/u/repo/data" in joined
    assert "--share-net" not in argv and "--unshare-all" in argv
    assert argv[-3:] == ["--", "python", "train.py"]
    # The tree is bound after the read-only system, the dataset after the tree.
    assert joined.index("--ro-bind / /") < joined.index("--bind " + str(tmp_path / "s"))
    assert joined.index("/home/u/repo ") < joined.index("/home/u/repo/data")
    assert os.fspath(tmp_path / "records") in argv
