"""``manifest capture`` (environment snapshot, no command) end to end, in subprocesses.

Each awkward state of the user's machine gives exit 0 with a valid manifest
and one clear note on stderr; each bad request gives exit 2 and one sentence.
Never a traceback. Secrets never reach stdout, stderr or the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import dumps, load_manifest
from tests.conftest import (
    REPO_ROOT,
    CliResult,
    GitRepo,
    RepoFactory,
    _real_nvml_available,
    assert_one_sentence,
    run_cli,
)

TOKEN = "glpat-Zz9SecretTokenValue42"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345",
}


def capture(cwd: Path, env: dict[str, str], *args: str) -> tuple[CliResult, dict[str, Any]]:
    result = run_cli("capture", *args, cwd=cwd, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    # stdout is exactly the canonical document, and it loads (digest checked).
    manifest = load_manifest(result.stdout)
    assert dumps(manifest) == result.stdout
    doc: dict[str, Any] = json.loads(result.stdout)
    return result, doc


def notes(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert all(line.startswith("manifest: ") for line in lines), stderr
    return lines


def has_note(stderr: str, phrase: str) -> bool:
    return any(phrase in line for line in notes(stderr))


def all_files_bytes(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in root.rglob("*") if p.is_file() and ".git" not in p.parts]


# ------------------------------------------------------------ same identity


def test_capture_twice_gives_the_same_run_id(repo: GitRepo, cli_env: dict[str, str],
                                             tmp_path: Path) -> None:
    _, first = capture(repo.path, cli_env)
    _, second = capture(repo.path, cli_env)
    assert first["run_id"] == second["run_id"]
    assert first["observed"]["started_at"] != second["observed"]["started_at"] or (
        first["digest"] == second["digest"])
    assert first["code"]["commit"] == repo.head()
    assert first["command"] is None
    assert first["env"]["python"]


def test_redirecting_stdout_into_the_repo_does_not_dirty_it(
    repo: GitRepo, cli_env: dict[str, str]
) -> None:
    """``manifest capture > run.json`` inside the repository, twice."""
    out = repo.path / "run.json"
    for _ in range(2):
        with out.open("wb") as fh:
            proc = subprocess.run([sys.executable, "-m", "manifest.cli", "capture"],
                                  cwd=repo.path, env=cli_env, stdout=fh,
                                  stderr=subprocess.PIPE, check=False)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(out.read_bytes())
        assert doc["code"]["dirty"] is False
        assert doc["code"]["untracked_files"] == 0


def test_capture_into_a_then_b_inside_the_repo_gives_the_same_run_id(
    repo: GitRepo, cli_env: dict[str, str]
) -> None:
    """``manifest capture > a.json; manifest capture > b.json``: a.json is not code."""
    docs = []
    for name in ("a.json", "b.json"):
        with (repo.path / name).open("wb") as fh:
            proc = subprocess.run([sys.executable, "-m", "manifest.cli", "capture"],
                                  cwd=repo.path, env=cli_env, stdout=fh,
                                  stderr=subprocess.PIPE, check=False)
        assert proc.returncode == 0, proc.stderr
        docs.append(json.loads((repo.path / name).read_bytes()))
    assert docs[0]["run_id"] == docs[1]["run_id"]
    assert docs[1]["code"]["untracked_files"] == 0
    # An ordinary untracked file still counts.
    (repo.path / "notes.json").write_text('{"not": "a manifest"}')
    _, third = capture(repo.path, cli_env)
    assert third["code"]["untracked_files"] == 1
    assert third["run_id"] != docs[0]["run_id"]


def test_console_script_and_module_agree(repo: GitRepo, cli_env: dict[str, str]) -> None:
    script = Path(sys.executable).parent / "manifest"
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(script), "capture"], cwd=repo.path, env=cli_env,
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    _, module = capture(repo.path, cli_env)
    assert json.loads(proc.stdout)["run_id"] == module["run_id"]


def test_output_file_is_written_atomically(repo: GitRepo, cli_env: dict[str, str],
                                           tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "run.json"
    result = run_cli("capture", "-o", str(target), cwd=repo.path, env=cli_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""
    manifest = load_manifest(target.read_bytes())
    assert manifest.code.commit == repo.head()
    assert [p.name for p in out_dir.iterdir()] == ["run.json"], "no temporary file left"


# ------------------------------------------------- awkward but valid states


def test_not_a_git_repository(tmp_path: Path, cli_env: dict[str, str]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    result, doc = capture(plain, cli_env)
    assert doc["code"]["commit"] is None
    assert doc["code"]["unavailable"]["commit"] == "not inside a git repository"
    assert has_note(result.stderr, "not inside a git repository")
    assert not (plain / ".manifest").exists()


def test_git_missing(repo: GitRepo, tmp_path: Path, cli_env: dict[str, str]) -> None:
    empty_bin = tmp_path / "no-git-bin"
    empty_bin.mkdir()
    result, doc = capture(repo.path, {**cli_env, "PATH": str(empty_bin)})
    assert doc["code"]["unavailable"]["commit"] == "git is not installed"
    assert has_note(result.stderr, "git is not installed")


def test_unborn_head(repos: RepoFactory, cli_env: dict[str, str]) -> None:
    repo = repos.empty()
    repo.write("train.py", "print(1)\n")
    result, doc = capture(repo.path, cli_env)
    assert doc["code"]["commit"] is None
    assert doc["code"]["dirty"] is True
    assert doc["observed"]["branch"] == "main"
    assert has_note(result.stderr, "no commits yet (unborn HEAD)")


def test_detached_head(repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.git("checkout", "-q", "--detach")
    result, doc = capture(repo.path, cli_env)
    assert doc["code"]["detached"] is True
    assert doc["observed"]["branch"] is None
    assert has_note(result.stderr, "HEAD is detached")


def test_shallow_clone(repo: GitRepo, repos: RepoFactory, cli_env: dict[str, str]) -> None:
    repo.write("train.py", "print(2)\n")
    repo.commit("second")
    clone = repos.base / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo.path}", str(clone)],
                   check=True, env=repos.env, capture_output=True)
    result, doc = capture(clone, cli_env)
    assert doc["code"]["shallow"] is True
    assert has_note(result.stderr, "shallow clone")


def test_dirty_tree_stores_a_patch_that_reproduces_it(
    repo: GitRepo, repos: RepoFactory, cli_env: dict[str, str]
) -> None:
    head = repo.head()
    repo.write("train.py", "print('edited')\n")
    repo.write("data_prep.py", "import os\n")
    repo.write("debug.log", "ignored\n")
    result, doc = capture(repo.path, cli_env)
    code = doc["code"]
    assert code["dirty"] is True
    assert code["untracked_files"] == 1
    blob = repo.path / ".manifest" / "blobs" / code["diff_digest"].replace(":", "-", 1)
    assert blob.is_file()
    assert has_note(result.stderr, f"blobs/{blob.name}")
    assert doc["observed"]["store"] == ".manifest"
    clone = repos.base / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True,
                   env=repos.env, capture_output=True)
    subprocess.run(["git", "checkout", "-q", head], cwd=clone, check=True, env=repos.env)
    subprocess.run(["git", "apply", "--binary", str(blob)], cwd=clone, check=True,
                   env=repos.env)
    assert (clone / "train.py").read_text() == "print('edited')\n"
    assert (clone / "data_prep.py").read_text() == "import os\n"
    assert not (clone / "debug.log").exists()
    _, again = capture(repo.path, cli_env)
    assert again["run_id"] == doc["run_id"], "the store itself is not part of the tree"


def test_submodule(repo: GitRepo, repos: RepoFactory, cli_env: dict[str, str]) -> None:
    lib = repos.with_commit("lib")
    repo.git("-c", "protocol.file.allow=always", "submodule", "add", "-q",
             f"file://{lib.path}", "vendor/lib")
    repo.commit("vendor lib")
    result, doc = capture(repo.path, cli_env)
    assert doc["code"]["submodules"] == [{"path": "vendor/lib", "commit": lib.head()}]
    assert doc["code"]["dirty"] is False
    assert not has_note(result.stderr, "uncommitted")


def test_fsmonitor_in_repo_config_is_not_run(repo: GitRepo, tmp_path: Path,
                                             cli_env: dict[str, str]) -> None:
    marker = tmp_path / "pwned"
    repo.git("config", "core.fsmonitor", f"touch '{marker}'; false")
    repo.write("new.py", "x = 1\n")
    capture(repo.path, cli_env)
    assert not marker.exists()


def test_remote_token_appears_nowhere(repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.git("remote", "add", "origin", f"https://deploy:{TOKEN}@git.example.invalid/x.git")
    repo.write("train.py", "print('dirty so a blob is stored')\n")
    result, doc = capture(repo.path, cli_env)
    assert doc["observed"]["remote_url"] == "https://git.example.invalid/x.git"
    assert TOKEN.encode() not in result.stdout
    assert TOKEN not in result.stderr
    for data in all_files_bytes(repo.path / ".manifest"):
        assert TOKEN.encode() not in data


def test_secret_variables_appear_nowhere(repo: GitRepo, cli_env: dict[str, str]) -> None:
    repo.write("train.py", "print('dirty so a blob is stored')\n")
    env = {**cli_env, **SECRETS, "OMP_NUM_THREADS": "1"}
    result, doc = capture(repo.path, env)
    assert doc["env"]["variables"]["OMP_NUM_THREADS"] == "1"
    stored = all_files_bytes(repo.path / ".manifest")
    for key, value in SECRETS.items():
        for haystack in (result.stdout, result.stderr.encode(), *stored):
            assert value.encode() not in haystack
            assert key.encode() not in haystack


def _site_view_without_torch(tmp_path: Path) -> Path:
    """A directory that holds every installed distribution except torch (symlinks)."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    view = tmp_path / "site-without-torch"
    view.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("torch", "__editable__", "_distutils_hack", "distutils-precedence",
                            "manifest")):
            continue
        (view / entry.name).symlink_to(entry)
    return view


