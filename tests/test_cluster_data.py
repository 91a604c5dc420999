"""Data outside the repository goes with a cluster re-run (issue 30), through submitit's local
executor (the same flow as SLURM, no root needed):

* bundled: the dataset is copied into the bundle (``tree/.manifest-data/<i>``, indexed and
  checked on arrival like every file), the command's path to it pointed at that copy, or a
  relative reference linked where it lands; the bundle grows by the data's bytes;
* ``--shared-path``: the dataset is used at its own path where the job runs, nothing shipped;
* over ``max_data_bytes``: one sentence naming ``--shared-path``, exit 2, nothing submitted.

Each way is said before submission and listed in the report's ``job.data``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.runs import capture, make_repo, manifest_cli

pytest.importorskip("submitit", reason="the slurm extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SCRIPT = """\
import hashlib, os, sys
import torch
from safetensors.torch import save_file
data = open(sys.argv[1], 'rb').read()
print('read', os.path.realpath(sys.argv[1]), flush=True)
seed = int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), 'little')
w = torch.randn(16, 16, generator=torch.Generator().manual_seed(seed))
os.makedirs('out', exist_ok=True)
save_file({'w': w}, 'out/model.safetensors')
"""

DATA_BYTES = 1 << 20


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("data")
    ext = base / "ext"
    ext.mkdir()
    (ext / "data.bin").write_bytes(os.urandom(DATA_BYTES))
    folder = base / "slurm"
    repo = make_repo(base / "repo", {"use_data.py": SCRIPT, "pyproject.toml": (
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(folder))}\nlocal = true\ntime_min = 10\n")})
    absolute, _ = capture(repo, "--data", f"ext={ext}", "--artifact", "out/*.safetensors",
                          name="absolute.json",
                          command=["python", "use_data.py", str(ext / "data.bin")])
    relative, _ = capture(repo, "--data", "ext=../ext", "--artifact", "out/*.safetensors",
                          name="relative.json",
                          command=["python", "use_data.py", "../ext/data.bin"])
    return {"repo": repo, "ext": ext, "absolute": absolute, "relative": relative}


def _verify(setup: dict[str, Any], which: str, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(setup[which]), "--json", "--on", "slurm", *args,
                        cwd=setup["repo"], timeout=600)
    return proc.returncode, json.loads(proc.stdout or b"{}"), proc.stderr.decode()


def _log(report: dict[str, Any]) -> str:
    """The job's stdout and stderr (submitit's two log files; the command's output is in one)."""
    out = Path(report["job"]["where"])
    return out.read_text() + out.with_name(out.name.replace("_log.out", "_log.err")).read_text()


def test_bundled_and_shared_both_reach_the_job(setup: dict[str, Any]) -> None:
    code, bundled, stderr = _verify(setup, "absolute")
    assert code == 0, stderr
    assert bundled["verdict"] == "identical"
    [line] = bundled["job"]["data"]
    assert line["path"] == str(setup["ext"]) and line["how"].startswith("bundled")
    assert line["bytes"] == DATA_BYTES
    assert f"data outside the repository: {setup['ext']}: bundled" in stderr
    log = _log(bundled)  # what the script read, as it said in the job's log
    assert "/.manifest-data/0/data.bin" in log and f"read {setup['ext']}" not in log

    code, shared, stderr = _verify(setup, "absolute", "--shared-path", str(setup["ext"].parent))
    assert code == 0, stderr
    assert shared["verdict"] == "identical"
    assert shared["job"]["data"][0]["how"].startswith("shared: mounted from the same path")
    assert f"read {setup['ext'] / 'data.bin'}" in _log(shared)
    grew = bundled["job"]["bytes_shipped"] - shared["job"]["bytes_shipped"]
    assert DATA_BYTES <= grew < DATA_BYTES + 4096  # the data, and its index lines
    print(f"\nbytes shipped: {shared['job']['bytes_shipped']} without the dataset, "
          f"{bundled['job']['bytes_shipped']} with it bundled ({DATA_BYTES} bytes of data)")


def test_relative_reference_lands_beside_the_tree(setup: dict[str, Any]) -> None:
    code, report, stderr = _verify(setup, "relative")
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    assert report["job"]["data"][0]["how"].startswith("bundled")
    # The bundle's copy: linked where ../ext lands (bound there read-only when confined).
    log = _log(report)
    assert "/out/ext/data.bin" in log or "/.manifest-data/0/data.bin" in log
    assert f"read {setup['ext']}" not in log


def test_over_the_limit_is_one_sentence_before_anything_is_submitted(
        setup: dict[str, Any]) -> None:
    repo: Path = setup["repo"]
    config = repo / "pyproject.toml"
    before = config.read_text()
    config.write_text(before + f"max_data_bytes = {DATA_BYTES // 2}\n")
    try:
        code, _, stderr = _verify(setup, "absolute")
    finally:
        config.write_text(before)
    assert code == 2, stderr
    assert "over the 0 MiB that travels in a bundle" in stderr or "travels in a bundle" in stderr
    assert f"--shared-path {setup['ext'].parent}" in stderr
    assert "submitted" not in stderr
