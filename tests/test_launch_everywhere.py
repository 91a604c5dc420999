"""The launcher is in force in every Python process a command starts, or the process is named.

Real captures (real subprocesses, real torch on CPU, real git) through the CLI, each
with a positive control: the same start without the hook (an interpreter whose
site-packages has every package but not ``torch_manifest.pth``) is not recorded.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

from manifest.launch.boot._manifest_escape import describe_start
from manifest.launch.outside import outside_recipe
from manifest.models import Manifest
from tests.runs import make_repo, manifest_cli

SCRIPT = '''\
import random, sys
print("drew", random.random(), file=sys.stderr)
'''


def capture(repo: Path, *cmd: str, seed: str = "3") -> dict[str, Any]:
    proc = manifest_cli("capture", "--seed", seed, "--", *cmd, cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def no_hook_python(tmp: Path) -> str:
    """A virtual environment that sees every package of this one but runs no .pth of it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(tmp), "platbase": str(tmp)})["purelib"])
    (site / "here.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(tmp / "bin" / "python")


def recorded(doc: dict[str, Any]) -> list[dict[str, Any]]:
    procs: list[dict[str, Any]] = doc["randomness"]["processes"]
    return procs


# ------------------------------------------------------------ replaced PYTHONPATH


@pytest.mark.slow
def test_env_pythonpath_in_argv_is_still_prepared(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"main.py": SCRIPT, "tools/x.py": ""}, example=False)
    doc = capture(repo, "env", "PYTHONPATH=tools", "python", "main.py")
    [proc] = recorded(doc)
    assert proc["seed"] == 3
    assert "outside_recipe" not in doc["determinism"]
    # Positive control: the same command where the interpreter has no hook escapes,
    # and is named rather than counted as recipe.
    bare = no_hook_python(tmp_path / "bare")
    doc = capture(repo, "env", "PYTHONPATH=tools", bare, "main.py")
    assert recorded(doc) == []
    [out] = doc["determinism"]["outside_recipe"]
    assert out["command"] == "python main.py" and "PYTHONPATH" in out["reason"]
    assert "ran outside the recipe" in doc["randomness"]["unavailable"]["processes"]


@pytest.mark.slow
def test_shell_script_that_exports_pythonpath_is_still_prepared(tmp_path: Path) -> None:
    run_sh = "#!/bin/sh\nexport PYTHONPATH=tools\nexec python main.py\n"
    # It lives longer than the watch's poll interval (manifest.launch.outside.POLL_S).
    main = SCRIPT + "import time; time.sleep(0.5)\n"
    repo = make_repo(tmp_path / "r", {"main.py": main, "run.sh": run_sh, "tools/x.py": ""},
                     example=False)
    (repo / "run.sh").chmod(0o755)
    [proc] = recorded(capture(repo, "./run.sh"))
    assert proc["seed"] == 3
    bare = no_hook_python(tmp_path / "bare")
    (repo / "run.sh").write_text(run_sh.replace("exec python", f"exec {bare}"))
    doc = capture(repo, "./run.sh")
    assert recorded(doc) == []  # positive control: without the hook nothing is recorded
    # The process-tree watch read its environment and named it.
    [out] = doc["determinism"]["outside_recipe"]
    assert out["command"] == "python main.py"


# ---------------------------------------------------------------- escapes named


@pytest.mark.slow
def test_python_I_is_prepared_by_the_hook_and_python_S_is_named(tmp_path: Path) -> None:
    spawn = textwrap.dedent('''\
        import subprocess, sys
        subprocess.run([sys.executable, "-S", "child.py"], check=True)
    ''')
    repo = make_repo(tmp_path / "r", {"main.py": SCRIPT, "child.py": SCRIPT, "spawn.py": spawn},
                     example=False)
    # -I ignores PYTHONPATH, but site still runs the installed start-up hook.
    [proc] = recorded(capture(repo, "python", "-I", "main.py"))
    assert proc["seed"] == 3
    # -S skips site: nothing can prepare it. The command line names it...
    doc = capture(repo, "python", "-S", "main.py")
    assert recorded(doc) == []
    [out] = doc["determinism"]["outside_recipe"]
    assert out == {"command": "python -S main.py", "site": "the command line",
                   "reason": out["reason"]} and "-S" in out["reason"]
    # ... and a prepared process's audit hook names its child, with the call site.
    doc = capture(repo, "python", "spawn.py")
    assert len(recorded(doc)) == 1
    [out] = doc["determinism"]["outside_recipe"]
    assert out["command"].endswith("-S child.py") and out["site"] == "spawn.py:2"
    sentences = outside_recipe(Manifest.model_validate(doc))
    assert len(sentences) == 1 and "ran outside the recipe" in sentences[0]


@pytest.mark.slow
def test_scrubbed_environment_is_named(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"main.py": SCRIPT}, example=False)
    doc = capture(repo, "env", "-i", f"PATH={os.environ['PATH']}", "python", "main.py")
    assert recorded(doc) == []
    [out] = doc["determinism"]["outside_recipe"]
    assert "MANIFEST_LAUNCH" in out["reason"]


def test_describe_start_reads_env_shells_and_interpreter_options() -> None:
    boot = str(Path(__file__).resolve().parents[1] / "manifest" / "launch" / "boot")
    env = {"MANIFEST_LAUNCH": "{}", "PYTHONPATH": boot, "PATH": os.environ["PATH"]}
    assert describe_start(["python", "train.py"], env) is None
    assert describe_start(["env", "PYTHONPATH=x", sys.executable, "t.py"], env) is None
    found = describe_start(["sh", "-c", "FOO=1 exec python -IS t.py --token=s3cret; ls"], env)
    assert found is not None and found["command"] == "python -IS t.py"  # never its arguments
    found = describe_start(["env", "-u", "MANIFEST_LAUNCH", "python3", "-m", "pkg.mod"], env)
    assert found is not None and found["command"] == "python3 -m pkg.mod"
    assert describe_start(["bash", "run.sh"], env) is None  # opaque: the watch's job


# ----------------------------------------------------------- chained sitecustomize


HOLDER = '''\
import weakref
class Registry:
    pass
REGISTRY = Registry()
REGISTRY.ops = ["mylib::nms"]
ALIVE = weakref.ref(REGISTRY)
'''
CHECK = '''\
import gc, sys
gc.collect()
import sitecustomize
print("alive" if sitecustomize.ALIVE() is not None else "collected",
      sitecustomize.REGISTRY.ops, file=sys.stderr)
'''


@pytest.mark.slow
def test_chained_sitecustomize_stays_alive(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"main.py": CHECK, "site_dir/sitecustomize.py": HOLDER},
                     example=False)
    proc = manifest_cli("capture", "--", "env", "PYTHONPATH=site_dir", "python", "main.py",
                        cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"alive ['mylib::nms']" in proc.stderr
    [rec] = json.loads(proc.stdout)["randomness"]["processes"]
    assert rec["seed"] == 0


def test_old_chaining_loses_the_state_positive_control(tmp_path: Path) -> None:
    """What the launcher did before: run the module without keeping it. Its state dies."""
    import importlib.util

    (tmp_path / "sitecustomize.py").write_text(HOLDER)
    spec = importlib.util.spec_from_file_location("sitecustomize", tmp_path / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    alive = module.ALIVE
    del module
    gc.collect()
    assert alive() is None