def test_no_torch_installed(repo: GitRepo, tmp_path: Path, cli_env: dict[str, str]) -> None:
    view = _site_view_without_torch(tmp_path)
    env = {**cli_env, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(view)])}
    proc = subprocess.run([sys.executable, "-S", "-m", "manifest.cli", "capture"],
                          cwd=repo.path, env=env, capture_output=True, check=False)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    doc = json.loads(proc.stdout)
    assert doc["env"]["torch"] is None
    assert doc["env"]["unavailable"]["torch"] == "torch is not installed"
    assert "torch" not in doc["env"]["packages"]
    assert has_note(stderr, "torch (torch is not installed)")


def test_no_nvml_library(repo: GitRepo, cli_env: dict[str, str]) -> None:
    if _real_nvml_available():
        pytest.skip("this machine has a working NVIDIA driver")
    result, doc = capture(repo.path, cli_env)
    assert doc["hardware"]["gpus"] is None
    assert doc["env"]["cuda_driver"] is None
    assert "NVML" in doc["hardware"]["unavailable"]["gpus"]
    # No driver on a CPU machine is the normal case there: a note only with -v.
    assert not has_note(result.stderr, "GPUs (NVML")
    verbose, _ = capture(repo.path, cli_env, "-v")
    assert has_note(verbose.stderr, "GPUs (NVML")


