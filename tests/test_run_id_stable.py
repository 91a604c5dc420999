"""A run_id does not depend on where or when the run ran (issue 27, item 4).

Seen on a busy machine without ``PYTHONDONTWRITEBYTECODE``: a local lab, then a
lab on SLURM of the same tree, reported two recipe run_ids. The field that moved
was ``code.diff_digest``: the first lab's runs imported an untracked module, the
interpreter wrote ``__pycache__/helper.cpython-311.pyc`` beside it (the tree's
.gitignore did not name it), and the second lab's snapshot packed that file as
code. Where ``PYTHONDONTWRITEBYTECODE=1`` is set (this project's dev machines),
no cache is written and the test passed, which is why it looked like load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import make_repo

HELPER_IMPORT = "\nimport helper  # noqa\nopen('train.log', 'a').write('ran\\n')\n"


def _tree(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo", {})
    (repo / "helper.py").write_text("LOADED = True\n")  # untracked, not ignored
    (repo / "train.py").write_text((repo / "train.py").read_text() + HELPER_IMPORT)
    return repo


def _diff_digest(repo: Path) -> str | None:
    from manifest.capture.snapshot import take_snapshot

    code = take_snapshot(repo).sections["code"]
    return code.get("diff_digest") if isinstance(code, dict) else None


def test_bytecode_caches_are_not_code(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    before = _diff_digest(repo)
    cache = repo / "__pycache__"
    cache.mkdir()
    (cache / "helper.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + os.urandom(32))
    (repo / "pkg" / "__pycache__").mkdir(parents=True)
    (repo / "pkg" / "__pycache__" / "mod.cpython-312.opt-1.pyc").write_bytes(os.urandom(16))
    assert _diff_digest(repo) == before
    # Positive control: any other untracked file is code, and moves the digest.
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    assert _diff_digest(repo) != before


@pytest.mark.slow
def test_two_labs_of_one_tree_get_one_recipe_run_id(tmp_path: Path) -> None:
    repo = _tree(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"}}
    lab = [sys.executable, "-m", "manifest", "lab", "--runs", "1", "--threads", "2",
           "--seed", "0", "--artifact", "out/*.safetensors", "--format", "json", "-q",
           "--", "python", "train.py", "--steps", "4"]
    ids = []
    for _ in range(2):
        proc = subprocess.run(lab, cwd=repo, env=env, capture_output=True, timeout=900,
                              check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        ids.append(json.loads(proc.stdout)["identity"]["recipe_run_id"])
        # The plants happened: the runs wrote a bytecode cache and a log into the tree.
        assert list((repo / "__pycache__").glob("helper.*.pyc"))
        assert (repo / "train.log").read_text().count("ran") >= 1
    assert ids[0] == ids[1]
