"""URLs keep their secrets (issue 31): a ``--data`` URL is redacted like argv wherever it is
shown, and shown as it was typed.

``tests/hostile/conformance/url/<case>.json``: ``url`` is given to ``manifest capture
--data URL -- python -c pass`` (``cli``, default true) in a fresh repository; a
``*_fail`` case ends with exit 2 and one sentence that contains ``stderr`` (the URL or
path as typed, credentials withheld), within the limit (the figure is printed), and none
of ``secrets`` appears in stdout, stderr or any file the capture left (the store
included). Every case also goes through the one redactor in-process
(``manifest.redact.redact_url``/``redact_urls``): no secret survives, and an ``*_ok``
case (a Hub revision's ``@``, an endpoint's port, a plain query) is ``unchanged``.

Positive control: the raw URL does carry each secret, and the old sentence (the URL
echoed, a path through ``pathlib``) did show it or mangled the path.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_sentence
from tests.runs import manifest_cli

HERE = Path(__file__).parent / "conformance" / "url"
LIMIT_S = 20.0


def _cases() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _case(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((HERE / f"{name}.json").read_text())
    assert name.endswith(("_ok", "_fail")), name
    return doc


@pytest.mark.parametrize("name", _cases())
def test_url_case_through_the_redactor(name: str) -> None:
    from manifest.redact import redact_url, redact_urls

    case = _case(name)
    url = case["url"].partition("=")[2] if name.startswith("named_") else case["url"]
    shown = redact_url(url)
    if case.get("unchanged"):
        assert shown == url
    for secret in case.get("secrets", []):
        assert secret in url  # positive control: the raw URL carries it
        assert secret not in shown, shown
        assert secret not in redact_urls(f"cannot list {url}: Access Denied.")


@pytest.mark.parametrize("name", [n for n in _cases() if _case(n).get("cli", True)])
def test_url_case_through_capture(name: str, tmp_path: Path, home: Path) -> None:
    case = _case(name)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=120)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "*"}
    started = time.monotonic()
    proc = manifest_cli("capture", "--data", case["url"], "--", "python", "-c", "pass",
                        cwd=repo, env=env, timeout=LIMIT_S * 3)
    elapsed = time.monotonic() - started
    print(f"url/{name}: exit {proc.returncode} in {elapsed:.3f} s")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert elapsed < LIMIT_S
    assert_one_sentence(err)
    assert case["stderr"] in err, err
    written = [p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts]
    for secret in case.get("secrets", []):
        assert secret not in err and secret.encode() not in proc.stdout
        assert not any(secret.encode() in data for data in written), secret


def test_control_the_old_sentences_showed_the_secret_and_mangled_the_path() -> None:
    from pathlib import PurePosixPath

    url = _case("s3_userinfo_fail")["url"]
    assert f"{url} does not name a valid bucket.".count("wJalrSECRETbPxRfiCY") == 1
    assert str(PurePosixPath("file:///etc/passwd")) == "file:/etc/passwd"
    assert str(PurePosixPath("./missing//data/../x")) == "missing/data/../x"
