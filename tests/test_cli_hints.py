"""Hints that lead somewhere: every sentence the CLI gives for a mistake names the way out.

Through the real CLI in a subprocess: a missing extra is the install line and exit 2 (the
library blocked by a meta path finder in that process, nothing else changed), a mistyped
flag or config key gets "did you mean", no flag is taken by its prefix, and the trust
hint names the file that, once edited as it says, lets the run through.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.cli.app import build_parser
from manifest.cli.options import Parser
from manifest.errors import EXTRA_OF_MODULE, missing_extra
from tests.runs import make_repo, manifest_cli
from tests.travel import capture_run, dirty_repo, other_machine, write_keys

# Runs the CLI with the named top-level modules unimportable, as in an environment that
# never installed their extra: the finder answers before any installed copy is found.
BLOCKED_CLI = """
import sys
blocked = set(sys.argv[1].split(","))

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
sys.argv = ["manifest", *sys.argv[2:]]
from manifest.cli.app import entry
sys.exit(entry())
"""


def blocked_cli(blocked: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
                ) -> tuple[int, str]:
    full = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | (env or {})
    proc = subprocess.run([sys.executable, "-c", BLOCKED_CLI, blocked, *args], cwd=cwd,
                          env=full, capture_output=True, timeout=300, check=False)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr, stderr
    return proc.returncode, stderr


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(repository with run.json signed by alice as run.json.sig, alice's key, her .pub)."""
    base = tmp_path_factory.mktemp("hints")
    repo = dirty_repo(base / "repo")
    capture_run(repo)
    private, public = write_keys(base / "keys", "alice")
    proc = manifest_cli("sign", "run.json", "--key", str(private), cwd=repo,
                        env=other_machine(base / "signer"))
    assert proc.returncode == 0, proc.stderr.decode()
    return repo, private, public


# ------------------------------------------------------------------ missing extras


@pytest.mark.parametrize(("blocked", "extra", "args"), [
    ("cryptography", "sign", ("sign", "run.json", "--key", "{key}", "-o", "{tmp}/a.sig")),
    ("sigstore", "sign", ("sign", "run.json", "--sigstore", "-o", "{tmp}/b.sig")),
    ("cryptography", "sign", ("attest", "run.json", "--key", "{key}", "-o", "{tmp}/c.json")),
    ("model_signing", "sign", ("attest", "run.json", "--key", "{key}", "-o", "{tmp}/d.json",
                               "--oms", "{tmp}/d.sig")),
    ("cryptography", "sign", ("verify", "run.json", "--no-rerun")),
    ("cryptography", "sign", ("show", "run.json")),
    ("submitit", "slurm", ("verify", "run.json", "--on", "slurm", "--trust")),
    ("ray", "ray", ("verify", "run.json", "--on", "ray", "--trust")),
    ("kubernetes", "k8s", ("explain", "run.json", "--on", "k8s", "--trust")),
    ("boto3", "s3", ("capture", "--data", "s3://bucket/prefix", "--", "true")),
    ("google", "gcs", ("capture", "--data", "gs://bucket/prefix", "--", "true")),
    ("huggingface_hub", "hf", ("capture", "--data", "hf://datasets/org/name@main", "--",
                               "true")),
])
def test_a_missing_extra_is_its_install_line(signed: tuple[Path, Path, Path], tmp_path: Path,
                                             blocked: str, extra: str,
                                             args: tuple[str, ...]) -> None:
    repo, private, public = signed
    home = tmp_path / "home"
    (home / "manifest").mkdir(parents=True)
    # A policy that lists a key: reading it needs cryptography (verify, show).
    (home / "manifest" / "trust.toml").write_text(f"keys = [{json.dumps(str(public))}]\n")
    argv = [a.format(key=private, tmp=tmp_path) for a in args]
    env = other_machine(home) | {"XDG_CONFIG_HOME": str(home)}
    code, stderr = blocked_cli(blocked, *argv, cwd=repo, env=env)
    assert code == 2, stderr
    assert f"pip install 'torch-manifest[{extra}]'" in stderr, stderr
    assert "internal error" not in stderr and stderr.count("\n") <= 2, stderr
    # Positive control: the same command line with nothing blocked gets past the import
    # (a signature is written, or a verdict given, or it fails for another reason).
    if argv[0] in {"sign", "show", "verify"} and "--sigstore" not in argv and "--on" not in argv:
        code, stderr = blocked_cli("nothing_at_all", *argv, cwd=repo, env=env)
        assert code == 0, stderr


