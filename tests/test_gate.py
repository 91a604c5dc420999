"""``manifest gate`` on the bundled example and on each planted break (issue 7).

The example (``examples/gate_repo``) is copied into a fresh git repository
and its baseline is recreated there: a baseline names a commit and paths of
the repository it was recorded in. Each break is planted in a copy of that
repository, so the tests do not see each other's changes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, load_manifest, seal, to_document
from tests.runs import REPO, git, manifest_cli

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "gate_repo"


def gate(repo: Path, *args: str, env: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], str]:
    """Run the gate; returns its exit status, the JSON report and the human text.

    The human report goes to stdout and the JSON report to --json-file, both
    from the same run: the text returned is stdout followed by stderr.
    """
    with tempfile.TemporaryDirectory() as scratch:
        report_file = Path(scratch) / "report.json"
        proc = manifest_cli("gate", "--json-file", str(report_file), *args, cwd=repo, env=env)
        stderr = proc.stderr.decode()
        assert "Traceback" not in stderr, stderr
        report = json.loads(report_file.read_bytes()) if report_file.exists() else {}
    return proc.returncode, report, proc.stdout.decode() + stderr


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example in a repository of its own, its baseline recorded there and committed."""
    repo = tmp_path_factory.mktemp("gate") / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("out", ".manifest"))
    (repo / "manifests" / "baseline.json").unlink(missing_ok=True)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "example")
    code, report, stderr = gate(repo, "--update-baseline")
    assert code == 0, stderr
    assert report["baseline_written"] is True
    commit(repo, "baseline")
    return repo


@pytest.fixture
def work(example: Path, tmp_path: Path) -> Path:
    """A private copy of the example repository (history included) to break."""
    repo = tmp_path / "repo"
    shutil.copytree(example, repo, symlinks=True)
    return repo


