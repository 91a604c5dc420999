"""The library says what to show; the CLI shows it.

A remote dataset's progress line and the launcher's note about unreadable records are
handed to the caller (a sink, a list of notes); only ``manifest.cli`` writes to stderr.
"""

from __future__ import annotations

import time

import pytest

from manifest.cli.verbs_record import ProgressLine
from manifest.data.remote.source import Progress
from manifest.launch.runner import LaunchResult


class _Sink:
    live = True

    def __init__(self) -> None:
        self.lines: list[str | None] = []

    def __call__(self, text: str | None) -> None:
        self.lines.append(text)


def test_a_listing_progress_goes_to_its_sink_not_to_stderr(
        capsys: pytest.CaptureFixture[str]) -> None:
    sink = _Sink()
    progress = Progress("listing s3://b/d", show=sink, total=3)
    progress(1, 10)  # within the first second: nothing shown yet
    assert sink.lines == []
    time.sleep(1.05)
    progress(1, 10)
    progress.close()
    assert len(sink.lines) == 2 and sink.lines[1] is None
    assert str(sink.lines[0]).startswith("listing s3://b/d: 2/3 objects, 0.00 GB")
    assert capsys.readouterr().err == ""
    # Positive control: the CLI's line renders the same text on stderr.
    line = ProgressLine()
    line(sink.lines[0])
    line(None)
    assert f"manifest: {sink.lines[0]}" in capsys.readouterr().err


def test_without_a_sink_nothing_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("listing s3://b/d", show=None)
    progress.started -= 2
    progress._next = 0.0  # past the first second: a line is due
    progress(5, 50)
    progress.close()
    assert capsys.readouterr().err == ""


def test_unreadable_records_are_a_note_for_the_caller() -> None:
    result = LaunchResult(exit_code=0, records=[], env={}, unreadable=2)
    assert result.notes() == ["2 process record(s) unreadable or not a JSON object; left out."]
    assert LaunchResult(exit_code=0, records=[], env={}).notes() == []