def test_quiet_silences_notes(tmp_path: Path, cli_env: dict[str, str]) -> None:
    result, _ = capture(tmp_path, cli_env, "-q")
    assert result.stderr == ""


# ------------------------------------------------------------ bad requests


def test_output_in_a_missing_directory(repo: GitRepo, tmp_path: Path,
                                       cli_env: dict[str, str]) -> None:
    target = tmp_path / "no" / "such" / "dir" / "run.json"
    result = run_cli("capture", "-o", str(target), cwd=repo.path, env=cli_env)
    assert result.returncode == 2
    assert result.stdout == b""
    assert_one_sentence(result.stderr)
    assert "does not exist" in result.stderr
    assert not target.parent.exists()


def test_output_in_an_unwritable_directory(repo: GitRepo, tmp_path: Path,
                                           cli_env: dict[str, str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running with privileges that ignore directory permissions (root)")
        result = run_cli("capture", "-o", str(locked / "run.json"), cwd=repo.path, env=cli_env)
        assert result.returncode == 2
        assert result.stdout == b""
        assert_one_sentence(result.stderr)
        assert "cannot write" in result.stderr
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_output_onto_a_directory(repo: GitRepo, tmp_path: Path,
                                 cli_env: dict[str, str]) -> None:
    result = run_cli("capture", "-o", str(tmp_path), cwd=repo.path, env=cli_env)
    assert result.returncode == 2
    assert_one_sentence(result.stderr)


# --------------------------------------------------------- import hygiene


IMPORT_PROBE = """
import json, sys
from manifest.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
with open(sys.argv[1], "w") as fh:
    json.dump({"code": code, "modules": sorted(sys.modules)}, fh)
"""

HEAVY = ("torch", "numpy", "pynvml", "git", "gitdb", "rich", "ctypes.util")


@pytest.mark.parametrize("argv", [["--help"], ["capture"], ["capture", "--help"]])
def test_cli_does_not_import_heavy_modules(argv: list[str], repo: GitRepo, tmp_path: Path,
                                           cli_env: dict[str, str]) -> None:
    report = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(report), *argv],
                          cwd=repo.path, env=cli_env, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(report.read_text())
    assert seen["code"] in (0, None)
    modules = set(seen["modules"])
    for heavy in HEAVY:
        assert heavy not in modules, f"{' '.join(argv)} imported {heavy}"
    if argv[0] == "--help" or argv[-1] == "--help":
        assert "pydantic" not in modules, "--help needs no models"
