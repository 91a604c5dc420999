"""The headline case: a run verified on another machine, in its own rebuilt environment.

The bundled example is captured in venv A (this test's own); a fresh clone is verified
from venv B, which has another numpy (the run imports it). Plain verify reports the
numpy drift and says the re-run used this machine's environment; ``verify --env run``
rebuilds the run's environment with uv from a wheelhouse, proves it file by file,
re-runs in it and gives ``identical`` with no drift that can change bits.

Venv B layers its own numpy over venv A's site-packages (a ``.pth`` that adds it after
its own), so it needs one wheel, not a second copy of torch. Nothing reaches the network:
the wheels come from the folder ``.ci/run`` fills once (``tests/run_env_wheels.py``);
without them the test skips and names what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.run_env_wheels import other_numpy, wheelhouse
from tests.runs import make_repo

pytestmark = pytest.mark.slow


def _uv() -> str:
    uv = pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")
    found: str = uv.find_uv_bin()
    return found


def _missing(folder: Path, wanted: dict[str, str]) -> list[str]:
    """``name==version`` of each wanted distribution without a wheel in ``folder``."""
    have = {p.name.split("-")[0].lower().replace("_", "-") + "==" + p.name.split("-")[1]
            for p in folder.glob("*.whl")} if folder.is_dir() else set()
    return sorted(f"{n}=={v}" for n, v in wanted.items()
                  if f"{n.replace('_', '-')}=={v}" not in have)


def _cli(python: Path, *args: str, cwd: Path, env: dict[str, str]) -> tuple[int, Any, str]:
    proc = subprocess.run([str(python), "-m", "manifest", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=1200, check=False)
    stderr = proc.stderr.decode()
    assert proc.stdout, stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), stderr


def test_verify_in_the_runs_rebuilt_environment(tmp_path: Path) -> None:
    uv = _uv()
    wheels = wheelhouse()
    origin = make_repo(tmp_path / "origin", {})
    venv_a = Path(sys.prefix)
    path_a = f"{venv_a / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, PATH=path_a, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("PYTHONHASHSEED", None)
    proc = subprocess.run([sys.executable, "-m", "manifest", "capture", "-q", "--artifact",
                           "out/*.safetensors", "--", "python", "train.py", "--steps", "6"],
                          cwd=origin, env=env, capture_output=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    (origin / "run.json").write_bytes(proc.stdout)
    recorded = json.loads(proc.stdout)["env"]
    assert recorded["numpy"] != other_numpy()  # positive control: B's numpy is another
    from manifest.pyenv.sources import SELF_DISTRIBUTIONS, rebuild_set

    wanted = {n: recorded["distributions"][n]["version"]
              for n in rebuild_set(recorded["distributions"], recorded["imported"]) or []
              if n not in SELF_DISTRIBUTIONS}
    missing = _missing(wheels, {**wanted, "numpy": other_numpy()})
    if missing:
        pytest.skip(f"the wheelhouse {wheels} lacks {', '.join(missing)} "
                    "(python tests/run_env_wheels.py fills it; .ci/run does)")

    # venv B: another numpy, the rest (this tool included) from venv A after it
    venv_b = tmp_path / "venv-b"
    subprocess.run([uv, "venv", "-q", "--no-config", "--python", sys.executable, str(venv_b)],
                   check=True, timeout=300, env=env)
    subprocess.run([uv, "pip", "install", "-q", "--no-config", "--no-index", "--find-links",
                    str(wheels), "--python", str(venv_b / "bin" / "python"),
                    f"numpy=={other_numpy()}"], check=True, timeout=600, env=env)
    site_b = next((venv_b / "lib").glob("python*/site-packages"))
    site_a = sysconfig.get_paths()["purelib"]
    (site_b / "zz_venv_a.pth").write_text(f"import site; site.addsitedir({site_a!r})\n")
    python_b = venv_b / "bin" / "python"
    elsewhere = tmp_path / "far" / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(elsewhere)], check=True)
    shutil.copy(origin / "run.json", elsewhere / "run.json")
    env_b = dict(env, PATH=f"{venv_b / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")

    code, plain, _ = _cli(python_b, "verify", "run.json", "--json", cwd=elsewhere, env=env_b)
    numpy_drift = [d for d in plain["drift"] if d["impact"] == "bits" and "numpy" in d["reason"]]
    assert numpy_drift, plain["drift"]
    assert plain["environment"]["used"] == "here"
    assert plain["environment"]["line"].startswith("this machine's: ")
    assert "differ" in plain["environment"]["line"], plain["environment"]
    assert code in (0, 1), plain["reason"]  # numpy's drift may or may not reach the weights

    code, run, stderr = _cli(python_b, "verify", "run.json", "--env", "run", "--find-links",
                             str(wheels), "--json", cwd=elsewhere, env=env_b)
    assert (code, run["verdict"]) == (0, "identical"), run["reason"]
    assert [d for d in run["drift"] if d["impact"] == "bits"] == []
    assert run["environment"]["used"] == "run"
    assert run["environment"]["line"] == "the run's environment (rebuilt, files identical)"
    assert run["environment"]["proof"]["proven"] is True
    assert run["basis"] == "tensors and trail"  # the launcher fingerprinted the steps there
    # the proof was said before the re-run started
    assert stderr.index("files identical") < stderr.index("re-running")
