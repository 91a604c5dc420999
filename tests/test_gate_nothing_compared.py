"""The gate never passes on nothing (issue 32): a smoke command that declares no output
and takes no optimizer step is ``nothing-compared`` (exit 3) with the fix, not ``pass``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import make_repo, manifest_cli

pytestmark = pytest.mark.slow

PYPROJECT = """[tool.manifest]
command = ["python", "hello.py"]
threads = 1

[tool.manifest.gate]
command = ["python", "hello.py"]
checks = ["determinism"]
"""


def test_gate_that_compared_nothing_says_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"hello.py": "print('no weights')\n",
                                         "pyproject.toml": PYPROJECT}, example=False)
    report_file = tmp_path / "gate.json"
    proc = manifest_cli("gate", "--json-file", str(report_file), cwd=repo)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 3, out
    report = json.loads(report_file.read_bytes())
    assert report["verdict"] == "nothing-compared"
    [check] = report["checks"]
    assert (check["name"], check["status"]) == ("determinism", "nothing-compared")
    assert "nothing was compared: the run declared no output" in check["reason"]
    assert check["details"][0].startswith("compared: nothing")
    assert "outputs" in check["hint"] and "[tool.manifest]" in check["hint"]
    assert "NOTHING-COMPARED" in out
