"""README's test command runs on 2 pytest-xdist workers (``-n 2 --dist loadfile``): what
``tests/conftest.py`` promises of that run, checked on a small suite of its own.

The suite is written to a temporary directory beside a copy of this conftest and run by
the real pytest and xdist in a subprocess: the cluster modules all land on one worker
(two Ray clusters or two SLURM jobs at once would share CI's 2 cores), and a test marked
``cluster`` outside them is refused at collection, since the scheduler would not see it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytest.importorskip("xdist", reason="pytest-xdist is not installed (the dev extra has it)")

INI = """[pytest]
markers =
    cluster: a cluster test
    slow: a slow test
"""

# Each test records the worker that ran it (xdist's scheduler deals out every module before
# any test runs: where a module goes does not depend on timing).
MODULE = """import os
def test_{name}(tmp_path_factory):
    out = tmp_path_factory.getbasetemp().parent.parent / "ran"
    with open(out, "a") as fh:
        fh.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def _suite(root: Path, modules: list[str]) -> Path:
    tests = root / "tests"
    tests.mkdir(parents=True)
    shutil.copy(HERE / "conftest.py", tests / "conftest.py")
    (root / "pytest.ini").write_text(INI)
    (root / "tmp").mkdir()
    for name in modules:
        (tests / f"{name}.py").write_text(MODULE.format(name=name))
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(root / "tmp" / "base"), *args],
                          cwd=root, capture_output=True, text=True, timeout=300, check=False,
                          env={k: v for k, v in os.environ.items()  # the caller's settings
                               if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")})


def _workers(root: Path) -> dict[str, str]:
    lines = (root / "tmp" / "ran").read_text().split("\n")
    return dict(line.split() for line in lines if line)


def test_the_cluster_modules_run_on_one_worker(tmp_path: Path) -> None:
    clustered = _suite(tmp_path / "a", ["test_cluster_ray", "test_cluster_slurm",
                                        "test_lab", "test_gate"])
    proc = _run(clustered, "-n", "2", "--dist", "loadfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = _workers(clustered)
    assert len(ran) == 4 and len(set(ran.values())) == 2  # both workers worked
    assert ran["test_cluster_ray"] == ran["test_cluster_slurm"]
    # Positive control: the same two modules under other names are xdist's to place, and
    # its loadfile scheduler deals the four modules out to the two workers in turn.
    loose = _suite(tmp_path / "b", ["test_ray", "test_slurm", "test_lab", "test_gate"])
    proc = _run(loose, "-n", "2", "--dist", "loadfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = _workers(loose)
    assert ran["test_ray"] != ran["test_slurm"]


def test_a_cluster_test_outside_the_cluster_modules_is_refused(tmp_path: Path) -> None:
    root = _suite(tmp_path, [])
    marked = "import pytest\n@pytest.mark.cluster\ndef test_it():\n    pass\n"
    (root / "tests" / "test_lab_on_ray.py").write_text(marked)
    proc = _run(root)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "tests/test_lab_on_ray.py: a test marked cluster belongs in a" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Positive control: the same test in a cluster module is collected and passes.
    (root / "tests" / "test_lab_on_ray.py").rename(root / "tests" / "test_cluster_lab.py")
    proc = _run(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
