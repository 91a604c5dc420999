"""Reads the record missed, and no plain digest of a read value (issue 49, classes 3, 4).

Each case runs a small script (no torch: fast) under the real ``manifest capture`` twice,
with the variable at two values, and asks the real CLI: another value must be another
run_id, and diff must name the variable. The control is the same capture under the same
value: the same run_id, no line.

The secret case brute-forces a 4-digit PIN over 0000-9999 against everything the capture
left (the manifest, the store) and what ``show`` and ``diff`` print: nothing gives it back.
Its positive control runs the same brute force against today's process record, which holds
the plain blake3 the launcher computes: there it finds the PIN.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import blake3
import pytest

from manifest.launch.runner import LaunchSettings
from tests.runs import make_repo, manifest_cli

HOSTILE = """\
import collections, os
from pathlib import Path
# A name a prefix rule dropped: how an honest SLURM sweep picks its hyper-parameter.
task = os.environ.get("SLURM_ARRAY_TASK_ID", "0")
mine = os.environ.get("MANIFEST_MY_LR", "0")
# Code compiled under a library-looking file name is still the script's.
exec(compile("import os\\nfrozen = os.environ.get('FROZEN_LR', '0')", "<frozen os>", "exec"))
site = os.path.join(os.path.dirname(os.__file__), "json", "__init__.py")
exec(compile("import os\\nlibrary = os.environ.get('SITE_LR', '0')", site, "exec"))
# A ChainMap over the environment, with defaults.
chained = collections.ChainMap(os.environ, {"CHAIN_LR": "0"}).get("CHAIN_LR")
Path("out").mkdir(exist_ok=True)
Path("out/w.txt").write_text(task + mine + frozen + library + chained)
"""

NAMES = ("SLURM_ARRAY_TASK_ID", "MANIFEST_MY_LR", "FROZEN_LR", "SITE_LR", "CHAIN_LR")


def _capture(repo: Path, out: str, env: dict[str, str]) -> dict[str, Any]:
    cap = manifest_cli("capture", "--artifact", "out/w.txt", "-o", out, "--", "python",
                       "script.py", cwd=repo, env=env, timeout=300)
    assert cap.returncode == 0, cap.stderr.decode()
    doc: dict[str, Any] = json.loads((repo / out).read_text())
    return doc


def _diff(repo: Path, a: str, b: str) -> tuple[int, str, list[dict[str, Any]]]:
    text = manifest_cli("diff", a, b, cwd=repo)
    js = manifest_cli("diff", "--json", a, b, cwd=repo)
    assert b"Traceback" not in text.stderr + js.stderr
    return text.returncode, text.stdout.decode(), json.loads(js.stdout)["differences"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    repo = make_repo(tmp_path_factory.mktemp("hostile") / "repo", {"script.py": HOSTILE},
                     example=False)
    ones = {name: "1" for name in NAMES}
    base = _capture(repo, "base.json", ones)
    return repo, base


def test_every_read_is_recorded_whatever_its_name_or_origin(
        hostile: tuple[Path, dict[str, Any]]) -> None:
    repo, base = hostile
    [process] = base["determinism"]["processes"]
    assert set(NAMES) <= set(process["environ"]), process.get("environ")
    # The control: the same values, the same run_id and no line about a variable.
    again = _capture(repo, "again.json", {name: "1" for name in NAMES})
    assert again["run_id"] == base["run_id"]
    code, _, same = _diff(repo, "base.json", "again.json")
    assert not [d for d in same if "environ" in d["path"]], same
    for name in NAMES:
        other = _capture(repo, f"{name}.json", {**{n: "1" for n in NAMES}, name: "2"})
        assert other["run_id"] != base["run_id"], name
        code, text, lines = _diff(repo, "base.json", f"{name}.json")
        assert code == 1, text
        [line] = [d for d in lines if d["path"].endswith(f"environ[{name}].digest")]
        assert line["impact"] == "bits", line
        assert f"{name} changed: another value" in text, text


PIN_SCRIPT = """\
import os
from pathlib import Path
pin = os.environ["ADMIN_PIN"]
Path("out").mkdir(exist_ok=True)
Path("out/w.txt").write_text("ok")
"""


def _brute_force(blobs: list[bytes]) -> str | None:
    """The PIN whose blake3 (hex) any blob holds, over 0000-9999; None when none does."""
    for n in range(10_000):
        guess = f"{n:04d}"
        if any(blake3.blake3(guess.encode()).hexdigest().encode() in b for b in blobs):
            return guess
    return None


def test_a_four_digit_pin_is_not_recovered_from_what_capture_leaves(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"script.py": PIN_SCRIPT}, example=False)
    doc = _capture(repo, "a.json", {"ADMIN_PIN": "1234"})
    _capture(repo, "b.json", {"ADMIN_PIN": "4321"})
    [process] = doc["determinism"]["processes"]
    read = process["environ"]["ADMIN_PIN"]
    assert read["set"] is True and read["digest"] is not None and read["key"] is not None
    show = manifest_cli("show", "a.json", cwd=repo)
    code, text, _ = _diff(repo, "a.json", "b.json")
    # Still compared: another PIN is another run, named as such, by no digest.
    assert code == 1 and "ADMIN_PIN changed: another value" in text, text
    blobs = [(repo / "a.json").read_bytes(), (repo / "b.json").read_bytes(), show.stdout,
             text.encode()]
    blobs += [p.read_bytes() for p in (repo / ".manifest").rglob("*") if p.is_file()]
    assert _brute_force(blobs) is None
    # diff and show print no digest of a read value, keyed or not.
    keyed = [read["digest"], json.loads((repo / "b.json").read_text())["determinism"][
        "processes"][0]["environ"]["ADMIN_PIN"]["digest"]]
    for digest in keyed:
        assert digest not in text and digest.encode() not in show.stdout
    # The positive control: the process record the launcher writes holds the plain blake3
    # (today's manifest kept it in identity), and the same brute force gives 1234 back.
    records = tmp_path / "records"
    records.mkdir()
    settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True,
                              trail="off", root=str(repo), numeric=False)
    env = {**settings.child_env(records), "ADMIN_PIN": "1234"}
    proc = subprocess.run([sys.executable, "script.py"], cwd=repo, env=env,
                          capture_output=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    [record] = [p.read_bytes() for p in records.glob("*.json")]
    assert _brute_force([record]) == "1234"


CHAIN = """
import collections, os
defaults = {"CHAIN_DEFAULT": "d"}
got = collections.ChainMap(os.environ, defaults).get("CHAIN_GET")
inside = "CHAIN_IN" in collections.ChainMap(os.environ, defaults)
item = collections.ChainMap(os.environ, defaults)["CHAIN_ITEM"]
fallback = collections.ChainMap(os.environ, defaults)["CHAIN_DEFAULT"]
copies = [dict(collections.ChainMap(os.environ, defaults)),
          {**collections.ChainMap(os.environ, defaults)},
          list(collections.ChainMap(os.environ, defaults).items()),
          list(collections.ChainMap(os.environ, defaults).values()),
          collections.ChainMap(os.environ, defaults).copy()]
"""


def test_chainmap_reads_count_and_its_copies_do_not(tmp_path: Path) -> None:
    """Every Mapping method of a ChainMap over the environment: a read of one named
    variable is the script's (``get``, ``in``, ``[]``, a default under an unset name); a
    copy (``dict``, ``{**…}``, ``items``, ``values``, ``copy``) hands the environment on and
    reads none. The control: the twin below the hook saw the copies take every value."""
    from tests.test_environ_reads import _launched

    env = {"CHAIN_GET": "1", "CHAIN_IN": "2", "CHAIN_ITEM": "3", "COPY_ONLY": "4"}
    reads, seen = _launched(tmp_path, CHAIN, env)
    assert set(reads) == {"CHAIN_GET", "CHAIN_IN", "CHAIN_ITEM", "CHAIN_DEFAULT"}, reads
    assert reads["CHAIN_DEFAULT"]["set"] is False  # unset: the script's default counted
    assert "COPY_ONLY" in seen and "COPY_ONLY" not in reads
