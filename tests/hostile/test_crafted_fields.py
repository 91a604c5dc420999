"""Crafted manifest fields are data: nothing they name is written outside the scratch tree.

Conformance-style: each file in ``crafted/`` is one case, ``*_fail`` cases
must be refused, the others must verify. A case edits fields of a real
captured manifest (``set``: dotted paths; ``add_dataset``; ``commit_symlink``:
a commit whose tree holds a symlink, made with plumbing so the user's
working tree is untouched) and re-seals it, as anyone can. Every case runs
with ``--trust`` (trust is not what must stop it: the path validator must)
and ``--no-sandbox`` (the validator alone must hold, without bubblewrap).

``{outside}`` is a directory beside the repository holding a precious
``w.bin``; after each case it must hold exactly what it held, and the user's
repository must be byte-for-byte as before: "writes outside the scratch
tree" is the number of cases where either changed, and must be 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, load_manifest, seal, to_document
from tests.runs import capture, git, make_repo, manifest_cli, tree_state

pytestmark = pytest.mark.slow

CASES = Path(__file__).parent / "crafted"
SCRIPT = """
import pathlib
pathlib.Path('out').mkdir(exist_ok=True)
pathlib.Path('out/w.bin').write_bytes(b'weights')
"""


def _state(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() and not p.is_symlink() else "dir-or-link"
            for p in sorted(path.rglob("*"))}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("crafted")
    outside = root / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(b"precious")
    repo = make_repo(root / "repo", {"w.py": SCRIPT}, example=False)
    (repo / "committed-blobs").mkdir()
    (repo / "committed-blobs" / "note.txt").write_text("not a store\n")
    git(repo, "add", "committed-blobs")
    git(repo, "commit", "-q", "-m", "a directory named like a store")
    manifest, _ = capture(repo, command=["python", "w.py"], outputs="out/*.bin")
    return repo, manifest, outside


def _commit_with_symlink(repo: Path, path: str, target: str) -> str:
    """A commit on top of HEAD whose tree adds ``path`` as a symlink to ``target``."""
    env = {**os.environ, "GIT_INDEX_FILE": str(repo / ".git" / "crafted-index")}

    def run(*args: str, data: bytes | None = None) -> str:
        return subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args],
                              cwd=repo, env=env, input=data, capture_output=True,
                              check=True).stdout.decode().strip()

    run("read-tree", "HEAD")
    blob = run("hash-object", "-w", "--stdin", data=target.encode())
    run("update-index", "--add", "--cacheinfo", f"120000,{blob},{path}")
    tree = run("write-tree")
    commit = run("commit-tree", tree, "-p", "HEAD", "-m", f"symlink {path}")
    (repo / ".git" / "crafted-index").unlink()
    return commit


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[key]
    doc[last] = value


def _fill(value: Any, outside: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{outside}", str(outside)).replace(
            "{home}", os.path.expanduser("~"))
    if isinstance(value, list):
        return [_fill(v, outside) for v in value]
    return value


@pytest.mark.parametrize("verb", ["verify", "explain", "verify --no-rerun"])
@pytest.mark.parametrize("case", sorted(p.stem for p in CASES.glob("*.json")))
def test_crafted_case(base: tuple[Path, Path, Path], tmp_path: Path, case: str,
                      verb: str) -> None:
    """Every verb that re-runs plans through the one engine: the same refusals."""
    repo, manifest, outside = base
    spec = json.loads((CASES / f"{case}.json").read_text())
    doc = to_document(load_manifest(manifest.read_bytes()))
    for dotted, value in spec.get("set", {}).items():
        _set(doc, dotted, _fill(value, outside))
    if "commit_symlink" in spec:
        link, target = (_fill(v, outside) for v in spec["commit_symlink"])
        doc["code"]["commit"] = _commit_with_symlink(repo, link, target)
    if "add_dataset" in spec:
        doc["data"].append({"name": "crafted", "path": _fill(spec["add_dataset"], outside),
                            "root": "blake3:" + "0" * 64, "files": 0, "bytes": 0})
    crafted = tmp_path / "crafted.json"
    crafted.write_bytes(dumps(seal(doc)))
    before_repo, before_outside = tree_state(repo), _state(outside)

    args = verb.split()
    started = time.monotonic()
    proc = manifest_cli(*args, str(crafted), "--trust", "--json",
                        *(["--no-sandbox"] if "--no-rerun" not in args else []), cwd=repo)
    elapsed = time.monotonic() - started
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    expected = spec["exit"]
    if "--no-rerun" in args:
        # Nothing runs: only the dataset paths matter (read, hashed), and a system
        # tree is refused before a single file of it is read.
        if not case.startswith("dataset_"):
            return
        assert elapsed < 20, f"{case}: refusing took {elapsed:.1f} s"
    elif verb == "explain" and not case.endswith("_fail"):
        # explain's verdict on a run that does not part: exit 0 ("agree"), or 3 when the
        # script trains no step; what matters is that nothing landed outside.
        expected = proc.returncode if proc.returncode in (0, 3) else expected
    assert proc.returncode == expected, f"{case} ({spec['why']}): {stderr}"
    assert spec["stderr"] in stderr
    if case.endswith("_fail"):
        assert "re-running" not in stderr, "refused only after the command started"
    assert _state(outside) == before_outside, f"{case}: a write landed outside the tree"
    assert tree_state(repo) == before_repo, f"{case}: the user's repository changed"
    assert not (outside / "store").exists()