def test_gate_passes_on_the_example_and_writes_the_summary(example: Path,
                                                           tmp_path: Path) -> None:
    status_before = git(example, "status", "--porcelain")
    summary = tmp_path / "summary.md"
    code, report, stderr = gate(example, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert code == 0, stderr
    assert report["verdict"] == "pass"
    found = checks(report)
    assert [c["name"] for c in report["checks"]] == ["determinism", "baseline", "hygiene"]
    assert all(c["status"] == "pass" for c in found.values()), found
    assert "bit-identical" in found["determinism"]["reason"]
    # The re-run went through the one engine: its plan is in the report, unconfined with
    # the gate's stated reason (its own capture ran the command unconfined).
    assert report["plan"]["verb"] == "verify" and report["plan"]["confined"] is False
    assert "gate's own capture" in report["plan"]["confinement"]
    assert any("re-run: not confined" in d for d in found["determinism"]["details"])
    assert "identical to the baseline" in found["baseline"]["reason"]
    assert "gate PASSED" in stderr
    assert git(example, "status", "--porcelain") == status_before
    text = summary.read_text()
    assert text.startswith("## Reproducibility gate: ✅ passed")
    assert "| determinism | ✅ pass |" in text


def test_update_baseline_rewrites_atomically(work: Path) -> None:
    baseline = work / "manifests" / "baseline.json"
    before = load_manifest(baseline.read_bytes())
    edit(work / "train.py", "lr=0.1", "lr=0.05")
    code, report, _ = gate(work)
    assert code == 1
    assert checks(report)["baseline"]["status"] == "fail"
    code, report, stderr = gate(work, "--update-baseline")
    assert code == 0, stderr
    after = load_manifest(baseline.read_bytes())
    assert after.run_id != before.run_id
    assert baseline.read_bytes() == dumps(after)
    assert [p.name for p in baseline.parent.iterdir()] == ["baseline.json"]
    commit(work, "accept lr change")
    code, report, _ = gate(work)
    assert code == 0
    assert checks(report)["baseline"]["status"] == "pass"


def test_changed_data_byte_fails_with_the_cause(work: Path) -> None:
    data = work / "data" / "images.bin"
    raw = bytearray(data.read_bytes())
    raw[1000] ^= 0x01
    data.write_bytes(bytes(raw))
    code, report, stderr = gate(work)
    assert code == 1
    found = checks(report)
    assert found["determinism"]["status"] == "pass"
    baseline = found["baseline"]
    assert baseline["status"] == "fail"
    assert "recorded input(s) differ" in baseline["reason"]
    assert any(d.startswith("data: dataset data content") for d in baseline["details"])
    assert not any(d.startswith("code:") for d in baseline["details"])
    assert "manifest gate --update-baseline" in baseline["hint"]
    assert "--update-baseline" in stderr
    # The cheap mode finds it too, by file, without training.
    code, report, _ = gate(work, "--no-rerun")
    assert code == 1
    assert any("images.bin" in d for d in checks(report)["manifests"]["details"])


def test_dropped_seed_fails_as_non_deterministic(work: Path) -> None:
    # The script reseeds from the clock after the launcher seeded it.
    edit(work / "train.py", "    images, labels = load(Path(args.data))\n",
         "    import time\n\n    torch.manual_seed(time.time_ns())\n"
         "    images, labels = load(Path(args.data))\n")
    commit(work, "reseed from the clock")
    code, report, stderr = gate(work)
    assert code == 1
    determinism = checks(report)["determinism"]
    assert determinism["status"] == "fail"
    assert determinism["reason"].startswith("non-deterministic")
    assert any("differs in" in d for d in determinism["details"])
    assert "clock" in determinism["hint"]
    assert "Look for randomness" in stderr


def test_op_fed_by_os_entropy_fails_as_non_deterministic(work: Path) -> None:
    # An augmentation whose generator the seed does not reach.
    edit(work / "train.py", "            loss = F.cross_entropy(model(images[batch])",
         "            noise = torch.Generator()\n            noise.seed()\n"
         "            x = images[batch] + 0.01 * torch.randn(images[batch].shape, "
         "generator=noise)\n            loss = F.cross_entropy(model(x)")
    commit(work, "add noise augmentation")
    code, report, _ = gate(work)
    assert code == 1
    assert checks(report)["determinism"]["status"] == "fail"
    assert checks(report)["determinism"]["reason"].startswith("non-deterministic")


def test_switching_off_deterministic_algorithms_fails_hygiene(work: Path) -> None:
    # scatter_add_ has no deterministic CUDA kernel; the script turns the check off so
    # the op runs on GPU. On CPU the weights still reproduce: hygiene is what catches it.
    edit(work / "train.py", "    images, labels = load(Path(args.data))\n",
         "    torch.use_deterministic_algorithms(False)\n"
         "    images, labels = load(Path(args.data))\n"
         "    counts = torch.zeros(10).scatter_add_(0, labels, torch.ones(len(labels)))\n"
         "    print('class counts', counts.tolist())\n")
    commit(work, "class counts via scatter_add_")
    code, report, _ = gate(work)
    assert code == 1
    found = checks(report)
    assert found["determinism"]["status"] == "pass"
    assert found["hygiene"]["status"] == "fail"
    assert any("deterministic_algorithms was False at exit" in d
               for d in found["hygiene"]["details"])


def test_undeclared_file_that_changes_is_non_reproducible(work: Path, tmp_path: Path) -> None:
    outside = tmp_path / "scale.txt"
    outside.write_text("1.0\n")
    edit(work / "train.py", "    images, labels = load(Path(args.data))\n",
         "    images, labels = load(Path(args.data))\n"
         f"    images = images * float(Path({str(outside)!r}).read_text())\n")
    commit(work, "scale from a shared file")
    code, report, stderr = gate(work, "--update-baseline")
    assert code == 0, stderr
    commit(work, "baseline")
    code, _, _ = gate(work)
    assert code == 0
    outside.write_text("1.001\n")
    code, report, _ = gate(work)
    assert code == 1
    found = checks(report)
    assert found["determinism"]["status"] == "pass"
    assert found["hygiene"]["status"] == "pass"
    baseline = found["baseline"]
    assert baseline["status"] == "fail"
    # The launcher saw the run read the file: it is a discovered input, named as the cause
    # (before inputs were discovered this was "non-reproducible", with no recorded cause).
    assert baseline["reason"].startswith("weights changed from the baseline"), baseline
    assert any("scale.txt" in d and d.startswith("data:") for d in baseline["details"])


def _reseal_baseline(repo: Path, change: dict[str, Any]) -> None:
    path = repo / "manifests" / "baseline.json"
    doc = to_document(load_manifest(path.read_bytes()))
    doc["env"] = {**doc["env"], **change}
    path.write_bytes(dumps(seal(doc)))


def test_baseline_from_another_environment_is_compared_and_noted(work: Path) -> None:
    _reseal_baseline(work, {"torch": "2.0.0"})
    commit(work, "baseline from another runner")
    code, report, _ = gate(work)
    assert code == 0
    baseline = checks(report)["baseline"]
    # The weights are compared all the same: identical here, with the drift named.
    assert baseline["status"] == "pass"
    assert "identical" in baseline["reason"] and "another environment" in baseline["reason"]
    assert any("torch" in d for d in baseline["details"])
    edit(work / "pyproject.toml", "same_env = false", "same_env = true")
    commit(work, "same_env")
    code, report, _ = gate(work)
    # Same weights: the torch difference is harmless here.
    assert code == 0
    assert checks(report)["baseline"]["status"] == "pass"


def test_committed_example_baseline_never_fails_on_its_own(tmp_path: Path) -> None:
    """The committed baseline was recorded elsewhere: here it passes, or says the weights
    moved with the environment (no verdict), never fails."""
    committed = load_manifest((EXAMPLE / "manifests" / "baseline.json").read_bytes())
    assert committed.determinism.num_threads == 1
    assert committed.randomness.seed == 0
    assert [d.name for d in committed.data] == ["data"]
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("out", ".manifest"))
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "example")
    code, report, stderr = gate(repo)
    assert code in (0, 3), stderr
    assert checks(report)["baseline"]["status"] in ("pass", "no-verdict")


def test_no_rerun_validates_and_refuses_a_tampered_baseline(work: Path) -> None:
    code, report, stderr = gate(work, "--no-rerun")
    assert code == 0, stderr
    found = checks(report)
    assert found["determinism"]["status"] == "skip"
    assert found["manifests"]["status"] == "pass"
    assert "re-running" not in stderr
    path = work / "manifests" / "baseline.json"
    path.write_bytes(path.read_bytes().replace(b'"seed":0', b'"seed":1', 1))
    code, _, stderr = gate(work, "--no-rerun")
    assert code == 2
    assert "digest does not match" in stderr


def test_pre_commit_entry_warns_on_unpinned_threads(work: Path) -> None:
    edit(work / "pyproject.toml", "threads = 1 ", "# threads = 1 ")
    proc = manifest_cli("gate", "--no-rerun", "--warn-hygiene", "manifests/baseline.json",
                        cwd=work)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "warning: the thread count is not pinned" in proc.stdout.decode()


def test_training_crash_is_no_verdict(work: Path) -> None:
    edit(work / "train.py", "    main()\n", "    raise SystemExit(5)\n")
    code, report, _ = gate(work)
    assert code == 3
    assert checks(report)["determinism"]["status"] == "no-verdict"
