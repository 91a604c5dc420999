"""The cyclic collector is off while ``manifest`` imports, and on for the work
(``manifest/cli/startup.py``: ~20 ms of a ~0.16 s capture).

Each case runs the CLI in a child process with spies that record
``gc.isenabled()`` and ``gc.get_freeze_count()`` at three moments: when
capture starts its git prefetch (before the heavy imports), when
``capture_from_cli`` starts (a captured command runs inside it), and after
``main`` returns. The positive control is the process entry point: there
the collector *is* off during the imports, so the spies can see it; a
``main([...])`` called inside another program must find the collector as it
left it and freeze none of that program's objects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GitRepo

SPY = '''
import gc, json, sys
seen = {}
import manifest.probes.repo as repo
real_prefetch = repo.prefetch
def prefetch(cwd):
    seen["imports"] = [gc.isenabled(), gc.get_freeze_count()]
    return real_prefetch(cwd)
repo.prefetch = prefetch
import manifest.cli.verbs_record as verbs
real_show = verbs._cmd_show
def show(args):
    seen["show"] = [gc.isenabled(), gc.get_freeze_count()]
    return real_show(args)
verbs._cmd_show = show
def capture_spy():
    import manifest.capture.run as run
    real = run.capture_from_cli
    def capture_from_cli(*a, **k):
        seen["run"] = [gc.isenabled(), gc.get_freeze_count()]
        return real(*a, **k)
    run.capture_from_cli = capture_from_cli
capture_spy()
from manifest.cli import entry, main
args = json.loads(sys.argv[1])
if sys.argv[2] == "entry":
    sys.argv = ["manifest", *args]
    code = entry()
elif sys.argv[2] == "argv":  # another program that sets sys.argv and calls main()
    sys.argv = ["manifest", *args]
    code = main()
else:
    code = main(args)
seen["after"] = [gc.isenabled(), gc.get_freeze_count()]
seen["code"] = code
print(json.dumps(seen), file=sys.stderr)
'''


def _spied(args: list[str], how: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", SPY, json.dumps(args), how], cwd=cwd,
                          env=env, capture_output=True, text=True, check=False, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    seen: dict[str, Any] = json.loads(last)
    assert seen["code"] == 0, proc.stderr
    return seen


def test_entry_point_imports_without_the_collector_and_runs_with_it(
        repo: GitRepo, cli_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    seen = _spied(["capture", "-q", "-o", str(out), "--", sys.executable, "-c", "pass"],
                  "entry", repo.path, cli_env)
    assert seen["imports"] == [False, 0]  # paused, nothing frozen yet: the control
    enabled, frozen = seen["run"]
    assert enabled and frozen > 10_000  # the command runs with it on; the imports frozen
    assert seen["after"][0]
    assert json.loads(out.read_bytes())["command"] is not None


def test_other_verbs_get_the_collector_back_before_they_run(
        repo: GitRepo, cli_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    _spied(["capture", "-q", "-o", str(out)], "entry", repo.path, cli_env)
    seen = _spied(["show", str(out)], "entry", repo.path, cli_env)
    assert seen["show"][0]
    assert seen["after"][0]


@pytest.mark.parametrize("how", ["call", "argv"])
def test_main_inside_another_program_leaves_its_collector_alone(
        repo: GitRepo, cli_env: dict[str, str], tmp_path: Path, how: str) -> None:
    # "argv": main() with argv=None once froze the calling program's objects (12,171 of them)
    seen = _spied(["capture", "-q", "-o", str(tmp_path / "run.json")], how,
                  repo.path, cli_env)
    assert seen["imports"] == [True, 0]
    assert seen["run"] == [True, 0]
    assert seen["after"] == [True, 0]


def test_diff_gives_the_collector_back(repo: GitRepo, cli_env: dict[str, str],
                                       tmp_path: Path) -> None:
    # diff pauses the collector for its own work; main([...]) left it off for the caller
    out = tmp_path / "run.json"
    _spied(["capture", "-q", "-o", str(out)], "entry", repo.path, cli_env)
    seen = _spied(["diff", str(out), str(out)], "call", repo.path, cli_env)
    assert seen["after"] == [True, 0]
