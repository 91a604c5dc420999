"""The id the training callbacks log (``MANIFEST_SEALED_RUN``) is the one ``show`` prints, is
the same in a re-run and holds no secret (issue 38, "The id the integrations log").

The Lightning and Hugging Face callbacks log ``MANIFEST_SEALED_RUN`` as
``manifest.launch_id`` (``manifest.integrations._steps``; ``show`` prints it as ``launch
id``). A real capture of a script that writes what the launcher gave it: hashed from
the raw argv, ``--api-key=A`` and ``--api-key=B`` gave two ids, neither was the one
``show`` prints (computed from the recorded, redacted argv), and a re-run (from the
recorded argv) gave a third.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from manifest.canonical import blake3_name, canonical_bytes
from tests.runs import make_repo, manifest_cli

SCRIPT = """import os
from pathlib import Path

Path(os.environ["SEEN_FILE"]).write_text(os.environ.get("MANIFEST_SEALED_RUN", "none"))
"""


def raw_argv_identity(doc: dict[str, object], argv: list[str]) -> str:
    """The id as it was computed before: from the argv as typed, secrets included."""
    code = doc["code"]
    assert isinstance(code, dict)
    return blake3_name(canonical_bytes({"commit": code["commit"],
                                        "diff_digest": code["diff_digest"],
                                        "argv": argv, "seed": 0}))


@pytest.mark.slow
def test_the_logged_id_is_shows_id_in_capture_and_rerun_whatever_the_secret(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"seen.py": SCRIPT}, example=False)
    seen = tmp_path / "seen.txt"
    env = {"SEEN_FILE": str(seen)}
    ids: dict[str, str] = {}
    docs: dict[str, dict[str, object]] = {}
    for key in ("A", "B"):
        cap = manifest_cli("capture", "--seed", "0", "-o", f"run-{key}.json", "--", "python",
                           "seen.py", f"--api-key={key}", cwd=repo, env=env)
        assert cap.returncode == 0, cap.stderr.decode()
        ids[key] = seen.read_text()
        docs[key] = json.loads((repo / f"run-{key}.json").read_text())
    command = docs["A"]["command"]
    assert isinstance(command, dict)
    assert command["argv"] == ["python", "seen.py", "--api-key=<redacted:1>"]
    # Positive control: hashed from the argv as typed, the two keys give two ids.
    assert (raw_argv_identity(docs["A"], ["python", "seen.py", "--api-key=A"])
            != raw_argv_identity(docs["B"], ["python", "seen.py", "--api-key=B"]))
    assert ids["A"].startswith("blake3:") and ids["A"] == ids["B"]
    shown = manifest_cli("show", "run-A.json", cwd=repo)
    assert shown.returncode == 0, shown.stderr.decode()
    found = re.search(r"launch id +(blake3:[0-9a-f]{64})$", shown.stdout.decode(),
                      re.MULTILINE)
    assert found is not None and found.group(1) == ids["A"]
    # The re-run (the recorded argv, its secret given back through MANIFEST_SECRET_1).
    seen.unlink()
    again = manifest_cli("verify", "--no-sandbox", "-q", "run-A.json", cwd=repo,
                         env={**env, "MANIFEST_SECRET_1": "A"})
    assert "Traceback" not in again.stderr.decode(), again.stderr.decode()
    assert seen.read_text() == ids["A"], again.stderr.decode()
