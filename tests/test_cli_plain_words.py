"""What a verb prints for a new user (issue 32): hashes in ``show`` on one line at 80
columns, and trust and confinement in words, not in the security page's shorthand."""

from __future__ import annotations

import re
from pathlib import Path

from manifest.cli.text import plain_confinement, plain_trust
from tests.runs import REPO, manifest_cli

GOLDEN = REPO / "tests" / "golden" / "manifest_v1.json"


def test_show_never_splits_a_hash_at_80_columns(tmp_path: Path) -> None:
    proc = manifest_cli("show", str(GOLDEN), cwd=tmp_path, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout.decode()
    hashes = re.findall(r"blake3:[0-9a-f]*", text)
    assert len(hashes) >= 6
    assert all(len(h) == len("blake3:") + 64 for h in hashes), hashes
    assert any(len(line) > 80 for line in text.splitlines())  # long lines stay long
    # The id the training callbacks log is shown, so a tracker's entry leads here.
    assert re.search(r"launch id +blake3:[0-9a-f]{64}$", text, re.MULTILINE)


def test_trust_and_confinement_in_words() -> None:
    sealed = plain_trust("sealed here")
    assert "written on this machine by manifest" in sealed and "sealed" not in sealed
    assert plain_trust("--trust") == "you passed --trust after seeing the command"
    assert "trust policy" in plain_trust("signed by alice@example.com")
    boxed = plain_confinement("bubblewrap: system read-only, only the scratch tree writable, "
                              "private /tmp, no network")
    assert boxed == ("in a sandbox (bubblewrap): it could not change the system, it could "
                     "write only in a scratch copy of your repository, it had a /tmp of its "
                     "own, it had no network")
    assert plain_confinement("not confined (--no-sandbox)") == (
        "without a sandbox (--no-sandbox): it could read and write whatever you can")