def test_a_module_no_extra_installs_stays_an_internal_error() -> None:
    # Only the optional libraries' names map to an install line: blake3 is a hard
    # requirement, so its absence is a broken installation, not a missing extra.
    assert missing_extra(ModuleNotFoundError("x", name="blake3")) is None
    absent = missing_extra(ModuleNotFoundError("x", name="cryptography.hazmat"), what="sign")
    assert absent is not None and absent.exit_code == 2
    assert "pip install 'torch-manifest[sign]'" in absent.message
    extras = set(EXTRA_OF_MODULE.values())
    declared = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    for extra in extras:  # every extra the table names exists in pyproject.toml
        assert f"\n{extra} = [" in declared, extra


# ------------------------------------------------------------------ flags and keys


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_parser_takes_a_prefix_for_a_flag() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 10
    for parser in parsers:
        assert isinstance(parser, Parser) and parser.allow_abbrev is False, parser.prog


def test_a_prefix_of_a_flag_is_refused_with_the_flag_it_resembles(tmp_path: Path) -> None:
    proc = manifest_cli("explain", "--thread", "1", "run.json", cwd=tmp_path)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "unrecognized arguments: --thread" in stderr, stderr
    assert "did you mean --threads?" in stderr
    # Control: the whole flag parses, and the command fails only at the missing file.
    proc = manifest_cli("explain", "--threads", "1", "run.json", cwd=tmp_path)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "unrecognized" not in stderr and "run.json" in stderr


def test_a_mistyped_flag_gets_did_you_mean(tmp_path: Path) -> None:
    proc = manifest_cli("capture", "--artefact", "out/*", "--", "true", cwd=tmp_path)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "did you mean --artifact?" in stderr, stderr
    assert stderr.count("\n") == 1
    # Control: a word like no flag gets no guess.
    proc = manifest_cli("capture", "--zzzzzz", "--", "true", cwd=tmp_path)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "--zzzzzz" in stderr and "did you mean" not in stderr


