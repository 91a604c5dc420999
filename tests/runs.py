"""Helpers for tests that capture and verify real training runs on CPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train.py"
GIT_ID = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def make_repo(path: Path, files: dict[str, str], *, example: bool = True) -> Path:
    """A real git repository with one commit holding ``files`` (and the example script)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    if example:
        shutil.copy(EXAMPLE, path / "train.py")
    (path / ".gitignore").write_text("out/\n*.json\ndata/\n")
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def manifest_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    full_env = dict(os.environ)
    full_env.pop("PYTHONHASHSEED", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "manifest", *args], cwd=cwd, env=full_env,
                          capture_output=True, timeout=timeout, check=False)


def capture(repo: Path, *extra: str, command: list[str] | None = None,
            outputs: str = "out/*.safetensors", name: str = "run.json",
            expect: int = 0) -> tuple[Path, dict[str, Any]]:
    cmd = command or ["python", "train.py", "--steps", "20"]
    proc = manifest_cli("capture", "--artifact", outputs, *extra, "--", *cmd, cwd=repo)
    assert proc.returncode == expect, proc.stderr.decode()
    path = repo / name
    path.write_bytes(proc.stdout)
    return path, json.loads(proc.stdout)


def tree_state(repo: Path) -> str:
    """A digest of everything a user could lose: files, index, refs, stash, worktrees."""
    h = hashlib.sha256()
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if rel.parts[0] == ".git" and (len(rel.parts) < 2 or rel.parts[1] not in (
                "index", "refs", "HEAD", "worktrees", "packed-refs", "logs")):
            continue
        h.update(str(rel).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    h.update(git(repo, "status", "--porcelain", "--ignored").encode())
    h.update(git(repo, "stash", "list").encode())
    h.update(git(repo, "worktree", "list", "--porcelain").encode())
    return h.hexdigest()


def free_port() -> int:
    """A TCP port free on loopback now (for torchrun's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
