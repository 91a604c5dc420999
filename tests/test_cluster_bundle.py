"""The bundle a cluster executor ships, and the remote entrypoint's arrival checks (issue 23).

Every refusal has a positive control: the same bundle, unedited, runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from manifest.rerun.cluster import cluster_options, missing_extra
from manifest.rerun.cluster.bundle import INDEX, PATCH, TREE, build_bundle
from manifest.rerun.cluster.options import RayOptions, SlurmOptions

SCRIPT = "from pathlib import Path\nPath('out').mkdir(exist_ok=True)\n" \
         "Path('out/x.txt').write_text('hello')\n"
PATCH_BYTES = b"diff --git a/train.py b/train.py\n"  # shipped as evidence; content irrelevant here


def _bundle(tmp_path: Path, **over: Any) -> tuple[Path, str]:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text(SCRIPT)
    (tree / "sub").mkdir()
    (tree / "sub" / "data.bin").write_bytes(b"\x00\x01" * 100)
    import blake3

    digest = "blake3:" + blake3.blake3(PATCH_BYTES).hexdigest()
    settings = {"seed": 0, "derivation": "same", "threads": 1, "deterministic": True,
                "trail": "off", "ops": None, "root": str(tree), "hashseed": None}
    args: dict[str, Any] = {
        "tree": tree, "cwd": tree, "mount_at": tree, "argv": [sys.executable, "train.py"],
        "outputs": ["out/*.txt"], "patch": PATCH_BYTES, "commit": "0" * 40,
        "diff_digest": digest, "settings": settings,
        "env": {"MY_TOKEN": "s3cret-value", "MANIFEST_SECRET_0": "hidden",
                "OMP_NUM_THREADS": "1", "SOME_PATH": f"{tree}/lib"},
        "sandbox": False}
    args.update(over)
    bundle = build_bundle(tmp_path / "bundle", **args)
    return bundle.path, bundle.name


def _remote(bundle: Path, out: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-m", "manifest.rerun.remote", str(bundle),
                           str(out), "--expect", name], capture_output=True, text=True,
                          timeout=120, check=False)


def test_unedited_bundle_runs_and_returns_tables(tmp_path: Path) -> None:
    bundle, name = _bundle(tmp_path)
    proc = _remote(bundle, tmp_path / "out", name)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["exit_code"] == 0
    assert [a["path"] for a in doc["artifacts"]] == ["out/x.txt"]
    assert doc["outputs"] == {}  # tables only, unless --fetch-outputs


def test_no_credential_enters_the_bundle(tmp_path: Path) -> None:
    bundle, _ = _bundle(tmp_path)
    index = (bundle / INDEX).read_text()
    assert "s3cret-value" not in index
    assert "hidden" not in index
    env = json.loads(index)["env"]
    assert env["SOME_PATH"] == "{tree}/lib"  # this machine's paths travel as placeholders
    assert str(tmp_path) not in index


@pytest.mark.parametrize("edit", ["patch", "tree-file", "extra-file", "missing-file", "index"])
def test_edited_bundle_is_refused_on_arrival(tmp_path: Path, edit: str) -> None:
    bundle, name = _bundle(tmp_path)
    if edit == "patch":
        (bundle / PATCH).write_bytes(PATCH_BYTES + b"+import os; os.system('evil')\n")
    elif edit == "tree-file":
        (bundle / TREE / "train.py").write_text(SCRIPT + "print('edited')\n")
    elif edit == "extra-file":
        (bundle / TREE / "sitecustomize.py").write_text("print('planted')\n")
    elif edit == "missing-file":
        (bundle / TREE / "sub" / "data.bin").unlink()
    else:
        doc = json.loads((bundle / INDEX).read_text())
        doc["argv"] = ["sh", "-c", "echo planted"]
        (bundle / INDEX).write_text(json.dumps(doc))
    proc = _remote(bundle, tmp_path / "out", name)
    assert proc.returncode == 3, proc.stderr
    assert "refused" in proc.stderr
    assert not (tmp_path / "out" / "tree").exists()  # nothing ran
    assert "refused" in json.loads((tmp_path / "out" / "result.json").read_text())


def test_patch_that_is_not_the_recorded_one_is_not_shipped(tmp_path: Path) -> None:
    from manifest.errors import NoVerdictError

    with pytest.raises(NoVerdictError, match="does not reproduce the recorded patch"):
        _bundle(tmp_path, diff_digest="blake3:" + "0" * 64)


def test_fetch_outputs_brings_the_file_back(tmp_path: Path) -> None:
    bundle, name = _bundle(tmp_path, fetch_outputs=True)
    assert _remote(bundle, tmp_path / "out", name).returncode == 0
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert set(doc["outputs"]) == {"out/x.txt"}


def test_address_is_kept_without_credentials() -> None:
    options = cluster_options("ray", {"address": "http://alice:s3cret@head:8265"}, {})
    assert isinstance(options, RayOptions)
    assert options.address == "http://head:8265"
    assert "s3cret" not in json.dumps(options.to_json())


def test_options_come_from_pyproject_and_flags_win() -> None:
    table = {"slurm": {"partition": "gpu", "account": "proj", "time_min": 30}}
    options = cluster_options("slurm", {"partition": "debug", "account": None}, table)
    assert isinstance(options, SlurmOptions)
    assert (options.partition, options.account, options.time_min) == ("debug", "proj", 30)


def test_unknown_executor_key_is_refused() -> None:
    from manifest.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        cluster_options("ray", {}, {"ray": {"adress": "x"}})


def test_missing_extra_is_one_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from manifest.cli.app import main

    monkeypatch.setitem(sys.modules, "ray", None)
    assert missing_extra("ray") == ("--on ray needs its client library: pip install "
                                    "'torch-manifest[ray]'.")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.json").write_text("{}")
    assert main(["verify", "run.json", "--on", "ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'torch-manifest[ray]'" in err
    assert "Traceback" not in err


def test_help_and_diff_never_import_a_cluster_library(tmp_path: Path) -> None:
    code = ("import sys, contextlib, io\nfrom manifest.cli.app import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: main(['--help'])\n    except SystemExit: pass\n"
            "    try: main(['verify', '--help'])\n    except SystemExit: pass\n"
            "bad = [m for m in ('ray', 'submitit', 'kubernetes') if m in sys.modules]\n"
            "print(bad)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True, cwd=tmp_path)
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_users_tree_ships_what_git_lists_and_its_data(tmp_path: Path) -> None:
    """lab (and --in-place) run in the user's tree: tracked and untracked-not-ignored files,
    the declared data inside the tree even when ignored, never .venv or ignored builds."""
    from manifest.errors import UsageError
    from manifest.rerun.cluster.bundle import check_bundle, tree_files
    from tests.runs import make_repo

    repo = make_repo(tmp_path / "repo", {"lib/util.py": "X = 1\n"}, example=False)
    (repo / ".gitignore").write_text("data/\nbuild/\n.venv/\n")
    (repo / "new.py").write_text("Y = 2\n")  # untracked, not ignored: shipped
    for ignored in (".venv/lib/site.py", "build/out.bin", "data/train/a.bin"):
        (repo / ignored).parent.mkdir(parents=True, exist_ok=True)
        (repo / ignored).write_bytes(b"x")
    assert tree_files(repo) == [".gitignore", "lib/util.py", "new.py"]
    shipped = tree_files(repo, [str(repo / "data" / "train")])
    assert shipped == [".gitignore", "data/train/a.bin", "lib/util.py", "new.py"]
    with pytest.raises(UsageError, match="lies outside it"):
        tree_files(repo, [str(tmp_path)])
    # What is listed is what arrives: the arrival check walks the copy and agrees.
    settings = {"seed": 0, "derivation": "same", "threads": 1, "deterministic": True,
                "trail": "off", "ops": None, "root": str(repo), "hashseed": None}
    bundle = build_bundle(tmp_path / "bundle", tree=repo, cwd=repo, mount_at=repo,
                          argv=["python", "new.py"], outputs=[], patch=None, commit=None,
                          diff_digest=None, settings=settings, env={}, only=shipped)
    assert sorted(check_bundle(bundle.path, bundle.name)["files"]) == shipped
