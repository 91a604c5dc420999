"""The step-trail plot in the Markdown reports of verify, explain and diff (issue 24, item 4).

With matplotlib the report embeds a PNG (a base64 data URI); without it, a text
sparkline. Absence is simulated for real: the report is rendered in a fresh
interpreter in which ``import matplotlib`` fails, not by mocking the renderer.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import textwrap

import pytest

from manifest.cli.render_explain import explain_markdown, explain_trail
from manifest.cli.render_markdown import (
    AGREE,
    PART,
    UNKNOWN,
    sparkline,
    trail_between,
    trail_to_first,
    verify_markdown,
    verify_trail,
)
from manifest.explain.pipeline import ExplainReport
from manifest.verify.report import VerifyReport
from tests.runs import REPO

GOLDEN = REPO / "tests" / "golden"
SEED_A = GOLDEN / "diff" / "seed_change" / "a.json"
SEED_B = GOLDEN / "diff" / "seed_change" / "b.json"
SAME_A = GOLDEN / "diff" / "identical" / "a.json"
SAME_B = GOLDEN / "diff" / "identical" / "b.json"
IMAGE = re.compile(r"!\[step trail[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")
BLOCK = "import sys; sys.modules['matplotlib'] = None  # import matplotlib now raises\n"


def _png(markdown: str) -> bytes:
    found = IMAGE.search(markdown)
    assert found is not None, markdown[:400]
    data = base64.b64decode(found.group(1))
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return data


def _python(code: str, *, block: bool) -> str:
    done = subprocess.run([sys.executable, "-c", (BLOCK if block else "") + textwrap.dedent(code)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def _diff_cli(a: object, b: object, *, block: bool) -> str:
    return _python(f"""
        import sys
        from manifest.cli.app import main
        sys.exit(main(["diff", "--format", "markdown", {str(a)!r}, {str(b)!r}]))
        """, block=block)


def test_blocking_matplotlib_really_blocks_it() -> None:
    # Positive control for the tests below: the same interpreter imports it unblocked.
    pytest.importorskip("matplotlib")
    probe = "try:\n import matplotlib\n print('yes')\nexcept ImportError:\n print('no')\n"
    assert _python(probe, block=False).strip() == "yes"
    assert _python(probe, block=True).strip() == "no"


def test_diff_markdown_embeds_the_trail_as_png() -> None:
    pytest.importorskip("matplotlib")
    text = _diff_cli(SEED_A, SEED_B, block=False)
    assert "### Step trail: a vs b" in text
    _png(text)
    assert "The runs part first at step 0; 3 of 3 step(s) compared part." in text
    assert "```text" not in text


def test_diff_markdown_without_matplotlib_draws_a_sparkline() -> None:
    text = _diff_cli(SEED_A, SEED_B, block=True)
    assert "data:image/png" not in text
    assert "rank 0  ███\n" in text
    assert "steps 0–200; ▁ agree  █ part  · not compared" in text
    assert "pip install 'torch-manifest[plot]'" in text
    agree = _diff_cli(SAME_A, SAME_B, block=True)
    assert "rank 0  ▁▁▁\n" in agree
    assert "The runs agree at every one of the 3 step(s) compared." in agree


def test_no_trail_no_plot() -> None:
    from manifest.canonical import load_manifest

    bare = load_manifest((GOLDEN / "diff" / "seed_change" / "a.json").read_bytes())
    assert bare.outputs is not None
    empty = bare.model_copy(update={"outputs": bare.outputs.model_copy(update={"processes": []})})
    assert trail_between(bare, empty) is None
    report = VerifyReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"])
    assert verify_trail(report, SEED_A.read_bytes()) is None  # trails were not compared
    assert "Step trail" not in verify_markdown(report)


def test_verify_trail_stops_at_the_first_divergent_step() -> None:
    pytest.importorskip("matplotlib")
    report = VerifyReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"],
                          verdict="differs", trail_compared=True, first_divergent_step=100)
    trail = verify_trail(report, SEED_A.read_bytes())
    assert trail is not None
    assert trail.rows[0].points == ((0, AGREE), (100, PART), (200, UNKNOWN))
    text = verify_markdown(report, trail=trail)
    assert "### Step trail: the recorded run vs the re-run" in text
    _png(text)
    assert "The 1 step(s) after step 100 were not compared one by one." in text
    assert "▁█·" in verify_markdown(report, trail=trail, plots=False)


def _explain_report(**fields: object) -> ExplainReport:
    report = ExplainReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"])
    for name, value in fields.items():
        setattr(report, name, value)
    return report


def test_explain_markdown_plot_and_sparkline() -> None:
    pytest.importorskip("matplotlib")
    report = _explain_report(verdict="parted", cause="configuration", first_step=3, steps_run=5)
    trail = explain_trail(report, None)
    assert trail is not None and trail.title == "run A vs run B"
    assert sparkline(trail.rows[0].points) == "▁▁█··"
    _png(explain_markdown(report, trail=trail))
    without = _python("""
        from manifest.cli.render_explain import explain_markdown, explain_trail
        from manifest.explain.pipeline import ExplainReport
        r = ExplainReport(file="run.json", run_id="blake3:" + "0" * 64, command=["python"],
                          verdict="parted", cause="configuration", first_step=3, steps_run=5)
        print(explain_markdown(r, trail=explain_trail(r, None)))
        """, block=True)
    assert "## Explain: parted" in without
    assert "every rank  ▁▁█··\n" in without
    assert "data:image/png" not in without


def test_explain_trail_says_what_was_compared() -> None:
    from manifest.canonical import load_manifest

    recorded = load_manifest(SEED_A.read_bytes())
    env = explain_trail(_explain_report(verdict="parted", cause="environment", first_step=100,
                                        recorded_step=100, steps_run=3), recorded)
    assert env is not None and env.title == "the fresh runs vs the recorded trail"
    assert [s for s, _ in env.rows[0].points] == [0, 100, 200]  # the recorded trail's steps
    agree = explain_trail(_explain_report(verdict="agree", steps_run=4), None)
    assert agree is not None and sparkline(agree.rows[0].points) == "▁▁▁▁"
    # --step N (verify --explain): no step was located, nothing is known before N.
    assert explain_trail(_explain_report(verdict="parted", first_step=3), None) is None


def test_long_trails_fold_into_the_sparkline_width() -> None:
    trail = trail_to_first(range(1, 1001), 500, "run A vs run B")
    assert trail is not None
    line = sparkline(trail.rows[0].points)
    assert len(line) <= 60 and "█" in line and line.startswith("▁") and line.endswith("·")
