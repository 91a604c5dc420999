"""A newcomer's second day (issue 39): the next install, the next capture, a mistake.

* Packages installed since the capture that the run never imported fold into one drift
  line (``--verbose`` lists them); ``torchmetrics`` is not torch: it counts for the bits
  only when the run imported it, while ``torch`` itself always does.
* A file the run read that the re-run cannot see (capture did not digest it: beyond its
  budget) is named, with ``--data`` or ``--no-sandbox``; the confined re-run of a script
  that falls back to a default really runs with the default (the positive control).
* Verify in another repository, or outside any, is exit 2 and a sentence naming the
  recorded commit and remote, not git's words.
* ``manifest capture`` with no command says it is a command-less capture.
* ``verify --help``'s exit statuses are read from the verdict table (a verdict added to
  the table shows up); ``manifest verfy`` asks "did you mean verify?".
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from manifest.canonical import load_manifest
from manifest.cli import app as cli
from manifest.rerun.sandbox import unavailable_reason
from tests.conftest import GitRepo, RepoFactory, assert_one_sentence, run_cli

# ------------------------------------------------------------------ drift


def _captured(repo: GitRepo, env: dict[str, str], script: str = "print('trained')\n"
              ) -> tuple[Path, Any]:
    repo.write("train.py", script)
    repo.commit("script")
    result = run_cli("capture", "-q", "--", "python", "train.py", cwd=repo.path, env=env)
    assert result.returncode == 0, result.stderr
    path = repo.path.parent / f"{repo.path.name}.json"
    path.write_bytes(result.stdout)
    return path, load_manifest(result.stdout)


def _today(recorded: Any, packages: dict[str, str | None]) -> Any:
    """This machine as verify probes it, with ``packages`` installed (a version), removed
    (None) or upgraded since the capture."""
    from manifest.capture.snapshot import probe_machine

    env, hardware, nvml = probe_machine()
    installed = dict(recorded.env.packages)
    for name, version in packages.items():
        if version is None:
            installed.pop(name, None)
        else:
            installed[name] = version
    return dict(env, packages=installed), hardware, nvml


def test_a_torch_named_package_never_imported_is_benign_and_torch_is_bits(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    from manifest.verify.drift import environment_drift

    _, recorded = _captured(repo, cli_env)
    assert recorded.env.imported is not None and "torchmetrics" not in recorded.env.imported
    machine = _today(recorded, {"torchmetrics": "9.9.9", "zz-extra-a": "1.0",
                                "zz-extra-b": "2.0", "torch": "0.0.1"})
    drift = {d.path: d for d in environment_drift(recorded, machine)}
    # Today's code labelled torchmetrics 'bits' by its name alone, and quoted it in the verdict.
    assert drift["env.packages[torchmetrics]"].impact == "benign"
    assert drift["env.packages[zz-extra-a]"].change == "added"
    assert drift["env.packages[torch]"].impact == "bits"  # torch counts unasked


def test_a_package_the_run_imported_stays_bits(repo: GitRepo, cli_env: dict[str, str]) -> None:
    from manifest.verify.drift import environment_drift

    _, recorded = _captured(repo, cli_env, "import rich\nprint('trained')\n")
    assert recorded.env.imported is not None and "rich" in recorded.env.imported
    drift = {d.path: d for d in environment_drift(recorded, _today(recorded, {"rich": "0.1"}))}
    assert drift["env.packages[rich]"].impact == "bits"


def _report_with(drift: list[Any]) -> Any:
    from manifest.verify.report import VerifyReport

    return VerifyReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"],
                        verdict="identical", basis="tensors", drift=drift)


def test_benign_packages_fold_into_one_line_and_verbose_lists_them() -> None:
    from manifest.cli.render import render_verify
    from manifest.verify.report import Drift

    drift = [Drift("hardware.cpu.model", "bits", "CPU model a → b: kernels may change")]
    drift += [Drift(f"env.packages[extra-{i}]", "benign",
                    f"package extra-{i} not installed → 1.0: installed, never imported by the "
                    "run", "added") for i in range(40)]
    drift += [Drift("env.packages[rich]", "benign", "package rich 1 → 2: installed, never "
                    "imported by the run", "changed"),
              Drift("env.packages[toml]", "benign", "package toml 1 → not installed: installed, "
                    "never imported by the run", "removed")]
    out = io.StringIO()
    render_verify(_report_with(drift), out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("drift")]
    assert lines == [
        "drift (bits): CPU model a → b: kernels may change",
        "drift (benign): 40 packages installed since, 1 removed since, 1 at another version; "
        "none imported by the run (--verbose lists them)"]
    out = io.StringIO()
    render_verify(_report_with(drift), out, verbose=True)
    listed = [line for line in out.getvalue().splitlines() if line.startswith("drift")]
    assert len(listed) == 43 and "package rich 1 → 2" in listed[41]


def test_one_benign_package_reads_as_one() -> None:
    from manifest.cli.text import folded_drift
    from manifest.verify.report import Drift

    one = [Drift("env.packages[a]", "benign", "package a not installed → 1", "added")]
    assert folded_drift(one) == [
        ("benign", "1 package installed since; not imported by the run (--verbose lists them)")]


# ---------------------------------------------------------- unseen inputs


def test_inputs_capture_did_not_digest_are_named_where_the_rerun_cannot_see_them() -> None:
    from manifest.rerun.workspace import unseen_inputs

    class Observed:
        inputs_not_digested: ClassVar[dict[str, int]] = {
            "/tmp/cfg/lr.txt": 4, "data/big.bin": 9, "/srv/shared/tokens.bin": 9}

    class Recorded:
        observed = Observed()

    confined = unseen_inputs(Recorded(), confined=True)  # type: ignore[arg-type]
    assert len(confined) == 2
    assert confined[0].startswith("the run read /tmp/cfg/lr.txt, outside the repository")
    assert confined[0].endswith("capture again with --data /tmp/cfg/lr.txt (verify then "
                                "provides it read-only and checks it), or verify with "
                                "--no-sandbox")
    assert "data/big.bin" in confined[1] and "--data data/big.bin" in confined[1]
    # Unconfined, /tmp is the host's: only the file git does not carry is missing.
    [unconfined] = unseen_inputs(Recorded(), confined=False)  # type: ignore[arg-type]
    assert "data/big.bin" in unconfined


LR_SCRIPT = """\
import os, sys
d = sys.argv[1]
for n in sorted(os.listdir(d)):  # f1, f10, f100, …, f99: the last is past capture's budget
    open(os.path.join(d, n)).read()
