"""The gate says what it could not check, and its hints lead somewhere.

Through the real CLI on the bundled gate example in a repository of its own: a baseline
that git ignores is a warning; a missing dataset under ``--no-rerun`` is "missing", not a
change to accept; a baseline recorded under another thread count (``OMP_NUM_THREADS``,
the count unpinned) is judged, never skipped: ``equivalent`` against its envelope with
``allow_equivalent``, no verdict (exit 3) without it, even with ``--warn-hygiene``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.runs import REPO, git, manifest_cli

EXAMPLE = REPO / "examples" / "gate_repo"


def gate(repo: Path, *args: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], str]:
    with tempfile.TemporaryDirectory() as scratch:
        report_file = Path(scratch) / "report.json"
        proc = manifest_cli("gate", "--json-file", str(report_file), *args, cwd=repo, env=env,
                            timeout=900)
        text = proc.stdout.decode() + proc.stderr.decode()
        assert "Traceback" not in text, text
        report = json.loads(report_file.read_bytes()) if report_file.exists() else {}
    return proc.returncode, report, text


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def example_repo(path: Path, *, committed_baseline: bool = True) -> Path:
    shutil.copytree(EXAMPLE, path, ignore=shutil.ignore_patterns("out", ".manifest"))
    if not committed_baseline:
        (path / "manifests" / "baseline.json").unlink()
    git(path, "init", "-q", "-b", "main")
    commit(path, "example")
    return path


def light_baseline(repo: Path) -> None:
    """A baseline recorded here without training (``--no-rerun`` only validates it): the
    example's dataset at its path in this repository, committed."""
    # An empty safetensors file (an 8-byte header length, then the header "{}") stands in
    # for the declared weights.
    write = ("import os, struct; os.makedirs('out', exist_ok=True); "
             "open('out/model.safetensors', 'wb').write(struct.pack('<Q', 2) + b'{}')")
    proc = manifest_cli("capture", "-q", "--data", "data", "--", "python", "-c", write,
                        cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    (repo / "manifests" / "baseline.json").write_bytes(proc.stdout)
    commit(repo, "baseline")


def test_a_baseline_git_ignores_is_a_warning(tmp_path: Path) -> None:
    repo = example_repo(tmp_path / "repo")
    light_baseline(repo)
    git(repo, "rm", "-q", "--cached", "manifests/baseline.json")
    (repo / ".gitignore").write_text("*.json\n")
    code, report, text = gate(repo, "--no-rerun")
    assert code in (0, 1), text
    [warning] = [w for w in report["warnings"] if "ignored by git" in w]
    assert "manifests/baseline.json" in warning and ".gitignore:1:*.json" in warning
    assert "!manifests/baseline.json" in warning
    # Control: tracked (committed with -f), it is carried whatever .gitignore says.
    git(repo, "add", "-f", "manifests/baseline.json")
    code, report, _ = gate(repo, "--no-rerun")
    assert code in (0, 1) and not any("ignored by git" in w for w in report["warnings"])


def test_no_rerun_says_a_missing_dataset_is_missing(tmp_path: Path) -> None:
    repo = example_repo(tmp_path / "repo")
    light_baseline(repo)
    shutil.rmtree(repo / "data")
    code, report, text = gate(repo, "--no-rerun")
    assert code == 1, text
    found = checks(report)["manifests"]
    assert found["reason"] == "1 recorded dataset(s) missing", found
    assert "dataset data is missing" in found["details"][0]
    assert "update the baseline" not in found["hint"] and "--update-baseline" not in text
    # Control: a dataset that is there but changed still offers the update.
    repo = example_repo(tmp_path / "changed")
    light_baseline(repo)
    labels = repo / "data" / "labels.bin"
    labels.write_bytes(bytes([labels.read_bytes()[0] ^ 1]) + labels.read_bytes()[1:])
    code, report, _ = gate(repo, "--no-rerun")
    found = checks(report)["manifests"]
    assert code == 1 and "changed since capture" in found["reason"]
    assert "--update-baseline" in found["hint"]


@pytest.fixture(scope="module")
def other_threads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example with its thread count unpinned and allow_equivalent on, its baseline
    (with its noise envelope) recorded under OMP_NUM_THREADS=2 and committed."""
    repo = tmp_path_factory.mktemp("gate-threads") / "repo"
    example_repo(repo, committed_baseline=False)
    config = repo / "pyproject.toml"
    text = config.read_text()
    for old, new in (("threads = 1 ", "# threads = 1 "),
                     ('"--epochs", "10"', '"--epochs", "2"'),
                     ("same_env = false", "same_env = false\nallow_equivalent = true")):
        assert old in text, old
        text = text.replace(old, new, 1)
    config.write_text(text)
    commit(repo, "unpinned threads, allow_equivalent")
    code, report, text = gate(repo, "--update-baseline", "--warn-hygiene",
                              env={"OMP_NUM_THREADS": "2"})
    assert code == 0 and report["baseline_written"], text
    commit(repo, "baseline at 2 threads")
    return repo


@pytest.mark.slow
def test_another_thread_count_is_judged_against_the_envelope(other_threads: Path) -> None:
    code, report, text = gate(other_threads, "--warn-hygiene", env={"OMP_NUM_THREADS": "1"})
    baseline = checks(report)["baseline"]
    assert code == 0, text
    assert baseline["status"] == "pass", baseline
    assert baseline["reason"].startswith("equivalent to the baseline"), baseline
    assert baseline["reason"].endswith("the step trails decide and the final weights were "
                                       "held to no bound"), baseline
    assert any("OMP_NUM_THREADS 2 → 1" in d for d in baseline["details"]), baseline
    assert any(d.startswith("weights: ") for d in baseline["details"]), baseline


@pytest.mark.slow
def test_without_allow_equivalent_the_moved_weights_are_no_verdict(other_threads: Path,
                                                                   tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(other_threads, repo, symlinks=True)
    config = repo / "pyproject.toml"
    config.write_text(config.read_text().replace("allow_equivalent = true",
                                                 "allow_equivalent = false"))
    commit(repo, "no allow_equivalent")
    # --warn-hygiene turns hygiene into warnings; the weights still decide (exit 3).
    code, report, text = gate(repo, "--warn-hygiene", env={"OMP_NUM_THREADS": "1"})
    baseline = checks(report)["baseline"]
    assert code == 3, text
    assert baseline["status"] == "no-verdict", baseline
    assert "the weights differ from the baseline" in baseline["reason"]
    assert "allow_equivalent = true" in baseline["hint"]
    # (Identical weights on another environment pass: tests/test_gate.py, whose baseline
    # only claims another torch.)


@pytest.mark.slow
def test_a_code_change_is_never_equivalent(other_threads: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(other_threads, repo, symlinks=True)
    train = repo / "train.py"
    train.write_text(train.read_text().replace("lr=0.1", "lr=0.11"))
    commit(repo, "another learning rate")
    code, report, text = gate(repo, "--warn-hygiene", env={"OMP_NUM_THREADS": "1"})
    baseline = checks(report)["baseline"]
    assert code == 1, text
    assert baseline["status"] == "fail" and "beyond rounding" in baseline["reason"], baseline
    assert any("train.py" in d for d in baseline["details"]), baseline
