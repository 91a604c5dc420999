"""The ``manifest`` process loads no third-party pydantic plugin (``manifest/cli/startup.py``).

A real plugin, registered the way a package registers one (an entry point in
group ``pydantic`` of an installed distribution), records that it was loaded.
Plain pydantic loads it (the positive control); ``manifest capture`` does not,
and does not import ``importlib.metadata`` to look for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.cli import startup
from tests.conftest import GitRepo, run_cli

PLUGIN = '''
import os
from pathlib import Path

Path(os.environ["PLUGIN_MARKER"]).write_text("loaded")


class Plugin:
    def new_schema_validator(self, *args, **kwargs):
        return None, None, None


plugin = Plugin()
'''


@pytest.fixture
def plugin_env(tmp_path: Path, cli_env: dict[str, str]) -> dict[str, str]:
    site = tmp_path / "site"
    (site / "spyplugin-1.0.dist-info").mkdir(parents=True)
    (site / "spyplugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spyplugin\nVersion: 1.0\n")
    (site / "spyplugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[pydantic]\nspy = spyplugin:plugin\n")
    (site / "spyplugin.py").write_text(PLUGIN)
    env = dict(cli_env)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    env["PLUGIN_MARKER"] = str(tmp_path / "marker")
    return env


def test_plain_pydantic_loads_the_plugin(plugin_env: dict[str, str], tmp_path: Path) -> None:
    code = ("from pydantic import BaseModel\n"
            "class A(BaseModel):\n    x: int\n"
            "A(x=1)\n")
    subprocess.run([sys.executable, "-c", code], env=plugin_env, check=True, timeout=60)
    assert (tmp_path / "marker").read_text() == "loaded"


def test_manifest_capture_does_not(plugin_env: dict[str, str], tmp_path: Path,
                                   repo: GitRepo) -> None:
    result = run_cli("capture", "-q", "-o", str(tmp_path / "run.json"),
                     cwd=repo.path, env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run.json").stat().st_size > 0
    assert not (tmp_path / "marker").exists()
    probe = ("import sys\nfrom manifest.cli import main\n"
             f"main(['capture', '-q', '-o', {str(tmp_path / 'again.json')!r}])\n"
             "print('importlib.metadata' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=repo.path, env=plugin_env,
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
    assert not (tmp_path / "marker").exists()


def test_the_stand_in_answers_other_names_from_the_real_loader() -> None:
    real = startup._from_real_loader("PYDANTIC_ENTRY_POINT_GROUP")
    assert real == "pydantic"
    with pytest.raises(AttributeError):
        startup._from_real_loader("__path__")