path = os.path.join(d, "f99.txt")
lr = float(open(path).read()) if os.path.exists(path) else 0.1
print("lr", lr)
"""


@pytest.mark.slow
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}")
def test_the_confined_rerun_names_the_file_its_private_tmp_hides(
        repo: GitRepo, cli_env: dict[str, str], tmp_path: Path) -> None:
    from manifest.capture.observed import DISCOVER_MAX_FILES

    folder = tmp_path / "cfg"  # under /tmp: the sandbox's private /tmp hides it
    assert str(folder).startswith("/tmp/")
    folder.mkdir()
    for i in range(1, DISCOVER_MAX_FILES + 2):
        (folder / f"f{i}.txt").write_text(f"{i}\n")
    repo.write("train.py", LR_SCRIPT)
    repo.commit("lr from a file")
    result = run_cli("capture", "-q", "--", "python", "train.py", str(folder),
                     cwd=repo.path, env=cli_env)
    assert result.returncode == 0, result.stderr
    recorded = json.loads(result.stdout)
    assert recorded["observed"]["inputs_not_digested"] == {str(folder / "f99.txt"): 3}
    (tmp_path / "run.json").write_bytes(result.stdout)
    verify = run_cli("verify", "--json", str(tmp_path / "run.json"), cwd=repo.path,
                     env=cli_env, timeout=300)
    report = json.loads(verify.stdout)
    assert "lr 0.1" in verify.stderr  # the positive control: the re-run used the default
    [note] = [n for n in report["notes"] if "f99.txt" in n]
    assert "private /tmp hides it" in note and "--no-sandbox" in note
    assert f"--data {folder / 'f99.txt'}" in note


# ------------------------------------------------------------ wrong place


def test_verify_in_another_repository_or_none_is_bad_input_with_the_commit(
        repos: RepoFactory, cli_env: dict[str, str], tmp_path: Path) -> None:
    made = repos.with_commit("made")
    made.git("remote", "add", "origin", "https://example.org/team/made.git")
    path, recorded = _captured(made, cli_env)
    commit = recorded.code.commit
    other = repos.with_commit("other")
    loose = tmp_path / "loose"
    loose.mkdir()
    for where in (other.path, loose):
        result = run_cli("verify", str(path), cwd=where, env=cli_env, timeout=300)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("manifest: ")
                 and "re-running" not in line]
        assert_one_sentence(lines[-1])
        assert "fatal" not in result.stderr and "git " not in lines[-1].split(":", 1)[1][:5]
        assert (f"run it in a clone of the repository that made the run: commit {commit}, "
                "remote https://example.org/team/made.git") in lines[-1]
    # The control: in the repository that made it, the same manifest gets past the code.
    result = run_cli("verify", str(path), cwd=made.path, env=cli_env, timeout=300)
    assert result.returncode == 3, result.stderr
    assert "nothing was compared" in result.stdout.decode()


# -------------------------------------------------------- capture, help


def test_a_command_less_capture_says_so(repo: GitRepo, cli_env: dict[str, str]) -> None:
    result = run_cli("capture", cwd=repo.path, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["command"] is None
    [note] = [line for line in result.stderr.splitlines() if "command-less" in line]
    assert note.startswith("manifest: note: no command given: this is a command-less capture "
                           "(environment and code only")
    with_command = run_cli("capture", "--", "python", "-c", "pass", cwd=repo.path, env=cli_env)
    assert with_command.returncode == 0 and "command-less" not in with_command.stderr


def _verify_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_verify_help_lists_every_exit_status_from_the_verdict_table(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.judge import tables as verdicts

    text = _verify_help(capsys)
    assert "Exit 0 identical or checked, 1 differs or changed-topology, 2 bad input, " \
           "3 nothing-compared or no-verdict, 4 equivalent." in text
    # Generated, not typed: a verdict added to the table is listed.
    table: dict[Any, tuple[int, str]] = verdicts.VERDICTS
    monkeypatch.setitem(table, "brand-new", (5, "a new outcome"))
    assert "4 equivalent, 5 brand-new." in _verify_help(capsys)


def test_a_mistyped_verb_gets_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verfy", "run.json"]) == 2
    err = capsys.readouterr().err
    assert err == "manifest: 'verfy' is not a manifest verb; did you mean verify?\n"
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "the verbs are capture, show" in err