def test_a_mistyped_config_key_gets_did_you_mean(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"job.py": "print('ok')\n"}, example=False)
    (repo / "pyproject.toml").write_text('[tool.manifest]\ncomand = ["python", "job.py"]\n'
                                         '[tool.manifest.gate]\nbaseline_ = "b.json"\n')
    proc = manifest_cli("capture", "-q", cwd=repo)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "comand (did you mean command?)" in stderr, stderr
    (repo / "pyproject.toml").write_text('[tool.manifest.gate]\nbaselin = "b.json"\n')
    proc = manifest_cli("gate", "--no-rerun", cwd=repo)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "(did you mean baseline?)" in stderr, stderr
    # Control: the key as the hint spells it is taken.
    (repo / "pyproject.toml").write_text('[tool.manifest]\ncommand = ["python", "job.py"]\n')
    proc = manifest_cli("capture", "-q", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()


# ------------------------------------------------------------------ trust hint


def test_following_the_trust_hint_literally_trusts_the_signer(
        signed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    repo, _, public = signed
    home = tmp_path / "home"
    env = other_machine(home) | {"XDG_CONFIG_HOME": str(home)}
    proc = manifest_cli("verify", "run.json", "--no-rerun", cwd=repo, env=env)
    stderr = proc.stderr.decode()
    assert proc.returncode == 2 and "which no trust policy lists" in stderr, stderr
    trust_file = home / "manifest" / "trust.toml"
    assert f"in your trust file {trust_file}" in stderr, stderr
    # Control: the repository's table alone (the advice this hint replaces) is not enough.
    (repo / "pyproject.toml").write_text(
        f"[tool.manifest.trust]\nkeys = [{json.dumps(str(public))}]\n")
    try:
        proc = manifest_cli("verify", "run.json", "--no-rerun", cwd=repo, env=env)
        assert proc.returncode == 2, proc.stderr.decode()
    finally:
        (repo / "pyproject.toml").unlink()
    # Do what it says: the public key's path under keys in that file.
    trust_file.parent.mkdir(parents=True)
    trust_file.write_text(f"keys = [{json.dumps(str(public))}]\n")
    proc = manifest_cli("verify", "run.json", "--no-rerun", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "signed by" in proc.stderr.decode()


# ------------------------------------------------------------------ verify - --explain

NOISE = """
import os
import torch
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 4))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(1, 4):
    x = torch.randn(8, 4)
    if step == 2 and os.environ.get("NOISE"):
        x = x + torch.tensor(list(os.urandom(4)), dtype=torch.float32) / 255
    loss = (x @ w).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
os.makedirs("out", exist_ok=True)
torch.save({"w": w.detach()}, "out/w.pt")
"""


@pytest.mark.slow
def test_verify_explain_reads_stdin_once(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"noise.py": NOISE}, example=False)
    proc = manifest_cli("capture", "-q", "--seed", "0", "--threads", "1", "--artifact",
                        "out/*.pt", "--", "python", "noise.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    run = proc.stdout
    full = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"NOISE": "1"}
    done = subprocess.run([sys.executable, "-m", "manifest", "verify", "-", "--explain",
                           "--json"], input=run, cwd=repo, env=full, capture_output=True,
                          timeout=900, check=False)
    stderr = done.stderr.decode()
    assert "not valid JSON" not in stderr and "Traceback" not in stderr, stderr
    assert done.returncode == 1, stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "differs" and doc["explain"]["first_step"] == 2


# ------------------------------------------------------------------ lab's checklist

RESEEDS = """
import os
import torch
torch.manual_seed(42)  # RESEED
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    m(torch.randn(8, 4)).square().mean().backward()
    opt.step()
os.makedirs("out", exist_ok=True)
torch.save(m.state_dict(), "out/m.pt")
"""


@pytest.mark.slow
def test_lab_checklist_says_the_script_s_seed_and_no_dataloader(tmp_path: Path) -> None:
    from manifest.canonical import load_manifest
    from manifest.lab.checklist import checklist
    from manifest.lab.report import LabReport
    from manifest.models import LoaderSeed

    repo = make_repo(tmp_path / "repo", {"reseeds.py": RESEEDS}, example=False)
    proc = manifest_cli("lab", "--json", "--runs", "2", "--threads", "1", "--artifact",
                        "out/*.pt", "--", "python", "reseeds.py", cwd=repo, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode()
    report = LabReport.model_validate_json(proc.stdout)
    checks = {c.name: c for c in report.checklist}
    seeded = checks["seeded"].detail
    line = next(i for i, t in enumerate(RESEEDS.splitlines(), 1) if "RESEED" in t)
    assert f"reseeds.py:{line} reseeds torch_cpu" in seeded, seeded
    assert "torch.manual_seed(42)" in seeded and "before any draw" in seeded, seeded
    workers = checks["DataLoader workers"]
    assert workers.detail.startswith("not used"), workers
    # Control: the same checklist over a capture of the script, once with a DataLoader
    # iterator that started workers recorded in it: then it is not "not used".
    proc = manifest_cli("capture", "-q", "--threads", "1", "--artifact", "out/*.pt", "--",
                        "python", "reseeds.py", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    run = load_manifest(proc.stdout)
    same = {c.name: c for c in checklist(run, threads=1, default=report.default,
                                         recipe=report.recipe)}
    assert same["DataLoader workers"].detail.startswith("not used")
    first = run.randomness.processes[0].model_copy(update={"loaders": [
        LoaderSeed(base_seed="7", workers=2, site="reseeds.py:9")]})
    randomness = run.randomness.model_copy(
        update={"processes": [first, *run.randomness.processes[1:]]})
    used = {c.name: c for c in checklist(run.model_copy(update={"randomness": randomness}),
                                         threads=1, default=report.default,
                                         recipe=report.recipe)}
    assert not used["DataLoader workers"].detail.startswith("not used")
    assert "reseeds.py:9" in used["DataLoader workers"].detail
