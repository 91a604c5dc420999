"""Recorded strings are shown as text: no rich markup, no terminal control, in every
renderer; a closed pipe ends quietly with status 0.

Positive controls: a plain rich console eats ``[cat,dog]`` and raises
MarkupError on ``[/data/a]``; a plain Python program whose reader went away
exits 120 with "Exception ignored … BrokenPipeError" on stderr.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from manifest.canonical import dumps, seal
from manifest.cli import app as cli
from manifest.cli.render import render_command
from manifest.cli.render_gate import gate_markdown, render_gate
from manifest.cli.text import markup, printable, shell_join
from manifest.gate.policy import GatePolicy
from manifest.gate.report import CheckResult, GateReport, Status

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "manifest_v1.json"
HOSTILE_ARGV = ["python", "train.py", "data.classes=[cat,dog]", "paths=[/data/a]",
                "--lr=[bold]1[/bold]", "ok\rrm -rf ~", "\x1b[2J\x1b[1;1Hclean", "\u202eexe.txt",
                "a\\rb"]
RAW_CONTROLS = ("\r", "\x1b", "\u202e")


def _hostile_manifest(tmp_path: Path) -> Path:
    doc = json.loads(GOLDEN.read_bytes())
    doc = copy.deepcopy(doc)
    doc["command"]["argv"] = HOSTILE_ARGV
    doc["command"]["outputs"] = ["out/[x]*.pt"]
    doc["outputs"]["error"] = "boom [red]x[/red] \x1b[31mred\r"
    doc["observed"]["branch"] = "feat/[/data/a]\x1b]0;title\x07"
    doc["env"]["variables"] = {**doc["env"]["variables"], "OMP_NUM_THREADS": "[/x]\r2"}
    path = tmp_path / "hostile.json"
    path.write_bytes(dumps(seal(doc)))
    return path


def test_positive_control_plain_rich_interprets_markup() -> None:
    from rich.console import Console
    from rich.errors import MarkupError

    out = io.StringIO()
    Console(file=out, highlight=False).print("data.classes=[cat,dog]")
    assert "[cat,dog]" not in out.getvalue()
    with pytest.raises(MarkupError):
        Console(file=io.StringIO()).print("paths=[/data/a]")


def test_helpers_escape_markup_and_controls() -> None:
    assert printable("a\rb\x1b[2Jc\u202e") == "a\\rb\\e[2Jc\\u202e"
    assert printable("plain [x]") == "plain [x]"
    assert printable("a\\rb") == "a\\rb"  # nothing to escape: shown as recorded
    assert printable("a\\rb\r") == "a\\\\rb\\r"  # with an escape, backslashes double
    assert markup("[bold]x") == "\\[bold]x"
    assert shell_join(["python", "a b", "x\ry", "it's\x1b"]) == \
        "python 'a b' $'x\\ry' $'it\\'s\\e'"


@pytest.mark.parametrize("verb", [["show"], ["diff", str(GOLDEN)], ["verify", "--no-rerun"],
                                  ["diff", "--json", str(GOLDEN)]])
def test_every_verb_shows_hostile_strings_as_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        verb: list[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no table folding inside the strings we look for
    path = _hostile_manifest(tmp_path)
    code = cli.main([*verb, str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "internal error" not in err and "MarkupError" not in err
    for ch in RAW_CONTROLS:
        assert ch not in out and ch not in err
    if verb == ["show"]:
        assert "data.classes=[cat,dog]" in out and "paths=[/data/a]" in out
        assert "$'ok\\rrm -rf ~'" in out and "--lr=[bold]1[/bold]" in out


def test_announced_command_cannot_disguise_itself() -> None:
    stream = io.StringIO()
    render_command(HOSTILE_ARGV, stream)
    text = stream.getvalue()
    assert not any(ch in text for ch in RAW_CONTROLS)
    assert "$'ok\\rrm -rf ~'" in text and "$'\\e[2J\\e[1;1Hclean'" in text


def test_gate_reports_escape_recorded_strings() -> None:
    report = GateReport(project=".", mode="full", policy=GatePolicy(), baseline="b.json",
                        command=["python", "t.py\rrm -rf ~"],
                        checks=[CheckResult("baseline", Status.FAIL, "moved \x1b[2J",
                                            ("file a\rb | c",), hint="hint \u202e")],
                        warnings=["w\x1b[31m"])
    human = io.StringIO()
    render_gate(report, human)
    for text in (human.getvalue(), gate_markdown(report)):
        assert not any(ch in text for ch in RAW_CONTROLS), text
        assert "rm -rf" in text


def _closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run with stdout on a pipe whose reader is already gone."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, b"", err)


def test_closed_pipe_ends_quietly_with_status_0(tmp_path: Path) -> None:
    control = _closed_pipe_run([sys.executable, "-c", "print('x' * 100000)"])
    assert control.returncode != 0 and b"BrokenPipeError" in control.stderr  # positive control
    hostile = _hostile_manifest(tmp_path)
    for args in (["show", str(GOLDEN)], ["diff", str(GOLDEN), str(hostile)],
                 ["diff", "--json", str(GOLDEN), str(hostile)], ["schema"]):
        proc = _closed_pipe_run([sys.executable, "-m", "manifest", *args])
        assert proc.returncode in (0, 1), proc.stderr  # diff's 1 is its verdict, not the pipe
        assert proc.stderr == b"", proc.stderr
    # ``manifest show run.json | head -1``, as a shell would wire it.
    head = subprocess.Popen(["head", "-1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert head.stdin is not None and head.stdout is not None
    show = subprocess.Popen([sys.executable, "-m", "manifest", "show", str(GOLDEN)],
                            stdout=head.stdin, stderr=subprocess.PIPE)
    head.stdin.close()
    first = head.stdout.read()
    head.stdout.close()
    head.wait(timeout=60)
    _, show_err = show.communicate(timeout=60)
    assert first.startswith(b"run_id") and first.count(b"\n") == 1
    assert show.returncode == 0 and show_err == b""
