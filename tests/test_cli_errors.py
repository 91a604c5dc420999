"""The CLI's last line of defence: no traceback reaches the user."""

from __future__ import annotations

import argparse

import pytest

from manifest.cli import app as cli
from manifest.cli import verbs_record


def _boom(exc: BaseException) -> object:
    def verb(args: argparse.Namespace) -> int:
        raise exc

    return verb


@pytest.mark.parametrize(("exc", "code", "text"), [
    (RuntimeError("surprise"), 3, "internal error (RuntimeError: surprise)"),
    (OSError(28, "No space left on device", "/x/run.json"), 2,
     "No space left on device (/x/run.json)."),
])
def test_unexpected_errors_become_one_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    exc: BaseException, code: int, text: str,
) -> None:
    monkeypatch.delenv("MANIFEST_DEBUG", raising=False)
    monkeypatch.setattr(verbs_record, "_cmd_schema", _boom(exc))
    assert cli.main(["schema"]) == code
    err = capsys.readouterr().err
    assert text in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_debug_variable_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANIFEST_DEBUG", "1")
    monkeypatch.setattr(verbs_record, "_cmd_schema", _boom(RuntimeError("surprise")))
    with pytest.raises(RuntimeError, match="surprise"):
        cli.main(["schema"])
