"""Reports that say what changed, through the real CLI on real git repositories.

* the launcher's own libraries (blake3) are not the run's imports, unless the
  script imports them itself;
* a lockfile pinning another version than the run used is said at capture
  (a note) and by ``show``.

Scripts here import no torch: each capture is a plain Python process (~1 s).
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import GitRepo, run_cli


def _capture(repo: GitRepo, env: dict[str, str], *command: str) -> tuple[dict[str, Any], str]:
    result = run_cli("capture", "--", *command, cwd=repo.path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    (repo.path / "run.json").write_bytes(result.stdout)
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc, result.stderr


def _show(repo: GitRepo, env: dict[str, str]) -> str:
    result = run_cli("show", "run.json", cwd=repo.path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.text


# ------------------------------------------------------------ imported by the run


def test_the_launchers_blake3_is_not_the_runs_import_but_the_scripts_is(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.write("plain.py", "import json\nprint(json.dumps([1]))\n")
    repo.write("helper.py", "from blake3 import blake3 as hasher\n")
    repo.write("hashes.py", "import helper\nprint(helper.hasher(b'x').hexdigest()[:8])\n")
    repo.write(".gitignore", "*.json\n")
    repo.commit("scripts")
    doc, _ = _capture(repo, cli_env, "python", "plain.py")
    # The launcher hashed the generators with blake3 before the script started.
    assert doc["env"]["imported"] == []
    assert "blake3" not in _show(repo, cli_env).split("imported by the run")[1].split("\n")[0]
    # Positive control: a module of the script holds blake3's class, so the run imported it.
    doc, _ = _capture(repo, cli_env, "python", "hashes.py")
    assert doc["env"]["imported"] == ["blake3"]
    line = _show(repo, cli_env).split("imported by the run")[1].split("\n")[0]
    assert line.split() == ["blake3"]


# ------------------------------------------------------------------- lockfiles


def test_a_lockfile_pinning_another_version_is_noted_and_shown(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    import importlib.metadata

    rich = importlib.metadata.version("rich")
    pydantic = importlib.metadata.version("pydantic")
    repo.write("requirements.txt",
               f"rich==0.0.1 \\\n    --hash=sha256:00\npydantic=={pydantic}\n"
               "blake3==0.0.2 ; python_version < '3'\nnot-installed-anywhere==1.0\n")
    repo.write("uv.lock", 'version = 1\n\n[[package]]\nname = "Rich"\nversion = "0.0.3"\n\n'
               f'[[package]]\nname = "pydantic"\nversion = "{pydantic}"\n')
    repo.write(".gitignore", "*.json\n")
    repo.commit("locks")
    doc, stderr = _capture(repo, cli_env, "python", "-c", "pass")
    assert doc["observed"]["lockfile_disagrees"] == [
        {"package": "rich", "lockfile": "requirements.txt", "locked": "0.0.1",
         "installed": rich},
        {"package": "rich", "lockfile": "uv.lock", "locked": "0.0.3", "installed": rich}]
    notes = [line for line in stderr.splitlines() if "pins" in line]
    assert notes == [
        f"manifest: note: requirements.txt pins rich 0.0.1, but the run used {rich}: the "
        "lockfile does not describe this run's environment.",
        f"manifest: note: uv.lock pins rich 0.0.3, but the run used {rich}: the lockfile does "
        "not describe this run's environment."]
    shown = _show(repo, cli_env)
    assert f"requirements.txt disagrees  rich pinned 0.0.1, the run used {rich}" in shown
    assert "uv.lock disagrees" in shown and "pydantic pinned" not in shown
    # Positive control of silence: pins that agree leave no field and no note.
    repo.write("requirements.txt", f"rich=={rich}\n")
    repo.write("uv.lock", "version = 1\n")
    repo.commit("agree")
    doc, stderr = _capture(repo, cli_env, "python", "-c", "pass")
    assert "lockfile_disagrees" not in doc["observed"]
    assert "pins" not in stderr and "disagrees" not in _show(repo, cli_env)


# ------------------------------------------------------------- code in diff

SCRIPT = ('import os\nlr = 0.1\nos.makedirs("out", exist_ok=True)\n'
          'open("out/w.bin", "w").write(str(lr))\n')


def _run(repo: GitRepo, env: dict[str, str], name: str) -> None:
    result = run_cli("capture", "--artifact", "out/*", "--", "python", "train.py",
                     cwd=repo.path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    (repo.path / name).write_bytes(result.stdout)


def _diff(repo: GitRepo, env: dict[str, str], a: str, b: str) -> tuple[int, list[str]]:
    result = run_cli("diff", a, b, cwd=repo.path, env=env, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, [line for line in result.text.splitlines()
                               if line.startswith(("code:", "  "))]


def test_diff_names_the_changed_line_and_the_untracked_files_of_a_patch(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.write("train.py", SCRIPT)
    repo.write(".gitignore", "out/\n*.json\n")
    repo.commit("train")
    _run(repo, cli_env, "a.json")
    repo.write("train.py", SCRIPT.replace("lr = 0.1", "lr = 0.2"))
    repo.write("logs/a.log", "x\n")
    repo.write("logs/b.log", "y\n")
    _run(repo, cli_env, "b.json")
    status, lines = _diff(repo, cli_env, "a.json", "b.json")
    assert status == 1
    assert lines == [
        "code: the uncommitted changes differ in 3 file(s):",
        "  logs/a.log +1 -0, line 1: + x",
        "  logs/b.log +1 -0, line 1: + y",
        "  train.py +1 -1, line 2: - lr = 0.1 + lr = 0.2",
        "code: untracked, not ignored, so packed with the code of b: logs/a.log, "
        "logs/b.log; if they are not code, add them to .gitignore (logs/).",
    ]
    markdown = run_cli("diff", "--format", "markdown", "a.json", "b.json", cwd=repo.path,
                       env=cli_env, timeout=300).text
    assert "```text\ncode: the uncommitted changes differ in 3 file(s):\n" in markdown
    # Positive control: the same run twice has no code lines at all.
    status, lines = _diff(repo, cli_env, "b.json", "b.json")
    assert (status, lines) == (0, [])


def test_a_readme_only_commit_is_bits_and_says_the_outputs_are_identical(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.write("train.py", SCRIPT)
    repo.write(".gitignore", "out/\n*.json\n")
    repo.commit("train")
    _run(repo, cli_env, "a.json")
    repo.write("README.md", "# a project\n\nHow to train.\n")
    repo.commit("docs")
    _run(repo, cli_env, "b.json")
    status, lines = _diff(repo, cli_env, "a.json", "b.json")
    assert status == 1  # another commit can change the bits: still bits
    assert lines == ["code: the commits differ in 1 file(s):",
                     "  README.md +2 -0, line 2: + (blank line)",
                     "code: only README.md changed; the outputs are identical."]
    # Positive control: a change the outputs show is never called "only".
    repo.write("train.py", SCRIPT.replace("lr = 0.1", "lr = 0.3"))
    repo.commit("lr")
    _run(repo, cli_env, "c.json")
    status, lines = _diff(repo, cli_env, "b.json", "c.json")
    assert status == 1
    assert lines == ["code: the commits differ in 1 file(s):",
                     "  train.py +1 -1, line 2: - lr = 0.1 + lr = 0.3"]


# ------------------------------------------------------------- folded drift

CUDA_PACKAGES = ["nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-nccl-cu13",
                 "nvidia-nvjitlink", "triton", "cuda-bindings"]


def _cuda_build_run(repo: GitRepo, env: dict[str, str], *, devices: list[str]) -> str:
    """A run recorded under a CUDA build of torch (a colleague's), re-sealed: verify and
    diff compare it with this machine's CPU build."""
    from manifest.canonical import seal

    doc, _ = _capture(repo, env, "python", "-c", "pass")
    e = doc["env"]
    e.update(torch="9.9.1+cu130", torch_cuda="13.0", cudnn="9.13.0", nccl="2.27.7",
             numpy="0.0.1", unavailable={})
    e["packages"].update({name: "13.0.1" for name in CUDA_PACKAGES},
                         torch="9.9.1+cu130", numpy="0.0.1")
    for proc in doc["determinism"]["processes"]:
        proc["devices"] = devices
    name = f"cuda{len(devices)}.json"
    (repo.path / name).write_text(seal(doc).model_dump_json(by_alias=True), encoding="utf-8")
    return name


def test_verify_folds_a_torch_builds_cuda_libraries_and_says_each_fact_once(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.write(".gitignore", "*.json\n")
    repo.commit("ignore")
    name = _cuda_build_run(repo, cli_env, devices=[])
    result = run_cli("verify", "--no-rerun", name, cwd=repo.path, env=cli_env, timeout=300)
    assert result.returncode == 0, result.stderr
    drift = [line for line in result.text.splitlines() if line.startswith("drift")]
    assert len(drift) == 3, drift
    assert drift[0].startswith("drift (bits): torch 9.9.1+cu130 → ")
    assert "the CUDA libraries with it differ too (torch CUDA build 13.0 → none" in drift[0]
    assert "7 package(s): nvidia-cublas" in drift[0]
    assert drift[0].endswith("; this run used no GPU")
    assert drift[1].startswith("drift (bits): numpy 0.0.1 → ")  # once, not again as a package
    assert drift[2].startswith("drift (benign): ") and "--verbose lists them" in drift[2]
    # --verbose: every line, the reasons for what was not recorded among them.
    verbose = run_cli("verify", "--no-rerun", "--verbose", name, cwd=repo.path, env=cli_env,
                      timeout=300)
    lines = [line for line in verbose.text.splitlines() if line.startswith("drift")]
    assert len(lines) > 15 and any("reason for" in line for line in lines)
    assert any("package nvidia-cublas 13.0.1 → not installed" in line for line in lines)
    # Positive control: a run that did compute on a GPU is not said to have used none.
    gpu = _cuda_build_run(repo, cli_env, devices=["cuda:0"])
    result = run_cli("verify", "--no-rerun", gpu, cwd=repo.path, env=cli_env, timeout=300)
    assert "the CUDA libraries with it differ too" in result.text
    assert "used no GPU" not in result.text
    # diff folds the same rows the same way.
    diff = run_cli("diff", "run.json", name, cwd=repo.path, env=cli_env, timeout=300)
    assert diff.returncode == 1
    text = " ".join(diff.text.split())
    assert "the CUDA libraries with it differ too" in text and "neither run used a GPU" in text
    assert "nvidia-nvjitlink" not in text and "--verbose lists them" in text
    diff = run_cli("diff", "--verbose", "run.json", name, cwd=repo.path, env=cli_env,
                   timeout=300)
    assert "nvidia-nvjitlink" in diff.text


def test_the_plan_shown_before_trust_carries_the_drift(
        repo: GitRepo, cli_env: dict[str, str]) -> None:
    from manifest.canonical import seal

    repo.write(".gitignore", "*.json\n")
    repo.commit("ignore")
    name = _cuda_build_run(repo, cli_env, devices=[])  # re-sealed: not sealed by this machine
    result = run_cli("verify", name, cwd=repo.path, env=cli_env, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    refusal = next(i for i, line in enumerate(lines) if "refusing to run" in line)
    drift = [i for i, line in enumerate(lines) if line.startswith("manifest:   drift (")]
    assert len(drift) == 3 and max(drift) < refusal, result.stderr
    assert lines[drift[0]].startswith("manifest:   drift (bits): torch 9.9.1+cu130 → ")
    assert lines[drift[0]].endswith("this run used no GPU")
    # Positive control: a run of this very environment, not sealed here, has a plan and no drift.
    doc = json.loads((repo.path / "run.json").read_bytes())
    doc["observed"]["started_at"] = "2026-01-01T00:00:00Z"
    (repo.path / "other.json").write_text(seal(doc).model_dump_json(by_alias=True),
                                          encoding="utf-8")
    result = run_cli("verify", "other.json", cwd=repo.path, env=cli_env, timeout=300)
    assert result.returncode == 2 and "manifest: verify would run:" in result.stderr
    assert "drift (" not in result.stderr
