"""What a user wires into CI installs this package by its own name and fits their runners.

The name `manifest` on PyPI is an unrelated project: every place that tells
pip what to install names `torch-manifest`. The reusable workflow runs on a
runner the caller picks, and both the workflow and the action upload the JSON
report; the pre-commit hook is not verbose (pre-commit shows it only on failure).
"""

from __future__ import annotations

import re
import tomllib

from tests.runs import REPO

WORKFLOW = REPO / ".github" / "workflows" / "reproducibility.yml"
ACTION = REPO / ".github" / "actions" / "manifest-gate" / "action.yml"
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"


def test_distribution_name_is_not_the_unrelated_pypi_project() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "torch-manifest"
    assert project["scripts"] == {"manifest": "manifest.cli:entry"}
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_no_install_line_names_the_unrelated_package() -> None:
    pip_manifest = re.compile(r"pip install[^\n`]*(?<![\w-])manifest(?![\w/.-])|"
                              r"install: \"[^\"]*(?<![\w-])manifest\"")
    for path in (REPO / "README.md", WORKFLOW, ACTION, REPO / ".pre-commit-hooks.yaml"):
        text = path.read_text()
        assert not pip_manifest.search(text), (path, pip_manifest.search(text))
    # Positive control: the old README line is caught by the same pattern.
    assert pip_manifest.search("(`pip install manifest` leaves your CUDA")
    assert pip_manifest.search('install: "-r requirements.txt manifest"')
    assert "pip install 'torch-manifest[torch]'" in (REPO / "README.md").read_text()


def test_reusable_workflow_takes_runs_on_and_uploads_the_report() -> None:
    text = WORKFLOW.read_text()
    assert re.search(r"\n      runs-on:\n        description: .+\n        type: string\n"
                     r"        default: ubuntu-latest\n", text)
    assert "runs-on: ${{ inputs.runs-on }}" in text
    assert UPLOAD in text
    assert "--json-file" in text
    assert "if: always()" in text


def test_action_uploads_the_report_and_keeps_the_summary() -> None:
    text = ACTION.read_text()
    assert UPLOAD in text
    assert 'manifest gate --json-file "$report"' in text
    assert "job summary" in text.lower()


def test_pre_commit_hook_is_not_verbose() -> None:
    text = (REPO / ".pre-commit-hooks.yaml").read_text()
    assert not re.search(r"^\s*verbose:\s*true", text, re.M)
