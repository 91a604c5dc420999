"""``manifest lab``: real CPU training, the checked-in schema, the op catalogue.

The slow tests each run one whole lab (2 + 2 runs and the audit run): the
bundled example through the CLI (``--json`` validated against the schema,
``--report``), and a script that hits ``index_add_``/``scatter_add_`` and
reads an unseeded source, through the library.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from manifest.cli.render_lab import render_lab, render_lab_markdown
from manifest.lab.report import LabReport, lab_schema_text
from manifest.ops.catalogue import load_table, parse_docstring
from tests.runs import make_repo, manifest_cli

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "schemas" / "lab.v1.schema.json"

SCATTER_SCRIPT = '''\
import os

import torch
from safetensors.torch import save_file
from torch import nn

import manifest


class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, idx):
        h = self.proj(x)
        pooled = torch.zeros(4, 8).index_add_(0, idx, h)
        spread = torch.zeros(4, 8).scatter_add_(0, idx[:, None].expand(-1, 8), h)
        return pooled + spread


model = Pool()
jitter = int.from_bytes(os.urandom(4), "little") / 2**32  # not seeded by anyone
with torch.no_grad():
    model.proj.bias.add_(jitter)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 8)
idx = torch.randint(0, 4, (32,))
for _ in range(5):
    loss = model(x, idx).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    manifest.log(loss=loss)
os.makedirs("out", exist_ok=True)
save_file(model.state_dict(), "out/model.safetensors")
'''


def test_checked_in_schema_matches_the_models() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == lab_schema_text(), (
        "regenerate with: manifest schema --lab -o schemas/lab.v1.schema.json")


def test_catalogue_comes_from_the_installed_torch() -> None:
    import torch

    table = load_table(torch)
    assert table.source.startswith("torch docstring")
    assert table.unmapped == []  # every op torch documents is mapped to the ops an audit sees
    assert {r.kind for r in table.rules["index_add_"]} == {"switched"}
    assert {r.kind for r in table.rules["histc"]} == {"raises"}
    assert "add" not in table.rules  # positive control's negative: a plain op is not listed


def test_catalogue_falls_back_to_the_table_and_names_new_entries() -> None:
    broken = types.SimpleNamespace(__version__="9.9",
                                   use_deterministic_algorithms=types.SimpleNamespace(__doc__="x"))
    table = load_table(broken)
    assert table.source.startswith("maintained table")
    assert "index_add_" in table.rules and "histc" in table.rules
    import torch

    doc = torch.use_deterministic_algorithms.__doc__ or ""
    grown = doc.replace("* :func:`torch.histc`",
                        "* :func:`torch.new_op` when x\n* :func:`torch.histc`")
    entries = parse_docstring(grown)
    assert entries is not None and ("torch.new_op", "when x", "raises") in entries
    renamed = types.SimpleNamespace(
        __version__="9.9", use_deterministic_algorithms=types.SimpleNamespace(__doc__=grown))
    assert load_table(renamed).unmapped == ["torch.new_op"]


def test_lab_without_a_command_is_a_usage_error(tmp_path: Path) -> None:
    proc = manifest_cli("lab", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("manifest: no command: give one after '--'")
    assert b"Traceback" not in proc.stderr


def test_log_outside_the_launcher_does_nothing() -> None:
    import manifest
    from manifest.launch.boot._manifest_state import state

    manifest.log(loss=0.5)
    assert state["log"] == []
    # Positive control: with a process record (as under the launcher) it is kept.
    state["record"] = {}
    try:
        manifest.log(loss=0.25, acc=1)
        assert state["log"] == [{"step": 0, "loss": 0.25, "acc": 1.0}]
    finally:
        state["record"] = None
        state["log"].clear()


def _validate(doc: dict[str, Any]) -> None:
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


@pytest.mark.slow
def test_lab_on_the_bundled_example(tmp_path: Path) -> None:
    import jsonschema

    repo = make_repo(tmp_path / "repo", {})
    report_md = tmp_path / "lab.md"
    proc = manifest_cli("lab", "--runs", "2", "--threads", "2", "--json", "--report",
                        str(report_md), "--output", "out/*.safetensors", "--",
                        "python", "train.py", "--steps", "20", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    _validate(doc)
    # The schema rejects what it should (positive control for the validation above).
    with pytest.raises(jsonschema.ValidationError):
        _validate({**doc, "surprise": 1})
    report = LabReport.model_validate_json(proc.stdout)

    # CPU, same seed, same 2 threads: both modes bit-identical, the noise floor is zero.
    for mode in (report.default, report.recipe):
        assert mode.bit_identical and mode.differing == []
        assert mode.basis == "tensors and trail" and mode.outcome == "bit-identical"
        assert mode.tensors_compared == 11  # conv1 (2), bn1 (5), conv2 (2), fc (2)
        assert mode.max_abs == 0.0 and mode.max_ulp == 0 and mode.weight_l2 == 0.0
        assert mode.loss_gap == 0.0 and mode.max_loss_gap == 0.0
        assert mode.first_divergent_step is None
        assert [r.trail_steps for r in mode.runs] == [20, 20]
        assert all(r.final_loss is not None for r in mode.runs)
        walls = [r.wall_s for r in mode.runs]
        assert mode.wall.min_s == min(walls) and mode.wall.max_s == max(walls)
    assert not report.default.deterministic and report.recipe.deterministic
    cost = report.cost
    expected = (cost.recipe_median_s - cost.default_median_s) / cost.default_median_s * 100
    assert cost.determinism_cost_pct == pytest.approx(expected, abs=0.01)
    assert cost.within_noise == (cost.caveat is not None)

    ident = report.identity
    assert ident.recipe_runs_agree and ident.perturbed_differs
    assert ident.recipe_run_id == report.recipe.runs[0].run_id
    assert ident.perturbed_run_id == report.default.runs[0].run_id
    assert len({r.run_id for r in report.default.runs}) == 1

    assert {c.category for c in report.checklist} == {
        "code", "data", "env", "random state", "hardware", "numerics"}
    assert all(c.fix for c in report.checklist if c.status != "pass")

    cat = report.catalogue
    assert cat.source.startswith("torch docstring") and cat.audit_error is None
    conv = next(e for e in cat.entries if e.op == "aten::convolution")
    assert conv.kind == "switched" and conv.count == 40  # 2 convs × 20 steps
    lines = (repo / "train.py").read_text().splitlines()
    forward_line = next(i for i, t in enumerate(lines, 1) if "self.conv1(x)" in t)
    assert {s.module for s in conv.sites} == {"conv1", "conv2"}
    assert f"train.py:{forward_line}" in {s.where for s in conv.sites}

    text = report_md.read_text(encoding="utf-8")
    assert "data:image/png;base64," in text  # matplotlib is in the dev extra
    assert "determinism\\_cost\\_pct" not in text and "determinism_cost_pct" in text
    assert report.recipe.runs[0].run_id in text
    # Without the plotting library the same report degrades to tables.
    plain = render_lab_markdown(report, plots=False)
    assert "data:image" not in plain and "| PASS |" in plain
    import io

    out = io.StringIO()
    render_lab(report, out)
    assert "bit-identical     yes" in out.getvalue()
    assert "determinism_cost_pct" in out.getvalue()


@pytest.mark.slow
def test_lab_catalogues_scatter_ops_and_sees_an_unseeded_source(tmp_path: Path) -> None:
    from manifest.lab.runs import LabOptions, run_lab

    repo = make_repo(tmp_path / "repo", {"pool.py": SCATTER_SCRIPT}, example=False)
    report = run_lab(repo, ["python", "pool.py"],
                     LabOptions(runs=2, threads=2, outputs=["out/*.safetensors"]))
    lines = SCATTER_SCRIPT.splitlines()
    add_line = next(i for i, t in enumerate(lines, 1) if "index_add_" in t)
    scatter_line = next(i for i, t in enumerate(lines, 1) if "scatter_add_" in t)
    entries = {e.op: e for e in report.catalogue.entries}
    assert entries["aten::index_add_"].sites[0].where == f"pool.py:{add_line}"
    assert entries["aten::index_add_"].sites[0].module_type == "Pool"  # the top module
    assert entries["aten::index_add_"].count == 5
    assert entries["aten::scatter_add_"].sites[0].where == f"pool.py:{scatter_line}"
    assert all(s.device == "cpu" for e in entries.values() for s in e.sites)

    # os.urandom: neither mode can be bit-identical, and the noise floor says by how much.
    noise = report.default
    assert not noise.bit_identical and not report.recipe.bit_identical
    assert noise.max_abs is not None and noise.max_abs > 0
    assert noise.weight_l2 is not None and noise.weight_l2 > 0
    assert noise.loss_gap is not None and noise.loss_gap > 0
    assert noise.first_divergent_step == 1
    assert "proj.bias" in {d.name for d in noise.differing}
    assert report.exit_code == 1
    # The recipe's divergence is handed to explain: the step and the first op that parts.
    explained = report.explained
    assert explained is not None and explained.step == 1, explained
    assert explained.findings and explained.findings[0].where.startswith("pool.py:"), explained
    checks = {c.name: c for c in report.checklist}
    # No DataLoader in the script: the unseeded source is named as such, not as workers.
    assert checks["DataLoader workers"].detail.startswith("not used")
    assert checks["unseeded source"].status == "warn"
    _validate(json.loads(report.model_dump_json()))


@pytest.mark.slow
@pytest.mark.parametrize(("script", "outcome", "code", "basis"), [
    ("print('no weights')\n", "nothing-compared", 3, "nothing"),
    ("import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
     "for _ in range(3):\n    opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()\n",
     "bit-identical", 0, "trail"),
])
def test_lab_says_what_it_compared(tmp_path: Path, script: str, outcome: str, code: int,
                                   basis: str) -> None:
    """Issue 32: a lab that compared nothing never says bit-identical; one that compared
    the step trail only says so, in the report and the checklist."""
    repo = make_repo(tmp_path / "repo", {"job.py": script}, example=False)
    proc = manifest_cli("lab", "--runs", "2", "--json", "--", "python", "job.py", cwd=repo)
    assert proc.returncode == code, proc.stderr.decode()
    report = LabReport.model_validate_json(proc.stdout)
    assert (report.recipe.outcome, report.recipe.basis) == (outcome, basis)
    assert report.recipe.bit_identical is (outcome == "bit-identical")
    assert report.recipe.tensors_compared == 0
    [compared] = [c for c in report.checklist if c.name == "compared"]
    assert compared.status == ("fail" if basis == "nothing" else "warn")
    assert compared.fix is not None and "--artifact PATH" in compared.fix
    text = manifest_cli("lab", "--runs", "2", "--", "python", "job.py", cwd=repo)
    shown = text.stdout.decode()
    if basis == "nothing":
        assert "bit-identical     NOTHING COMPARED" in shown
    else:
        assert "compared          the step trail only" in shown
